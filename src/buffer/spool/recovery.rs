//! Opening the spool: what an earlier run left, checked frame by frame; damaged files repaired
//! (or, on a disk with no room for that, read around their damage) with their originals kept in
//! `quarantine/`; interrupted repairs finished.
//!
//! Owns: start-up recovery and the quarantine. Must not: delete damaged data, count a damage
//! twice while its quarantine link lasts, or keep the agent down because a file is damaged or
//! the disk is full.

use std::fs::File;
use std::io::{self};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing::{error, info, warn};

use super::*;

/// A repair of a damaged segment ([`recover_segment`]) writes and syncs the intact copy as
/// `N.seg.tmp`, moves `N.seg` to the quarantine, then renames the copy to `N.seg`. A crash in
/// between leaves a copy: with `N.seg` still there it may be partial and is removed (the repair
/// runs again); without it, it is complete and takes its place, else its records would be
/// neither delivered nor counted.
pub(super) fn remove_partial_copies(quarantine: &Path) {
    let Ok(entries) = std::fs::read_dir(quarantine) else { return };
    for path in entries.filter_map(Result::ok).map(|entry| entry.path()) {
        if path.extension().is_some_and(|extension| extension == PARTIAL) {
            warn!(copy = %path.display(), "removing a quarantine copy a crash left unfinished");
            let _ = std::fs::remove_file(&path);
        }
    }
}

pub(super) fn finish_interrupted_repairs(dir: &Path) -> io::Result<()> {
    let copies: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| path.to_str().is_some_and(|name| name.ends_with(".seg.tmp")))
        .collect();
    for copy in &copies {
        let segment = copy.with_extension("");
        if segment.exists() {
            warn!(copy = %copy.display(), "removing the partial copy of an interrupted segment repair");
            std::fs::remove_file(copy)?;
        } else {
            warn!(segment = %segment.display(), "completing an interrupted segment repair");
            std::fs::rename(copy, &segment)?;
        }
    }
    if !copies.is_empty() {
        sync_dir(dir)?;
    }
    Ok(())
}

impl Spool {
    /// Opens (or creates) the spool, recovering what an earlier run left. Blocking.
    pub fn open(config: SpoolConfig) -> io::Result<(Arc<Spool>, SpoolWriter, Recovered)> {
        std::fs::create_dir_all(&config.dir)?;
        let quarantine = config.dir.join("quarantine");
        // Made while there is room, so a damaged file can later be linked into it on a full disk.
        let made = std::fs::create_dir_all(&quarantine);
        remove_partial_copies(&quarantine);
        if let Err(error) = made {
            warn!(%error, quarantine = %quarantine.display(), "cannot make the spool's quarantine directory; trying again when damage is found");
        }
        let mut recovered = Recovered::default();
        let mut state = State::default();
        finish_interrupted_repairs(&config.dir)?;
        let mut ids: Vec<u64> = std::fs::read_dir(&config.dir)?
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".seg")?.parse().ok())
            .collect();
        ids.sort_unstable();
        for id in &ids {
            let path = segment_path(&config.dir, *id);
            let Recovery { records, bytes, first_ingest_ms, skips } =
                recover_segment(&path, &quarantine, &mut recovered)?;
            if records == 0 {
                continue;
            }
            recovered.records += records;
            state.disk_bytes += bytes;
            state.segments.insert(
                *id,
                SegmentState { records, bytes, first_ingest_ms, sealed: true, skips, ..SegmentState::default() },
            );
        }
        state.backlog = state.segments.keys().next().map(|id| SpoolPos::start_of(*id));
        let next = ids.last().map_or(0, |id| id + 1);
        let spool = Arc::new(Spool { config, quarantine, state: Mutex::new(state) });
        let marked = spool.load_maybe_stored();
        if marked > 0 {
            info!(records = marked, "records an earlier run sent without an answer are marked: kafka may hold them");
        }
        let mut writer = SpoolWriter::pending(spool.clone(), next);
        if let Err(error) = writer.start_segment() {
            let error = SpoolIoError { op: SpoolOp::Write, error };
            if !error.disk_full() {
                return Err(error.error);
            }
            // A full disk is the spool's normal weather, not a reason to stay down (a crash loop
            // with the app's socket gone): the first write makes the segment once there is
            // room, and until then `when_full` decides.
            warn!(segment = next, %error, "the spool's disk is full: its next segment is made once there is room");
        }
        if recovered.records > 0 || recovered.corrupt_regions > 0 {
            info!(
                records = recovered.records,
                corrupt_regions = recovered.corrupt_regions,
                "spool recovered records from an earlier run; they are sent first"
            );
        }
        Ok((spool, writer, recovered))
    }

    /// Copies a damaged segment into quarantine (the reader found damage after start-up).
    /// Moves an unreadable sealed segment's file to the quarantine directory (a copy would need
    /// to read it). Its records held in memory still deliver; the ledger forgets the file once
    /// they are finished.
    pub(super) fn quarantine_move(&self, segment: u64) -> Option<PathBuf> {
        // The segment being written stays: the writer still appends to it.
        if !self.lock().segments.get(&segment).is_some_and(|state| state.sealed) {
            return None;
        }
        let source = segment_path(&self.config.dir, segment);
        let target = self.quarantine.join(format!("{segment:020}.seg.{}", quarantine_suffix()));
        std::fs::create_dir_all(&self.quarantine).ok()?;
        match std::fs::rename(&source, &target) {
            Ok(()) => Some(target),
            Err(error) => {
                warn!(%error, segment, "cannot move an unreadable spool segment to the quarantine");
                None
            }
        }
    }

    pub(super) fn quarantine_copy(&self, segment: u64) -> Option<PathBuf> {
        let source = segment_path(&self.config.dir, segment);
        let target = self.quarantine.join(format!("{segment:020}.seg.{}", quarantine_suffix()));
        // A link of the active segment would follow the writer's later appends.
        let sealed = self.lock().segments.get(&segment).is_some_and(|s| s.sealed);
        quarantine_keep(&source, &target, sealed).ok()?;
        Some(target)
    }
}

