//! The honest driver of the daemon tests: sqcq-driver, the project's own
//! vhost-user frontend and virtio-scsi driver (what sqcq-bench runs), set
//! up as sqcq-bench's `device.rs` does: shared memfd memory, the control
//! and event queues, the request queues in a notification mode, and a
//! pool of data buffers per request queue.

use std::path::Path;
use std::time::{Duration, Instant};

use sqcq_driver::frontend::{CONTROL_QUEUE, EVENT_QUEUE, FIRST_REQUEST_QUEUE};
use sqcq_driver::scsi::sense::STATUS_CHECK_CONDITION;
use sqcq_driver::scsi::{
    Cdb, Command, CommandError, Completion, ControlQueue, Data, Done, EventQueue, Lun, ScsiQueue,
    Sense,
};
use sqcq_driver::sqcq::{PollGroup, PollGroupBuilder, PollThreads, parked_queue};
use sqcq_driver::{
    Buffer, DriverMemory, Frontend, FrontendConfig, FrontendError, NotifyMode, QueueConfig,
    QueueEvents, Ring, Virtqueue,
};
use sqcq_protocol::SpinConfig;
use sqcq_wire::scsi::{VIRTIO_SCSI_F_CHANGE, VIRTIO_SCSI_F_HOTPLUG};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{QUEUE_SIZE, WAIT};

/// virtio-scsi's HOTPLUG and CHANGE feature bits.
pub const HOTPLUG_AND_CHANGE: u64 = (1 << VIRTIO_SCSI_F_HOTPLUG) | (1 << VIRTIO_SCSI_F_CHANGE);
/// Bytes of each data buffer.
pub const BUF_LEN: u32 = 8192;
/// Data buffers per request queue: commands with data in flight at once.
pub const BUFS: usize = 32;
/// Descriptors of the control and event queues.
const SMALL_QUEUE: u16 = 16;
/// Buffers on the event queue.
const EVENT_BUFS: u16 = 8;
/// Entries per indirect table: request, data, response, one spare.
const INDIRECT_MAX: u16 = 4;
const MEM_SIZE: usize = 16 << 20;

/// What to negotiate and how the request queues run.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Ask for VIRTIO_RING_F_EVENT_IDX.
    pub event_idx: bool,
    /// Ask for VIRTIO_RING_F_INDIRECT_DESC (requests then take one
    /// descriptor; without it, a direct chain each).
    pub indirect: bool,
    /// Device-type feature bits to ask for (and require).
    pub device_features: u64,
    /// The request queues' notification mode; with a doorbell mode the
    /// control and event queues are parked (spec 4.5).
    pub mode: NotifyMode,
    /// The spin window of the polling modes.
    pub spin: SpinConfig,
}

impl Default for Options {
    /// EVENT_IDX, direct chains, HOTPLUG and CHANGE, `notify`.
    fn default() -> Self {
        Self {
            event_idx: true,
            indirect: false,
            device_features: HOTPLUG_AND_CHANGE,
            mode: NotifyMode::Notify,
            spin: SpinConfig::default(),
        }
    }
}

/// A connected driver with every queue started.
pub struct Driver {
    /// Declared first: dropping it closes the connection before the poll
    /// threads stop.
    pub frontend: Frontend,
    pub control: ControlQueue,
    pub events: EventQueue,
    /// The request queues (vrings 2, 3, ...).
    pub rqs: Vec<Rq>,
    poll: Option<PollGroup>,
    /// Holds the memfd the device maps.
    pub mem: DriverMemory,
}

impl Driver {
    /// Connects with [`Options::default`].
    pub fn connect(socket: &Path) -> Driver {
        Self::connect_with(socket, Options::default())
    }

