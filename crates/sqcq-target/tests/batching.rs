//! Batching under EVENT_IDX: K requests made available at once (one avail
//! index store, one kick) complete with one store of the used index and at
//! most one call. Publishes are the device's per-queue counter; calls are
//! both that counter and the call eventfd's value (each call adds 1).

// Test code: lengths and indices are small constants of the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use common::*;
use vm_memory::{Bytes, GuestAddress};

const K: u32 = 16;

/// The call eventfd's counter (calls since the last read), reset to 0.
fn take_calls(vq: &Vq) -> u64 {
    vq.call.read().unwrap_or(0)
}

/// Asks for a call once the used index passes what the driver has seen
/// (`used_event` = `last_used`, as Linux's virtqueue_enable_cb does).
fn want_call(vq: &Vq, g: &Guest) {
    let used_event = vq.avail + 4 + 2 * u64::from(vq.size);
    g.mem
        .write_obj(vq.last_used.to_le(), GuestAddress(used_event))
        .unwrap();
}

#[test]
fn a_batch_completes_with_one_publish_and_one_call() {
    let dir = TempDir::new("batching");
    let (daemon, socket) = start(&dir, 1);
    let mut g = Guest::new();
    let mut qs = vqs();
    let _fe = connect(&socket, &g, &mut qs, true);
    let rq = &mut qs[2];
    clear_unit_attention(rq, &mut g, 0);
    let stats = || {
        daemon.devices()[0]
            .shared()
            .info
            .metrics
            .queue(2)
            .and_then(|q| q.snapshot(0, 2))
            .map(|s| (s.completions, s.publishes, s.calls))
            .unwrap()
    };

    for round in 0..4 {
        let write = round % 2 == 0;
        let data = vec![round as u8; 4096];
        want_call(rq, &g);
        let _ = take_calls(rq);
        let (c0, p0, k0) = stats();
        let pending: Vec<Pending> = (0..K)
            .map(|i| {
                if write {
                    submit(rq, &mut g, lun_field(0, 0), &write10(i * 8, 8), &data, 0)
                } else {
                    submit(rq, &mut g, lun_field(0, 0), &read10(i * 8, 8), &[], 4096)
                }
            })
            .collect();
        // One avail index store, one kick, for all K.
        rq.kick(&g);
        for _ in &pending {
            rq.wait_used(&g);
        }
        for p in &pending {
            let r = read_resp(&g, p.resp);
            assert_eq!((r.response, r.status), (0, 0), "{r:?}");
        }
        let (c1, p1, k1) = stats();
        let calls = take_calls(rq);
        eprintln!(
            "round {round}: {} completions, {} used-index publishes, {} calls \
             (call eventfd counted {calls})",
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
    let _ = take_calls(rq);
    let (_, p0, k0) = stats();
    let pending: Vec<Pending> = (0..K)
        .map(|i| submit(rq, &mut g, lun_field(0, 0), &read10(i, 1), &[], 512))
        .collect();
    rq.kick(&g);
    for _ in &pending {
        rq.wait_used(&g);
    }
    let (_, p1, k1) = stats();
    assert_eq!((p1 - p0, k1 - k0, take_calls(rq)), (1, 0, 0));
    daemon.shutdown();
}
