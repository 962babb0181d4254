//! Events: what happened to the daemon's devices, for the admin socket's
//! clients that subscribed (`events_subscribe`), as JSON-RPC
//! notifications, as QMP events are for a QEMU or qemu-storage-daemon
//! client.
//!
//! Anything that sees an event (a device's control thread, a worker, the
//! registry) publishes it on the daemon's [`EventBus`]; each
//! [`Subscription`] holds the notifications not yet sent in a queue of at
//! most [`QUEUE_LEN`]. A client that does not read loses the oldest, and
//! the next notification it gets says how many (`lost`): memory stays
//! bounded whoever subscribes, and a publisher never waits for a client.
//!
//! Without a subscriber, publishing is one relaxed load: events cost the
//! request path nothing, and the only event it publishes (an I/O error)
//! is rare. With subscribers, an event is written to JSON once, and
//! queued under a lock held for the copy only.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use vmm_sys_util::eventfd::EventFd;

/// Notifications held for one subscriber at most; older ones are dropped.
pub const QUEUE_LEN: usize = 1024;

/// The JSON-RPC method name of every notification.
pub const METHOD: &str = "event";

/// Something that happened, for subscribers. Devices are numbered as in
/// `device_list`; `vq` is a virtqueue index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A device was created (by the API, or a reload).
    DeviceCreated {
        /// The device.
        device: u32,
    },
    /// A device was deleted; its socket is gone.
    DeviceDeleted {
        /// The device.
        device: u32,
    },
    /// A frontend (a VM's QEMU) connected to a device's socket.
    FrontendConnected {
        /// The device.
        device: u32,
    },
    /// The frontend's connection ended (the VM stopped or crashed, or was
    /// migrated, or the device was deleted).
    FrontendDisconnected {
        /// The device.
        device: u32,
    },
    /// A request queue started on a worker.
    QueueStarted {
        /// The device.
        device: u32,
        /// The queue.
        vq: u16,
        /// How it learns of requests (as `stats_get` says it).
        mode: &'static str,
    },
    /// A request queue stopped (the frontend stopped it, or it moved to
    /// another worker, or the device or daemon is going).
    QueueStopped {
        /// The device.
        device: u32,
        /// The queue.
        vq: u16,
        /// Requests it served while it ran.
        requests: u64,
    },
    /// A request queue found its ring corrupt: it serves nothing more
    /// until the driver resets the device (DEVICE_NEEDS_RESET).
    QueueBroken {
        /// The device.
        device: u32,
        /// The queue.
        vq: u16,
        /// What was wrong.
        reason: String,
    },
    /// The backstore failed a request: the guest got an I/O error (SCSI:
    /// its sense data; blk: VIRTIO_BLK_S_IOERR).
    IoError {
        /// The device.
        device: u32,
        /// The LUN (0 for a blk device).
        lun: u16,
        /// What the request did.
        op: IoKind,
        /// Its first block, as the guest addresses it: a logical block of
        /// the LUN (SCSI), a 512-byte sector (virtio-blk). 0 for a flush
        /// and an UNMAP (whose ranges are not listed).
        lba: u64,
        /// Bytes from there (0 for a flush and an UNMAP).
        bytes: u64,
        /// What failed.
        error: String,
    },
    /// A LUN was added to a SCSI device.
    LunAdded {
        /// The device.
        device: u32,
        /// The LUN.
        lun: u16,
    },
    /// A LUN was removed from a SCSI device.
    LunRemoved {
        /// The device.
        device: u32,
        /// The LUN.
        lun: u16,
    },
    /// A LUN's capacity changed (`lun_resize`, or its storage was resized
    /// outside the daemon, as an RBD image by `rbd resize`).
    LunResized {
        /// The device.
        device: u32,
        /// The LUN.
        lun: u16,
        /// Its new capacity.
        bytes: u64,
    },
    /// A configuration reload ended (SIGHUP or `config_reload`).
    ReloadDone {
        /// The changes made, one line each.
        changed: Vec<String>,
        /// What failed or needs a restart, one line each.
        errors: Vec<String>,
    },
}

