//! VIRTIO_F_SQCQ_POLL on the driver side: the doorbells of each queue, the
//! driver's poll thread (`sqcq`), and the submitter's half (the `sqcq` and
//! `sqcq-inline` [`NotifyMode`](crate::NotifyMode)s).
//!
//! - [`bell`]: the two doorbells of a queue in driver memory (where
//!   `sqcq_protocol::doorbell_location` puts them, zeroed before the queue
//!   is enabled), and the per-queue state the poll thread and the
//!   submitter share, including the *mailbox* through which the poll
//!   thread signals completions.
//! - [`poll_thread`]: one thread per device (default) or per queue that
//!   watches the CQ doorbells, spins for the adaptive window, then sets
//!   NEED_WAKEUP on all of them and sleeps in `epoll_wait` over their call
//!   eventfds (spec section 12.2).
//! - [`notifier`]: the submitter: `avail->idx`, then `sq.idx` through
//!   `SqProducer`, a kick only on `Wake::Owed`; waiting for completions on
//!   the mailbox with the same spin-then-sleep handshake.
//!
//! # Completion dispatch
//!
//! The ring stays the submitter's alone: it adds requests and pops used
//! entries, and no lock or shared free list exists. The poll thread never
//! touches the used ring; when it sees `cq.idx` move it tells the
//! queue's mailbox (a count of its forwards), an in-process
//! [`Doorbell`](sqcq_protocol::Doorbell)
//! with the CQ roles: the poll thread is its producer
//! (`CqProducer::publish`: store, `fence(SeqCst)`, load NEED_WAKEUP) and the
//! submitter its consumer (`Poller<CqConsumer>`: spin, then set
//! NEED_WAKEUP, `fence(SeqCst)`, re-check, sleep on the mailbox eventfd).
//! Those two fences pair with each other exactly as fences 3 and 4 of the
//! protocol do; the code is the protocol crate's, model-checked there.
//! A forward only says "`used->idx` moved": the poll thread's
//! Acquire on `cq.idx` (pairing with the device's Release) and the
//! mailbox's Release/Acquire pass the device's used-ring writes on to the
//! submitter, which then pops and validates them itself.
//!
//! While it spins, the submitter also looks at its used ring on every
//! pass, so it takes what the device published without waiting for a
//! forward; and while every submitter it serves spins so, the poll thread
//! steps aside for a moment (50 µs) instead of competing for a CPU it may
//! share with them. The mailbox matters once a submitter's window expires
//! and it sleeps: then the poll thread, back within that moment, watches
//! `cq.idx` and wakes it.
//!
//! In `sqcq-inline` there is no poll thread and no mailbox: the submitter
//! is the queue's CQ consumer. It runs the same `Poller<CqConsumer>` over
//! the CQ doorbell in driver memory that a poll thread would, polling its
//! used ring too while it spins; once its window expires it sets CQ
//! NEED_WAKEUP, executes fence 4 (pairing with the device's fence 3),
//! re-checks `cq.idx`, and sleeps on the queue's call eventfd, which the
//! device signals only then. Between bursts it can park
//! ([`Virtqueue::park`](crate::Virtqueue::park)): NEED_WAKEUP stays set
//! while it has nothing in flight, the idle state of the handshake.

pub mod bell;
pub mod notifier;
pub mod poll_thread;
#[cfg(test)]
mod tests;

pub use crate::poll_stats::PollStats;
pub use bell::{DoorbellError, GuestBell};
pub use poll_thread::{PollGroup, PollGroupBuilder, PollThreads};

use crate::memory::DriverMemory;
use crate::notify::QueueEvents;
use crate::virtqueue::Virtqueue;
use crate::vring::Ring;

/// A queue nobody polls while VIRTIO_F_SQCQ_POLL is negotiated (spec 4.5):
/// its doorbells zeroed, `sq.idx` written at every publication, a kick
/// when the device asks, and the CQ doorbell parked (NEED_WAKEUP set for
/// good), so that the device calls after every completion. For the control
/// and event queues of a device whose request queues use `sqcq` or
/// `sqcq-inline`; call it before the queue is started.
pub fn parked_queue(
    mem: &DriverMemory,
    index: u16,
    ring: Ring,
    events: QueueEvents,
) -> Result<Virtqueue, DoorbellError> {
    let (sq, cq) = bell::queue_doorbells(mem, &ring)?;
    let notifier = Box::new(notifier::ParkedNotifier::new(sq, cq));
    Ok(Virtqueue::with_notifier(index, ring, notifier, events))
}
