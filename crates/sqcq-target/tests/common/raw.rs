//! A raw vhost-user client, for hostile-frontend tests only: it sends
//! whatever bytes and descriptors a test asks for (rust-vmm's `Frontend`
//! and sqcq-driver only build valid messages), and reads replies with
//! deadlines. Rings it sets up are laid out as [`super::raw_ring`] does.

// Test code: lengths and indices are small constants of the tests.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Request codes (vhost-user specification).
pub mod code {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const GET_CONFIG: u32 = 24;
    pub const SET_CONFIG: u32 = 25;
    pub const RESET_DEVICE: u32 = 34;
}

/// Header flags: version 1, reply, need reply.
pub const VERSION: u32 = 0x1;
pub const REPLY: u32 = 0x4;
pub const NEED_REPLY: u32 = 0x8;

/// VIRTIO_F_VERSION_1 | VHOST_USER_F_PROTOCOL_FEATURES.
pub const BASE_FEATURES: u64 = (1 << 32) | (1 << 30);
/// Protocol features MQ | REPLY_ACK | CONFIG.
pub const BASE_PROTOCOL: u64 = 1 | (1 << 3) | (1 << 9);

/// A message as received: request code, flags, body.
#[derive(Debug)]
pub struct Msg {
    pub code: u32,
    pub flags: u32,
    pub body: Vec<u8>,
}

impl Msg {
    /// The body as a u64 (replies to GET_* and REPLY_ACK).
    pub fn u64(&self) -> u64 {
        u64::from_le_bytes(self.body[..8].try_into().unwrap())
    }
}

pub struct Raw {
    pub sock: UnixStream,
}

impl Raw {
    pub fn connect(path: &Path) -> Raw {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match UnixStream::connect(path) {
                Ok(sock) => return Raw { sock },
                Err(e) => {
                    assert!(Instant::now() < deadline, "cannot connect: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Sends raw bytes (no descriptors).
    pub fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.sock.write_all(b)
    }

    /// Sends one message with `flags` (VERSION is added) and descriptors.
    pub fn send(&self, code: u32, flags: u32, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(12 + body.len());
        msg.extend_from_slice(&code.to_le_bytes());
        msg.extend_from_slice(&(flags | VERSION).to_le_bytes());
        msg.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        msg.extend_from_slice(body);
        let n = self.sock.send_with_fds(&[&msg[..]], fds)?;
        assert_eq!(n, msg.len(), "short send");
        Ok(())
    }

    /// Sends with NEED_REPLY and returns the reply, or `None` if the
    /// daemon closed the connection or did not answer within 5 s.
    pub fn request(&mut self, code: u32, body: &[u8], fds: &[RawFd]) -> Option<Msg> {
        self.send(code, NEED_REPLY, body, fds).ok()?;
        self.recv(Duration::from_secs(5))
    }

    /// A SET_* with NEED_REPLY: whether the device acknowledged it with
    /// success (0).
    pub fn set(&mut self, code: u32, body: &[u8], fds: &[RawFd]) -> Option<bool> {
        self.request(code, body, fds).map(|m| m.u64() == 0)
    }

    /// Receives one message; `None` on end of file, error or timeout.
    pub fn recv(&mut self, timeout: Duration) -> Option<Msg> {
        self.sock.set_read_timeout(Some(timeout)).ok()?;
        let mut hdr = [0u8; 12];
        self.sock.read_exact(&mut hdr).ok()?;
        let len = u32::from_le_bytes(hdr[8..12].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        self.sock.read_exact(&mut body).ok()?;
        Some(Msg {
            code: u32::from_le_bytes(hdr[0..4].try_into().unwrap()),
            flags: u32::from_le_bytes(hdr[4..8].try_into().unwrap()),
            body,
        })
    }

    /// Whether the daemon closes the connection within `timeout` (reads
    /// and discards whatever comes first).
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            self.sock
                .set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                ))
                .unwrap();
            match self.sock.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut => {}
                Err(_) => return true,
            }
        }
        false
    }

    /// SET_OWNER, features and protocol features (REPLY_ACK on), so that
    /// every later SET_* with NEED_REPLY is acknowledged.
    pub fn negotiate(&mut self, features: u64) {
        self.send(code::SET_OWNER, 0, &[], &[]).unwrap();
        let offered = self.request(code::GET_FEATURES, &[], &[]).unwrap().u64();
        assert_eq!(offered & features, features, "offered {offered:#x}");
        let proto = self
            .request(code::GET_PROTOCOL_FEATURES, &[], &[])
            .unwrap()
            .u64();
        assert_eq!(proto & BASE_PROTOCOL, BASE_PROTOCOL);
        self.send(
            code::SET_PROTOCOL_FEATURES,
            0,
            &BASE_PROTOCOL.to_le_bytes(),
            &[],
        )
        .unwrap();
        assert_eq!(
            self.set(code::SET_FEATURES, &features.to_le_bytes(), &[]),
            Some(true)
        );
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// A negotiated connection with `g` as its memory table.
    pub fn with_memory(path: &Path, g: &super::raw_ring::Guest) -> Raw {
        let mut c = Raw::connect(path);
        c.negotiate(BASE_FEATURES);
        let r = g.region();
        let table = mem_table(0, r.memory_size, r.userspace_addr, 0);
        assert_eq!(
            c.set(code::SET_MEM_TABLE, &table, &[r.mmap_handle]),
            Some(true)
        );
        c
    }

    /// Zeroes the rings of vq `index` (laid out as `Vq::new(index)`) and
    /// sends its size and addresses.
    pub fn ring(&mut self, g: &super::raw_ring::Guest, index: u32) {
        let vq = super::raw_ring::Vq::new(index as usize);
        g.write(vq.desc, &vec![0u8; 0x3000]);
        let size = u32::from(super::QUEUE_SIZE);
        assert_eq!(
            self.set(code::SET_VRING_NUM, &vring_state(index, size), &[]),
            Some(true)
        );
        let addr = vring_addr(index, g.va(vq.desc), g.va(vq.used), g.va(vq.avail));
        assert_eq!(self.set(code::SET_VRING_ADDR, &addr, &[]), Some(true));
    }
}

/// A SET_MEM_TABLE body with one region.
pub fn mem_table(gpa: u64, size: u64, user: u64, offset: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for v in [gpa, size, user, offset] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// A vring state body (index, num).
pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&num.to_le_bytes());
    b
}

/// A SET_VRING_ADDR body.
pub fn vring_addr(index: u32, desc: u64, used: u64, avail: u64) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&0u32.to_le_bytes());
    for v in [desc, used, avail, 0u64] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// The u64 body of SET_VRING_KICK/CALL/ERR for `index` with a descriptor.
pub fn vring_fd(index: u8) -> Vec<u8> {
    u64::from(index).to_le_bytes().to_vec()
}