impl Event {
    /// Every event's name, as subscriptions filter them.
    pub const NAMES: [&'static str; 12] = [
        "device_created",
        "device_deleted",
        "frontend_connected",
        "frontend_disconnected",
        "queue_started",
        "queue_stopped",
        "queue_broken",
        "io_error",
        "lun_added",
        "lun_removed",
        "lun_resized",
        "reload_done",
    ];

    /// Its name (one of [`Self::NAMES`]).
    pub fn name(&self) -> &'static str {
        match self {
            Event::DeviceCreated { .. } => "device_created",
            Event::DeviceDeleted { .. } => "device_deleted",
            Event::FrontendConnected { .. } => "frontend_connected",
            Event::FrontendDisconnected { .. } => "frontend_disconnected",
            Event::QueueStarted { .. } => "queue_started",
            Event::QueueStopped { .. } => "queue_stopped",
            Event::QueueBroken { .. } => "queue_broken",
            Event::IoError { .. } => "io_error",
            Event::LunAdded { .. } => "lun_added",
            Event::LunRemoved { .. } => "lun_removed",
            Event::LunResized { .. } => "lun_resized",
            Event::ReloadDone { .. } => "reload_done",
        }
    }
}

/// What an I/O request does, as events and per-LUN figures tell it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoKind {
    /// Reads.
    #[default]
    Read,
    /// Writes (a WRITE SAME of a pattern too).
    Write,
    /// Makes writes durable (SYNCHRONIZE CACHE, VIRTIO_BLK_T_FLUSH).
    Flush,
    /// Deallocates (UNMAP, WRITE SAME with UNMAP, VIRTIO_BLK_T_DISCARD).
    Discard,
    /// Zeroes (WRITE SAME of zeros, VIRTIO_BLK_T_WRITE_ZEROES).
    WriteZeroes,
}

impl IoKind {
    /// What backstore operation `op` does.
    pub fn of(op: &sqcq_backstore::IoOp) -> Self {
        use sqcq_backstore::IoOp;
        match op {
            IoOp::Read { .. } => IoKind::Read,
            IoOp::Write { .. } => IoKind::Write,
            IoOp::Flush => IoKind::Flush,
            IoOp::Discard { .. } => IoKind::Discard,
            IoOp::WriteZeroes { .. } => IoKind::WriteZeroes,
        }
    }
}

/// The daemon's events and their subscribers.
#[derive(Debug)]
pub struct EventBus {
    /// Whether anyone subscribed (possibly gone since): publishing skips
    /// everything without.
    active: AtomicBool,
    /// Numbers the events, from 1, so a subscriber sees what it missed.
    seq: AtomicU64,
    subscribers: Mutex<Subscribers>,
}

#[derive(Debug, Default)]
struct Subscribers {
    list: Vec<Weak<Subscription>>,
    /// Written when an event was queued for anyone: what the admin
    /// socket's thread waits on.
    wake: Option<Arc<EventFd>>,
}

impl EventBus {
    /// A bus without subscribers.
    pub fn new() -> Self {
        EventBus {
            active: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            subscribers: Mutex::new(Subscribers::default()),
        }
    }

    /// A new subscriber, to the events named in `only` (every event when
    /// empty; the names are [`Event::NAMES`], checked by the caller);
    /// `wake` is written whenever something is queued for it.
    pub fn subscribe(&self, only: &[String], wake: &Arc<EventFd>) -> Arc<Subscription> {
        let mask = only.iter().fold(0u32, |m, n| m | Subscription::bit(n));
        let sub = Arc::new(Subscription {
            mask: if only.is_empty() { u32::MAX } else { mask },
            queue: Mutex::new(Pending::default()),
        });
        let mut subs = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        subs.list.retain(|s| s.strong_count() > 0);
        subs.list.push(Arc::downgrade(&sub));
        subs.wake = Some(Arc::clone(wake));
        // Relaxed: a publisher that misses the flag published before the
        // subscription existed, which is what subscribing means.
        self.active.store(true, Ordering::Relaxed);
        sub
    }

