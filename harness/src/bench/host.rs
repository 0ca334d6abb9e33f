//! What the benchmark reads about processes and the machine: CPU time and memory of a pid from
//! `/proc` (and of a PostgreSQL server: its postmaster and every child), the machine's busy
//! CPU time, the clock tick, wall-clock time, the machine's one-line description.
//!
//! Owns: those readings. Must not: change anything (no signals, no files written).

/// Wall-clock seconds since the epoch (`date +%s.%N`): phases and samples are timed by it.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// User + system CPU time of `pid`, in clock ticks (`/proc/PID/stat` fields 14 and 15).
pub fn cpu_ticks(pid: i32) -> u64 {
    let fields = stat_fields(pid);
    field(&fields, 14) + field(&fields, 15)
}

/// Field `n` of `/proc/PID/stat` (numbered as `proc(5)` does) among [`stat_fields`]' (0 if absent).
fn field(fields: &[u64], n: usize) -> u64 {
    fields.get(n - 3).copied().unwrap_or(0)
}

/// The fields of `/proc/PID/stat` after the command name (field 3 first; empty when the process
/// is gone). The command name (field 2) is in parentheses and may hold spaces: counted from after it.
fn stat_fields(pid: i32) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    // Field 3 (the state) is a letter: 0 here, which nobody reads.
    rest.split_whitespace().map(|value| value.parse::<u64>().unwrap_or(0)).collect()
}

/// The parent of `pid` (`/proc/PID/stat` field 4); `None` when `pid` is not visible here.
pub fn parent_pid(pid: i32) -> Option<i32> {
    i32::try_from(field(&stat_fields(pid), 4)).ok().filter(|parent| *parent > 0)
}

/// CPU clock ticks of a PostgreSQL server whose postmaster is `postmaster`: its own user +
/// system time, its children's that are running (backends, background workers: fields 14 and
/// 15 of each), and what the children it has reaped used (fields 16 and 17). A backend that
/// ends between two readings moves from the second sum to the third, so a difference of two
/// readings is the server's CPU between them. Another client's backends count too.
pub fn postmaster_cpu_ticks(postmaster: i32) -> u64 {
    let own = stat_fields(postmaster);
    let mut ticks = field(&own, 14) + field(&own, 15) + field(&own, 16) + field(&own, 17);
    let Ok(processes) = std::fs::read_dir("/proc") else { return ticks };
    for entry in processes.filter_map(Result::ok) {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
        let fields = stat_fields(pid);
        if field(&fields, 4) == u64::try_from(postmaster).unwrap_or(0) {
            ticks += field(&fields, 14) + field(&fields, 15);
        }
    }
    ticks
}

/// Clock ticks the machine's CPUs spent busy (everything in `/proc/stat`'s `cpu` line but idle
/// and iowait): with [`clock_ticks`], how many cores were in use over a span, whoever used them.
pub fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else { return 0 };
    // user nice system idle iowait irq softirq steal (guest time is inside user and nice).
    let values: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|value| value.parse().unwrap_or(0)).collect();
    values.iter().sum::<u64>() - values.get(3).copied().unwrap_or(0) - values.get(4).copied().unwrap_or(0)
}

/// A `Vm…` line of `/proc/PID/status`, in KiB (0 when the process is gone).
fn status_kib(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of `pid` now (`VmRSS`), KiB.
pub fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// Peak resident memory of `pid` (`VmHWM`), KiB.
pub fn hwm_kib(pid: i32) -> u64 {
    status_kib(pid, "VmHWM")
}

/// The output of a command, trimmed (empty if it cannot run).
fn output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 if it does not answer).
pub fn clock_ticks() -> u64 {
    output("getconf", &["CLK_TCK"]).parse().unwrap_or(100)
}

/// "2 cores, 24 GiB, Linux 6.1.0": `nproc`, MemTotal, `uname -sr`.
pub fn machine() -> String {
    format!("{} cores, {:.0} GiB, {}", cores(), memory_gib(), output("uname", &["-sr"]))
}

/// The cores this process may run on (`nproc`; 0 if it does not answer).
pub fn cores() -> u64 {
    output("nproc", &[]).parse().unwrap_or(0)
}

/// The machine's memory (`MemTotal`), GiB.
pub fn memory_gib() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total_kib: f64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    total_kib / 1_048_576.0
}

/// The first line of `rsyslogd -v`, second word: its version.
pub fn rsyslog_version(rsyslogd: &str) -> String {
    let version = output(rsyslogd, &["-v"]);
    version.lines().next().and_then(|line| line.split_whitespace().nth(1)).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id() as i32;
        let spin: u64 = (0..5_000_000u64).fold(0, |sum, n| sum.wrapping_add(n * n));
        assert!(spin > 0);
        // The peak read after the resident size: other test threads may grow the process between
        // the two reads, and the peak never falls.
        let rss = rss_kib(pid);
        assert!(rss > 0 && hwm_kib(pid) >= rss);
        let _ = cpu_ticks(pid);
        assert_eq!(rss_kib(i32::MAX), 0, "a pid that does not exist reads 0");
        assert!(machine().contains(" cores, "));
        assert!(cores() > 0 && memory_gib() > 0.0);
    }

    #[test]
    fn a_parent_counts_the_cpu_of_its_children_alive_and_reaped() {
        let pid = std::process::id() as i32;
        assert_eq!(parent_pid(i32::MAX), None, "a pid that does not exist has no parent");
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep runs");
        let child_pid = i32::try_from(child.id()).expect("a pid fits");
        assert_eq!(parent_pid(child_pid), Some(pid));
        // Its own time first: other tests' threads keep adding to it meanwhile (seen on CI).
        let own = cpu_ticks(pid);
        assert!(postmaster_cpu_ticks(pid) >= own, "its own time is counted");
        child.kill().expect("kill the child");
        child.wait().expect("reap the child");
        assert!(machine_busy_ticks() > 0);
    }
}
