//! Driver and device on two threads, waking each other through eventfds
//! only when the suppression handshakes say so. A lost kick or interrupt
//! (a missing fence, a wrong event index) shows up as a wait that times out.

use std::os::fd::AsRawFd;
use std::thread;
use std::time::Duration;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::*;

const REQUESTS: usize = 20_000;
const DEPTH: u16 = 8;
const LOST: Duration = Duration::from_secs(20);

/// Waits for `fd` to be signalled and consumes the signal; panics after
/// `LOST`, which only a lost notification explains.
fn wait(fd: &EventFd, what: &str) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = i32::try_from(LOST.as_millis()).unwrap();
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and the
    // count of 1 matches it.
    let ready = unsafe { libc::poll(&mut pfd, 1, timeout) };
    assert!(ready > 0, "{what} lost (poll returned {ready})");
    fd.read().unwrap();
}

fn device_thread(mut device: Queue, mem: GuestMemoryMmap, kick: EventFd, call: EventFd) {
    let mut done = 0;
    while done < REQUESTS {
        loop {
            while let Some(chain) = device.pop_descriptor_chain(&mem) {
                let head = chain.head_index();
                let written = chain.filter(|d| d.is_write_only()).map(|d| d.len()).sum();
                device.add_used(&mem, head, written).unwrap();
                done += 1;
                if device.needs_notification(&mem).unwrap() {
                    call.write(1).unwrap();
                }
            }
            if !device.enable_notification(&mem).unwrap() {
                break;
            }
        }
        if done < REQUESTS {
            wait(&kick, "kick");
            device.disable_notification(&mem).unwrap();
        }
    }
}

fn run(config: QueueConfig) {
    let mut rig = Rig::new(config);
    let out = rig.buf(16);
    let in_ = rig.buf(512);
    let Rig {
        mem,
        mut driver,
        device,
    } = rig;
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let dev = {
        let (mem, kick, call) = (
            mem.guest_memory().clone(),
            kick.try_clone().unwrap(),
            call.try_clone().unwrap(),
        );
        thread::spawn(move || device_thread(device, mem, kick, call))
    };

    let (mut submitted, mut completed) = (0, 0);
    let (mut kicks, mut waits) = (0, 0);
    while completed < REQUESTS {
        while submitted < REQUESTS && driver.in_flight() < DEPTH {
            driver.add(&[out], &[in_], submitted).unwrap();
            submitted += 1;
        }
        if driver.publish().needs_kick() {
            kick.write(1).unwrap();
            kicks += 1;
        }
        let mut progressed = false;
        while let Some(used) = driver.pop_used() {
            assert_eq!(
                used.unwrap(),
                Used {
                    token: completed,
                    len: 512
                }
            );
            completed += 1;
            progressed = true;
        }
        if !progressed && completed < REQUESTS {
            if driver.enable_interrupts() {
                continue;
            }
            wait(&call, "interrupt");
            waits += 1;
            driver.disable_interrupts();
        }
    }
    dev.join().expect("device thread");
    assert!((1..=REQUESTS).contains(&kicks) && waits <= REQUESTS);
    assert_eq!(driver.in_flight(), 0);
}

#[test]
fn threads_with_event_idx() {
    run(QueueConfig {
        event_idx: true,
        ..QueueConfig::new(16)
    });
}

#[test]
fn threads_with_flags() {
    run(QueueConfig::new(16));
}
