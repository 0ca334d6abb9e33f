//! Reading a stream connection in ticks: while a connection is busy, its socket is out of the
//! event loop and read on a timer, so a writer logging a record every 100 µs wakes the agent a
//! few hundred times a second instead of once per record.
//!
//! Why: on a virtual machine a thread's sleep and wake-up cost tens of µs; at 1,000–10,000
//! records/s nearly all of the agent's CPU went into being woken once per `write()` (epoll
//! returns, the handoff to the shipper, librdkafka's broker thread woken per record;
//! `sluice-bench pod`, docs/PERFORMANCE.md "Reading in ticks"). Edge-triggered epoll wakes the
//! thread on every write while the socket is registered, whether a task waits on it or not, so
//! the socket is deregistered, not merely left unpolled.
//!
//! Acknowledged connections stop ticking ([`PacedStream::stop_ticking`]) when their
//! acknowledgements start: their writer task holds a registered handle on the socket, which
//! epoll wakes for every write anyway (safe Rust cannot register a socket for writability
//! alone), and a writer waiting for its acknowledgement should not wait for a tick too.
//!
//! Modes of a [`PacedStream`]:
//! - *waiting*: registered for readability (an idle connection costs nothing); the first read
//!   that returns data starts ticking;
//! - *ticking*: deregistered; each tick (after [`FIRST_TICK`], then the `read_interval` or less)
//!   reads until the socket is empty. A tick that finds nothing goes back to waiting; so does a
//!   tick that finds the connection hot ([`HOT_BYTES_PER_MS`]), and that connection stays on
//!   epoll (read as fast as epoll reports it, as before) for [`HOT_FOR`] before it tries a tick
//!   again. The next
//!   tick comes sooner when the last one brought more: a tick is due when about
//!   [`TICK_BYTES`] have probably arrived, at most `read_interval` after the last one. A tick's
//!   reads charge tokio's task budget, as reads through epoll do, so a writer that never lets
//!   the socket empty cannot keep the connection's task from seeing shutdown.
//!
//! Between ticks a writer's records queue in the socket. The kernel charges each small write
//! about 800 B of the writer's ~208 KiB send buffer, so about 250 writes fit: a writer that
//! sends more than that within one tick — a burst above ~50,000 writes/s at the default 5 ms —
//! waits (or, non-blocking, gets `EAGAIN`) until the tick, at most `read_interval`. A steady
//! rate is covered by the next tick coming sooner: ticks count a line as its bytes plus
//! [`WRITE_COST`], so short lines count as the writes they are. Writes that are not lines
//! (octet-counted or Forward frames without newlines) count by their bytes only. A record is
//! read at most `read_interval` later.
//!
//! Owns: the mode switches and the tick timing. Must not: read ahead of what the framer asks
//! for (it reads into the buffer it is given, as any `AsyncRead`), or lose readiness across a
//! switch (registering a socket that already holds data reports it at once).
//!
//! Written here rather than taken from a crate: no crate does this, and it is the ingest
//! path's core.

use std::future::Future;
use std::io::{self, Read};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::UnixStream;
use tokio::time::{Instant, Sleep};

/// The first tick after a waiting connection's read: short, so a writer that just became busy
/// at a high rate does not fill its socket before the first tick measures it.
pub const FIRST_TICK: Duration = Duration::from_millis(1);

/// What a write costs the writer's socket beyond its bytes (the kernel's buffer per write,
/// charged against its ~208 KiB send buffer: about 250 small writes fit). A tick counts a
/// read's bytes plus this for every newline in them — a line is usually one write — so a
/// writer of short lines is measured by its writes, not its few bytes.
pub const WRITE_COST: usize = 768;

/// The next tick is due when about this much (bytes plus [`WRITE_COST`] per line) has probably
/// arrived at the last tick's rate: ~48 lines of 256 B, ~60 short lines — a quarter of what the
/// socket holds.
pub const TICK_BYTES: usize = 48 * 1024;

/// What `read` costs the writer's socket, as counted against [`TICK_BYTES`].
pub fn units(read: &[u8]) -> usize {
    read.len() + WRITE_COST * memchr::memchr_iter(b'\n', read).count()
}

