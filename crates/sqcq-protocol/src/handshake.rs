//! The four roles of the NEED_WAKEUP handshake.
//!
//! | doorbell | producer (stores `idx`)  | consumer (stores `flags`)        |
//! |----------|--------------------------|----------------------------------|
//! | SQ       | driver, after avail idx  | device poll thread               |
//! | CQ       | device, after used idx   | driver poll thread               |
//!
//! Each role stores its own word and then loads the other side's. That is
//! Dekker's pattern, and like io_uring's SQPOLL (`io_sqring_wait` against
//! `io_uring_submit`'s `IORING_SQ_NEED_WAKEUP` check) it needs a full
//! `fence(SeqCst)` between the store and the load on *both* sides. Without
//! it the store can sit in the CPU's store buffer while the load reads the
//! old value: the producer sees no NEED_WAKEUP, the consumer sees no new
//! index, and the consumer sleeps with work pending (a lost wakeup, on x86
//! too). The four fences are:
//!
//! 1. SQ producer: `sq.idx` store → fence → `sq.flags` load ([`Producer::publish`]).
//! 2. SQ consumer: `sq.flags` store → fence → `sq.idx` load ([`Consumer::prepare_sleep`]).
//! 3. CQ producer: like 1 on the CQ doorbell.
//! 4. CQ consumer: like 2 on the CQ doorbell.
//!
//! Fence 1 pairs with fence 2 and fence 3 with fence 4.
//!
//! The SQ consumer (the device) also owns THROTTLE, bit 1 of `sq.flags`
//! (spec section "Backpressure"): [`Consumer::set_throttle`] keeps it in
//! every store of `flags`, so NEED_WAKEUP and THROTTLE always travel in
//! one 16-bit store (T4), and a clear made before the device publishes a
//! used index is ordered before it by that publication's Release store
//! (T2). The SQ producer reads it with the flags it loads anyway after
//! fence 1 ([`Producer::throttle`]), and again after it consumed used
//! buffers ([`Producer::load_throttle`], D2).
//!
//! Building with
//! `--cfg sqcq_omit_fence="sq_producer"` (or `sq_consumer`, `cq_producer`,
//! `cq_consumer`) removes exactly one of them, so the loom tests can show
//! that each is needed.

use core::fmt;
use core::marker::PhantomData;

use crate::doorbell::{DoorbellCell, NEED_WAKEUP, THROTTLE};
use crate::sync::{Ordering, fence};

/// Which doorbell a handle works on; selects the fences it may omit in a
/// proof build.
pub trait Role {
    /// "sq" or "cq", for logs.
    const NAME: &'static str;
    /// True only in a proof build that removes the producer's fence.
    const OMIT_PRODUCER_FENCE: bool;
    /// True only in a proof build that removes the consumer's fence.
    const OMIT_CONSUMER_FENCE: bool;
    /// Whether bit 1 of the consumer's `flags` is THROTTLE (the SQ) or
    /// reserved (the CQ).
    const THROTTLE: bool;
}

/// The submission doorbell: the driver produces, the device consumes.
#[derive(Debug)]
pub enum Sq {}

/// The completion doorbell: the device produces, the driver consumes.
#[derive(Debug)]
pub enum Cq {}

impl Role for Sq {
    const NAME: &'static str = "sq";
    const OMIT_PRODUCER_FENCE: bool = cfg!(sqcq_omit_fence = "sq_producer");
    const OMIT_CONSUMER_FENCE: bool = cfg!(sqcq_omit_fence = "sq_consumer");
    const THROTTLE: bool = true;
}

impl Role for Cq {
    const NAME: &'static str = "cq";
    const OMIT_PRODUCER_FENCE: bool = cfg!(sqcq_omit_fence = "cq_producer");
    const OMIT_CONSUMER_FENCE: bool = cfg!(sqcq_omit_fence = "cq_consumer");
    const THROTTLE: bool = false;
}

/// Whether a producer must notify the consumer after publishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a consumer that asked for a wakeup sleeps until it gets one"]
pub enum Wake {
    /// The consumer set NEED_WAKEUP: signal its eventfd (kick or call).
    Owed,
    /// The consumer is polling; no notification.
    NotOwed,
}

/// What a consumer learned when it prepared to sleep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "sleeping after `Work` loses a request"]
pub enum SleepCheck {
    /// NEED_WAKEUP is set and nothing new arrived: sleep on the eventfd,
    /// then call [`Consumer::finish_sleep`].
    Sleep,
    /// A new index arrived meanwhile; NEED_WAKEUP was cleared again. Process
    /// the ring instead of sleeping.
    Work(u16),
}

