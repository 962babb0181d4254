//! The honest virtio-blk driver of the daemon tests: sqcq-driver's
//! frontend and `BlkQueue` (what `sqcq-bench --device-type blk` runs), set
//! up as sqcq-bench's `device.rs` does, with one data buffer per request
//! queue and one request at a time.

use std::path::Path;
use std::time::Instant;

use sqcq_driver::blk::{self, BlkQueue, Completion, Done, Request, RequestError, Segment};
use sqcq_driver::sqcq::{PollGroup, PollGroupBuilder, PollThreads};
use sqcq_driver::{
    Buffer, DeviceType, DriverMemory, Frontend, FrontendConfig, NotifyMode, QueueConfig,
    QueueEvents, Ring, Virtqueue,
};
use sqcq_protocol::SpinConfig;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{QUEUE_SIZE, WAIT};

/// Bytes of each request queue's data buffer.
pub const BUF_LEN: u32 = 64 << 10;
const MEM_SIZE: usize = 8 << 20;

/// A connected virtio-blk driver with every request queue started.
pub struct BlkDriver {
    /// Declared first: dropping it closes the connection before the poll
    /// threads stop.
    pub frontend: Frontend,
    pub rqs: Vec<BlkRq>,
    _poll: Option<PollGroup>,
    /// Holds the memfd the device maps.
    _mem: DriverMemory,
}

/// A request submitted and published, and its completion once reaped.
pub struct Started {
    token: u64,
    done: Option<Completion>,
}

/// One request queue and its data buffer.
pub struct BlkRq {
    pub queue: BlkQueue,
    guest: GuestMemoryMmap,
    buf: GuestAddress,
    id: GuestAddress,
    next_token: u64,
}

impl BlkDriver {
    /// Connects (retrying until the socket is there, within [`WAIT`]) in
    /// `mode`, asking for sqcq-driver's blk features, and starts every
    /// request queue.
    pub fn connect(socket: &Path, mode: NotifyMode) -> BlkDriver {
        Self::connect_features(socket, mode, 0)
    }

    /// [`Self::connect`], asking for and requiring `features` too (e.g.
    /// VIRTIO_F_RING_PACKED).
    pub fn connect_features(socket: &Path, mode: NotifyMode, features: u64) -> BlkDriver {
        let config = FrontendConfig {
            device: DeviceType::Blk,
            event_idx: true,
            indirect: false,
            extra_features: blk::FEATURES | mode.required_features() | features,
            timeout: WAIT,
            inflight: false,
            ..FrontendConfig::new(socket)
        };
        let mut frontend = super::driver::connect_retrying(&config);
        let neg = frontend.negotiated().clone();
        let required = mode.required_features() | features;
        assert_eq!(neg.acked & required, required, "{neg:?}");
        let mut mem = DriverMemory::new(MEM_SIZE).unwrap();
        let qconfig = QueueConfig::negotiated(QUEUE_SIZE, neg.acked, 0);
        let mut poll = mode
            .doorbells()
            .then(|| PollGroupBuilder::new(PollThreads::PerDevice, SpinConfig::default()));
        let mut rqs = Vec::new();
        for i in 0..neg.request_queues() {
            let index = DeviceType::Blk.first_request_queue() + i;
            let mut events = QueueEvents::new(Some(frontend.hangup_fd().unwrap()), WAIT).unwrap();
            let vq = match &mut poll {
                Some(poll) => {
                    let ring = Ring::new(&mut mem, qconfig).unwrap();
                    let inline = mode == NotifyMode::SqcqInline;
                    let notifier = poll
                        .attach(&mem, index, &ring, &mut events, inline)
                        .unwrap();
                    Virtqueue::with_notifier(index, ring, notifier, events)
                }
                None => Virtqueue::new(&mut mem, index, qconfig, mode, events).unwrap(),
            };
            let queue = BlkQueue::new(&mut mem, vq).unwrap();
            let buf = mem.alloc(usize::try_from(BUF_LEN).unwrap(), 4096).unwrap();
            let id = mem.alloc(blk::ID_BYTES, 64).unwrap();
            rqs.push(BlkRq {
                queue,
                guest: mem.guest_memory().clone(),
                buf,
                id,
                next_token: 0,
            });
        }
        let poll = poll.map(|p| p.start().unwrap());
        frontend.set_mem_table(&mem).unwrap();
        for rq in &rqs {
            frontend.start_queue(&mem, rq.queue.virtqueue()).unwrap();
        }
        frontend.sync().unwrap();
        BlkDriver {
            frontend,
            rqs,
            _poll: poll,
            _mem: mem,
        }
    }

