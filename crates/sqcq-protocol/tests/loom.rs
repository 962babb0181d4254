//! Model-checks the NEED_WAKEUP handshake with loom, in both directions.
//!
//! The real `handshake.rs` and `doorbell.rs` are compiled here against
//! loom's atomics: they reach atomics only through `crate::sync`, and this
//! test crate supplies that module. The eventfd is modelled as a counter
//! behind a mutex and condition variable, so a consumer that sleeps with
//! nobody left to wake it blocks forever and loom reports the deadlock.
//!
//! These tests pass as built. Built with
//! `RUSTFLAGS='--cfg sqcq_omit_fence="sq_producer"'` (or `sq_consumer`,
//! `cq_producer`, `cq_consumer`) one fence is gone and the test of that
//! direction must fail with a deadlock: `scripts/check-fences.sh` checks it.
//!
//! Ordering is expressed with `fence(SeqCst)` only, never with SeqCst
//! loads or stores: loom treats those as AcqRel and would report false
//! alarms.

#![allow(dead_code, missing_docs)]

mod sync {
    pub(crate) use loom::sync::atomic::{AtomicU16, Ordering, fence};
}
#[path = "../src/doorbell.rs"]
mod doorbell;
#[path = "../src/handshake.rs"]
mod handshake;

use doorbell::{Doorbell, DoorbellCell};
use handshake::{Consumer, Producer, Role, SleepCheck, Wake};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// A counting eventfd: `signal` adds one, `wait` blocks until non-zero and
/// resets the count, like `read(2)` on an eventfd without EFD_SEMAPHORE.
#[derive(Default)]
struct EventFd {
    count: Mutex<u64>,
    ready: Condvar,
}

impl EventFd {
    fn signal(&self) {
        *self.count.lock().unwrap() += 1;
        self.ready.notify_one();
    }

    fn wait(&self) {
        let mut count = self.count.lock().unwrap();
        while *count == 0 {
            count = self.ready.wait(count).unwrap();
        }
        *count = 0;
    }
}

/// A producer publishes `requests` indices; a consumer that sleeps whenever
/// it finds nothing must still see the last one.
fn producer_consumer<R: Role + 'static>(requests: u16) {
    loom::model(move || {
        let bell = Arc::new(Doorbell::new());
        let eventfd = Arc::new(EventFd::default());

        let producer = {
            let (bell, eventfd) = (Arc::clone(&bell), Arc::clone(&eventfd));
            thread::spawn(move || {
                let mut producer = Producer::<_, R>::new(&*bell);
                for idx in 1..=requests {
                    if producer.publish(idx) == Wake::Owed {
                        eventfd.signal();
                    }
                }
            })
        };

        let mut consumer = Consumer::<_, R>::new(&*bell, 0);
        let mut seen = 0;
        while seen != requests {
            if let Some(idx) = consumer.poll() {
                seen = idx;
                continue;
            }
            match consumer.prepare_sleep() {
                SleepCheck::Work(idx) => seen = idx,
                SleepCheck::Sleep => {
                    eventfd.wait();
                    consumer.finish_sleep();
                }
            }
        }
        producer.join().unwrap();
        assert_eq!(
            u16::from_le(bell.idx().load(sync::Ordering::Relaxed)),
            requests
        );
    });
}

#[test]
fn sq_handshake_never_loses_a_wakeup() {
    producer_consumer::<handshake::Sq>(2);
}

#[test]
fn cq_handshake_never_loses_a_wakeup() {
    producer_consumer::<handshake::Cq>(2);
}

/// Seeing a new doorbell index makes the ring entries published before it
/// visible: the Acquire fence in `poll` pairs with the Release store in
/// `publish`. Without it a consumer on a weakly ordered CPU could record
/// the new index, read the old ring index, and never look again.
#[test]
fn a_new_index_makes_earlier_ring_writes_visible() {
    loom::model(|| {
        let bell = Arc::new(Doorbell::new());
        let ring_idx = Arc::new(sync::AtomicU16::new(0));
        let producer = {
            let (bell, ring_idx) = (Arc::clone(&bell), Arc::clone(&ring_idx));
            thread::spawn(move || {
                ring_idx.store(1, sync::Ordering::Relaxed);
                let _ = Producer::<_, handshake::Sq>::new(&*bell).publish(1);
            })
        };
        let mut consumer = Consumer::<_, handshake::Sq>::new(&*bell, 0);
        if consumer.poll().is_some() {
            assert_eq!(ring_idx.load(sync::Ordering::Relaxed), 1);
        }
        producer.join().unwrap();
    });
}