/// The producing side of a doorbell: the driver on the SQ, the device on
/// the CQ.
pub struct Producer<C, R> {
    cell: C,
    idx: u16,
    /// The consumer's `flags` as last loaded.
    flags: u16,
    _role: PhantomData<R>,
}

/// The SQ producer: the driver's submission path.
pub type SqProducer<C> = Producer<C, Sq>;
/// The CQ producer: the device's completion path.
pub type CqProducer<C> = Producer<C, Cq>;

impl<C: DoorbellCell, R: Role> Producer<C, R> {
    /// Takes the producer role on `cell`, continuing from the index already
    /// there (zero on a fresh queue).
    pub fn new(cell: C) -> Self {
        let idx = u16::from_le(cell.idx().load(Ordering::Relaxed));
        Producer {
            cell,
            idx,
            flags: 0,
            _role: PhantomData,
        }
    }

    /// Publishes `idx` (the ring index just written, with the ring entries
    /// before it) and says whether the consumer must be woken.
    pub fn publish(&mut self, idx: u16) -> Wake {
        self.idx = idx;
        // Release: pairs with the consumer's `fence(Acquire)` after it sees
        // this value, so the ring entries and ring index stored before are
        // visible to it.
        self.cell.idx().store(idx.to_le(), Ordering::Release);
        if !R::OMIT_PRODUCER_FENCE {
            // Fences 1 and 3 of the module docs: orders the `idx` store
            // before the `flags` load. Pairs with the consumer's fence in
            // `prepare_sleep`: either it sees our `idx`, or we see its
            // NEED_WAKEUP.
            fence(Ordering::SeqCst);
        }
        // Relaxed: the fence above orders it.
        let flags = u16::from_le(self.cell.flags().load(Ordering::Relaxed));
        self.flags = flags;
        if flags & NEED_WAKEUP != 0 {
            Wake::Owed
        } else {
            Wake::NotOwed
        }
    }

    /// The last index published.
    pub fn idx(&self) -> u16 {
        self.idx
    }

    /// Whether THROTTLE was set in the consumer's `flags` as last loaded
    /// (by [`Self::publish`] or [`Self::load_throttle`]): the device asks
    /// for no more buffers for now (D1). Always false on the CQ, whose
    /// bit 1 is reserved.
    pub fn throttle(&self) -> bool {
        R::THROTTLE && self.flags & THROTTLE != 0
    }

    /// Loads the consumer's `flags` again and says whether THROTTLE is
    /// set: a driver that holds buffers back calls this after it consumed
    /// used buffers (D2). The caller's Acquire load of the used index (or
    /// `cq.idx`) orders this load after it, so a clear the device made
    /// before publishing those buffers (T2) is seen.
    pub fn load_throttle(&mut self) -> bool {
        // Relaxed: ordered by the caller's Acquire, as said above.
        self.flags = u16::from_le(self.cell.flags().load(Ordering::Relaxed));
        self.throttle()
    }
}

impl<C, R: Role> fmt::Debug for Producer<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("role", &R::NAME)
            .field("idx", &self.idx)
            .finish()
    }
}

/// The consuming side of a doorbell: the device poll thread on the SQ, the
/// driver poll thread on the CQ.
pub struct Consumer<C, R> {
    cell: C,
    seen: u16,
    /// THROTTLE if the consumer set it (SQ only), kept in every store of
    /// `flags`.
    throttle: u16,
    /// NEED_WAKEUP as this consumer last stored it (the producer may
    /// write anything into `flags`; it is never read back).
    need_wakeup: u16,
    _role: PhantomData<R>,
}

/// The SQ consumer: the device's poll thread.
pub type SqConsumer<C> = Consumer<C, Sq>;
/// The CQ consumer: the driver's poll thread.
pub type CqConsumer<C> = Consumer<C, Cq>;

impl<C: DoorbellCell, R: Role> Consumer<C, R> {
    /// Takes the consumer role on `cell`. `start` is the index the consumer
    /// considers already handled: the ring position it starts from. A
    /// doorbell holding any other value reads as new work, which at worst
    /// costs one empty look at the ring.
    pub fn new(cell: C, start: u16) -> Self {
        // Start awake: a stale NEED_WAKEUP from a previous owner would only
        // cost the producer needless notifications.
        // A stale THROTTLE goes with it (T5): this consumer has taken
        // nothing yet.
        cell.flags().store(0, Ordering::Relaxed);
        Consumer {
            cell,
            seen: start,
            throttle: 0,
            need_wakeup: 0,
            _role: PhantomData,
        }
    }