/// A connection whose tick brought at least half of [`TICK_BYTES`] at this rate or more ([`units`] per
/// millisecond since the tick before: ~32,000 lines/s of 256 B, ~40,000 short lines/s) goes back
/// to waiting on epoll
/// for [`HOT_FOR`]: epoll's wake-ups then bring many records each, while ticks would come late
/// behind the other connections' work and let the writer's socket fill (measured: max-rate
/// ingest 9% slower with every connection ticking).
pub const HOT_BYTES_PER_MS: f64 = 32.0 * 1024.0;

/// How long a connection that was hot stays on epoll before it tries a tick again.
pub const HOT_FOR: Duration = Duration::from_millis(100);

/// The read side of a stream connection, paced (see the module doc). `interval` zero: always
/// waiting on epoll, as a plain tokio stream.
pub struct PacedStream {
    mode: Mode,
    interval: Duration,
    /// A tick found the connection hot ([`is_hot`]): it stays on epoll until then.
    hot_until: Option<Instant>,
}

enum Mode {
    Waiting(UnixStream),
    Ticking(Ticking),
    /// Only while switching.
    Switching,
    /// A switch failed after a read: that read's bytes were returned, the error comes next.
    Broken(Option<io::Error>),
}

struct Ticking {
    stream: StdUnixStream,
    sleep: Pin<Box<Sleep>>,
    /// The sleep has fired: reading until the socket is empty.
    due: bool,
    /// Bytes read in this tick.
    bytes: usize,
    /// When this tick began (for the rate).
    began: Instant,
    /// When the previous tick began.
    previous: Instant,
}

impl PacedStream {
    /// Takes a tokio stream out of the event loop's hands (it is registered again while the
    /// connection waits).
    pub fn new(stream: UnixStream, interval: Duration) -> Self {
        Self { mode: Mode::Waiting(stream), interval, hot_until: None }
    }

    /// From now on every write is read as epoll reports it (acknowledged connections: their
    /// writer task's registered handle wakes the agent for every write anyway, and a writer
    /// waiting for its acknowledgement should not wait for a tick too).
    pub fn stop_ticking(&mut self) {
        self.interval = Duration::ZERO;
    }

    /// The socket, whatever the mode.
    pub fn socket(&self) -> Option<socket2::SockRef<'_>> {
        match &self.mode {
            Mode::Waiting(stream) => Some(socket2::SockRef::from(stream)),
            Mode::Ticking(ticking) => Some(socket2::SockRef::from(&ticking.stream)),
            Mode::Switching | Mode::Broken(_) => None,
        }
    }

    /// A second handle on the socket, not registered with the event loop, for writing
    /// acknowledgements. Registering it (which an acknowledged connection's writer task does)
    /// makes every write of the peer wake the agent again: acknowledged connections are not
    /// paced.
    pub fn writer(&self) -> io::Result<StdUnixStream> {
        match &self.mode {
            Mode::Waiting(stream) => {
                let fd = std::os::fd::AsFd::as_fd(stream).try_clone_to_owned()?;
                Ok(StdUnixStream::from(fd))
            }
            Mode::Ticking(ticking) => ticking.stream.try_clone(),
            Mode::Switching | Mode::Broken(_) => Err(io::Error::other("the socket is gone")),
        }
    }

    /// Takes the socket out of epoll. On failure the socket is gone and the next read reports it
    /// (the bytes just read are still returned).
    fn start_ticking(&mut self, now: Instant) {
        let Mode::Waiting(stream) = std::mem::replace(&mut self.mode, Mode::Switching) else { return };
        // Deregisters it.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(error) => {
                self.mode = Mode::Broken(Some(error));
                return;
            }
        };
        self.mode = Mode::Ticking(Ticking {
            stream,
            sleep: Box::pin(tokio::time::sleep_until(now + FIRST_TICK)),
            due: false,
            bytes: 0,
            began: now,
            previous: now,
        });
    }

    /// Registers the socket again. On failure the socket is gone (and what it held unread: the
    /// connection ends with a read error, as on any failed read).
    fn start_waiting(&mut self) {
        let Mode::Ticking(ticking) = std::mem::replace(&mut self.mode, Mode::Switching) else { return };
        self.mode = match UnixStream::from_std(ticking.stream) {
            Ok(stream) => Mode::Waiting(stream),
            Err(error) => Mode::Broken(Some(error)),
        };
    }
}