    /// Connects (retrying until the socket is there, within [`WAIT`]),
    /// checks that everything asked for was negotiated, starts every queue
    /// and posts the event buffers.
    pub fn connect_with(socket: &Path, opts: Options) -> Driver {
        let config = FrontendConfig {
            event_idx: opts.event_idx,
            indirect: opts.indirect,
            extra_features: opts.device_features | opts.mode.required_features(),
            timeout: WAIT,
            inflight: false,
            ..FrontendConfig::new(socket)
        };
        let mut frontend = connect_retrying(&config);
        let neg = frontend.negotiated().clone();
        let mut wanted = (1 << VIRTIO_F_VERSION_1)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | config.extra_features;
        if opts.event_idx {
            wanted |= 1 << VIRTIO_RING_F_EVENT_IDX;
        }
        if opts.indirect {
            wanted |= 1 << VIRTIO_RING_F_INDIRECT_DESC;
        }
        assert_eq!(
            neg.acked & wanted,
            wanted,
            "the device must offer {wanted:#x}; it offered {:#x}",
            neg.offered
        );
        let protocol = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK;
        assert!(neg.protocol_acked.contains(protocol), "{neg:?}");

        let mut mem = DriverMemory::new(MEM_SIZE).unwrap();
        let indirect_max = if opts.indirect { INDIRECT_MAX } else { 0 };
        let qconfig = |size| QueueConfig::negotiated(size, neg.acked, indirect_max);
        let events = |frontend: &Frontend| {
            QueueEvents::new(Some(frontend.hangup_fd().unwrap()), WAIT).unwrap()
        };
        let small_queue = |mem: &mut DriverMemory, index| {
            let events = events(&frontend);
            if opts.mode.doorbells() {
                let ring = Ring::new(mem, qconfig(SMALL_QUEUE)).unwrap();
                parked_queue(mem, index, ring, events).unwrap()
            } else {
                Virtqueue::new(mem, index, qconfig(SMALL_QUEUE), NotifyMode::Notify, events)
                    .unwrap()
            }
        };
        let control = small_queue(&mut mem, CONTROL_QUEUE);
        let event = small_queue(&mut mem, EVENT_QUEUE);
        let mut poll = opts
            .mode
            .doorbells()
            .then(|| PollGroupBuilder::new(PollThreads::PerDevice, opts.spin));
        let mut rqs = Vec::new();
        for i in 0..neg.request_queues() {
            let index = FIRST_REQUEST_QUEUE + i;
            let mut events = events(&frontend);
            let vq = match &mut poll {
                Some(poll) => {
                    let ring = Ring::new(&mut mem, qconfig(QUEUE_SIZE)).unwrap();
                    let inline = opts.mode == NotifyMode::SqcqInline;
                    let notifier = poll
                        .attach(&mem, index, &ring, &mut events, inline)
                        .unwrap();
                    Virtqueue::with_notifier(index, ring, notifier, events)
                }
                None => {
                    Virtqueue::new(&mut mem, index, qconfig(QUEUE_SIZE), opts.mode, events).unwrap()
                }
            };
            let config = neg.scsi_config().expect("a SCSI device");
            let queue = ScsiQueue::new(&mut mem, vq, config).unwrap();
            let len = usize::try_from(BUF_LEN).unwrap();
            let bufs = (0..BUFS).map(|_| mem.alloc(len, 4096).unwrap()).collect();
            rqs.push(Rq {
                queue,
                guest: mem.guest_memory().clone(),
                bufs,
                free: (0..BUFS).rev().collect(),
                din: vec![0; BUFS],
            });
        }
        let poll = poll.map(|p| p.start().unwrap());
        let control = ControlQueue::new(&mut mem, control).unwrap();
        let mut events = EventQueue::new(&mut mem, event, EVENT_BUFS).unwrap();

        frontend.set_mem_table(&mem).unwrap();
        frontend.start_queue(&mem, control.virtqueue()).unwrap();
        frontend.start_queue(&mem, events.virtqueue()).unwrap();
        for rq in &rqs {
            frontend.start_queue(&mem, rq.queue.virtqueue()).unwrap();
        }
        frontend.sync().unwrap();
        events.post().unwrap();
        Driver {
            frontend,
            control,
            events,
            rqs,
            poll,
            mem,
        }
    }

    /// The two request queues, both borrowed at once.
    pub fn two_rqs(&mut self) -> (&mut Rq, &mut Rq) {
        match &mut self.rqs[..] {
            [a, b, ..] => (a, b),
            _ => panic!("fewer than two request queues"),
        }
    }
}

