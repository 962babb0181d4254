//! The hostile-frontend suite: the real `sqcqd` binary, two devices on one
//! shared worker, and on device A a frontend that does what rust-vmm's
//! frontend never would (a raw vhost-user client for bad messages; bad
//! descriptors and memory through the normal frontend). Every case then
//! checks that
//!
//! - the daemon is alive,
//! - device B, on the same worker, still completes verified I/O,
//! - the daemon's CPU use is back to idle,
//! - a fresh frontend on device A works (once the hostile one is gone),
//! - SIGTERM ends the daemon in time, with exit status 0.
//!
//! Each class of `docs/target.md` ("Hostile frontends") has a case here.

// Test code: lengths and indices are small constants of the test.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::raw::{self, Raw, code};
use common::raw_ring::*;
use common::*;
use vhost::VhostBackend;
use vhost::vhost_user::Frontend;
use vmm_sys_util::eventfd::EventFd;

/// SHUTDOWN_GRACE + the margin of `sqcqd`'s main, plus slack for a busy
/// machine.
const SIGTERM_BOUND: Duration = Duration::from_secs(17);
/// Clock ticks (1/100 s) the daemon may use in a second once idle.
const IDLE_TICKS: u64 = 20;

/// A running `sqcqd` with devices A and B on one worker, and a healthy
/// frontend on B.
struct Harness {
    dir: TempDir,
    child: Child,
    a: PathBuf,
    admin: PathBuf,
    log: PathBuf,
    healthy: Healthy,
}

struct Healthy {
    g: Guest,
    qs: Vec<Vq>,
    _fe: Frontend,
    round: u32,
}

impl Healthy {
    /// Writes a pattern through one queue of device B and reads it back
    /// through the other.
    fn verify(&mut self) {
        self.round += 1;
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + self.round) as u8).collect();
        let lba = self.round % 64 * 8;
        let (w, r) = self.qs.split_at_mut(3);
        let (w, r) = (&mut w[2], &mut r[0]);
        let (resp, _) = command(
            w,
            &mut self.g,
            lun_field(0, 0),
            &write10(lba, 8),
            &pattern,
            0,
        );
        assert_eq!(
            (resp.response, resp.status),
            (0, 0),
            "device B WRITE: {resp:?}"
        );
        let (resp, data) = command(r, &mut self.g, lun_field(0, 0), &read10(lba, 8), &[], 4096);
        assert_eq!(
            (resp.response, resp.status),
            (0, 0),
            "device B READ: {resp:?}"
        );
        assert_eq!(data, pattern, "device B read back other data");
    }
}