    /// Whether `publish` would queue anything (to skip building an event
    /// whose fields cost something).
    pub fn wanted(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Queues `event` for every subscriber that wants it.
    pub fn publish(&self, event: Event) {
        if !self.wanted() {
            return;
        }
        let bit = Subscription::bit(event.name());
        let mut subs = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        subs.list.retain(|s| s.strong_count() > 0);
        if subs.list.is_empty() {
            self.active.store(false, Ordering::Relaxed);
            return;
        }
        // Relaxed: a number only; the lock held here orders the queueing.
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let line = serde_json::json!({
            "jsonrpc": "2.0",
            "method": METHOD,
            "params": Notification { seq, time, event: &event },
        })
        .to_string();
        let mut queued = false;
        for sub in subs.list.iter().filter_map(Weak::upgrade) {
            if sub.mask & bit != 0 {
                sub.push(&line);
                queued = true;
            }
        }
        if queued && let Some(wake) = &subs.wake {
            let _ = wake.write(1);
        }
    }
}

/// A notification's parameters: the event's fields, its number and time
/// (`lost` is added to the first one sent after a loss).
#[derive(Serialize)]
struct Notification<'a> {
    seq: u64,
    /// Seconds since the Unix epoch.
    time: f64,
    #[serde(flatten)]
    event: &'a Event,
}

/// What one subscriber was not sent yet.
#[derive(Debug, Default)]
struct Pending {
    /// Notifications (JSON-RPC lines without their newline).
    lines: VecDeque<String>,
    /// Dropped since the last one sent.
    lost: u64,
}

/// One subscriber's queue: dropped with the connection that owns it.
#[derive(Debug)]
pub struct Subscription {
    /// Bit `i` set: event `Event::NAMES[i]` wanted.
    mask: u32,
    queue: Mutex<Pending>,
}

impl Subscription {
    fn bit(name: &str) -> u32 {
        Event::NAMES
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| 1 << i)
    }

    fn push(&self, line: &str) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if q.lines.len() >= QUEUE_LEN {
            q.lines.pop_front();
            q.lost += 1;
        }
        q.lines.push_back(line.to_owned());
    }

    /// Takes what is queued, each line ended by a newline, appended to
    /// `out`; false when nothing was.
    pub fn take(&self, out: &mut Vec<u8>) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if q.lines.is_empty() {
            return false;
        }
        let lost = std::mem::take(&mut q.lost);
        for (i, line) in q.lines.drain(..).enumerate() {
            if i == 0 && lost > 0 {
                // The first line kept follows the ones dropped: it says so.
                out.extend_from_slice(&with_lost(&line, lost).into_bytes());
            } else {
                out.extend_from_slice(line.as_bytes());
            }
            out.push(b'\n');
        }
        true
    }
}

