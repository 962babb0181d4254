//! The control queue (task management, asynchronous notification) and the
//! event queue (hot plug and parameter change events).
//!
//! Both run on the device's control thread rather than on a worker: their
//! traffic is rare and latency-insensitive, and what they do needs the
//! state that thread owns (which worker serves which queue, the LUNs, the
//! nexus, the negotiated features). A task management function waits for
//! the workers to drain the device's requests; doing that on a worker
//! would stall that worker's other queues, on the control thread it only
//! delays the next vhost-user message.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use sqcq_protocol::{CqProducer, DoorbellLocation, SqConsumer, Wake, guest_doorbells};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use crate::guest_warn;
use crate::runtime::batch::{Batch, Mapped};
use crate::runtime::chain::ChainBuffers;
use crate::runtime::eventfd::{PeerEventFd, Signal};
use crate::runtime::guest::GuestMem;
use crate::runtime::metrics::DeviceMetrics;
use crate::runtime::queue::{PollError, QueueError, RingConfig};
use crate::runtime::ring::Ring;
use crate::runtime::split::RingError;
use crate::runtime::stream;
use crate::scsi::device::ScsiSession;
use crate::transport::device_type::{LocalQueueFds, SessionCtx};
use sqcq_wire::scsi::{
    AN_REQ_SIZE, AnReq, CTRL_AN_QUERY, CTRL_AN_SUBSCRIBE, CTRL_TMF, EVENT_INFO_SIZE, EVENT_SIZE,
    EVT_EVENTS_MISSED, EVT_PARAM_CHANGE, EVT_TRANSPORT_RESET, Event, Lun, Response, TMF_REQ_SIZE,
    Tmf, TmfReq, VIRTIO_SCSI_F_CHANGE, VIRTIO_SCSI_F_HOTPLUG, ctrl_type, encode_an_resp,
};

/// Index of the control queue.
pub const CONTROL_VQ: usize = 0;
/// Index of the event queue.
pub const EVENT_VQ: usize = 1;

/// epoll token of the control queue's kick eventfd on the control thread.
pub const CONTROL_KICK_TOKEN: u64 = 100;
/// epoll token of the event queue's kick eventfd.
pub const EVENT_KICK_TOKEN: u64 = 101;

/// Events kept while the driver has no event buffer; more are dropped and
/// the next event delivered carries VIRTIO_SCSI_T_EVENTS_MISSED.
const MAX_PENDING_EVENTS: usize = 64;

/// Control requests served per pass of the control thread.
const CONTROL_BUDGET: u32 = 16;

struct CtrlQueue {
    ring: Ring,
    kick: PeerEventFd,
    call: Option<PeerEventFd>,
    /// A notification fell due while there was no call eventfd (see
    /// `ServedQueue`): sent when one arrives.
    call_owed: bool,
    /// The ring was found corrupt: not served until the driver resets it.
    broken: bool,
    /// Where the doorbells are, with VIRTIO_F_SQCQ_POLL.
    doorbells: Option<DoorbellLocation>,
}

