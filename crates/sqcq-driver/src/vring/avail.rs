//! The driver-written half: building descriptor chains, the avail ring,
//! and the kick decision.

use std::sync::atomic::{Ordering, fence};

use super::{
    Buffer, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DESC_SIZE, QueueError, RingLayout,
    SharedWindow, Slot, SplitQueue, USED_F_NO_NOTIFY,
};

/// Whether the device must be notified after [`SplitQueue::publish`].
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyDecision {
    /// Notify (kick) the device.
    Kick,
    /// Do not: nothing new was published, or the device asked not to be
    /// notified (`VRING_USED_F_NO_NOTIFY`, or its `avail_event` was not
    /// crossed).
    Suppressed,
}

impl NotifyDecision {
    /// Whether the device must be kicked.
    pub fn needs_kick(self) -> bool {
        self == Self::Kick
    }
}

/// What [`check_request`] found out about a request.
pub(super) struct Checked {
    /// Buffers.
    pub(super) len: u16,
    /// Total bytes of the device-writable buffers.
    pub(super) writable: u64,
}

/// The checks every request passes before it is laid out in a ring of
/// `size`, split or packed: the queue is not broken, the request has 1 to
/// `size` buffers of at most 4 GiB in all.
pub(super) fn check_request(
    broken: Option<&super::DeviceError>,
    out: &[Buffer],
    in_: &[Buffer],
    size: u16,
) -> Result<Checked, QueueError> {
    if let Some(e) = broken {
        return Err(QueueError::Broken(e.clone()));
    }
    let total = out.len().saturating_add(in_.len());
    if total == 0 {
        return Err(QueueError::EmptyChain);
    }
    let len =
        u16::try_from(total)
            .ok()
            .filter(|&len| len <= size)
            .ok_or(QueueError::ChainTooLong {
                len: total,
                max: size,
            })?;
    // At most 32768 buffers of u32::MAX bytes: no u64 overflow.
    let readable: u64 = out.iter().map(|b| u64::from(b.len)).sum();
    let writable: u64 = in_.iter().map(|b| u64::from(b.len)).sum();
    let bytes = readable + writable;
    if bytes > u64::from(u32::MAX) {
        return Err(QueueError::ChainTooLarge { bytes });
    }
    Ok(Checked { len, writable })
}

