//! Gathering a batch: when the device finds only a few new requests on a
//! queue, it looks at the avail index again a moment later, and goes on
//! looking while the driver is still making requests available, before it
//! takes them all as one batch.
//!
//! Why: a driver that publishes each request as soon as it is written
//! (SPDK's virtio initiator, Linux, `sqcq-bench --iodepth_batch_submit 1`)
//! refills its queue after a round of completions as a burst of single
//! publications in quick succession. A device that takes each one the
//! moment it appears reads the descriptors of request k while the driver
//! writes those of request k+1 into the same cache lines (its free list
//! hands out neighbouring descriptors), and publishes a used index for
//! every one or two requests: the lines go back and forth once per
//! request, and both sides slow down together. Gathering while the index
//! moves ends that, and leaves drivers that do not share lines between
//! requests as they were (docs/benchmarks.md, "Target: gathering a
//! batch"). A driver that publishes a whole batch at once is not
//! affected: a look finds nothing more and the batch is taken as it is.
//!
//! A look that finds nothing new costs a request [`LOOK_NS`] of latency.
//! So that a queue at depth 1, where no look can ever find more, does not
//! pay it each time, a fruitless look makes the next one wait for as many
//! batches as the one before it waited, doubled (up to [`MAX_BACKOFF`]);
//! a fruitful one starts over.

/// Gathering is tried only when a poll found fewer requests than this:
/// more are a batch already.
pub const GATHER_BELOW: u16 = 8;
/// How long the device waits between two looks at the avail index.
pub const LOOK_NS: u64 = 50;
/// The longest a batch is gathered for.
pub const MAX_GATHER_NS: u64 = 2_000;
/// Gathering stops once this many requests are waiting: enough to take
/// the back-and-forth out of a burst, few enough that the device starts on
/// them while the driver still writes the rest (a driver whose requests
/// do not share lines only loses by a longer wait: docs/benchmarks.md,
/// "Target: gathering a batch").
pub const GATHER_UPTO: u16 = 8;
/// The most batches taken as found after fruitless looks.
pub const MAX_BACKOFF: u16 = 64;

/// A queue's gathering state.
#[derive(Debug)]
pub(crate) struct Gather {
    /// Batches still to be taken as found, without a look.
    skip: u16,
    /// What `skip` becomes after the next fruitless look.
    backoff: u16,
}

impl Default for Gather {
    fn default() -> Self {
        Gather {
            skip: 0,
            backoff: 1,
        }
    }
}