    /// Returns the doorbell's index if it changed since the last call.
    ///
    /// The caller then takes work from the ring itself and validates the
    /// value with [`check_index`](crate::check_index) against its ring
    /// position.
    pub fn poll(&mut self) -> Option<u16> {
        // Relaxed: return early on the common "nothing new" path without a
        // barrier; the Acquire fence below makes a new value's ring entries
        // visible.
        let idx = u16::from_le(self.cell.idx().load(Ordering::Relaxed));
        if idx == self.seen {
            return None;
        }
        // Pairs with the producer's Release store of `idx` in `publish`.
        fence(Ordering::Acquire);
        self.seen = idx;
        Some(idx)
    }

    /// Sets NEED_WAKEUP and re-checks the index: the last step before
    /// sleeping on the eventfd.
    pub fn prepare_sleep(&mut self) -> SleepCheck {
        self.ask_wakeup();
        match self.poll() {
            Some(idx) => {
                // Cleared so the producer stops notifying; a notification
                // it already decided on is harmless (a spurious wakeup).
                self.store_flags(0);
                SleepCheck::Work(idx)
            }
            None => SleepCheck::Sleep,
        }
    }

    /// Sets NEED_WAKEUP for good: for a queue whose consumer never polls
    /// but is served by its notifications alone (a device's control queue,
    /// a driver's interrupt-driven queue). The producer then notifies after
    /// every publication, as without doorbells. The caller looks at the
    /// ring once afterwards: a publication whose producer read the flag
    /// before it was set was not notified.
    pub fn park(&mut self) {
        self.ask_wakeup();
    }

    /// Sets NEED_WAKEUP and re-checks with `pending` instead of `idx`: the
    /// re-check of a packed virtqueue's consumer (spec section 10.2),
    /// which loads the flags of the descriptor at its own position, since
    /// a position in `idx` repeats every two laps of the ring. `pending`
    /// runs after the fence and says whether there is work; NEED_WAKEUP is
    /// then cleared again. Returns what `pending` said.
    pub fn prepare_sleep_on(&mut self, pending: impl FnOnce() -> bool) -> bool {
        self.ask_wakeup();
        if pending() {
            self.store_flags(0);
            return true;
        }
        false
    }

    /// NEED_WAKEUP, then fences 2 and 4 of the module docs: orders the
    /// store before the re-check that follows (of `idx`, or of the ring).
    /// Pairs with the producer's fence in `publish`.
    fn ask_wakeup(&mut self) {
        self.store_flags(NEED_WAKEUP);
        if !R::OMIT_CONSUMER_FENCE {
            fence(Ordering::SeqCst);
        }
    }

    /// Clears NEED_WAKEUP after the consumer woke up (or gave up sleeping).
    /// Producers stop notifying once they see it.
    pub fn finish_sleep(&mut self) {
        self.store_flags(0);
    }

    /// Sets or clears THROTTLE in `sq.flags`, keeping NEED_WAKEUP as it
    /// is; a no-op on the CQ (bit 1 of `cq.flags` is reserved) and when
    /// nothing changes.
    ///
    /// Set it only while buffers taken from the ring are outstanding
    /// (T1), and clear it before publishing the used index of the
    /// completions that let it go (T2): the publication's Release store
    /// orders this store before it.
    pub fn set_throttle(&mut self, on: bool) {
        let bit = if on && R::THROTTLE { THROTTLE } else { 0 };
        if bit == self.throttle {
            return;
        }
        self.throttle = bit;
        self.store_flags(self.need_wakeup);
    }

    /// Whether this consumer has THROTTLE set.
    pub fn throttled(&self) -> bool {
        self.throttle != 0
    }

    /// Stores `flags` with THROTTLE as this consumer has it: one 16-bit
    /// store of both bits (T4).
    fn store_flags(&mut self, need_wakeup: u16) {
        self.need_wakeup = need_wakeup;
        self.cell
            .flags()
            .store((need_wakeup | self.throttle).to_le(), Ordering::Relaxed);
    }

    /// The index last seen.
    pub fn seen(&self) -> u16 {
        self.seen
    }

    /// The consumer took work from the ring up to `idx` without reading
    /// the doorbell (a poller that watches the ring index itself while it
    /// spins, and reads the doorbell only in [`Self::prepare_sleep`]):
    /// `idx` is the value the re-check compares against from now on. Any
    /// other doorbell value reads as work there: a publication the
    /// consumer has not taken, or one it took before its producer stored
    /// the doorbell, which costs one more spin window, never a lost
    /// wakeup.
    pub fn acted_on(&mut self, idx: u16) {
        self.seen = idx;
    }
}

impl<C, R: Role> fmt::Debug for Consumer<C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("role", &R::NAME)
            .field("seen", &self.seen)
            .finish()
    }
}