/// The control and event queues of one connection.
pub struct ControlPlane {
    epoll: Epoll,
    queues: [Option<CtrlQueue>; 2],
    pending: VecDeque<Event>,
    missed: bool,
    chain: ChainBuffers,
    /// The control queue has requests left over from the last pass.
    pub(crate) more: bool,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("pending_events", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Control queues with their own epoll set for their kicks (the
    /// control thread watches that set's descriptor, [`Self::epoll_fd`]).
    pub fn new() -> std::io::Result<Self> {
        Ok(ControlPlane {
            epoll: Epoll::new()?,
            queues: [None, None],
            pending: VecDeque::new(),
            missed: false,
            chain: ChainBuffers::with_capacity(8),
            more: false,
        })
    }

    /// The epoll set of the kicks, readable when one fired.
    pub fn epoll_fd(&self) -> std::os::fd::RawFd {
        self.epoll.as_raw_fd()
    }

    /// The vqs (0, 1) whose kick fired.
    pub fn fired(&self) -> [bool; 2] {
        let mut events = [EpollEvent::default(); 2];
        let n = self.epoll.wait(0, &mut events).unwrap_or(0);
        let mut fired = [false; 2];
        for e in &events[..n] {
            let vq = match e.data() {
                CONTROL_KICK_TOKEN => CONTROL_VQ,
                EVENT_KICK_TOKEN => EVENT_VQ,
                _ => continue,
            };
            if e.event_set()
                .intersects(EventSet::HANG_UP | EventSet::ERROR)
            {
                // Level-triggered and never cleared: stop watching it (an
                // eventfd never does this; the queue is then served only
                // when it starts or an event is reported).
                if let Some(q) = &self.queues[vq] {
                    let _ = self.epoll.ctl(
                        ControlOperation::Delete,
                        q.kick.as_raw_fd(),
                        EpollEvent::default(),
                    );
                }
                continue;
            }
            fired[vq] = true;
        }
        fired
    }

    /// Starts vq `index` (0 or 1).
    ///
    /// With VIRTIO_F_SQCQ_POLL (`doorbells`) the queue has doorbells like
    /// every other: it is served by its kicks alone, so NEED_WAKEUP is set
    /// in its SQ doorbell for good (a driver that follows the protocol
    /// then kicks for every request), and a completion is signalled when
    /// the standard rules or the driver's CQ NEED_WAKEUP ask for it.
    pub(crate) fn start(
        &mut self,
        index: usize,
        ring: &RingConfig,
        mem: &Arc<GuestMem>,
        fds: LocalQueueFds,
        doorbells: bool,
    ) -> Result<(), QueueError> {
        let vq =
            Ring::open(ring, Mapped::new(Arc::clone(mem)).batch()).map_err(QueueError::Ring)?;
        let doorbells = if doorbells {
            let location = ring
                .doorbell_location()
                .map_err(|e| QueueError::Doorbells(PollError::Layout(e)))?;
            let (sq, _) = guest_doorbells(mem, location)
                .map_err(|e| QueueError::Doorbells(PollError::Memory(e)))?;
            // The queue is looked at once right after it starts
            // (`ScsiSession::start_control_queue`), which covers requests
            // published before.
            SqConsumer::new(sq, ring.next_avail).park();
            Some(location)
        } else {
            None
        };
        let LocalQueueFds { kick, call } = fds;
        let token = if index == CONTROL_VQ {
            CONTROL_KICK_TOKEN
        } else {
            EVENT_KICK_TOKEN
        };
        let _ = self.epoll.ctl(
            ControlOperation::Add,
            kick.as_raw_fd(),
            EpollEvent::new(EventSet::IN, token),
        );
        self.queues[index] = Some(CtrlQueue {
            ring: vq,
            kick,
            call,
            call_owed: false,
            broken: false,
            doorbells,
        });
        Ok(())
    }

    /// Stops vq `index`; returns where it stopped.
    pub(crate) fn stop(&mut self, index: usize) -> Option<u32> {
        let q = self.queues.get_mut(index)?.take()?;
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            q.kick.as_raw_fd(),
            EpollEvent::default(),
        );
        Some(q.ring.base())
    }

    pub(crate) fn set_call(&mut self, index: usize, call: Option<PeerEventFd>) {
        if let Some(q) = self.queues.get_mut(index).and_then(Option::as_mut) {
            q.call = call;
            if std::mem::take(&mut q.call_owed) {
                signal(q);
            }
        }
    }

    pub(crate) fn reset(&mut self) {
        self.stop(CONTROL_VQ);
        self.stop(EVENT_VQ);
        self.pending.clear();
        self.missed = false;
    }

    /// Queues an event for the driver.
    pub(crate) fn push_event(&mut self, event: Event) {
        if self.pending.len() >= MAX_PENDING_EVENTS {
            self.missed = true;
        } else {
            self.pending.push_back(event);
        }
    }
}

/// Publishes the used ring and calls the driver if it asked. The call
/// never blocks; a saturated counter already holds a notification, and a
/// call descriptor that fails otherwise is dropped (the queue goes on, the
/// driver polls or times out: control traffic is rare).
fn publish(q: &mut CtrlQueue, mem: Batch<'_>) {
    let published = q.ring.pending() > 0;
    let standard = matches!(q.ring.publish(mem), Ok(true));
    // With doorbells: publish cq.idx too; fence 3 is inside `publish`.
    let owed = published
        && q.doorbells
            .and_then(|location| guest_doorbells(mem.map(), location).ok())
            .is_some_and(|(_, cq)| CqProducer::new(cq).publish(q.ring.next_used()) == Wake::Owed);
    if standard || owed {
        signal(q);
    }
}

/// Signals the call eventfd, or remembers the notification until there is
/// one.
fn signal(q: &mut CtrlQueue) {
    match &q.call {
        None => q.call_owed = true,
        Some(call) => {
            if let Signal::Failed(_) | Signal::Stalled = call.signal() {
                q.call = None;
            }
        }
    }
}

impl ScsiSession {
    /// Starts the control (0) or event (1) queue and serves what is
    /// already there.
    pub(crate) fn start_control_queue(
        &mut self,
        ctx: &SessionCtx<'_>,
        index: usize,
        ring: &RingConfig,
        fds: LocalQueueFds,
    ) -> Result<(), QueueError> {
        self.control.start(
            index,
            ring,
            &ctx.mem.memory().into_inner(),
            fds,
            ctx.has_feature(sqcq_protocol::VIRTIO_F_SQCQ_POLL),
        )?;
        self.service_control(ctx, index);
        Ok(())
    }

