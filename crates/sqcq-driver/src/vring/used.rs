//! The device-written half: harvesting and validating the used ring, and
//! interrupt suppression.

use std::sync::atomic::{Ordering, fence};

use super::{AVAIL_F_NO_INTERRUPT, DeviceError, Slot, SplitQueue, Used};

impl SplitQueue {
    /// Takes the next completed request off the used ring, validating it:
    /// `None` when there is none, an error when the device is broken or
    /// hostile (see [`DeviceError`]).
    pub fn pop_used(&mut self) -> Option<Result<Used, DeviceError>> {
        if let Some(e) = &self.broken {
            return Some(Err(e.clone()));
        }
        if self.last_used == self.used_seen {
            // Relaxed, then Acquire fence below only when there is news:
            // pairs with the device's Release store of used->idx
            // (virtio-queue's `add_used`), making the used elements it
            // announces visible. The entries up to that index are then
            // consumed without loading it again: it sits on the line the
            // device writes at every publish, and a load per entry took
            // that line from the device once per completion.
            let used_idx = u16::from_le(
                self.ring
                    .u16(self.layout.used_idx())
                    .load(Ordering::Relaxed),
            );
            if used_idx == self.last_used {
                return None;
            }
            fence(Ordering::Acquire);
            if used_idx.wrapping_sub(self.last_used) > self.size {
                return Some(Err(self.break_queue(DeviceError::UsedIndexJump {
                    last_used: self.last_used,
                    used_idx,
                    size: self.size,
                })));
            }
            self.used_seen = used_idx;
        }
        let elem = self.layout.used_elem(self.last_used & (self.size - 1));
        // Relaxed: ordered after the used->idx load by the Acquire fence.
        let id = u32::from_le(self.ring.u32(elem).load(Ordering::Relaxed));
        let len = u32::from_le(self.ring.u32(elem + 4).load(Ordering::Relaxed));
        let head = match u16::try_from(id) {
            Ok(head) if head < self.size => head,
            _ => {
                return Some(Err(self.break_queue(DeviceError::UnknownId {
                    id,
                    size: self.size,
                })));
            }
        };
        let slot = self.slots[usize::from(head)];
        if !slot.in_flight {
            return Some(Err(self.break_queue(DeviceError::NotInFlight { id: head })));
        }
        if u64::from(len) > slot.writable {
            return Some(Err(self.break_queue(DeviceError::LengthTooLong {
                id: head,
                len,
                max: slot.writable,
            })));
        }
        self.free_chain(head, slot);
        self.last_used = self.last_used.wrapping_add(1);
        Some(Ok(Used {
            token: slot.token,
            len,
        }))
    }

    /// Whether [`Self::pop_used`] has something to return: the device
    /// published used entries not consumed yet, or the queue is broken. A
    /// cheap check for polling loops; it does not validate anything.
    pub fn has_used(&self) -> bool {
        if self.broken.is_some() {
            return true;
        }
        if self.used_seen != self.last_used {
            return true;
        }
        // Relaxed: a hint only; `pop_used` does the Acquire fence that
        // pairs with the device's Release store of used->idx.
        let used_idx = u16::from_le(
            self.ring
                .u16(self.layout.used_idx())
                .load(Ordering::Relaxed),
        );
        used_idx != self.last_used
    }

    /// The device's `used->idx` as last stored: a hint for polling loops
    /// and statistics, never used to index anything (`pop_used` validates).
    pub fn used_index(&self) -> u16 {
        // Relaxed: a hint only; `pop_used` does the Acquire fence that pairs
        // with the device's Release store of used->idx.
        u16::from_le(
            self.ring
                .u16(self.layout.used_idx())
                .load(Ordering::Relaxed),
        )
    }

    /// The device's `used->flags` as last stored: bit 0 is
    /// `VRING_USED_F_NO_NOTIFY`, the device asking not to be kicked (which
    /// [`Self::publish`] already honours). An observation for tests and
    /// reports, never used to decide anything here.
    pub fn used_flags(&self) -> u16 {
        // Relaxed: an observation, ordered by nothing (`publish` makes its
        // own load after its SeqCst fence).
        u16::from_le(
            self.ring
                .u16(self.layout.used_flags())
                .load(Ordering::Relaxed),
        )
    }

    /// `avail_event` (with EVENT_IDX): the device asks to be kicked once
    /// the avail index passes it. An observation for tests and reports,
    /// as [`Self::used_flags`].
    pub fn avail_event(&self) -> u16 {
        // Relaxed: an observation (`publish` loads it after its fence).
        u16::from_le(
            self.ring
                .u16(self.layout.avail_event())
                .load(Ordering::Relaxed),
        )
    }