/// The virtio `vring_need_event`: whether moving an index from `old` to
/// `new` crosses `event`, the index the other side asked to be notified
/// after (all in wrapping 16-bit arithmetic).
pub fn vring_need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl SplitQueue {
    /// Adds a request: device-readable `out` buffers, then device-writable
    /// `in_` buffers, to be reported back with `token`. The request is not
    /// visible to the device before [`Self::publish`]. With indirect
    /// descriptors, a request of 2 to `indirect_max` buffers uses its head's
    /// preallocated table and one descriptor of the ring. Returns the head
    /// descriptor index.
    pub fn add(&mut self, out: &[Buffer], in_: &[Buffer], token: usize) -> Result<u16, QueueError> {
        let Checked { len, writable } = check_request(self.broken.as_ref(), out, in_, self.size)?;
        let indirect = if len > 1 && len <= self.indirect_max {
            self.indirect.as_ref()
        } else {
            None
        };
        let needed = if indirect.is_some() { 1 } else { len };
        if needed > self.num_free {
            return Err(QueueError::NoFreeDescriptors {
                needed,
                free: self.num_free,
            });
        }

        let head = self.free_head;
        let buffers = out
            .iter()
            .map(|b| (b, 0))
            .chain(in_.iter().map(|b| (b, DESC_F_WRITE)));
        let tail = match indirect {
            Some(tables) => {
                // head < size, so the table lies inside the window.
                let table = usize::from(head) * usize::from(self.indirect_max) * DESC_SIZE;
                for (i, (buf, flags)) in (0..len).zip(buffers) {
                    let (flags, next) = if i + 1 < len {
                        (flags | DESC_F_NEXT, i + 1)
                    } else {
                        (flags, 0)
                    };
                    let offset = table + usize::from(i) * DESC_SIZE;
                    write_desc(tables, offset, buf.addr.0, buf.len, flags, next);
                }
                // `len <= indirect_max <= 32768`: the table length fits.
                let table_len = u32::from(len) * 16;
                let table_gpa = self.indirect_gpa.0 + table as u64;
                let offset = RingLayout::desc(head);
                write_desc(&self.ring, offset, table_gpa, table_len, DESC_F_INDIRECT, 0);
                head
            }
            None => {
                let mut desc = head;
                for (i, (buf, flags)) in (0..len).zip(buffers) {
                    let next = self.free_next[usize::from(desc)];
                    let (flags, link) = if i + 1 < len {
                        (flags | DESC_F_NEXT, next)
                    } else {
                        (flags, 0)
                    };
                    let offset = RingLayout::desc(desc);
                    write_desc(&self.ring, offset, buf.addr.0, buf.len, flags, link);
                    if i + 1 < len {
                        desc = next;
                    }
                }
                desc
            }
        };
        // `free_next[tail]` is `size` (past the end) when the list empties;
        // it is then never followed, since `num_free` is 0.
        self.free_head = self.free_next[usize::from(tail)];
        self.num_free -= needed;
        self.in_flight += 1;
        self.slots[usize::from(head)] = Slot {
            token,
            writable,
            tail,
            descs: needed,
            in_flight: true,
        };
        let slot = self.avail_idx & (self.size - 1);
        // Relaxed: the descriptor writes above and this entry reach the
        // device through the Release store of avail->idx in `publish`.
        self.ring
            .u16(self.layout.avail_entry(slot))
            .store(head.to_le(), Ordering::Relaxed);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        Ok(head)
    }

    /// Makes every request added since the last call visible to the device,
    /// with one store of `avail->idx`, and says whether to kick it.
    pub fn publish(&mut self) -> NotifyDecision {
        let old = self.published_idx;
        let Some(new) = self.publish_index() else {
            return NotifyDecision::Suppressed;
        };
        // SeqCst: our store of avail->idx must be ordered before our load of
        // avail_event / used->flags below. It pairs with the device's fence
        // between storing avail_event (or clearing NO_NOTIFY) and re-reading
        // avail->idx (virtio-queue's `enable_notification`, Linux vhost's
        // `vhost_enable_notify`): either the device sees our new index, or
        // we see its re-enabled notification and kick. Without it both
        // loads can read stale values (store buffering) and the kick is
        // lost. Same as Linux `virtqueue_kick_prepare_split`'s virtio_mb.
        fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            // Relaxed: ordered by the fence above; the value is only a hint
            // to compare against.
            let event = u16::from_le(
                self.ring
                    .u16(self.layout.avail_event())
                    .load(Ordering::Relaxed),
            );
            vring_need_event(event, new, old)
        } else {
            // Relaxed: ordered by the fence above, as for avail_event.
            let flags = u16::from_le(
                self.ring
                    .u16(self.layout.used_flags())
                    .load(Ordering::Relaxed),
            );
            flags & USED_F_NO_NOTIFY == 0
        };
        if kick {
            NotifyDecision::Kick
        } else {
            NotifyDecision::Suppressed
        }
    }
}

impl SplitQueue {
    /// Makes every request added since the last call visible to the
    /// device, with one store of `avail->idx`, and returns the new index;
    /// `None` when nothing was added. No kick decision: with
    /// VIRTIO_F_SQCQ_POLL the caller stores the index in `sq.idx` and
    /// decides from `sq.flags` alone (spec section 6.1).
    pub fn publish_index(&mut self) -> Option<u16> {
        let new = self.avail_idx;
        if new == self.published_idx {
            return None;
        }
        // Release: pairs with the device's Acquire load of avail->idx
        // (virtio-queue's `iter`), so the descriptors and avail entries
        // written by `add` are visible before the index that announces them.
        self.ring
            .u16(self.layout.avail_idx())
            .store(new.to_le(), Ordering::Release);
        self.published_idx = new;
        Some(new)
    }
}

/// Writes one descriptor at byte `offset` of `window`: two 64-bit
/// stores, `addr`, then `len`, `flags` and `next` as the descriptor's
/// second little-endian word.
fn write_desc(window: &SharedWindow, offset: usize, addr: u64, len: u32, flags: u16, next: u16) {
    let desc = window.words(offset, 2);
    let rest = u64::from(len) | u64::from(flags) << 32 | u64::from(next) << 48;
    // Relaxed: descriptors reach the device through the Release store of
    // avail->idx in `SplitQueue::publish`.
    desc[0].store(addr.to_le(), Ordering::Relaxed);
    desc[1].store(rest.to_le(), Ordering::Relaxed);
}