/// When the next tick is due after one that read `bytes` over `elapsed` since the tick before:
/// when [`TICK_BYTES`] have probably arrived, within `interval`.
pub fn next_tick(bytes: usize, elapsed: Duration, interval: Duration) -> Duration {
    if bytes == 0 {
        return interval;
    }
    let until_full = elapsed.mul_f64(TICK_BYTES as f64 / bytes as f64);
    until_full.min(interval)
}

/// Whether a tick that read `bytes` over `elapsed` since the tick before found a connection
/// busy enough for epoll ([`HOT_BYTES_PER_MS`]).
pub fn is_hot(bytes: usize, elapsed: Duration) -> bool {
    bytes >= TICK_BYTES / 2 && bytes as f64 >= HOT_BYTES_PER_MS * elapsed.as_secs_f64() * 1000.0
}

impl AsyncRead for PacedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.mode {
                Mode::Switching => return Poll::Ready(Err(io::Error::other("socket lost while switching modes"))),
                Mode::Broken(error) => {
                    return Poll::Ready(Err(error.take().unwrap_or_else(|| io::Error::other("socket lost"))));
                }
                Mode::Waiting(stream) => {
                    // tokio's own read: readiness, the task's budget, no zeroing.
                    let before = buf.filled().len();
                    ready!(Pin::new(stream).poll_read(cx, buf))?;
                    let n = buf.filled().len() - before;
                    if n > 0 && !this.interval.is_zero() {
                        let now = Instant::now();
                        if this.hot_until.is_none_or(|until| now >= until) {
                            this.hot_until = None;
                            this.start_ticking(now);
                        }
                    }
                    return Poll::Ready(Ok(()));
                }
                Mode::Ticking(ticking) => {
                    if this.interval.is_zero() {
                        this.start_waiting();
                        continue;
                    }
                    if !ticking.due {
                        ready!(ticking.sleep.as_mut().poll(cx));
                        ticking.due = true;
                        ticking.previous = ticking.began;
                        ticking.began = Instant::now();
                        ticking.bytes = 0;
                    }
                    // Plain reads do not charge tokio's budget: without this a writer that keeps
                    // the socket full would keep the connection's task (and its checks for
                    // shutdown) from ever yielding.
                    let coop = ready!(tokio::task::coop::poll_proceed(cx));
                    match (&ticking.stream).read(unfilled(buf)) {
                        Ok(n) => {
                            coop.made_progress();
                            let read = &buf.initialized()[buf.filled().len()..buf.filled().len() + n];
                            ticking.bytes += units(read);
                            buf.advance(n);
                            return Poll::Ready(Ok(()));
                        }
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                            let elapsed = ticking.began - ticking.previous;
                            let hot = is_hot(ticking.bytes, elapsed);
                            if ticking.bytes == 0 || hot {
                                if hot {
                                    this.hot_until = Some(ticking.began + HOT_FOR);
                                }
                                this.start_waiting();
                                continue;
                            }
                            let wait = next_tick(ticking.bytes, elapsed, this.interval);
                            ticking.sleep.as_mut().reset(ticking.began + wait);
                            ticking.due = false;
                        }
                        Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                        Err(error) => return Poll::Ready(Err(error)),
                    }
                }
            }
        }
    }
}

/// Most bytes one read asks for: safe Rust must zero what it reads into, and the framer's
/// buffer can be a long record's size; zeroing all of it for every read would cost more than
/// the read.
pub const READ_CHUNK: usize = 32 * 1024;

fn unfilled<'a>(buf: &'a mut ReadBuf<'_>) -> &'a mut [u8] {
    let len = buf.remaining().min(READ_CHUNK);
    buf.initialize_unfilled_to(len)
}

#[cfg(test)]
mod tests;