    fn break_queue(&mut self, error: DeviceError) -> DeviceError {
        self.broken = Some(error.clone());
        error
    }

    /// Puts a completed chain at the end of the free list (FIFO, as SPDK's
    /// and DPDK's virtio drivers; Linux's is LIFO). The device read these
    /// descriptors last: taking them again at once would write into lines
    /// it may still hold for the neighbouring requests, where the oldest
    /// free ones were let go long ago (measured in docs/benchmarks.md,
    /// "Driver: freed descriptors and slots reused last (FIFO)").
    fn free_chain(&mut self, head: u16, slot: Slot) {
        self.slots[usize::from(head)].in_flight = false;
        if self.num_free == 0 {
            self.free_head = head;
        } else {
            self.free_next[usize::from(self.free_tail)] = head;
        }
        self.free_tail = slot.tail;
        self.num_free += slot.descs;
        self.in_flight -= 1;
    }

    /// Asks the device not to interrupt (call) on completions. A hint the
    /// device may ignore. Without EVENT_IDX it sets
    /// `VRING_AVAIL_F_NO_INTERRUPT`; with EVENT_IDX (where the flags must
    /// stay 0) it moves `used_event` just behind the last consumed entry, so
    /// that the device will not cross it for another 65535 completions
    /// (Linux writes 0 there; any value behind the device's index works).
    pub fn disable_interrupts(&mut self) {
        if self.interrupts_disabled {
            return;
        }
        self.interrupts_disabled = true;
        // Relaxed, in both branches: suppression is best effort and needs no
        // ordering; a late store costs at most one spurious interrupt.
        if self.event_idx {
            self.ring
                .u16(self.layout.used_event())
                .store(self.last_used.wrapping_sub(1).to_le(), Ordering::Relaxed);
        } else {
            self.ring
                .u16(self.layout.avail_flags())
                .store(AVAIL_F_NO_INTERRUPT.to_le(), Ordering::Relaxed);
        }
    }

    /// Asks the device to interrupt on the next completion, and returns
    /// whether completions arrived meanwhile: if `true`, consume them with
    /// [`Self::pop_used`] instead of waiting for the interrupt, which may
    /// never come. With EVENT_IDX the request is one-shot (the device
    /// interrupts once, when it crosses `used_event`): call this again
    /// before each wait. Publish added requests before waiting.
    #[must_use]
    pub fn enable_interrupts(&mut self) -> bool {
        self.enable_interrupts_after(1)
    }

    /// Like [`Self::enable_interrupts`], but with EVENT_IDX asks for the
    /// interrupt only once `count` more requests have completed (clamped to
    /// 1..=[`Self::in_flight`], so that it always comes), as Linux's
    /// `virtqueue_enable_cb_delayed`. Returns `true` when that many
    /// completions have already arrived: consume them instead of waiting.
    /// Without EVENT_IDX this is [`Self::enable_interrupts`].
    #[must_use]
    pub fn enable_interrupts_after(&mut self, count: u16) -> bool {
        let count = if self.event_idx {
            count.clamp(1, self.in_flight.max(1))
        } else {
            1
        };
        if self.interrupts_disabled {
            self.interrupts_disabled = false;
            if !self.event_idx {
                // Relaxed: ordered before the used->idx re-check by the
                // fence below.
                self.ring
                    .u16(self.layout.avail_flags())
                    .store(0, Ordering::Relaxed);
            }
        }
        if self.event_idx {
            let event = self.last_used.wrapping_add(count - 1);
            // Relaxed: ordered before the used->idx re-check by the fence
            // below.
            self.ring
                .u16(self.layout.used_event())
                .store(event.to_le(), Ordering::Relaxed);
        }
        // SeqCst: our store of used_event (or of the flags) must be ordered
        // before our re-load of used->idx. It pairs with the device's fence
        // between its store of used->idx and its load of used_event / flags
        // (virtio-queue's `needs_notification`, Linux vhost's
        // `vhost_notify`): either the device sees our request and
        // interrupts, or we see its new used->idx here. As Linux
        // `virtqueue_poll`'s virtio_mb.
        fence(Ordering::SeqCst);
        // Relaxed: only compared; `pop_used` does its own Acquire.
        let used_idx = u16::from_le(
            self.ring
                .u16(self.layout.used_idx())
                .load(Ordering::Relaxed),
        );
        used_idx.wrapping_sub(self.last_used) >= count
    }
}