pub(super) fn quarantine_suffix() -> String {
    chrono::Utc::now().format("%Y%m%dT%H%M%S%.6fZ").to_string()
}

/// What recovery found in one segment file.
pub(super) struct Recovery {
    /// Intact records (0: the file is no longer the spool's).
    pub(super) records: u64,
    /// File size.
    pub(super) bytes: u64,
    pub(super) first_ingest_ms: Option<u64>,
    /// See `SegmentState::skips`.
    pub(super) skips: Vec<(u64, u64)>,
}

/// Most damaged regions an unrepaired segment's skips keep (16 bytes each); beyond it, the
/// reader gives up the rest of the segment at its first damage (counted `corrupt`).
pub(super) const MAX_SKIPS: usize = 4096;

#[cfg(test)]
thread_local! {
    /// Test seam: copies of segments fail with ENOSPC on this thread (a full disk).
    pub(super) static NO_ROOM_FOR_COPIES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub(super) fn no_room_for_copies() -> io::Result<()> {
    #[cfg(test)]
    if NO_ROOM_FOR_COPIES.with(std::cell::Cell::get) {
        return Err(io::Error::from_raw_os_error(28));
    }
    Ok(())
}

/// The extension of a quarantine copy being made; one left by a crash is deleted at start.
pub(super) const PARTIAL: &str = "partial";

/// Keeps `source` in the quarantine as `target`: a hard link if `link` (a name, no data: it
/// works on a full disk and survives the segment's deletion; only for a file nobody writes to
/// any more), else a copy, made under a temporary name so a crash never leaves a partial one.
pub(super) fn quarantine_keep(source: &Path, target: &Path, link: bool) -> io::Result<()> {
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if link {
        match std::fs::hard_link(source, target) {
            Ok(()) => return Ok(()),
            // Kept already (or a name taken): a copy onto it would truncate the file it names.
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Err(error),
            Err(_) => {}
        }
    }
    // Under a temporary name, then linked to its own (which fails if that name exists):
    // neither a crash nor a clash leaves a partial or replaced file under a quarantine name.
    let partial = target.with_extension(PARTIAL);
    let copied = no_room_for_copies().and_then(|()| std::fs::copy(source, &partial)).and_then(|_| {
        match std::fs::hard_link(&partial, target) {
            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => std::fs::rename(&partial, target),
            linked => linked,
        }
    });
    let _ = std::fs::remove_file(&partial);
    copied
}

/// The quarantined name of `path`'s file, if an earlier start linked it there (its damage was
/// counted then, and is not again).
pub(super) fn quarantined_link(path: &Path, quarantine: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::metadata(path).ok()?;
    if file.nlink() < 2 {
        return None;
    }
    let name = path.file_name()?.to_str()?.to_owned();
    std::fs::read_dir(quarantine)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_str().is_some_and(|n| n.starts_with(&name)))
        .map(|entry| entry.path())
        .find(|other| std::fs::metadata(other).is_ok_and(|m| m.ino() == file.ino() && m.dev() == file.dev()))
}

/// The damaged regions between `frames` in a file of `len` bytes.
pub(super) fn damaged_regions(frames: &[std::ops::Range<usize>], len: usize) -> Vec<(u64, u64)> {
    let mut regions = Vec::new();
    let mut expected = HEADER.len();
    for frame in frames {
        if frame.start > expected {
            regions.push((expected as u64, frame.start as u64));
        }
        expected = frame.end;
    }
    if expected < len {
        regions.push((expected as u64, len as u64));
    }
    regions
}

