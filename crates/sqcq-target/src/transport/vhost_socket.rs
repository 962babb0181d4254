//! Bounded waits on a frontend's vhost-user socket.
//!
//! `vhost`'s `BackendReqHandler::handle_request` reads a whole message and
//! writes its reply with blocking calls that retry forever on `EAGAIN`: a
//! frontend that sends half a message, or never reads its replies, would
//! hold the device's control thread (and SIGTERM) for good. The control
//! thread therefore calls it only when it cannot block:
//!
//! - [`wait_for_message`] returns once the whole message (header and the
//!   body its header announces) is queued on the socket, or gives up after
//!   [`MESSAGE_TIMEOUT`] (the frontend is then disconnected), or when the
//!   device is stopping. Frontends write a message with one `sendmsg`, so
//!   an honest one never waits here. A frontend that hangs up after part
//!   of a message ends the wait at once: the part can never complete, and
//!   the next frontend of the device waits in the listen backlog until
//!   this connection is over.
//! - [`unread_reply_bytes`] tells how much of what the daemon sent the
//!   frontend has not read; above [`MAX_UNREAD_REPLIES`] the frontend is
//!   disconnected before a reply could fill the socket buffer and block.
//!
//! No library offers this (rust-vmm's answer is to shut the socket down
//! from another thread), so it is written here with `poll`, `recv(MSG_PEEK)`
//! and the `FIONREAD`/`TIOCOUTQ` ioctls of Unix sockets.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How long the rest of a message may take once its first byte arrived.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reply bytes a frontend may leave unread. Honest frontends read every
/// reply before their next request that has one, so they never exceed a
/// few hundred bytes; the socket buffer (about 200 KiB by default) is far
/// above this limit, so a reply written below it never blocks.
pub const MAX_UNREAD_REPLIES: usize = 64 << 10;

/// vhost-user message header: request (u32), flags (u32), size (u32).
const HEADER_LEN: usize = 12;
/// Largest body a valid header announces (vhost's `MAX_MSG_SIZE`).
const MAX_BODY: usize = 0x1000;

/// How [`wait_for_message`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A whole message is queued, or the peer closed or sent a header no
    /// valid message has: `handle_request` returns without blocking.
    Ready,
    /// Nothing is queued (a spurious wake-up): go back to waiting.
    Nothing,
    /// The stop descriptor became readable.
    Stopped,
    /// The message did not complete within the timeout.
    TimedOut,
}

/// Waits until a whole message can be read from `sock` (readable now or
/// soon), `stop` becomes readable, or `timeout` passes.
pub fn wait_for_message(sock: RawFd, stop: RawFd, timeout: Duration) -> io::Result<Wait> {
    let deadline = Instant::now() + timeout;
    match queued_message(sock)? {
        Some(true) => return Ok(Wait::Ready),
        Some(false) => {}
        None => return Ok(Wait::Nothing),
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(Wait::TimedOut);
        }
        // Unix sockets report readable as soon as any byte is queued, so
        // waiting for the rest of a message is a short sleep between
        // looks (this path is only taken by frontends that split
        // messages), while the stop descriptor is watched.
        let slice = (deadline - now).min(Duration::from_millis(10));
        if readable(stop, slice)? {
            return Ok(Wait::Stopped);
        }
        if queued_message(sock)? == Some(true) {
            return Ok(Wait::Ready);
        }
    }
}