impl Harness {
    fn start(name: &str, extra: &[&str]) -> Harness {
        let dir = TempDir::new(&format!("hostile-{name}"));
        let (a, b, admin) = (
            dir.path("a.sock"),
            dir.path("b.sock"),
            dir.path("admin.sock"),
        );
        let config = dir.path("sqcqd.toml");
        std::fs::write(
            &config,
            format!(
                "workers = 1\nadmin-socket = {admin:?}\n\
                 [[device]]\nsocket-path = {a:?}\nnum-queues = 2\nqueue-size = {QUEUE_SIZE}\n\
                 [[device.lun]]\nkind = \"ram\"\nsize = \"8M\"\n\
                 [[device]]\nsocket-path = {b:?}\nnum-queues = 2\nqueue-size = {QUEUE_SIZE}\n\
                 [[device.lun]]\nkind = \"ram\"\nsize = \"8M\"\n"
            ),
        )
        .unwrap();
        let log = dir.path("sqcqd.log");
        let child = Command::new(env!("CARGO_BIN_EXE_sqcqd"))
            .arg("--config")
            .arg(&config)
            .args(["--stats-interval", "0"])
            // The strictest filter: a system call the daemon was not
            // expected to make kills it, and the case fails.
            .args(["--seccomp", "kill"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let g = Guest::new();
        let mut qs = vqs();
        let fe = connect(&b, &g, &mut qs, true);
        // Applied right after start-up: wait for it, not for long.
        let status = format!("/proc/{}/status", child.id());
        let deadline = Instant::now() + WAIT;
        while !std::fs::read_to_string(&status)
            .unwrap()
            .contains("Seccomp:\t2")
        {
            assert!(
                Instant::now() < deadline,
                "the seccomp filter is not applied"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut healthy = Healthy {
            g,
            qs,
            _fe: fe,
            round: 0,
        };
        clear_unit_attention(&mut healthy.qs[2], &mut healthy.g, 0);
        clear_unit_attention(&mut healthy.qs[3], &mut healthy.g, 0);
        healthy.verify();
        Harness {
            dir,
            child,
            a,
            admin,
            log,
            healthy,
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// utime + stime of the daemon, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        // Fields after the command name (which may contain spaces).
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    /// The daemon lives, device B works, and the daemon is idle.
    fn check_alive_and_idle(&mut self, case: &str) {
        assert!(
            self.alive(),
            "{case}: the daemon died; log:\n{}",
            self.log_text()
        );
        self.healthy.verify();
        // Let the daemon settle (a connection being dropped), then measure.
        std::thread::sleep(Duration::from_millis(200));
        let before = self.cpu_ticks();
        std::thread::sleep(Duration::from_secs(1));
        let used = self.cpu_ticks() - before;
        assert!(used <= IDLE_TICKS, "{case}: {used} ticks in 1 s: not idle");
    }

    /// A new, well-behaved frontend on device A completes an INQUIRY.
    fn check_fresh_frontend(&mut self, case: &str) {
        let mut g = Guest::new();
        let mut qs = vqs();
        let _fe = connect(&self.a, &g, &mut qs, true);
        clear_unit_attention(&mut qs[2], &mut g, 0);
        let (r, data) = command(&mut qs[2], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
        assert_eq!(
            (r.response, r.status),
            (0, 0),
            "{case}: fresh frontend: {r:?}"
        );
        assert_eq!(&data[8..12], b"SQCQ");
    }

    /// Every check of a case, the hostile connection being gone.
    fn check(&mut self, case: &str) {
        self.check_alive_and_idle(case);
        self.check_fresh_frontend(case);
        assert!(self.alive(), "{case}: died after the fresh frontend");
    }

    /// SIGTERM; the daemon must exit 0 within the documented bound.
    fn stop(mut self) {
        // SAFETY: kill() with a valid pid and signal number.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
        let deadline = Instant::now() + SIGTERM_BOUND;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "no exit within {SIGTERM_BOUND:?} of SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "exit status {status:?}; log:\n{}",
            self.log_text()
        );
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's statistics (`stats_get`).
    fn stats(&self) -> serde_json::Value {
        rpc(&self.admin, "stats_get", serde_json::json!({})).unwrap()
    }

    /// Error counter `name` of device `device`, from `stats_get`.
    fn counter(&self, device: u32, name: &str) -> u64 {
        let s = self.stats();
        let d = device.to_string();
        s["errors"][&d][name]
            .as_u64()
            .or_else(|| s["events"][&d][name].as_u64())
            .unwrap_or_else(|| panic!("no {name} in {s}"))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = &self.dir;
    }
}

fn memfd(len: u64) -> std::fs::File {
    // SAFETY: a valid NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"hostile".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a new descriptor owned by nobody else.
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len(len).unwrap();
    f
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: two new descriptors owned by nobody else.
    let r = unsafe { OwnedFd::from_raw_fd(fds[0]) };
    // SAFETY: as above.
    let w = unsafe { OwnedFd::from_raw_fd(fds[1]) };
    (r, w)
}

/// A blocking eventfd.
fn blocking_eventfd() -> EventFd {
    EventFd::new(0).unwrap()
}

fn clear_nonblock(fd: RawFd) {
    // SAFETY: F_SETFL with an int argument.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, 0) }, 0);
}

/// A raw frontend with memory and one request queue (vq 2) set up, the
/// queue's descriptors given by the caller.
fn raw_queue(path: &std::path::Path, g: &Guest, kick: RawFd, call: RawFd) -> Raw {
    let mut c = Raw::with_memory(path, g);
    c.ring(g, 2);
    assert_eq!(
        c.set(code::SET_VRING_BASE, &raw::vring_state(2, 0), &[]),
        Some(true)
    );
    assert_eq!(
        c.set(code::SET_VRING_CALL, &raw::vring_fd(2), &[call]),
        Some(true)
    );
    assert_eq!(
        c.set(code::SET_VRING_KICK, &raw::vring_fd(2), &[kick]),
        Some(true)
    );
    assert_eq!(
        c.set(code::SET_VRING_ENABLE, &raw::vring_state(2, 1), &[]),
        Some(true)
    );
    c
}

// ---------------------------------------------------------------- memory

#[test]
fn memory_regions_the_file_does_not_cover_are_refused() {
    let mut h = Harness::start("mem-eof", &[]);
    let mut c = Raw::connect(&h.a);
    c.negotiate(raw::BASE_FEATURES);
    let f = memfd(1 << 20);
    // Larger than the file, then at an offset past its end, then a pipe.
    let too_big = raw::mem_table(0, 2 << 20, 0x7000_0000_0000, 0);
    assert_eq!(
        c.set(code::SET_MEM_TABLE, &too_big, &[f.as_raw_fd()]),
        Some(false)
    );
    let past = raw::mem_table(0, 1 << 20, 0x7000_0000_0000, 1 << 20);
    assert_eq!(
        c.set(code::SET_MEM_TABLE, &past, &[f.as_raw_fd()]),
        Some(false)
    );
    let (r, _w) = pipe();
    let fits = raw::mem_table(0, 1 << 20, 0x7000_0000_0000, 0);
    assert_eq!(
        c.set(code::SET_MEM_TABLE, &fits, &[r.as_raw_fd()]),
        Some(false)
    );
    // The same region on the memfd is fine.
    assert_eq!(
        c.set(code::SET_MEM_TABLE, &fits, &[f.as_raw_fd()]),
        Some(true)
    );
    drop(c);
    h.check("memory past EOF");
    h.stop();
}

/// Shrinks guest memory under a running queue so that the device's next
/// access to vq 3 faults; `extra` are daemon options.
fn shrink_under_running_queue(name: &str, extra: &[&str], features: u64) {
    let mut h = Harness::start(name, extra);
    let mut g = Guest::new();
    let mut qs = vqs();
    let fe = connect_with(&h.a, &g, &mut qs, true, features);
    clear_unit_attention(&mut qs[3], &mut g, 0);
    // vq 3's rings start at 0xc000: cut there, so the device faults on
    // vq 3 while this process keeps the pages of vq 0-2.
    let vq = &mut qs[3];
    let _pending = submit(vq, &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    g.truncate(vq.desc);
    // Kick without touching the lost pages (the doorbell and avail index
    // are there too): the kick wakes a sleeping poller as well.
    vq.kick.write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.counter(0, "memory_faults") == 0 {
        assert!(
            Instant::now() < deadline,
            "no memory fault recorded; log:\n{}",
            h.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The device dropped this frontend's connection.
    let deadline = Instant::now() + Duration::from_secs(10);
    while fe.get_features().is_ok() {
        assert!(Instant::now() < deadline, "the connection was not dropped");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(fe);
    assert!(h.log_text().contains("guest memory lost its backing"));
    h.check(name);
    h.stop();
}

#[test]
fn shrinking_memory_under_a_kicked_queue_costs_only_that_connection() {
    shrink_under_running_queue("shrink-kick", &[], 0);
}

#[test]
fn shrinking_memory_under_a_polled_queue_costs_only_that_connection() {
    shrink_under_running_queue("shrink-poll", &[], SQCQ);
}

#[test]
fn shrinking_memory_under_ring_polling_costs_only_that_connection() {
    shrink_under_running_queue("shrink-ring", &["--poll", "ring"], 0);
}

// ------------------------------------------------------------ descriptors

#[test]
fn kick_call_and_error_descriptors_that_are_not_eventfds_are_refused() {
    let mut h = Harness::start("fd-kind", &[]);
    let mut c = Raw::connect(&h.a);
    c.negotiate(raw::BASE_FEATURES);
    // A pipe whose write end is closed: readable (EPOLLHUP) forever.
    let (r, w) = pipe();
    drop(w);
    let f = memfd(4096);
    for req in [
        code::SET_VRING_KICK,
        code::SET_VRING_CALL,
        code::SET_VRING_ERR,
    ] {
        for vq in [0u8, 2] {
            assert_eq!(
                c.set(req, &raw::vring_fd(vq), &[r.as_raw_fd()]),
                Some(false)
            );
            assert_eq!(
                c.set(req, &raw::vring_fd(vq), &[f.as_raw_fd()]),
                Some(false)
            );
        }
    }
    drop(c);
    h.check("descriptor kinds");
    h.stop();
}

#[test]
fn a_saturated_call_descriptor_coalesces_and_a_blocking_one_is_cut_off() {
    let mut h = Harness::start("call-full", &[]);
    let mut g = Guest::new();
    let mut qs = vqs();
    // Blocking call eventfds, as a frontend may hand over.
    qs[2].call = blocking_eventfd();
    qs[3].call = blocking_eventfd();
    let _fe = connect(&h.a, &g, &mut qs, false);
    clear_unit_attention(&mut qs[2], &mut g, 0);
    clear_unit_attention(&mut qs[3], &mut g, 0);
    // The frontend leaves vq 2's counter one below its maximum: each call
    // is merged into the pending notification and I/O goes on.
    let _ = qs[2].call.read();
    qs[2].call.write(0xffff_ffff_ffff_fffe).unwrap();
    for _ in 0..32 {
        let (r, _) = command(&mut qs[2], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
        assert_eq!((r.response, r.status), (0, 0));
    }
    assert!(h.counter(0, "calls_coalesced") > 0, "{}", h.stats());
    h.healthy.verify();
    // On vq 3 it also makes the shared file description blocking again:
    // the write of the next call would block the worker for good. The
    // completion is published first; the stall guard interrupts the
    // write after a second and the queue is stopped.
    let _ = qs[3].call.read();
    qs[3].call.write(0xffff_ffff_ffff_fffe).unwrap();
    clear_nonblock(qs[3].call.as_raw_fd());
    let (r, _) = command(&mut qs[3], &mut g, lun_field(0, 0), &inquiry(36), &[], 36);
    assert_eq!((r.response, r.status), (0, 0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.counter(0, "stalled_writes") == 0 {
        assert!(Instant::now() < deadline, "no stalled write; {}", h.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    // The worker counts the stalled write, then breaks the ring.
    while h.counter(0, "broken_rings") == 0 {
        assert!(Instant::now() < deadline, "ring not broken; {}", h.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    h.healthy.verify();
    drop(_fe);
    h.check("saturated call fd");
    h.stop();
}

#[test]
fn a_kick_descriptor_drained_by_the_frontend_never_blocks_the_worker() {
    let mut h = Harness::start("kick-drain", &[]);
    let g = Guest::new();
    let kick = blocking_eventfd();
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let c = raw_queue(&h.a, &g, kick.as_raw_fd(), call.as_raw_fd());
    // The daemon made the kick descriptor non-blocking; make it blocking
    // again, then kick and take the count back at once, many times, so
    // that the daemon often finds it empty after epoll said readable.
    clear_nonblock(kick.as_raw_fd());
    for i in 0..20_000 {
        kick.write(1).unwrap();
        let mut pfd = libc::pollfd {
            fd: kick.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&raw mut pfd, 1, 0) } == 1 {
            // Not `read`: the daemon may have taken the count meanwhile,
            // and this test must not block either.
            let mut v = 0u64;
            let mut iov = libc::iovec {
                iov_base: (&raw mut v).cast(),
                iov_len: 8,
            };
            // SAFETY: one iovec over a local u64.
            unsafe { libc::preadv2(kick.as_raw_fd(), &raw mut iov, 1, -1, libc::RWF_NOWAIT) };
        }
        if i % 5000 == 0 {
            h.healthy.verify();
        }
    }
    h.healthy.verify();
    drop(c);
    h.check("drained kick fd");
    h.stop();
}

#[test]
fn blocking_control_queue_descriptors_never_block_the_control_thread() {
    let mut h = Harness::start("ctrl-fds", &[]);
    let g = Guest::new();
    let mut c = Raw::with_memory(&h.a, &g);
    c.ring(&g, 0);
    // Blocking call at its maximum, blocking kick with a count of zero:
    // the control queue starts (and is served once) at SET_VRING_KICK.
    let call = blocking_eventfd();
    call.write(0xffff_ffff_ffff_fffe).unwrap();
    let kick = blocking_eventfd();
    assert_eq!(
        c.set(code::SET_VRING_CALL, &raw::vring_fd(0), &[call.as_raw_fd()]),
        Some(true)
    );
    assert_eq!(
        c.set(code::SET_VRING_KICK, &raw::vring_fd(0), &[kick.as_raw_fd()]),
        Some(true)
    );
    clear_nonblock(call.as_raw_fd());
    clear_nonblock(kick.as_raw_fd());
    assert_eq!(
        c.set(code::SET_VRING_ENABLE, &raw::vring_state(0, 1), &[]),
        Some(true)
    );
    // The control thread still answers.
    assert!(c.request(code::GET_FEATURES, &[], &[]).is_some());
    h.check_alive_and_idle("control queue fds");
    drop(c);
    h.check("control queue fds");
    h.stop();
}

// ---------------------------------------------------------- control thread

#[test]
fn a_message_whose_body_never_comes_is_dropped_and_does_not_hold_sigterm() {
    let mut h = Harness::start("partial", &[]);
    let mut c = Raw::connect(&h.a);
    c.negotiate(raw::BASE_FEATURES);
    // SET_VRING_ADDR announces 40 bytes; 10 come.
    let mut msg = code::SET_VRING_ADDR.to_le_bytes().to_vec();
    msg.extend_from_slice(&raw::VERSION.to_le_bytes());
    msg.extend_from_slice(&40u32.to_le_bytes());
    msg.extend_from_slice(&[0; 10]);
    c.bytes(&msg).unwrap();
    h.check_alive_and_idle("partial message");
    assert!(c.closed_within(Duration::from_secs(10)), "still connected");
    assert!(h.counter(0, "dropped_connections") >= 1);
    drop(c);
    h.check("partial message");
    h.stop();
}

#[test]
fn frontends_that_hang_up_mid_message_do_not_hold_the_next_one() {
    let mut h = Harness::start("hangup", &[]);
    // 20 frontends in a row each send a header announcing 40 bytes of body
    // and 10 of them, then close. Each connection must end at its end of
    // file: waiting out the 5 s message deadline instead would keep the
    // next frontend in the listen backlog for 20 x 5 s.
    let mut msg = code::SET_VRING_ADDR.to_le_bytes().to_vec();
    msg.extend_from_slice(&raw::VERSION.to_le_bytes());
    msg.extend_from_slice(&40u32.to_le_bytes());
    msg.extend_from_slice(&[0; 10]);
    for _ in 0..20 {
        let mut c = Raw::connect(&h.a);
        c.bytes(&msg).unwrap();
    }
    // A hang guard far below those 100 s, far above what the 20 cost.
    let mut c = Raw::connect(&h.a);
    c.send(code::GET_FEATURES, 0, &[], &[]).unwrap();
    let reply = c.recv(Duration::from_secs(20));
    assert!(
        reply.is_some_and(|m| m.code == code::GET_FEATURES),
        "the fresh frontend's GET_FEATURES went unanswered; log:\n{}",
        h.log_text()
    );
    drop(c);
    h.check("hang-ups mid-message");
    h.stop();
}

#[test]
fn a_frontend_that_never_reads_replies_is_dropped() {
    let mut h = Harness::start("no-read", &[]);
    let c = Raw::connect(&h.a);
    c.send(code::SET_OWNER, 0, &[], &[]).unwrap();
    c.sock.set_nonblocking(true).unwrap();
    // GET_QUEUE_NUM replies 20 bytes each: a few MiB of replies nobody
    // reads. Sending stops when the daemon stops reading.
    let mut msg = code::GET_QUEUE_NUM.to_le_bytes().to_vec();
    msg.extend_from_slice(&raw::VERSION.to_le_bytes());
    msg.extend_from_slice(&0u32.to_le_bytes());
    let burst: Vec<u8> = msg.iter().copied().cycle().take(msg.len() * 1000).collect();
    let mut sock = &c.sock;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0usize;
    while Instant::now() < deadline && sent < 200 * burst.len() {
        match sock.write(&burst) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => break,
        }
    }
    h.check_alive_and_idle("unread replies");
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.counter(0, "dropped_connections") == 0 {
        assert!(
            Instant::now() < deadline,
            "not dropped; log:\n{}",
            h.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(c);
    h.check("unread replies");
    h.stop();
}

#[test]
fn sigterm_ends_the_daemon_in_time_whatever_a_frontend_is_doing() {
    let h = Harness::start("sigterm", &[]);
    // A partial message, a frontend that stopped reading, and a pile of
    // connections waiting in the backlog.
    let mut partial = Raw::connect(&h.a);
    partial.bytes(&[3, 0, 0, 0, 1, 0]).unwrap();
    let _backlog: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&h.a).unwrap())
        .collect();
    let started = Instant::now();
    h.stop();
    eprintln!("sqcqd exited {:?} after SIGTERM", started.elapsed());
}

#[test]
fn garbage_bad_sizes_and_unknown_codes_are_refused() {
    let mut h = Harness::start("garbage", &[]);
    // Pure noise: the daemon drops the connection.
    let mut c = Raw::connect(&h.a);
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let _ = c.bytes(&noise);
    assert!(c.closed_within(Duration::from_secs(10)));
    // Every request code with bodies of the wrong size, and codes past the
    // last known one; then a well-formed request still gets its answer
    // unless the connection was dropped for too many failures.
    for size in [0usize, 1, 7, 9, 39, 4096] {
        let mut c = Raw::connect(&h.a);
        for req in 0..70u32 {
            if c.send(req, raw::NEED_REPLY, &vec![0xa5; size], &[])
                .is_err()
            {
                break;
            }
        }
        assert!(c.closed_within(Duration::from_secs(10)));
    }
    // A header announcing a body above the protocol's maximum.
    let mut c = Raw::connect(&h.a);
    let mut msg = code::GET_FEATURES.to_le_bytes().to_vec();
    msg.extend_from_slice(&raw::VERSION.to_le_bytes());
    msg.extend_from_slice(&0x0100_0000u32.to_le_bytes());
    c.bytes(&msg).unwrap();
    assert!(c.closed_within(Duration::from_secs(10)));
    h.check("garbage");
    h.stop();
}

// --------------------------------------------------------------- vrings

#[test]
fn nonsense_vring_numbers_addresses_and_indices_are_refused() {
    let mut h = Harness::start("vrings", &[]);
    let g = Guest::new();
    let mut c = Raw::with_memory(&h.a, &g);
    let r = g.region();
    for (index, num) in [
        (2, 0),
        (2, 3),
        (2, 65536),
        (2, 4096),
        (300, 64),
        (u32::MAX, 64),
    ] {
        assert_eq!(
            c.set(code::SET_VRING_NUM, &raw::vring_state(index, num), &[]),
            Some(false),
            "num {index} {num}"
        );
    }
    // Addresses outside every region, and an index out of range.
    let outside = raw::vring_addr(2, 0x10, 0x20, 0x30);
    assert_eq!(c.set(code::SET_VRING_ADDR, &outside, &[]), Some(false));
    let bad_index = raw::vring_addr(9999, g.va(0), g.va(0x2000), g.va(0x1000));
    assert_eq!(c.set(code::SET_VRING_ADDR, &bad_index, &[]), Some(false));
    for base in [65536, u32::MAX] {
        assert_eq!(
            c.set(code::SET_VRING_BASE, &raw::vring_state(2, base), &[]),
            Some(false)
        );
    }
    // GET_VRING_BASE of a ring that never ran answers; out of range not.
    assert!(
        c.request(code::GET_VRING_BASE, &raw::vring_state(2, 0), &[])
            .is_some()
    );
    assert_eq!(
        c.set(code::SET_VRING_ENABLE, &raw::vring_state(4000, 1), &[]),
        Some(false)
    );
    // A ring whose avail ring ends past guest memory: accepted as
    // addresses, refused when it starts (the queue does not run).
    let top = r.memory_size - 8;
    assert_eq!(
        c.set(code::SET_VRING_NUM, &raw::vring_state(2, 64), &[]),
        Some(true)
    );
    let edge = raw::vring_addr(2, g.va(0), g.va(0x2000), g.va(top));
    assert_eq!(c.set(code::SET_VRING_ADDR, &edge, &[]), Some(true));
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    assert_eq!(
        c.set(code::SET_VRING_KICK, &raw::vring_fd(2), &[kick.as_raw_fd()]),
        Some(true)
    );
    assert_eq!(
        c.set(code::SET_VRING_ENABLE, &raw::vring_state(2, 1), &[]),
        Some(true)
    );
    kick.write(1).unwrap();
    assert!(
        c.request(code::GET_FEATURES, &[], &[]).is_some(),
        "still served"
    );
    drop(c);
    h.check("vrings");
    h.stop();
}

#[test]
fn corrupt_chains_and_doorbells_stop_one_queue_only() {
    let mut h = Harness::start("chains", &[]);
    let mut g = Guest::new();
    let mut qs = vqs();
    let fe = connect_with(&h.a, &g, &mut qs, true, SQCQ);
    clear_unit_attention(&mut qs[2], &mut g, 0);
    // A descriptor loop, then an SQ doorbell index a ring size ahead.
    let vq = &mut qs[2];
    let a = vq.reserve(2);
    vq.write_desc(&g, a, DATA_START, REQ_LEN, NEXT, a + 1);
    vq.write_desc(&g, a + 1, DATA_START, REQ_LEN, NEXT, a);
    vq.push_head(&g, a);
    vq.publish_sq(&g);
    assert_eq!(vq.wait_used(&g), (a, 0));
    let next = vq.next_avail.wrapping_add(QUEUE_SIZE + 7);
    vq.write_sq_idx(&g, next);
    vq.kick.write(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.counter(0, "broken_rings") == 0 {
        assert!(
            Instant::now() < deadline,
            "queue not stopped; log:\n{}",
            h.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(fe);
    h.check("chains and doorbells");
    h.stop();
}

// ------------------------------------------------------ churn and admin

#[test]
fn connection_churn_leaks_nothing() {
    let mut h = Harness::start("churn", &[]);
    let fds_before = h.open_fds();
    for i in 0..60 {
        let mut g = Guest::new();
        let mut qs = vqs();
        match i % 3 {
            // Disconnect mid-setup.
            0 => drop(Raw::with_memory(&h.a, &g)),
            // With queues running and I/O in flight.
            1 => {
                let _fe = connect(&h.a, &g, &mut qs, true);
                let _ = submit(
                    &mut qs[2],
                    &mut g,
                    lun_field(0, 0),
                    &read10(0, 8),
                    &[],
                    4096,
                );
                qs[2].kick(&g);
            }
            // Connect and close at once.
            _ => drop(UnixStream::connect(&h.a).unwrap()),
        }
    }
    h.check("churn");
    // Every connection's descriptors and mappings are gone once it ended.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.open_fds() > fds_before + 2 {
        assert!(
            Instant::now() < deadline,
            "{} fds before, {} after",
            fds_before,
            h.open_fds()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    h.stop();
}

#[test]
fn admin_socket_garbage_is_answered_and_survived() {
    let mut h = Harness::start("admin", &[]);
    // Each line gets a JSON-RPC error with a null id (blank lines no
    // answer): not JSON (binary, a text command of earlier versions) is
    // a parse error, JSON that is not a request an invalid request, a
    // change to a device that does not exist "not found".
    for (junk, expected) in [
        (&b"\x00\x01\x02\xff\n"[..], Some(-32700)),
        (b"lun add device=9 lun=1 kind=ram,size=1M\n", Some(-32700)),
        (b"stats stats\n", Some(-32700)),
        (b"42\n", Some(-32600)),
        (
            b"{\"jsonrpc\":\"2.0\",\"method\":\"lun_add\",\"params\":{\"device\":9,\"lun\":1,\"kind\":\"ram\",\"size\":\"1M\"},\"id\":null}\n",
            Some(-32001),
        ),
        (b"\n\n\n", None),
    ] {
        let mut s = UnixStream::connect(&h.admin).unwrap();
        s.write_all(junk).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let got = (!reply.is_empty()).then(|| {
            let v: serde_json::Value = serde_json::from_str(&reply)
                .unwrap_or_else(|e| panic!("{junk:?} -> {reply:?}: {e}"));
            assert!(v["id"].is_null(), "{junk:?} -> {reply}");
            error_code(&v["error"])
        });
        assert_eq!(got, expected, "{junk:?} -> {reply}");
    }
    // A line longer than the limit, and a client that sends half a line
    // and goes quiet while another one waits.
    let mut long = UnixStream::connect(&h.admin).unwrap();
    long.write_all(&vec![b'x'; 100_000]).unwrap_or(());
    let mut reply = String::new();
    let _ = long.read_to_string(&mut reply);
    let v: serde_json::Value =
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{reply}: {e}"));
    assert_eq!(error_code(&v["error"]), -32600, "{reply}");
    let mut quiet = UnixStream::connect(&h.admin).unwrap();
    quiet.write_all(b"{\"jsonrpc\"").unwrap();
    rpc(&h.admin, "daemon_info", serde_json::json!({})).unwrap();
    drop(quiet);
    h.check("admin garbage");
    h.stop();
}

#[test]
fn guest_triggered_control_queue_warnings_are_rate_limited() {
    let mut h = Harness::start("log-flood", &[]);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&h.a, &g, &mut qs, true);
    let started = Instant::now();
    // 2000 control requests of an unknown type, then one more in a later
    // second: its warning reports how many were suppressed.
    let ctrl = &mut qs[0];
    for i in 0..2001 {
        if i == 2000 {
            std::thread::sleep(Duration::from_millis(1100));
        }
        let req = g.alloc(4);
        g.write(req, &0xdead_u32.to_le_bytes());
        let resp = g.alloc(1);
        ctrl.add(&g, &[(req, 4, false), (resp, 1, true)]);
        ctrl.kick(&g);
        ctrl.wait_used(&g);
    }
    // Then a control ring whose avail index runs ahead, kicked 2000
    // times: every pass finds it corrupt.
    ctrl.next_avail = ctrl.next_avail.wrapping_add(QUEUE_SIZE + 1);
    for _ in 0..2000 {
        ctrl.kick(&g);
        std::thread::sleep(Duration::from_micros(100));
    }
    assert!(h.alive());
    // Request queues still answer (an unknown target: BAD_TARGET).
    clear_unit_attention(&mut qs[2], &mut g, 0);
    let (r, _) = command(
        &mut qs[2],
        &mut g,
        lun_field(1, 0),
        &TEST_UNIT_READY,
        &[],
        0,
    );
    assert_eq!(r.response, 3, "BAD_TARGET");
    let secs = started.elapsed().as_secs() + 2;
    let lines = h
        .log_text()
        .lines()
        .filter(|l| l.contains("unknown control request") || l.contains("control queue:"))
        .count() as u64;
    assert!(lines <= 10 * secs, "{lines} warnings in about {secs} s");
    assert!(
        h.log_text().contains("suppressed"),
        "suppression is reported"
    );
    drop(_fe);
    h.check("log flood");
    h.stop();
}