/// Connects as `config` says, retrying until the socket is there (within
/// [`WAIT`]).
pub fn connect_retrying(config: &FrontendConfig) -> Frontend {
    let deadline = Instant::now() + WAIT;
    loop {
        match Frontend::connect(config) {
            Ok(f) => return f,
            Err(FrontendError::Connect { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot connect: {e:?}"),
        }
    }
}

/// LUN `lun` of target `target`.
pub fn lun_at(target: u8, lun: u16) -> Lun {
    Lun::new(target, lun).expect("a single-level LUN")
}

/// A completed command: the token [`Rq::submit`] returned, how it ended,
/// and the data-in buffer (as long as asked for).
#[derive(Debug)]
pub struct Reply {
    pub token: u64,
    pub result: Result<Done, CommandError>,
    pub data: Vec<u8>,
}

impl Reply {
    /// Whether the command completed with GOOD status.
    pub fn good(&self) -> bool {
        self.result.is_ok()
    }

    /// The residual of a command that completed with GOOD status.
    pub fn resid(&self) -> u32 {
        match &self.result {
            Ok(done) => done.resid,
            Err(e) => panic!("the command failed: {e}"),
        }
    }

    /// The sense data of a CHECK CONDITION.
    pub fn sense(&self) -> Option<Sense> {
        match self.result {
            Err(CommandError::Status {
                status: STATUS_CHECK_CONDITION,
                sense,
            }) => sense,
            _ => None,
        }
    }

    /// (sense key, ASC) of a CHECK CONDITION.
    pub fn key_asc(&self) -> Option<(u8, u8)> {
        self.sense().map(|s| (s.key, s.asc))
    }

    /// The virtio-scsi response of a command the transport failed.
    pub fn response(&self) -> Option<sqcq_driver::scsi::Response> {
        match self.result {
            Err(CommandError::Response(r)) => Some(r),
            _ => None,
        }
    }
}

/// One request queue with its data buffers.
pub struct Rq {
    pub queue: ScsiQueue,
    guest: GuestMemoryMmap,
    bufs: Vec<GuestAddress>,
    free: Vec<usize>,
    /// Data-in bytes asked for by the command using each buffer.
    din: Vec<u32>,
}

impl Rq {
    /// Adds a command with `out` as data-out or `din` bytes of data-in
    /// (not both), without publishing it; returns its token.
    pub fn submit(&mut self, lun: Lun, cdb: Cdb, out: &[u8], din: u32) -> u64 {
        assert!(out.is_empty() || din == 0, "data-out or data-in, not both");
        let out_len = u32::try_from(out.len()).unwrap();
        assert!(
            out_len <= BUF_LEN && din <= BUF_LEN,
            "at most {BUF_LEN} bytes"
        );
        let b = self.free.pop().expect("a free data buffer");
        self.guest.write_slice(out, self.bufs[b]).unwrap();
        let buf = [Buffer::new(self.bufs[b], out_len.max(din))];
        let data = if out_len > 0 {
            Data::ToDevice(&buf)
        } else if din > 0 {
            Data::FromDevice(&buf)
        } else {
            Data::None
        };
        let token = b as u64;
        self.queue
            .submit(&Command::new(lun, cdb, data), token)
            .unwrap();
        self.din[b] = din;
        token
    }

    /// Makes the submitted commands visible to the device, notifying it as
    /// the mode decides.
    pub fn publish(&mut self) {
        self.queue
            .publish(|c| panic!("the queue failed with {c:?} in flight"))
            .unwrap();
    }

    /// Waits (each wait bounded by the queue's timeout) for `n`
    /// completions.
    pub fn wait(&mut self, n: usize) -> Vec<Reply> {
        let mut done = Vec::new();
        while done.len() < n {
            assert!(
                self.queue.in_flight() > 0,
                "waiting for more than is in flight"
            );
            self.queue.wait_and_reap(|c| done.push(c)).unwrap();
        }
        done.into_iter().map(|c| self.take(c)).collect()
    }

    /// Polls the used ring, without the mode's wait (which manages
    /// interrupts), until `n` completions came; fails after [`WAIT`].
    pub fn poll(&mut self, n: usize) -> Vec<Reply> {
        let deadline = Instant::now() + WAIT;
        let mut done = Vec::new();
        while done.len() < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions",
                done.len()
            );
            if self.queue.reap(|c| done.push(c)).unwrap() == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        done.into_iter().map(|c| self.take(c)).collect()
    }

    /// Submits one command, publishes it and waits for it.
    pub fn command(&mut self, lun: Lun, cdb: Cdb, out: &[u8], din: u32) -> Reply {
        let token = self.submit(lun, cdb, out, din);
        self.publish();
        let reply = self.wait(1).pop().unwrap();
        assert_eq!(reply.token, token);
        reply
    }

    /// INQUIRY for 36 bytes of LUN `lun`.
    pub fn inquiry(&mut self, lun: u16) -> Reply {
        self.command(lun_at(0, lun), Cdb::inquiry(None, 36), &[], 36)
    }

    /// The first command of a new I_T nexus reports the power-on unit
    /// attention; clear it.
    pub fn clear_unit_attention(&mut self, lun: u16) {
        let r = self.command(lun_at(0, lun), Cdb::test_unit_ready(), &[], 0);
        if !r.good() {
            assert_eq!(r.sense().map(|s| s.key), Some(6), "UNIT ATTENTION: {r:?}");
            let r = self.command(lun_at(0, lun), Cdb::test_unit_ready(), &[], 0);
            assert!(r.good(), "{r:?}");
        }
    }

    fn take(&mut self, c: Completion) -> Reply {
        let b = usize::try_from(c.token).unwrap();
        let mut data = vec![0; usize::try_from(self.din[b]).unwrap()];
        self.guest.read_slice(&mut data, self.bufs[b]).unwrap();
        self.free.push(b);
        Reply {
            token: c.token,
            result: c.result,
            data,
        }
    }
}