impl Gather {
    /// The avail index up to which to take requests, given that the ones
    /// from `next` to `avail` are there: `avail`, or a later index that
    /// `look` (a fresh read of the avail index; `None` if it cannot be
    /// read) returned while the driver kept publishing. `clock` reads the
    /// time in nanoseconds. The caller checks the index it gets as any
    /// other: a look returns what the driver wrote, hostile or not, and
    /// gathering stops at the first index that is not a few requests more.
    pub(crate) fn extend(
        &mut self,
        next: u16,
        avail: u16,
        mut look: impl FnMut() -> Option<u16>,
        mut clock: impl FnMut() -> u64,
    ) -> u16 {
        if avail.wrapping_sub(next) >= GATHER_BELOW {
            return avail;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return avail;
        }
        let start = clock();
        let mut avail = avail;
        let mut grew = false;
        loop {
            let due = clock().saturating_add(LOOK_NS);
            while clock() < due {
                std::hint::spin_loop();
            }
            let Some(idx) = look() else { break };
            if idx == avail {
                break;
            }
            grew = true;
            avail = idx;
            if idx.wrapping_sub(next) >= GATHER_UPTO
                || clock().saturating_sub(start) >= MAX_GATHER_NS
            {
                break;
            }
        }
        if grew {
            self.backoff = 1;
        } else {
            self.skip = self.backoff;
            self.backoff = self.backoff.saturating_mul(2).min(MAX_BACKOFF);
        }
        avail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A clock that moves `step` ns at every reading.
    fn clock(step: u64) -> impl FnMut() -> u64 {
        let t = Cell::new(0u64);
        move || {
            t.set(t.get() + step);
            t.get()
        }
    }

    /// Gathers from `next..avail` with `look`, returning the index and
    /// how many looks were made.
    fn gather(
        g: &mut Gather,
        next: u16,
        avail: u16,
        mut look: impl FnMut() -> Option<u16>,
        step: u64,
    ) -> (u16, usize) {
        let looks = Cell::new(0);
        let idx = g.extend(
            next,
            avail,
            || {
                looks.set(looks.get() + 1);
                look()
            },
            clock(step),
        );
        (idx, looks.get())
    }

    #[test]
    fn a_batch_found_whole_is_taken_without_a_look() {
        let mut g = Gather::default();
        let got = gather(&mut g, 10, 10 + GATHER_BELOW, || panic!("looked"), 10);
        assert_eq!(got, (10 + GATHER_BELOW, 0));
    }

    #[test]
    fn looks_go_on_while_the_driver_publishes_and_stop_when_it_stops() {
        let mut g = Gather::default();
        let mut seen = [3u16, 5, 7, 7].into_iter();
        assert_eq!(gather(&mut g, 0, 1, || seen.next(), 10), (7, 4));
        assert_eq!(seen.next(), None, "every index was looked at");
    }

    #[test]
    fn gathering_stops_at_its_count_or_its_time() {
        let mut g = Gather::default();
        let mut idx = 0u16;
        let more = || {
            idx += 3;
            Some(idx)
        };
        let (avail, _) = gather(&mut g, 0, 1, more, 1);
        assert!((GATHER_UPTO..GATHER_UPTO + 3).contains(&avail), "{avail}");
        let mut g = Gather::default();
        let mut idx = 1u16;
        let one_more = || {
            idx += 1;
            Some(idx)
        };
        // At 1 us a reading, the time is up after the first look, which
        // found one more.
        let (avail, looks) = gather(&mut g, 0, 1, one_more, 1_000);
        assert_eq!((avail, looks), (2, 1), "{avail} after {looks} looks");
    }

    #[test]
    fn a_hostile_index_ends_the_gathering_for_the_caller_to_check() {
        let mut g = Gather::default();
        let (avail, looks) = gather(&mut g, 0, 1, || Some(0x8000), 10);
        assert_eq!(
            (avail, looks),
            (0x8000, 1),
            "returned as read: the caller refuses it"
        );
        let mut g = Gather::default();
        assert_eq!(gather(&mut g, 0, 1, || None, 10), (1, 1), "unreadable");
    }

    #[test]
    fn fruitless_looks_back_off_and_a_fruitful_one_starts_over() {
        let mut g = Gather::default();
        let looked: Vec<bool> = (0..200)
            .map(|_| gather(&mut g, 0, 1, || Some(1), 10).1 > 0)
            .collect();
        // Looks at batches 0, 2, 5, 10, 19, 36, ... then every 65th.
        let at: Vec<usize> = (0..200).filter(|&i| looked[i]).collect();
        assert_eq!(at[..6], [0, 2, 5, 10, 19, 36]);
        let gaps: Vec<usize> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(*gaps.last().unwrap(), usize::from(MAX_BACKOFF) + 1);
        // A fruitful look: the next small batch is looked at again.
        let mut g = Gather::default();
        gather(&mut g, 0, 1, || Some(1), 10);
        assert_eq!(gather(&mut g, 0, 1, || Some(1), 10).1, 0, "skipped");
        let mut more = [2u16, 2].into_iter();
        assert_eq!(gather(&mut g, 0, 1, || more.next(), 10), (2, 2));
        assert_eq!(
            gather(&mut g, 0, 1, || Some(1), 10).1,
            1,
            "looked again at once"
        );
    }
}
