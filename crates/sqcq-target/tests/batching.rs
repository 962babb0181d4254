//! Batching under EVENT_IDX: K requests made available at once (one avail
//! index store, at most one kick) complete with one store of the used
//! index and at most one call. Publishes are the device's per-queue
//! counter; calls are both that counter and the driver's count of the call
//! eventfd (each call adds 1). The driver polls its used ring and asks for
//! calls itself, so that whether one is due depends on nothing else.

mod common;

use common::driver::*;
use common::*;
use sqcq_driver::scsi::Cdb;

const K: u32 = 16;

#[test]
fn a_batch_completes_with_one_publish_and_one_call() {
    let dir = TempDir::new("batching");
    let (daemon, socket) = start(&dir, 1);
    let mut d = Driver::connect(&socket);
    let rq = &mut d.rqs[0];
    let stats = || {
        daemon
            .device(0)
            .unwrap()
            .info
            .metrics
            .queue(2)
            .and_then(|q| q.snapshot(0, 2))
            .map(|s| (s.completions, s.publishes, s.calls))
            .unwrap()
    };
    // The device counts a call after writing the eventfd (and a
    // completion after publishing it, before it decides on the call):
    // wait until its figures and the driver's agree before taking or
    // comparing them.
    let settle = |rq: &mut Rq| {
        let completions = u64::from(rq.queue.virtqueue().ring().last_used());
        wait_until("the device's and the driver's figures agree", || {
            let (c, _, k) = stats();
            c == completions && k == rq.queue.counters().calls
        });
    };
    rq.clear_unit_attention(0);

    for round in 0..4u8 {
        let write = round % 2 == 0;
        let data = vec![round; 4096];
        // A call once the used index passes what the driver has seen
        // (`used_event` = the last used index consumed, as Linux's
        // virtqueue_enable_cb does).
        settle(rq);
        assert!(!rq.queue.enable_interrupts(), "nothing in flight");
        let calls0 = rq.queue.counters().calls;
        let (c0, p0, k0) = stats();
        for i in 0..K {
            if write {
                rq.submit(lun_at(0, 0), Cdb::write_10(i * 8, 8, false), &data, 0);
            } else {
                rq.submit(lun_at(0, 0), Cdb::read_10(i * 8, 8, false), &[], 4096);
            }
        }
        // One avail index store for all K.
        let publishes = rq.queue.counters().publishes;
        rq.publish();
        assert_eq!(rq.queue.counters().publishes, publishes + 1);
        for r in rq.poll(K as usize) {
            assert!(r.good(), "{r:?}");
        }
        // The call is due: wait for it (it may come after the driver
        // has seen the used index, and after the device counted the
        // completions: both figures agreeing before it proves nothing).
        // A call that never comes fails here.
        wait_until("the call the driver asked for", || {
            rq.queue.counters().calls != calls0
        });
        settle(rq);
        let (c1, p1, k1) = stats();
        let calls = rq.queue.counters().calls - calls0;
        eprintln!(
            "round {round}: {} completions, {} used-index publishes, {} calls \
             (the driver counted {calls})",
            c1 - c0,
            p1 - p0,
            k1 - k0
        );
        assert_eq!(c1 - c0, u64::from(K));
        assert_eq!(p1 - p0, 1, "one used-index publish for the batch");
        assert_eq!(k1 - k0, 1, "one call for the batch");
        assert_eq!(calls, 1, "the call eventfd was written once");
    }

    // With `used_event` left behind (the driver does not want a call), a
    // batch completes with no call at all.
    settle(rq);
    let calls0 = rq.queue.counters().calls;
    let (_, p0, k0) = stats();
    for i in 0..K {
        rq.submit(lun_at(0, 0), Cdb::read_10(i, 1, false), &[], 512);
    }
    rq.publish();
    for r in rq.poll(K as usize) {
        assert!(r.good(), "{r:?}");
    }
    settle(rq);
    let (_, p1, k1) = stats();
    let calls = rq.queue.counters().calls - calls0;
    assert_eq!((p1 - p0, k1 - k0, calls), (1, 0, 0));
    daemon.shutdown();
}
