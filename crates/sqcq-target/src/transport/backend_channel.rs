//! The backend channel (VHOST_USER_PROTOCOL_F_BACKEND_REQ): the socket a
//! frontend hands over with SET_BACKEND_REQ_FD, on which the device sends
//! requests of its own. The device sends one: CONFIG_CHANGE_MSG, after a
//! blk disk was resized, so that the frontend reads the configuration
//! space again and raises a configuration-change interrupt in the guest.
//!
//! Written here because rust-vmm's `vhost` 0.18 validates the descriptor
//! and wraps it in a `Backend` that cannot send that message and does not
//! give the socket back. So the control thread keeps its own duplicate:
//! when the next message on the vhost-user socket is SET_BACKEND_REQ_FD,
//! [`peek_backend_fd`] peeks it with a control buffer (a peek receives
//! duplicates of the attached descriptors and leaves the message queued),
//! and the duplicate is adopted only once `vhost` has accepted the
//! message ([`crate::transport::session::Session`]).
//!
//! Sends never block and never wait for a reply (NEED_REPLY is not set):
//! a frontend that does not read its channel loses the notification
//! (counted), it cannot hold the control thread. QEMU answers the message
//! with GET_CONFIG on the main socket, which the control thread serves
//! next.
//!
//! The same `vhost` does not dispatch SET_LOG_FD at all (it would end the
//! connection as an invalid message): [`take_log_fd`] takes that message
//! off the socket first and acknowledges it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use vhost::vhost_user::message::FrontendReq;

use crate::transport::vhost_socket;

/// SET_BACKEND_REQ_FD's request code on the main socket.
const SET_BACKEND_REQ_FD: u32 = FrontendReq::SET_BACKEND_REQ_FD as u32;
/// SET_LOG_FD's request code on the main socket.
const SET_LOG_FD: u32 = FrontendReq::SET_LOG_FD as u32;
/// Header flags: a reply.
const REPLY: u32 = 0x4;
/// Header flags: the frontend wants a reply (REPLY_ACK).
const NEED_REPLY: u32 = 0x8;
/// CONFIG_CHANGE_MSG's request code on the backend channel.
const CONFIG_CHANGE_MSG: u32 = 2;
/// Header flags: protocol version 1, no reply wanted.
const VERSION_1: u32 = 0x1;
/// vhost-user message header: request (u32), flags (u32), size (u32).
const HEADER_LEN: usize = 12;
/// Descriptors one peek takes at most (a valid message carries one; the
/// rest, if a frontend attached more, are closed at once).
const MAX_PEEKED_FDS: usize = 8;

/// The device's end of a frontend's backend channel.
#[derive(Debug)]
pub struct BackendChannel {
    sock: OwnedFd,
}

impl BackendChannel {
    /// Adopts the socket a SET_BACKEND_REQ_FD carried.
    pub fn new(sock: OwnedFd) -> Self {
        BackendChannel { sock }
    }

    /// Sends CONFIG_CHANGE_MSG without waiting: `Ok(false)` if the
    /// frontend's receive buffer is full (it is not reading).
    pub fn config_changed(&self) -> io::Result<bool> {
        let mut msg = [0u8; HEADER_LEN];
        msg[0..4].copy_from_slice(&CONFIG_CHANGE_MSG.to_le_bytes());
        msg[4..8].copy_from_slice(&VERSION_1.to_le_bytes());
        // SAFETY: sends HEADER_LEN bytes from a local buffer on a socket
        // this value owns; MSG_NOSIGNAL turns a closed peer into EPIPE.
        let n = unsafe {
            libc::send(
                self.sock.as_raw_fd(),
                msg.as_ptr().cast(),
                HEADER_LEN,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(false),
                _ => Err(e),
            };
        }
        if usize::try_from(n) != Ok(HEADER_LEN) {
            // A stream socket with room for a few bytes only: the rest
            // would go out as the start of another message. The channel
            // is useless from here on.
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "partial write on the backend channel",
            ));
        }
        Ok(true)
    }
}

/// If the next message queued on the vhost-user socket `sock` is
/// SET_BACKEND_REQ_FD with a descriptor, a duplicate of that descriptor;
/// the message itself stays queued for `vhost`'s handler.
pub fn peek_backend_fd(sock: RawFd) -> io::Result<Option<OwnedFd>> {
    let mut header = [0u8; HEADER_LEN];
    if !matches!(vhost_socket::peek(sock, &mut header), Ok(HEADER_LEN))
        || field(&header, 0) != SET_BACKEND_REQ_FD
    {
        return Ok(None);
    }
    receive_header(sock, &mut header, libc::MSG_PEEK)
}

