//! Which worker serves each request queue of a device: the one assigned
//! to it (`--queue-map`, or attached at run time like the multi-worker
//! seed's VHOST_ATTACH_VRING_WORKER), and the one running it now.
//!
//! Read and written on the control path only (a queue starting or
//! stopping, a management request), never per request.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::runtime::options::QueueMap;

/// No worker.
const NONE: usize = usize::MAX;

/// The workers of a device's request queues (request queue 0 is the
/// device's first request virtqueue).
#[derive(Debug)]
pub struct QueuePlacement {
    assigned: Box<[AtomicUsize]>,
    running: Box<[AtomicUsize]>,
}

// Relaxed throughout: a slot is a number read for a decision or a
// listing, and publishes no other data; the control thread that starts a
// queue, and the change lock of the registry, order what must be.
fn get(slot: Option<&AtomicUsize>) -> Option<usize> {
    slot.map(|s| s.load(Ordering::Relaxed))
        .filter(|&w| w != NONE)
}

impl QueuePlacement {
    /// `queues` request queues, assigned as `map` says (the others go
    /// round robin when they start).
    pub fn new(queues: usize, map: &QueueMap) -> Self {
        let slots = || (0..queues).map(|_| AtomicUsize::new(NONE)).collect();
        let p = QueuePlacement {
            assigned: slots(),
            running: slots(),
        };
        for &(rq, w) in &map.0 {
            p.assign(rq, Some(w));
        }
        p
    }

    /// Number of request queues.
    pub fn len(&self) -> usize {
        self.assigned.len()
    }

    /// Whether the device has no request queue.
    pub fn is_empty(&self) -> bool {
        self.assigned.is_empty()
    }

    /// The worker assigned to request queue `rq`, if any.
    pub fn assigned(&self, rq: u16) -> Option<usize> {
        get(self.assigned.get(usize::from(rq)))
    }

    /// Assigns request queue `rq` to `worker` (`None`: round robin);
    /// false if the device has no such queue.
    pub fn assign(&self, rq: u16, worker: Option<usize>) -> bool {
        match self.assigned.get(usize::from(rq)) {
            Some(s) => {
                s.store(worker.unwrap_or(NONE), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// The worker running request queue `rq` now.
    pub fn running(&self, rq: u16) -> Option<usize> {
        get(self.running.get(usize::from(rq)))
    }

    /// Records where request queue `rq` runs (`None`: stopped).
    pub fn set_running(&self, rq: u16, worker: Option<usize>) {
        if let Some(s) = self.running.get(usize::from(rq)) {
            s.store(worker.unwrap_or(NONE), Ordering::Relaxed);
        }
    }

    /// Whether worker `w` is assigned to, or runs, one of the queues.
    pub fn uses(&self, w: usize) -> bool {
        (0..self.len()).any(|rq| {
            let rq = u16::try_from(rq).unwrap_or(u16::MAX);
            self.assigned(rq) == Some(w) || self.running(rq) == Some(w)
        })
    }

    /// The explicit assignments, as a queue map.
    pub fn map(&self) -> QueueMap {
        QueueMap(
            (0..self.len())
                .filter_map(|rq| {
                    let rq = u16::try_from(rq).ok()?;
                    Some((rq, self.assigned(rq)?))
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_and_running_workers() {
        let p = QueuePlacement::new(4, &QueueMap(vec![(1, 3), (9, 0)]));
        assert_eq!(p.assigned(1), Some(3));
        assert_eq!(p.assigned(0), None);
        assert_eq!(p.map(), QueueMap(vec![(1, 3)]), "queue 9 does not exist");
        assert!(p.uses(3) && !p.uses(0));
        p.set_running(2, Some(0));
        assert!(p.uses(0));
        assert!(p.assign(1, None) && !p.assign(4, Some(1)));
        assert!(!p.uses(3));
        p.set_running(2, None);
        assert_eq!(p.running(2), None);
    }
}
