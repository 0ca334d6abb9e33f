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
//! Acknowledged connections are not paced in effect: their writer task holds a registered
//! handle on the socket, which epoll wakes for every write (safe Rust cannot register a socket
//! for writability alone).
//!
//! Modes of a [`PacedStream`]:
//! - *waiting*: registered for readability (an idle connection costs nothing); the first read
//!   that returns data starts ticking;
//! - *ticking*: deregistered; each tick (after [`FIRST_TICK`], then the `read_interval` or less)
//!   reads until the socket is empty. A tick that finds nothing goes back to waiting; so does a
//!   tick that read [`HOT_BYTES`] or more (a connection that busy is read as fast as epoll
//!   reports it, as before). The next tick comes sooner when the last one brought more: a tick
//!   is due when about [`TICK_BYTES`] have probably arrived, at most `read_interval` after the
//!   last one.
//!
//! The writer never waits for a tick: between ticks its records queue in the socket (the
//! kernel's send buffer holds about 250 small writes; a tick is due when about [`TICK_BYTES`],
//! 128 writes of 64 B, have probably arrived).
//! A record waits at most `read_interval` longer before it is read.
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

/// The next tick is due when about this much has probably arrived (at the last tick's rate).
pub const TICK_BYTES: usize = 8 * 1024;

/// A tick that read this much goes back to waiting on epoll: the connection is busy enough
/// that every wake-up brings a large read anyway.
pub const HOT_BYTES: usize = 32 * 1024;

/// The read side of a stream connection, paced (see the module doc). `interval` zero: always
/// waiting on epoll, as a plain tokio stream.
pub struct PacedStream {
    mode: Mode,
    interval: Duration,
}

enum Mode {
    Waiting(UnixStream),
    Ticking(Ticking),
    /// Only while switching (and after a failed registration, which is reported as an error).
    Switching,
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
        Self { mode: Mode::Waiting(stream), interval }
    }

    /// The socket, whatever the mode.
    pub fn socket(&self) -> Option<socket2::SockRef<'_>> {
        match &self.mode {
            Mode::Waiting(stream) => Some(socket2::SockRef::from(stream)),
            Mode::Ticking(ticking) => Some(socket2::SockRef::from(&ticking.stream)),
            Mode::Switching => None,
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
            Mode::Switching => Err(io::Error::other("socket is being switched")),
        }
    }

    fn start_ticking(&mut self, now: Instant) -> io::Result<()> {
        let Mode::Waiting(stream) = std::mem::replace(&mut self.mode, Mode::Switching) else { return Ok(()) };
        // Deregisters it.
        let stream = stream.into_std()?;
        self.mode = Mode::Ticking(Ticking {
            stream,
            sleep: Box::pin(tokio::time::sleep_until(now + FIRST_TICK)),
            due: false,
            bytes: 0,
            began: now,
            previous: now,
        });
        Ok(())
    }

    fn start_waiting(&mut self) -> io::Result<()> {
        let Mode::Ticking(ticking) = std::mem::replace(&mut self.mode, Mode::Switching) else { return Ok(()) };
        self.mode = Mode::Waiting(UnixStream::from_std(ticking.stream)?);
        Ok(())
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

impl AsyncRead for PacedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.mode {
                Mode::Switching => return Poll::Ready(Err(io::Error::other("socket lost while switching modes"))),
                Mode::Waiting(stream) => {
                    ready!(stream.poll_read_ready(cx))?;
                    match stream.try_read(buf.initialize_unfilled()) {
                        Ok(n) => {
                            buf.advance(n);
                            if n > 0 && !this.interval.is_zero() {
                                this.start_ticking(Instant::now())?;
                            }
                            return Poll::Ready(Ok(()));
                        }
                        // try_read cleared the readiness: poll_read_ready waits again.
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(error) => return Poll::Ready(Err(error)),
                    }
                }
                Mode::Ticking(ticking) => {
                    if !ticking.due {
                        ready!(ticking.sleep.as_mut().poll(cx));
                        ticking.due = true;
                        ticking.previous = ticking.began;
                        ticking.began = Instant::now();
                        ticking.bytes = 0;
                    }
                    match (&ticking.stream).read(buf.initialize_unfilled()) {
                        Ok(n) => {
                            ticking.bytes += n;
                            buf.advance(n);
                            return Poll::Ready(Ok(()));
                        }
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                            if ticking.bytes == 0 || ticking.bytes >= HOT_BYTES {
                                this.start_waiting()?;
                                continue;
                            }
                            let wait = next_tick(ticking.bytes, ticking.began - ticking.previous, this.interval);
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

#[cfg(test)]
mod tests;