/// If the next message queued on `sock` is SET_LOG_FD (without a body, as
/// the protocol defines it), takes it off the socket with its first
/// descriptor, and acknowledges it when the frontend asked for a reply;
/// `None` for any other message, which stays queued.
pub fn take_log_fd(sock: RawFd) -> io::Result<Option<Option<OwnedFd>>> {
    let mut header = [0u8; HEADER_LEN];
    if !matches!(vhost_socket::peek(sock, &mut header), Ok(HEADER_LEN))
        || field(&header, 0) != SET_LOG_FD
        || field(&header, 8) != 0
    {
        return Ok(None);
    }
    let fd = receive_header(sock, &mut header, 0)?;
    if field(&header, 4) & NEED_REPLY != 0 {
        let mut reply = [0u8; HEADER_LEN + 8];
        reply[0..4].copy_from_slice(&SET_LOG_FD.to_le_bytes());
        reply[4..8].copy_from_slice(&(VERSION_1 | REPLY).to_le_bytes());
        reply[8..12].copy_from_slice(&8u32.to_le_bytes());
        // A u64 of 0: success. Never blocks (see `BackendChannel`).
        // SAFETY: a live buffer of the length given.
        let n = unsafe {
            libc::send(
                sock,
                reply.as_ptr().cast(),
                reply.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if usize::try_from(n).ok() != Some(reply.len()) {
            return Err(io::Error::other("cannot acknowledge SET_LOG_FD"));
        }
    }
    Ok(Some(fd))
}

/// A little-endian u32 of a message header at `at`.
fn field(header: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
}

/// Receives the header of the next message into `header` (`flags`:
/// `MSG_PEEK` to leave it queued) with its descriptors; returns the first
/// and closes the others.
fn receive_header(
    sock: RawFd,
    header: &mut [u8; HEADER_LEN],
    flags: libc::c_int,
) -> io::Result<Option<OwnedFd>> {
    let mut control = [0u64; cmsg_words()];
    let mut iov = libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: HEADER_LEN,
    };
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: `msg` points at live local buffers of the sizes it states.
    let n = unsafe {
        libc::recvmsg(
            sock,
            &raw mut msg,
            flags | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut first = None;
    // SAFETY: `msg` describes the control buffer the kernel filled.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&raw const msg) };
    while !cmsg.is_null() {
        // SAFETY: a header the libc macros found within the buffer.
        let hdr = unsafe { cmsg.read_unaligned() };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: the data of that header, within the buffer.
            let data = unsafe { libc::CMSG_DATA(cmsg) };
            let len = hdr.cmsg_len.saturating_sub(data.addr() - cmsg.addr());
            for i in 0..len / std::mem::size_of::<RawFd>() {
                let at = data.wrapping_add(i * std::mem::size_of::<RawFd>());
                // SAFETY: the i-th descriptor of the header's data.
                let raw = unsafe { at.cast::<RawFd>().read_unaligned() };
                // SAFETY: every received descriptor is new and ours: the
                // first is kept, the others are closed here.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                if first.is_none() {
                    first = Some(fd);
                }
            }
        }
        // SAFETY: the next header after `cmsg`, or null.
        cmsg = unsafe { libc::CMSG_NXTHDR(&raw const msg, cmsg) };
    }
    Ok(first)
}

/// 8-byte words of a control buffer with room for [`MAX_PEEKED_FDS`].
const fn cmsg_words() -> usize {
    // CMSG_SPACE is not const in libc: header (16) + data, rounded up.
    (16 + MAX_PEEKED_FDS * std::mem::size_of::<RawFd>()).div_ceil(8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;

    /// Sends a message with `fds` attached on `sock`.
    fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) {
        assert_eq!(sock.send_with_fds(&[bytes], fds).unwrap(), bytes.len());
    }

    fn header(code: u32) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&code.to_le_bytes());
        h[4..8].copy_from_slice(&VERSION_1.to_le_bytes());
        h
    }

    #[test]
    fn a_peeked_backend_fd_is_a_working_duplicate_and_the_message_stays_queued() {
        let (front, back) = UnixStream::pair().unwrap();
        let (channel_front, channel_back) = UnixStream::pair().unwrap();
        send_with_fds(
            &front,
            &header(SET_BACKEND_REQ_FD),
            &[channel_back.as_raw_fd()],
        );
        drop(channel_back);
        let dup = peek_backend_fd(back.as_raw_fd())
            .unwrap()
            .expect("a descriptor");
        // The message is still there for the real handler.
        let mut h = [0u8; HEADER_LEN];
        (&back).read_exact(&mut h).unwrap();
        assert_eq!(h, header(SET_BACKEND_REQ_FD));
        // The duplicate reaches the frontend's end of the channel.
        assert!(BackendChannel::new(dup).config_changed().unwrap());
        let mut got = [0u8; HEADER_LEN];
        (&channel_front).read_exact(&mut got).unwrap();
        assert_eq!(got, header(CONFIG_CHANGE_MSG));
    }

    #[test]
    fn other_messages_and_missing_descriptors_give_nothing() {
        let (front, back) = UnixStream::pair().unwrap();
        assert!(peek_backend_fd(back.as_raw_fd()).unwrap().is_none());
        let (a, _b) = UnixStream::pair().unwrap();
        // SET_MEM_TABLE (5) with a descriptor: not peeked.
        send_with_fds(&front, &header(5), &[a.as_raw_fd()]);
        assert!(peek_backend_fd(back.as_raw_fd()).unwrap().is_none());
        let mut h = [0u8; HEADER_LEN];
        (&back).read_exact(&mut h).unwrap();
        // SET_BACKEND_REQ_FD without one.
        send_with_fds(&front, &header(SET_BACKEND_REQ_FD), &[]);
        assert!(peek_backend_fd(back.as_raw_fd()).unwrap().is_none());
    }

    #[test]
    fn a_full_channel_loses_the_notification_without_blocking() {
        let (front, back) = UnixStream::pair().unwrap();
        let channel = BackendChannel::new(OwnedFd::from(back));
        let mut sent = 0;
        while channel.config_changed().unwrap() {
            sent += 1;
            assert!(sent < 1 << 20, "the socket buffer never filled");
        }
        drop(front);
        assert!(
            channel.config_changed().is_err(),
            "a closed peer is an error"
        );
    }
}