/// Copies up to `buf.len()` bytes queued on `sock` into `buf` without
/// taking them off the socket and without waiting (no descriptor is
/// received: there is no control buffer); how many.
pub(crate) fn peek(sock: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        libc::recv(
            sock,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// `Some(true)`: a whole message (or end of file, or an invalid size, or
/// part of a message from a peer that hung up) is queued; `Some(false)`:
/// part of one that may still complete; `None`: nothing.
fn queued_message(sock: RawFd) -> io::Result<Option<bool>> {
    let mut header = [0u8; HEADER_LEN];
    let n = peek(sock, &mut header);
    let n = match n {
        Ok(n) => n,
        Err(e) => {
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                // A broken socket: let the handler find out and report it.
                _ => Ok(Some(true)),
            };
        }
    };
    if n == 0 {
        return Ok(Some(true));
    }
    let whole = if n < HEADER_LEN {
        false
    } else {
        let body = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        let body = usize::try_from(body).unwrap_or(usize::MAX);
        body > MAX_BODY || queued_bytes(sock)? >= HEADER_LEN + body
    };
    // Bytes still queued hide the end of file from `recv` (it returns
    // them, not 0), so a peer that closed after part of a message is
    // seen by `poll`'s hang-up flags: the handler then reads the part,
    // meets the end of file and ends the connection.
    Ok(Some(whole || hung_up(sock)?))
}

/// Whether the peer of `sock` shut down its sending side or closed:
/// nothing more will arrive.
fn hung_up(sock: RawFd) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: sock,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; no waiting.
    match unsafe { libc::poll(&raw mut pfd, 1, 0) } {
        n if n > 0 => Ok(pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

fn queued_bytes(sock: RawFd) -> io::Result<usize> {
    queue_bytes(sock, libc::FIONREAD)
}

/// Bytes sent on `sock` that the peer has not read yet.
pub fn unread_reply_bytes(sock: RawFd) -> io::Result<usize> {
    queue_bytes(sock, libc::TIOCOUTQ)
}

/// The bytes in one of `sock`'s queues: FIONREAD (SIOCINQ) the receive
/// queue, TIOCOUTQ (SIOCOUTQ) the send queue.
fn queue_bytes(sock: RawFd, request: libc::Ioctl) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: both requests write one int through a valid pointer.
    if unsafe { libc::ioctl(sock, request, &raw mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Whether `fd` becomes readable within `timeout`.
pub fn readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    match unsafe { libc::poll(&raw mut pfd, 1, ms) } {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn new_stop() -> crate::runtime::eventfd::PeerEventFd {
        crate::runtime::eventfd::PeerEventFd::new().unwrap()
    }

    #[test]
    fn a_whole_message_is_ready_a_partial_one_times_out() {
        let (mut fe, be) = UnixStream::pair().unwrap();
        let stop = new_stop();
        let wait = |t| wait_for_message(be.as_raw_fd(), stop.as_raw_fd(), t).unwrap();
        // Header announcing 8 bytes of body, then only 4 of them.
        let mut msg = vec![1, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0];
        fe.write_all(&msg).unwrap();
        assert_eq!(wait(Duration::from_millis(50)), Wait::TimedOut);
        fe.write_all(&[0; 4]).unwrap();
        assert_eq!(wait(Duration::from_millis(50)), Wait::TimedOut);
        fe.write_all(&[0; 4]).unwrap();
        assert_eq!(wait(Duration::from_millis(50)), Wait::Ready);
        // A header announcing more than any message has: ready, so the
        // handler refuses it at once.
        let (mut fe2, be2) = UnixStream::pair().unwrap();
        msg[8..12].copy_from_slice(&0x10_0000u32.to_le_bytes());
        fe2.write_all(&msg).unwrap();
        let w = wait_for_message(be2.as_raw_fd(), stop.as_raw_fd(), Duration::from_millis(50));
        assert_eq!(w.unwrap(), Wait::Ready);
    }

    #[test]
    fn stop_ends_the_wait_and_a_closed_peer_is_ready() {
        let (mut fe, be) = UnixStream::pair().unwrap();
        let stop = new_stop();
        fe.write_all(&[1, 0, 0]).unwrap();
        assert!(matches!(
            stop.signal(),
            crate::runtime::eventfd::Signal::Sent
        ));
        let w = wait_for_message(be.as_raw_fd(), stop.as_raw_fd(), Duration::from_secs(30));
        assert_eq!(w.unwrap(), Wait::Stopped);
        let (fe, be) = UnixStream::pair().unwrap();
        drop(fe);
        let w = wait_for_message(
            be.as_raw_fd(),
            new_stop().as_raw_fd(),
            Duration::from_secs(30),
        );
        assert_eq!(w.unwrap(), Wait::Ready);
    }

    #[test]
    fn a_peer_that_hangs_up_mid_message_is_ready_at_once() {
        let stop = new_stop();
        // Half a header, and a header with half its body.
        for part in [
            &[1u8, 0, 0][..],
            &[1, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        ] {
            let (mut fe, be) = UnixStream::pair().unwrap();
            fe.write_all(part).unwrap();
            drop(fe);
            let w = wait_for_message(be.as_raw_fd(), stop.as_raw_fd(), Duration::from_secs(5));
            assert_eq!(w.unwrap(), Wait::Ready, "{part:?}");
        }
        // Shutting down only the sending side counts as hanging up too.
        let (mut fe, be) = UnixStream::pair().unwrap();
        fe.write_all(&[1, 0, 0]).unwrap();
        fe.shutdown(std::net::Shutdown::Write).unwrap();
        let w = wait_for_message(be.as_raw_fd(), stop.as_raw_fd(), Duration::from_secs(5));
        assert_eq!(w.unwrap(), Wait::Ready);
    }

    #[test]
    fn unread_replies_are_counted() {
        let (fe, mut be) = UnixStream::pair().unwrap();
        assert_eq!(unread_reply_bytes(be.as_raw_fd()).unwrap(), 0);
        be.write_all(&[0; 1000]).unwrap();
        assert!(unread_reply_bytes(be.as_raw_fd()).unwrap() >= 1000);
        drop(fe);
    }
}
