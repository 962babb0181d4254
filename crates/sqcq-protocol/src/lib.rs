//! The VIRTIO_F_SQCQ_POLL doorbell protocol.
//!
//! A virtqueue that negotiated feature bit 42 gets two 64-byte doorbells
//! right after its used ring. The driver writes `sq.idx` instead of kicking
//! and the device writes `cq.idx` instead of interrupting; each side runs a
//! poll thread that watches one doorbell, spins for an adaptive window, and
//! sleeps on the ordinary eventfd after setting NEED_WAKEUP, which tells
//! the other side that one notification is owed. The normative text is
//! `docs/spec/virtio-sqcq.md`.
//!
//! This crate is the protocol and nothing else: no I/O, no threads,
//! `no_std` without the `std` feature; the pollers take the time as an
//! argument, and [`clock`] (`std`) is the cheap clock both sides feed them. Both the device (`sqcq-target`)
//! and the driver (`sqcq-driver`) build on it:
//!
//! - [`layout`]: where the doorbells are ([`doorbell_location`]) and which
//!   doorbell values make sense ([`check_index`]);
//! - [`packed`]: positions in a packed ring, as its doorbells name them;
//! - [`doorbell`]: the cache line itself and the [`DoorbellCell`] seam over
//!   the memory it lives in;
//! - [`handshake`]: the four roles ([`SqProducer`], [`SqConsumer`],
//!   [`CqProducer`], [`CqConsumer`]) and the four `fence(SeqCst)` points;
//! - [`spin`]: the adaptive spin window;
//! - [`poller`]: one consumer's poll decisions (spin, expire, sleep, wake)
//!   and counters, shared by the device's and the driver's poll threads;
//! - [`stats`]: per-queue counters in the RFC's log format.
//!
//! No library offers this protocol; it is written here, and proven by the
//! loom tests in `tests/loom.rs` and the Promela model in `models/`.
//!
//! ```
//! use sqcq_protocol::{Doorbell, SleepCheck, SqConsumer, SqProducer, Wake};
//!
//! let bell = Doorbell::new();
//! let mut driver = SqProducer::new(&bell);
//! let mut device = SqConsumer::new(&bell, 0);
//!
//! // The device's spin window expired: it asks to be woken and sleeps.
//! assert_eq!(device.prepare_sleep(), SleepCheck::Sleep);
//! // The driver publishes avail->idx = 1 and learns a kick is owed.
//! assert_eq!(driver.publish(1), Wake::Owed);
//! // Woken by the kick eventfd, the device clears the flag and polls.
//! device.finish_sleep();
//! assert_eq!(device.poll(), Some(1));
//! ```

#![cfg_attr(not(any(feature = "std", test)), no_std)]
#![deny(missing_docs)]

#[cfg(feature = "std")]
pub mod clock;
pub mod doorbell;
#[cfg(feature = "guest-memory")]
pub mod guest;
pub mod handshake;
pub mod layout;
pub mod packed;
pub mod poller;
pub mod spin;
pub mod stats;
mod sync;
#[cfg(feature = "std")]
pub mod yielder;

/// Feature bit number of VIRTIO_F_SQCQ_POLL.
pub const VIRTIO_F_SQCQ_POLL: u32 = 42;

pub use doorbell::{Doorbell, DoorbellCell, NEED_WAKEUP, RawDoorbell, THROTTLE};
#[cfg(feature = "guest-memory")]
pub use guest::{GuestDoorbell, GuestDoorbellError, guest_doorbells};
pub use handshake::{
    Consumer, CqConsumer, CqProducer, Producer, SleepCheck, SqConsumer, SqProducer, Wake,
};
pub use layout::{
    DoorbellLocation, LayoutError, NonsenseIndex, PackedAddrs, RingAddrs, check_index,
    doorbell_location, packed_doorbell_location,
};
pub use poller::{Poll, PollState, Poller, Watch};
pub use spin::{SpinConfig, SpinConfigError, SpinPolicy};
pub use stats::{QueueStats, counted_since};
