//! A global allocator that counts, per thread, the bytes allocated and not yet freed, so a
//! target can assert that what it calls holds memory in proportion to its input: a length read
//! off the input that the input cannot back must never become an allocation.
//!
//! Per thread, so the seed replays `cargo test` runs in parallel do not see each other's memory.
//! The only unsafe code of this crate: a `GlobalAlloc` cannot be written without it, and it
//! only forwards to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to [`System`], counting.
pub struct Counting;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

thread_local! {
    /// Bytes this thread has allocated and not freed (a block freed by another thread than the
    /// one that allocated it makes this an estimate; the targets are single-threaded).
    static LIVE: Cell<usize> = const { Cell::new(0) };
    /// The highest `LIVE` since [`peak_during`] began.
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(bytes: usize) {
    // `try_with`: the allocator is also called while a thread's locals are being torn down.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(bytes);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrank(bytes: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(bytes)));
}

// SAFETY: every call is forwarded unchanged to `System`; the counting touches only
// const-initialised thread locals without destructors, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Both blocks may exist for a moment: count the new one before freeing the old.
            grew(new_size);
            shrank(layout.size());
        }
        new
    }
}

/// Runs `f` and returns its result with the most memory it held at once beyond what this
/// thread held when it started (bytes it allocated, whether or not it freed them by the end).
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, peak.saturating_sub(base))
}
