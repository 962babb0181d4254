//! The virtio-scsi side of a request queue: its [`RequestHandler`].
//!
//! A [`ScsiQueue`] holds what a request queue needs to turn chains into
//! SCSI commands and back: the I_T nexus of the connection, the LUN
//! snapshot it serves with one backstore queue per LUN, the requests in
//! flight, and scratch buffers for everything answered without the
//! backstore. The runtime owns the ring; this owns nothing of it.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqcq_backstore::{Backstore, BackstoreQueue, IoOp};
use sqcq_scsi::NexusId;
use tracing::{debug, warn};

use crate::runtime::backstore;
use crate::runtime::batch::Batch;
use crate::runtime::chain::ChainBuffers;
use crate::runtime::lun_stats::LunSlot;
use crate::runtime::pass;
use crate::runtime::qos::Qos;
use crate::runtime::queue::{
    MakeHandler, QueueError, QueueKey, RequestHandler, RingConfig, Vring, drain_fd, segment_limit,
    wait_readable,
};
use crate::scsi::device::ScsiDevice;
use crate::scsi::inflight::Inflight;
use crate::scsi::target::Target;

/// One LUN's backstore queue on this worker.
pub(crate) struct LunQueue {
    /// The LUN, and the backstore the queue was opened on (a LUN removed
    /// and added again is a different backstore).
    pub(crate) lun: u16,
    pub(crate) backstore: Arc<dyn Backstore>,
    pub(crate) io: Box<dyn BackstoreQueue>,
    /// What `io` has queued and not sent.
    pub(crate) pending: backstore::Pending,
    /// This queue's counts of the LUN's I/O.
    pub(crate) stats: Arc<LunSlot>,
    /// The LUN's IOPS and bandwidth limits.
    pub(crate) qos: Arc<Qos>,
}

/// A read, write or flush taken from the ring whose LUN's limit holds it:
/// its slot is ready, its backstore operation goes out once the limit
/// lets it (`ScsiQueue::release_held`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub(crate) head: u16,
    pub(crate) lun: u16,
    pub(crate) op: IoOp,
    /// Its bytes, charged when it goes.
    pub(crate) bytes: u64,
}

/// The SCSI request handler of one request queue.
pub struct ScsiQueue {
    pub(crate) nexus: NexusId,
    pub(crate) sense_size: usize,
    /// This queue's LUN snapshot (see [`crate::scsi::hotplug`]): `luns[i]`
    /// is the backstore queue of `target.luns()[i]`; queues of removed
    /// LUNs with requests in flight follow.
    pub(crate) target: Arc<Target>,
    /// The device, whose LUN table a refresh reads.
    dev: Arc<ScsiDevice>,
    pub(crate) luns: Vec<LunQueue>,
    pub(crate) inflight: Inflight,
    /// Heads of requests whose next slice goes out on the next pass.
    pub(crate) resume: Vec<u16>,
    /// Requests their LUN's limit holds, in the order they came.
    pub(crate) held: VecDeque<Held>,
    /// A drain began while requests were held: they go at once.
    pub(crate) held_flush: bool,
    pub(crate) chain: ChainBuffers,
    pub(crate) max_segments: usize,
    pub(crate) header: Vec<u8>,
    pub(crate) data_out: Vec<u8>,
    pub(crate) data_in: Vec<u8>,
}

/// How a worker builds the SCSI handler of a request queue of `dev`: with
/// the LUN snapshot current when the worker starts the queue (a change
/// handed to the workers after that reaches it as an update).
pub fn make_handler(
    dev: Arc<ScsiDevice>,
    nexus: NexusId,
    cdb_size: u32,
    sense_size: u32,
    seg_max: u32,
) -> MakeHandler {
    Box::new(move |key: QueueKey, ring: &RingConfig| {
        let sizes = (cdb_size, sense_size, seg_max);
        // Virtqueues 0 and 1 are the control and event queues.
        let rq = key.vq.saturating_sub(2);
        let queue = ScsiQueue::new(Arc::clone(&dev), nexus, sizes, (rq, ring))?;
        Ok(Box::new(queue) as Box<dyn RequestHandler>)
    })
}

impl std::fmt::Debug for ScsiQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScsiQueue")
            .field("nexus", &self.nexus)
            .field("luns", &self.luns.len())
            .field("in_flight", &self.inflight.len())
            .finish_non_exhaustive()
    }
}

impl ScsiQueue {
    /// A handler serving the current LUN snapshot of `dev` (one backstore
    /// queue per LUN, as deep as the ring) for `nexus`, with the
    /// connection's CDB and sense sizes and the configuration space's
    /// `seg_max`, for request queue `rq`.
    pub fn new(
        dev: Arc<ScsiDevice>,
        nexus: NexusId,
        (cdb_size, sense_size, seg_max): (u32, u32, u32),
        (rq, ring): (u16, &RingConfig),
    ) -> Result<Self, QueueError> {
        let target = dev.target.current();
        let mut luns = Vec::with_capacity(target.luns().len());
        for entry in target.luns() {
            let io = entry
                .backstore
                .open_queue(u32::from(ring.size))
                .map_err(|source| QueueError::Backstore {
                    lun: entry.lun,
                    source,
                })?;
            luns.push(LunQueue {
                lun: entry.lun,
                backstore: Arc::clone(&entry.backstore),
                io,
                pending: backstore::Pending::default(),
                stats: entry.stats.slot(rq),
                qos: Arc::clone(&entry.qos),
            });
        }
        let data_out_len = target
            .luns()
            .iter()
            .map(|e| e.unit.max_data_out_len())
            .max()
            .unwrap_or(0);
        // Request header, response, data-out and data-in segments.
        let max_segments = segment_limit(ring, seg_max, 2);
        let cdb_size = usize::try_from(cdb_size).unwrap_or(usize::MAX);
        Ok(ScsiQueue {
            nexus,
            sense_size: usize::try_from(sense_size).unwrap_or(usize::MAX),
            target,
            dev,
            luns,
            inflight: Inflight::new(ring.size),
            resume: Vec::with_capacity(usize::from(ring.size)),
            held: VecDeque::with_capacity(usize::from(ring.size)),
            held_flush: false,
            chain: ChainBuffers::with_capacity(max_segments.min(64)),
            max_segments,
            header: vec![0; sqcq_wire::scsi::CMD_REQ_FIXED + cdb_size],
            data_out: vec![0; data_out_len],
            data_in: vec![0; sqcq_scsi::DATA_IN_LEN],
        })
    }