/// `line` with `"lost": n` among its parameters.
fn with_lost(line: &str, lost: u64) -> String {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(mut v) => {
            if let Some(p) = v.get_mut("params").and_then(|p| p.as_object_mut()) {
                let had = p
                    .get("lost")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
                p.insert("lost".into(), (had + lost).into());
            }
            v.to_string()
        }
        Err(_) => line.to_owned(),
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wake() -> Arc<EventFd> {
        Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap())
    }

    fn lines(sub: &Subscription) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        sub.take(&mut out);
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn names_match_the_variants() {
        let every = [
            Event::DeviceCreated { device: 0 },
            Event::DeviceDeleted { device: 0 },
            Event::FrontendConnected { device: 0 },
            Event::FrontendDisconnected { device: 0 },
            Event::QueueStarted {
                device: 0,
                vq: 2,
                mode: "kick",
            },
            Event::QueueStopped {
                device: 0,
                vq: 2,
                requests: 1,
            },
            Event::QueueBroken {
                device: 0,
                vq: 2,
                reason: "x".into(),
            },
            Event::IoError {
                device: 0,
                lun: 0,
                op: IoKind::Read,
                lba: 0,
                bytes: 512,
                error: "x".into(),
            },
            Event::LunAdded { device: 0, lun: 1 },
            Event::LunRemoved { device: 0, lun: 1 },
            Event::LunResized {
                device: 0,
                lun: 1,
                bytes: 1,
            },
            Event::ReloadDone {
                changed: vec![],
                errors: vec![],
            },
        ];
        assert_eq!(every.len(), Event::NAMES.len());
        for (e, name) in every.iter().zip(Event::NAMES) {
            assert_eq!(e.name(), name);
            // The name is also what the notification carries.
            assert_eq!(serde_json::to_value(e).unwrap()["event"], name);
        }
    }

    #[test]
    fn notifications_carry_the_fields_a_number_and_a_time() {
        let (bus, w) = (EventBus::new(), wake());
        let sub = bus.subscribe(&[], &w);
        bus.publish(Event::LunResized {
            device: 3,
            lun: 1,
            bytes: 4096,
        });
        bus.publish(Event::FrontendConnected { device: 3 });
        assert_eq!(w.read().unwrap(), 2);
        let got = lines(&sub);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0]["jsonrpc"], "2.0");
        assert_eq!(got[0]["method"], METHOD);
        assert!(got[0].get("id").is_none(), "a notification has no id");
        let p = &got[0]["params"];
        assert_eq!(p["event"], "lun_resized");
        assert_eq!(
            (p["device"].as_u64(), p["lun"].as_u64()),
            (Some(3), Some(1))
        );
        assert_eq!(p["bytes"], 4096);
        assert!(p["time"].as_f64().unwrap() > 1.6e9);
        assert!(p.get("lost").is_none());
        assert_eq!(
            got[1]["params"]["seq"].as_u64(),
            Some(p["seq"].as_u64().unwrap() + 1)
        );
        // Taken once.
        assert!(!sub.take(&mut Vec::new()));
    }

    #[test]
    fn a_subscription_gets_only_the_events_it_named() {
        let (bus, w) = (EventBus::new(), wake());
        let some = bus.subscribe(&["lun_added".into()], &w);
        let all = bus.subscribe(&[], &w);
        bus.publish(Event::LunRemoved { device: 0, lun: 1 });
        bus.publish(Event::LunAdded { device: 0, lun: 2 });
        let got = lines(&some);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["params"]["event"], "lun_added");
        assert_eq!(lines(&all).len(), 2);
    }

    #[test]
    fn a_reader_too_slow_loses_the_oldest_and_is_told_how_many() {
        let (bus, w) = (EventBus::new(), wake());
        let sub = bus.subscribe(&[], &w);
        let n = u32::try_from(QUEUE_LEN).unwrap() + 10;
        for device in 0..n {
            bus.publish(Event::DeviceCreated { device });
        }
        let got = lines(&sub);
        assert_eq!(got.len(), QUEUE_LEN);
        assert_eq!(got[0]["params"]["lost"], 10);
        assert_eq!(got[0]["params"]["device"], 10);
        assert!(got[1]["params"].get("lost").is_none());
        assert_eq!(got[QUEUE_LEN - 1]["params"]["device"], n - 1);
        // Nothing lost since.
        bus.publish(Event::DeviceDeleted { device: 0 });
        assert!(lines(&sub)[0]["params"].get("lost").is_none());
    }

    #[test]
    fn a_loss_is_reported_once() {
        let (bus, w) = (EventBus::new(), wake());
        let sub = bus.subscribe(&[], &w);
        for device in 0..(u32::try_from(QUEUE_LEN).unwrap() + 3) {
            bus.publish(Event::DeviceCreated { device });
        }
        // Taken: the loss goes with the first line taken.
        assert_eq!(lines(&sub)[0]["params"]["lost"], 3);
        bus.publish(Event::DeviceCreated { device: 9 });
        assert!(lines(&sub)[0]["params"].get("lost").is_none());
    }

    #[test]
    fn without_a_live_subscriber_nothing_is_kept() {
        let (bus, w) = (EventBus::new(), wake());
        assert!(!bus.wanted());
        let sub = bus.subscribe(&[], &w);
        assert!(bus.wanted());
        drop(sub);
        bus.publish(Event::DeviceCreated { device: 0 });
        assert!(
            !bus.wanted(),
            "the last subscriber gone, publishing is skipped again"
        );
        assert!(w.read().is_err(), "nobody to wake");
    }
}