    /// Serves the queues whose kick fired, and control requests left
    /// from the last pass.
    pub(crate) fn service_control_queues(&mut self, ctx: &SessionCtx<'_>) {
        let fired = self.control.fired();
        if fired[CONTROL_VQ] || self.control.more {
            self.service_control(ctx, CONTROL_VQ);
        }
        if fired[EVENT_VQ] {
            self.service_control(ctx, EVENT_VQ);
        }
    }

    /// The kick of vq `index` fired (or the vq just started): serve it.
    fn service_control(&mut self, ctx: &SessionCtx<'_>, index: usize) {
        if let Some(q) = self.control.queues.get(index).and_then(Option::as_ref) {
            let _ = q.kick.drain();
        }
        match index {
            CONTROL_VQ => self.process_control(ctx),
            EVENT_VQ => self.deliver_events(ctx),
            _ => {}
        }
    }

    /// Reports `event` to the driver if it negotiated the feature the event
    /// belongs to (HOTPLUG for transport resets, CHANGE for parameter
    /// changes).
    pub(crate) fn report_event(&mut self, ctx: &SessionCtx<'_>, lun: u16, event: u32, reason: u32) {
        let needed = match event {
            EVT_TRANSPORT_RESET => VIRTIO_SCSI_F_HOTPLUG,
            EVT_PARAM_CHANGE => VIRTIO_SCSI_F_CHANGE,
            _ => return,
        };
        if !ctx.has_feature(needed) {
            return;
        }
        self.control.push_event(Event {
            event,
            lun: Lun::new(0, lun),
            reason,
        });
        self.deliver_events(ctx);
    }

    fn deliver_events(&mut self, ctx: &SessionCtx<'_>) {
        let mapped = Mapped::new(ctx.mem.memory().into_inner());
        let mem = mapped.batch();
        let Some(q) = self.control.queues[EVENT_VQ].as_mut().filter(|q| !q.broken) else {
            return;
        };
        while let Some(mut event) = self.control.pending.front().copied() {
            let chain = match q.ring.pop(mem) {
                Ok(chain) => chain,
                Err(e) => {
                    q.broken = true;
                    DeviceMetrics::bump(&self.info.metrics.broken_rings);
                    guest_warn!(
                        self.info.limiter,
                        device = self.info.id,
                        "event queue: {e}: stopped, device needs reset"
                    );
                    break;
                }
            };
            let Some(chain) = chain else { break };
            let head = chain.head_index();
            let ok = chain.parse(mem, 4, &mut self.control.chain).is_ok()
                && self.control.chain.writable_len >= EVENT_SIZE as u64;
            let mut len = 0;
            if ok {
                if self.control.missed {
                    event.event |= EVT_EVENTS_MISSED;
                }
                if stream::write_at(mem, &self.control.chain.writable, 0, &event.encode()).is_ok() {
                    self.control.pending.pop_front();
                    self.control.missed = false;
                    len = EVENT_INFO_SIZE;
                }
            } else {
                DeviceMetrics::bump(&self.info.metrics.bad_control);
                guest_warn!(
                    self.info.limiter,
                    device = self.info.id,
                    "bad event buffer at head {head}"
                );
            }
            let _ = q.ring.push(mem, head, len);
        }
        publish(q, mem);
    }

    /// Serves up to [`CONTROL_BUDGET`] control requests; leaves
    /// `control.more` set when requests are left, for the control thread
    /// to come back after its other events (a guest that keeps the queue
    /// full cannot hold the thread, or SIGTERM, for good).
    fn process_control(&mut self, ctx: &SessionCtx<'_>) {
        let mapped = Mapped::new(ctx.mem.memory().into_inner());
        let mem = mapped.batch();
        let mut budget = CONTROL_BUDGET;
        self.control.more = false;
        loop {
            let Some(q) = self.control.queues[CONTROL_VQ].as_mut() else {
                return;
            };
            if q.broken {
                return;
            }
            if budget == 0 {
                // Back to the ring later: what is left stays available.
                self.control.more = q.ring.has_available(mem).unwrap_or(false);
                publish(q, mem);
                return;
            }
            let chain = match q.ring.pop(mem) {
                Ok(chain) => chain,
                Err(e) => {
                    // Stop serving it: every later pass would find the
                    // same (a reset gives the driver a new ring).
                    self.control_broken(&e);
                    return;
                }
            };
            let Some(chain) = chain else {
                publish(q, mem);
                // Re-enable notifications; a request that came meanwhile is
                // served now, as it may not be kicked.
                match q.ring.enable_notification(mem) {
                    Ok(true) => continue,
                    Ok(false) | Err(_) => return,
                }
            };
            budget -= 1;
            let head = chain.head_index();
            let parsed = chain.parse(mem, 8, &mut self.control.chain);
            let len = match parsed {
                Ok(()) => self.control_request(ctx, mem),
                Err(e) => {
                    DeviceMetrics::bump(&self.info.metrics.bad_control);
                    guest_warn!(
                        self.info.limiter,
                        device = self.info.id,
                        "bad control chain: {e}"
                    );
                    self.control_response(mem, &[Response::Failure.to_byte()])
                }
            };
            if let Some(q) = self.control.queues[CONTROL_VQ].as_mut() {
                let _ = q.ring.push(mem, head, len);
            }
        }
    }