    /// Whether a LUN's backstore refused a commit that waits to be tried
    /// again.
    fn retrying(&self) -> bool {
        self.luns.iter().any(|l| l.pending.retrying())
    }

    fn reap_all(&mut self, ring: &mut Vring, mem: Batch<'_>) {
        for lun in 0..self.luns.len() {
            self.reap(ring, lun, mem);
        }
    }
}

impl RequestHandler for ScsiQueue {
    fn handle(&mut self, ring: &mut Vring, mem: Batch<'_>, chain: crate::runtime::ring::Chain<'_>) {
        self.handle_chain(ring, mem, chain);
    }

    fn commit(&mut self, ring: &Vring) {
        for l in &mut self.luns {
            backstore::commit(&mut l.pending, l.io.as_mut(), ring, l.lun);
        }
    }

    fn reap(&mut self, ring: &mut Vring, mem: Batch<'_>) {
        self.reap_all(ring, mem);
    }

    fn memory_changed(&mut self) {
        self.inflight.release_idle_maps();
    }

    fn completed(&mut self, ring: &mut Vring, mem: Batch<'_>, source: usize) {
        if let Some(fd) = self.luns.get(source).and_then(|l| l.io.completion_fd()) {
            drain_fd(fd);
        }
        self.reap(ring, source, mem);
    }

    fn completion_fds(&self) -> Vec<(usize, RawFd)> {
        self.luns
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.io.completion_fd().map(|fd| (i, fd)))
            .collect()
    }

    fn busy(&self) -> bool {
        !self.inflight.is_empty()
    }

    fn has_deferred(&self) -> bool {
        // The next slice of a long command, a request its LUN's limit
        // lets go now, or the retry of a commit the backstore refused.
        self.has_slices_pending()
            || self.held_ready(pass::now())
            || self.retrying() && {
                let now = Instant::now();
                self.luns.iter().any(|l| l.pending.retry_due(now))
            }
    }

    fn commit_retry_in(&self) -> Option<Duration> {
        if !self.retrying() {
            return None;
        }
        let now = Instant::now();
        self.luns
            .iter()
            .filter_map(|l| l.pending.retry_in(now))
            .min()
    }

    fn run_deferred(&mut self, ring: &mut Vring, mem: Batch<'_>) {
        self.resume_slices(ring, mem);
        self.release_held(ring, mem, false);
    }

    fn deferred_in(&self) -> Option<Duration> {
        let now = pass::now();
        (self.held.iter())
            .filter_map(|h| self.luns.iter().find(|l| l.lun == h.lun))
            .map(|l| l.qos.wait(now).unwrap_or(Duration::ZERO))
            .min()
    }

    fn begin_drain(&mut self) -> bool {
        // A task management function or a drain does not wait for a
        // LUN's limit: what it holds goes on the next pass.
        self.held_flush = !self.held.is_empty();
        self.inflight.begin_drain()
    }

    fn drained(&self) -> bool {
        self.inflight.drained()
    }

    fn steer_completions(&mut self, ring: &Vring, cpus: &[usize]) {
        let mut steered = false;
        for l in &mut self.luns {
            match l.io.steer_completions(cpus) {
                Ok(s) => steered |= s,
                Err(e) => warn!(
                    device = ring.device().id,
                    vq = ring.key().vq,
                    "cannot steer backstore completions: {e}"
                ),
            }
        }
        if steered {
            debug!(
                device = ring.device().id,
                vq = ring.key().vq,
                "backstore completion work on CPUs {cpus:?}"
            );
        }
    }

    fn finish(&mut self, ring: &mut Vring, mem: Batch<'_>, deadline: Instant) -> usize {
        // The queue stops: what a limit holds goes now.
        self.release_held(ring, mem, true);
        RequestHandler::commit(self, ring);
        while !self.inflight.is_empty() && Instant::now() < deadline {
            if self.has_slices_pending() {
                self.resume_slices(ring, mem);
            }
            // Sends the next slices, and retries a refused commit.
            RequestHandler::commit(self, ring);
            for lun in 0..self.luns.len() {
                if self.luns[lun].io.in_flight() == 0 {
                    continue;
                }
                if let Some(fd) = self.luns[lun].io.completion_fd() {
                    wait_readable(fd, 10);
                    drain_fd(fd);
                }
                self.reap(ring, lun, mem);
            }
        }
        usize::try_from(self.inflight.len()).unwrap_or(usize::MAX)
    }

    fn cancel(&mut self, ring: &Vring) {
        for l in &mut self.luns {
            if let Err(e) = l.io.cancel() {
                warn!(
                    device = ring.device().id,
                    vq = ring.key().vq,
                    lun = l.lun,
                    "cannot cancel backstore requests: {e}"
                );
            }
        }
    }

    fn refresh(&mut self, ring: &Vring) -> Result<(), QueueError> {
        let target = self.dev.target.current();
        self.set_target(ring, &target)
    }
}