/// Checks every frame of a segment left by an earlier run. A damaged file is moved to the
/// quarantine directory and replaced by a copy holding only its intact frames; one without
/// records is deleted. Its damage is counted in `recovered` by the start that finds it.
///
/// The copy needs room. On a disk too full for it the file is read as it is, around its damage
/// (`SegmentState::skips`; beyond [`MAX_SKIPS`] regions, up to its first damage, the rest
/// counted `corrupt` by the reader). Its original is hard-linked into the quarantine (a link
/// needs no room); a later start sees the link and neither counts it again nor keeps it twice,
/// and repairs it once there is room. Where not even a link can be made, every start counts it
/// again: over-counted rather than lost uncounted, since the file goes once its records are
/// delivered. A damaged file without one intact frame needs no copy: it is moved to the
/// quarantine whole, or, when not even that can be done, left where it is (nothing is lost
/// while it stays) and counted by the start that moves it.
pub(super) fn recover_segment(path: &Path, quarantine: &Path, recovered: &mut Recovered) -> io::Result<Recovery> {
    let data = std::fs::read(path)?;
    let report = segment::scan(&data);
    let first_ingest_ms =
        report.frames.first().and_then(|range| segment::frame_at(&data, range.start)).map(|(frame, _)| frame.ingest_ms);
    let intact = report.frames.len() as u64;
    if report.corrupt_regions == 0 {
        if report.frames.is_empty() {
            // Nothing in it (a header, or a file a crash left empty).
            std::fs::remove_file(path)?;
        }
        return Ok(Recovery { records: intact, bytes: data.len() as u64, first_ingest_ms, skips: Vec::new() });
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let target = quarantine.join(format!("{name}.{}", quarantine_suffix()));
    let earlier = quarantined_link(path, quarantine);
    let count = |recovered: &mut Recovered, kept: Option<PathBuf>| {
        recovered.corrupt_regions += report.corrupt_regions;
        recovered.corrupt_bytes += report.corrupt_bytes;
        recovered.quarantined.extend(kept);
    };
    let sync_parent = || path.parent().map_or(Ok(()), sync_dir);
    if report.frames.is_empty() {
        if earlier.is_some() {
            std::fs::remove_file(path)?;
        } else {
            let moved = std::fs::create_dir_all(quarantine).and_then(|()| std::fs::rename(path, &target));
            if let Err(error) = moved {
                error!(
                    segment = %path.display(),
                    %error,
                    corrupt_bytes = report.corrupt_bytes,
                    "damaged spool segment without an intact record cannot be moved to quarantine: left in place, a later start moves it"
                );
                // Never deleted, and never read or numbered over (the next segment's number is
                // above every file's).
                return Ok(Recovery { records: 0, bytes: 0, first_ingest_ms: None, skips: Vec::new() });
            }
            error!(
                segment = %path.display(),
                quarantined = %target.display(),
                corrupt_bytes = report.corrupt_bytes,
                "damaged spool segment without an intact record: moved to quarantine"
            );
            count(recovered, Some(target));
        }
        sync_parent()?;
        return Ok(Recovery { records: 0, bytes: 0, first_ingest_ms: None, skips: Vec::new() });
    }
    let mut clean = HEADER.to_vec();
    for range in &report.frames {
        clean.extend_from_slice(&data[range.clone()]);
    }
    let temporary = path.with_extension("seg.tmp");
    let copied = no_room_for_copies()
        .and_then(|()| std::fs::write(&temporary, &clean))
        .and_then(|()| File::open(&temporary)?.sync_all())
        .and_then(|()| match earlier {
            // Already kept (and counted): the copy simply replaces the file.
            Some(_) => Ok(()),
            None => std::fs::create_dir_all(quarantine).and_then(|()| std::fs::rename(path, &target)),
        });
    if let Err(error) = copied {
        let _ = std::fs::remove_file(&temporary);
        let kept = match earlier {
            Some(_) => None,
            None => quarantine_keep(path, &target, true).ok().map(|()| target.clone()),
        };
        let mut skips = damaged_regions(&report.frames, data.len());
        if skips.len() > MAX_SKIPS {
            skips.clear();
        }
        error!(
            segment = %path.display(),
            %error,
            quarantined = ?kept,
            corrupt_regions = report.corrupt_regions,
            intact_records = intact,
            read_around_the_damage = !skips.is_empty(),
            "damaged spool segment cannot be repaired (no room for its intact copy?): it is read as it is"
        );
        // Counted once while the link lasts: a later start sees it and counts nothing. (Without
        // even a link — no quarantine directory could be made — every start counts it again.)
        if earlier.is_none() {
            count(recovered, kept);
        }
        return Ok(Recovery { records: intact, bytes: data.len() as u64, first_ingest_ms, skips });
    }
    std::fs::rename(&temporary, path)?;
    sync_parent()?;
    error!(
        segment = %path.display(),
        quarantined = %earlier.as_ref().unwrap_or(&target).display(),
        corrupt_regions = report.corrupt_regions,
        corrupt_bytes = report.corrupt_bytes,
        intact_records = intact,
        "damaged spool segment: intact records kept, original in quarantine"
    );
    if earlier.is_none() {
        count(recovered, Some(target));
    }
    Ok(Recovery { records: intact, bytes: clean.len() as u64, first_ingest_ms, skips: Vec::new() })
}