    /// The configuration space as negotiated (or last read again).
    pub fn config(&self) -> blk::BlkConfig {
        *self
            .frontend
            .negotiated()
            .blk_config()
            .expect("a blk device")
    }
}

impl BlkRq {
    /// Submits `req`, publishes it and waits (bounded) for its completion.
    fn run(&mut self, req: &Request<'_>) -> Result<Done, RequestError> {
        let started = self.start(req);
        self.finish(started)
    }

    /// Submits `req` and publishes it: when this returns the request is on
    /// the ring for the device to see. Its completion, if it came at once.
    fn start(&mut self, req: &Request<'_>) -> Started {
        let token = self.next_token;
        self.next_token += 1;
        self.queue.submit(req, token).unwrap();
        let mut done = None;
        self.queue.publish(|c| done = Some(c)).unwrap();
        Started { token, done }
    }

    /// Waits (bounded) for the completion of a started request.
    pub fn finish(&mut self, started: Started) -> Result<Done, RequestError> {
        let Started { token, mut done } = started;
        let deadline = Instant::now() + WAIT;
        while done.is_none() {
            assert!(Instant::now() < deadline, "no completion within {WAIT:?}");
            let _ = self.queue.wait_and_reap(|c| done = Some(c));
        }
        let c = done.unwrap();
        assert_eq!(c.token, token);
        c.result
    }

    /// Starts a read of `len` bytes at `sector` without waiting for it
    /// (see [`Self::start`]); [`Self::completed`] looks for its
    /// completion, [`Self::finish`] waits for it.
    pub fn start_read(&mut self, sector: u64, len: u32) -> Started {
        let data = [Buffer::new(self.buf, len)];
        self.start(&Request::Read {
            sector,
            data: &data,
        })
    }

    /// Whether the started request has completed, without waiting.
    pub fn completed(&mut self, started: &mut Started) -> bool {
        if started.done.is_none() {
            let _ = self.queue.reap(|c| started.done = Some(c));
        }
        started.done.is_some()
    }

    /// Writes `data` (whole sectors, at most [`BUF_LEN`]) at `sector`.
    pub fn write(&mut self, sector: u64, data: &[u8]) -> Result<Done, RequestError> {
        self.guest.write_slice(data, self.buf).unwrap();
        let len = u32::try_from(data.len()).unwrap();
        let data = [Buffer::new(self.buf, len)];
        self.run(&Request::Write {
            sector,
            data: &data,
        })
    }

    /// Reads `len` bytes (whole sectors) at `sector`.
    pub fn read(&mut self, sector: u64, len: u32) -> (Result<Done, RequestError>, Vec<u8>) {
        let data = [Buffer::new(self.buf, len)];
        let r = self.run(&Request::Read {
            sector,
            data: &data,
        });
        let mut out = vec![0; usize::try_from(len).unwrap()];
        self.guest.read_slice(&mut out, self.buf).unwrap();
        (r, out)
    }

    pub fn flush(&mut self) -> Result<Done, RequestError> {
        self.run(&Request::Flush)
    }

    /// GET_ID: the serial, as the device wrote it.
    pub fn get_id(&mut self) -> (Result<Done, RequestError>, Vec<u8>) {
        let len = u32::try_from(blk::ID_BYTES).unwrap();
        let r = self.run(&Request::GetId(Buffer::new(self.id, len)));
        let mut out = vec![0; blk::ID_BYTES];
        self.guest.read_slice(&mut out, self.id).unwrap();
        (r, out)
    }

    pub fn write_zeroes(&mut self, seg: Segment) -> Result<Done, RequestError> {
        self.run(&Request::WriteZeroes(&[seg]))
    }

    pub fn discard(&mut self, seg: Segment) -> Result<Done, RequestError> {
        self.run(&Request::Discard(&[seg]))
    }
}
