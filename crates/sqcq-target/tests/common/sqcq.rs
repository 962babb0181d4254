//! The driver's side of VIRTIO_F_SQCQ_POLL and of `ring-poll` for the
//! daemon tests: the doorbells at `doorbell_location` (zeroed with the
//! rings by `Vq::setup`), publishing through `sq.idx`, the CQ NEED_WAKEUP
//! flag, and the standard kick-suppression rules.

use std::sync::atomic::{Ordering, fence};

use sqcq_protocol::{DoorbellLocation, NEED_WAKEUP, RingAddrs, doorbell_location};
use vm_memory::{Bytes, GuestAddress};

use super::{Guest, Vq};

/// Feature bit of VIRTIO_F_SQCQ_POLL, for `connect_with`.
pub const SQCQ: u64 = 1 << sqcq_protocol::VIRTIO_F_SQCQ_POLL;
/// VRING_USED_F_NO_NOTIFY.
pub const USED_F_NO_NOTIFY: u16 = 1;

fn load(g: &Guest, at: u64) -> u16 {
    u16::from_le(g.mem.load(GuestAddress(at), Ordering::Acquire).unwrap())
}

fn store(g: &Guest, at: u64, v: u16) {
    g.mem
        .store(v.to_le(), GuestAddress(at), Ordering::Release)
        .unwrap();
}

impl Vq {
    /// Where this queue's doorbells are.
    pub fn doorbells(&self) -> DoorbellLocation {
        doorbell_location(
            RingAddrs {
                desc: self.desc,
                avail: self.avail,
                used: self.used,
            },
            self.size,
        )
        .unwrap()
    }

    /// The SQ doorbell's flags (written by the device's poller).
    pub fn sq_flags(&self, g: &Guest) -> u16 {
        load(g, self.doorbells().sq + 2)
    }

    /// The CQ doorbell's index (written by the device).
    pub fn cq_idx(&self, g: &Guest) -> u16 {
        load(g, self.doorbells().cq)
    }

    /// Sets or clears NEED_WAKEUP in the CQ doorbell (this driver's
    /// poller asleep or polling), with fence 4 after setting it.
    pub fn set_cq_need_wakeup(&self, g: &Guest, on: bool) {
        store(g, self.doorbells().cq + 2, if on { NEED_WAKEUP } else { 0 });
        fence(Ordering::SeqCst);
    }

    /// Writes the raw SQ doorbell index (for hostile values).
    pub fn write_sq_idx(&self, g: &Guest, idx: u16) {
        store(g, self.doorbells().sq, idx);
        fence(Ordering::SeqCst);
    }

    /// Publishes the avail index and `sq.idx`, then kicks only if the
    /// device's poller set NEED_WAKEUP (fence 1 between). Returns whether
    /// it kicked.
    pub fn publish_sq(&self, g: &Guest) -> bool {
        fence(Ordering::Release);
        store(g, self.avail + 2, self.next_avail);
        store(g, self.doorbells().sq, self.next_avail);
        fence(Ordering::SeqCst);
        let kick = self.sq_flags(g) & NEED_WAKEUP != 0;
        if kick {
            self.kick.write(1).unwrap();
        }
        kick
    }

    /// Publishes the avail index and kicks as standard virtio says: with
    /// EVENT_IDX when the new index passes `avail_event`, else when
    /// VRING_USED_F_NO_NOTIFY is clear. `old` is the index before this
    /// batch. Returns whether it kicked.
    pub fn publish_standard(&self, g: &Guest, old: u16, event_idx: bool) -> bool {
        fence(Ordering::Release);
        store(g, self.avail + 2, self.next_avail);
        // Pairs with the device's fence between re-enabling notifications
        // and re-reading avail->idx.
        fence(Ordering::SeqCst);
        let new = self.next_avail;
        let kick = if event_idx {
            let event = load(g, self.used + 4 + 8 * u64::from(self.size));
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            load(g, self.used) & USED_F_NO_NOTIFY == 0
        };
        if kick {
            self.kick.write(1).unwrap();
        }
        kick
    }

    /// Calls received since the last look (the call eventfd's count).
    pub fn calls(&self) -> u64 {
        self.call.read().unwrap_or(0)
    }

    /// Whether the error eventfd fired (the device found the queue broken).
    pub fn errored(&self) -> bool {
        self.err.read().is_ok()
    }
}

/// Reads a used-ring flag word, for tests that look at the device's side.
pub fn used_flags(g: &Guest, vq: &Vq) -> u16 {
    let v: u16 = g.mem.read_obj(GuestAddress(vq.used)).unwrap();
    u16::from_le(v)
}
