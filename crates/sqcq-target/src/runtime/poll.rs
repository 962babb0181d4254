//! Poll mode: how one worker spins over the polled queues it serves and
//! when it may sleep (its options are [`crate::runtime::options::PollOptions`]).
//!
//! A request queue is polled when VIRTIO_F_SQCQ_POLL is negotiated (its SQ
//! doorbell is watched) or, with `--poll ring`, when it is not (its avail
//! index is watched with notifications disabled, standard virtio only).
//! Either way the queue owns a `sqcq_protocol::Poller` (see
//! [`crate::runtime::queue`]); this module is the part that concerns the whole
//! worker:
//!
//! - while any polled queue is within its spin window, the worker polls
//!   them all, pass after pass, with no system call while work flows. A
//!   pass that finds nothing counts toward a yield of the CPU (on 2 CPUs
//!   the driver thread that will ring the doorbell may be waiting for this
//!   very CPU), paced by the worker's [`Yielder`]: after 16 idle passes
//!   while yields hand the CPU to another thread, after up to 1024 while
//!   they find it free. A turn ends at a yield, or after [`BUSY_TURN_NS`];
//!   between turns the worker looks at its epoll set without blocking
//!   (commands, kicks of classic queues, backstore completions);
//! - once every polled queue's window has expired, each sets NEED_WAKEUP
//!   (or re-enables ring notifications) and re-checks; if one finds work,
//!   the others cancel their sleep and polling goes on; otherwise the
//!   worker sleeps in `epoll_wait` on the kick eventfds;
//! - whatever wakes it, every queue clears NEED_WAKEUP and polls again.

use sqcq_protocol::Poll;
use sqcq_protocol::yielder::Yielder;

use crate::runtime::pass;
use crate::runtime::queue::ServedQueue;

/// How long a turn of polling goes on at most before the worker looks
/// at its epoll set (one `epoll_wait` with no timeout) and takes the
/// next turn: the bound on how late a command, a classic queue's kick or
/// a backstore completion is seen while polled queues keep it busy.
pub const BUSY_TURN_NS: u64 = 50_000;

/// One turn of a worker's poll loop over its polled queues: clears
/// NEED_WAKEUP after a sleep, then polls them pass after pass, and when
/// every window has expired, tries to put every queue to sleep. Returns
/// when they all sleep (the worker then blocks in `epoll_wait`), after a
/// yield of the CPU (`yielder`), or after [`BUSY_TURN_NS`].
pub(crate) fn spin(queues: &mut [Option<ServedQueue>], yielder: &mut Yielder) {
    let mut any = false;
    for q in queues.iter_mut().flatten().filter(|q| q.is_polled()) {
        // Woken from epoll, or still polling: either way poll again, on
        // doorbells rebuilt if the memory table changed meanwhile.
        q.poll_wake();
        any = true;
    }
    if !any {
        return;
    }
    let start = pass::now();
    loop {
        // Each poll pass is a pass of the worker (`pass`): what it takes
        // and completes carries this time.
        let now = pass::begin();
        let mut expired = true;
        let mut found = false;
        for q in queues.iter_mut().flatten().filter(|q| q.is_polled()) {
            match q.poll_once(now) {
                Poll::Work(_) => {
                    found = true;
                    expired = false;
                }
                Poll::Idle => expired = false,
                Poll::Expired => {}
            }
        }
        if expired && sleep_all(queues, now) {
            // The worker sleeps: the queues' poll figures are brought up
            // to date for whoever reads them before the next statistics
            // tick (a scrape). Not earlier: a sleep prepared can still be
            // cancelled, which takes its count back.
            for q in queues.iter_mut().flatten().filter(|q| q.is_polled()) {
                q.flush_poll_figures();
            }
            return;
        }
        if found {
            yielder.busy();
        } else if yielder.idle() {
            return;
        }
        if now.wrapping_sub(start) >= BUSY_TURN_NS {
            return;
        }
    }
}

/// Every polled queue asks for a notification and re-checks. Returns
/// whether all of them may sleep; if one found work (and processed it),
/// the ones already prepared cancel their sleep.
fn sleep_all(queues: &mut [Option<ServedQueue>], now: u64) -> bool {
    let mut found = false;
    for q in queues.iter_mut().flatten().filter(|q| q.is_polled()) {
        if !q.poll_prepare_sleep(now) {
            found = true;
            break;
        }
    }
    if found {
        for q in queues.iter_mut().flatten() {
            q.poll_cancel_sleep();
        }
    }
    !found
}