    /// The control queue's ring is corrupt: it is not served again until
    /// the driver resets it.
    fn control_broken(&mut self, e: &RingError) {
        if let Some(q) = self.control.queues[CONTROL_VQ].as_mut() {
            q.broken = true;
        }
        DeviceMetrics::bump(&self.info.metrics.broken_rings);
        guest_warn!(
            self.info.limiter,
            device = self.info.id,
            "control queue: {e}: stopped, device needs reset"
        );
    }

    fn control_response(&self, mem: Batch<'_>, bytes: &[u8]) -> u32 {
        let c = &self.control.chain;
        if c.writable_len >= bytes.len() as u64
            && stream::write_at(mem, &c.writable, 0, bytes).is_ok()
        {
            u32::try_from(bytes.len()).unwrap_or(0)
        } else {
            0
        }
    }

    /// Handles one control request; returns the used length.
    fn control_request(&mut self, ctx: &SessionCtx<'_>, mem: Batch<'_>) -> u32 {
        let readable = self.control.chain.readable.clone();
        let mut kind = [0u8; 4];
        if stream::read_at(mem, &readable, 0, &mut kind).is_err() {
            return self.bad_control(mem, "short control request");
        }
        match ctrl_type(&kind) {
            CTRL_TMF => {
                let mut buf = [0u8; TMF_REQ_SIZE];
                if stream::read_at(mem, &readable, 0, &mut buf).is_err() {
                    return self.bad_control(mem, "short TMF request");
                }
                let response = self.task_management(ctx, &TmfReq::decode(&buf));
                self.control_response(mem, &[response.to_byte()])
            }
            CTRL_AN_QUERY | CTRL_AN_SUBSCRIBE => {
                let mut buf = [0u8; AN_REQ_SIZE];
                if stream::read_at(mem, &readable, 0, &mut buf).is_err() {
                    return self.bad_control(mem, "short AN request");
                }
                let req = AnReq::decode(&buf);
                let response = match req.lun {
                    Some(lun) if lun.target() == 0 => Response::Ok,
                    _ => Response::BadTarget,
                };
                // No asynchronous notification class is supported.
                self.control_response(mem, &encode_an_resp(0, response))
            }
            other => self.bad_control(mem, &format!("unknown control request type {other}")),
        }
    }

    fn bad_control(&self, mem: Batch<'_>, what: &str) -> u32 {
        DeviceMetrics::bump(&self.info.metrics.bad_control);
        guest_warn!(self.info.limiter, device = self.info.id, "{what}");
        self.control_response(mem, &[Response::Failure.to_byte()])
    }

    /// Executes a task management function. Requests cannot be cancelled
    /// once the backstore has them, so the functions that end tasks wait
    /// until every request in flight when the TMF arrived has completed;
    /// then no task it names is left and FUNCTION COMPLETE is true.
    fn task_management(&mut self, ctx: &SessionCtx<'_>, req: &TmfReq) -> Response {
        let Some(lun) = req.lun.filter(|l| l.target() == 0).map(Lun::lun) else {
            return Response::BadTarget;
        };
        let target = self.dev.target.current();
        let unit = target
            .find(lun)
            .map(|i| std::sync::Arc::clone(&target.luns()[i].unit));
        let Some(function) = Tmf::from_u32(req.subtype) else {
            return Response::FunctionRejected;
        };
        match function {
            Tmf::ItNexusReset => {
                if !(ctx.drain_requests)() {
                    return Response::Failure;
                }
                for e in target.luns() {
                    e.unit.nexus_loss(self.nexus);
                    e.unit.add_nexus(self.nexus);
                }
                Response::Ok
            }
            Tmf::AbortTask
            | Tmf::AbortTaskSet
            | Tmf::ClearTaskSet
            | Tmf::LogicalUnitReset
            | Tmf::QueryTask
            | Tmf::QueryTaskSet => {
                let Some(unit) = unit else {
                    return Response::IncorrectLun;
                };
                if !(ctx.drain_requests)() {
                    return Response::Failure;
                }
                if function == Tmf::LogicalUnitReset {
                    unit.reset();
                }
                Response::Ok
            }
            Tmf::ClearAca => Response::FunctionRejected,
        }
    }
}
