//! The virtqueue runtime: what serves a request virtqueue whatever the
//! device behind it. A pool of worker threads (`worker`) owns the served
//! queues (`queue`): the split ring (`split`; virtio-queue is its test
//! oracle), checked descriptor chains (`chain`) over guest memory
//! (`guest`) accessed through one per-pass value (`batch`) as byte
//! streams (`stream`), used-ring
//! batching (`used`) and batch gathering (`gather`), the kick, ring-poll and SQ-doorbell sources with
//! the workers' spin loop (`poll`, `ring_poll`), eventfds that never
//! block (`eventfd`, `stall`), CPU binding (`cpu`), the measured wakeup
//! cost that bounds `--poll auto`'s spinning (`wakeup`), which worker serves
//! which queue ([`placement`]), and the figures ([`metrics`], `latency`,
//! `stats`, `ratelimit`) with the worker's pass clock that times requests
//! (`pass`).

pub(crate) mod backstore;
pub(crate) mod batch;
pub(crate) mod chain;
pub(crate) mod cpu;
pub(crate) mod eventfd;
pub mod events;
pub(crate) mod gather;
pub(crate) mod guest;
pub mod latency;
pub mod lun_stats;
pub mod metrics;
pub(crate) mod options;
pub(crate) mod packed;
pub(crate) mod pass;
pub(crate) mod pins;
pub mod placement;
pub(crate) mod poll;
pub mod qos;
pub(crate) mod queue;
pub(crate) mod ratelimit;
pub(crate) mod ring;
pub(crate) mod ring_poll;
pub mod shared_memory;
pub(crate) mod split;
pub(crate) mod stage_clock;
pub(crate) mod stall;
pub(crate) mod stats;
pub(crate) mod stoppable;
pub(crate) mod stream;
pub(crate) mod tracking;
pub(crate) mod used;
pub(crate) mod wakeup;
pub(crate) mod worker;

/// An error with its causes, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s.replace('\n', " ")
}
