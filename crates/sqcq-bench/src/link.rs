//! The connection to the device, and how jobs follow it across restarts
//! of the device (`--reconnect`).
//!
//! Without `--reconnect` a hangup of the device fails every I/O in flight
//! and the run. With it, the frontend asks for in-flight tracking
//! (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD) and keeps the area; the jobs'
//! queues survive a hangup with their requests in flight. The first job
//! whose wait sees the hangup connects again (retrying until the
//! reconnect timeout), negotiates the same features, shares the same
//! memory and hands the area back; then every job hands its queue to the
//! new connection at the ring's used index, as QEMU does, and the device
//! resubmits what it had taken and goes on from there. A request is then
//! completed exactly once (a second completion fails the run, see
//! `Job::complete`), and `--verify` checks every block written.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqcq_driver::{DriverMemory, Frontend, FrontendConfig, InflightRecord, Negotiated};

use crate::error::BenchError;
use crate::io::IoQueue;

/// What a reconnect needs besides the connection.
#[derive(Debug)]
struct Reconnect {
    config: FrontendConfig,
    timeout: Duration,
    record: InflightRecord,
}

#[derive(Debug)]
struct State {
    frontend: Option<Frontend>,
    /// Connections made so far (1 for the first).
    generation: u64,
}

/// The device connection the jobs share.
#[derive(Debug)]
pub struct Link {
    mem: DriverMemory,
    negotiated: Negotiated,
    reconnect: Option<Reconnect>,
    state: Mutex<State>,
}

impl Link {
    /// The connection `frontend` over `mem`; with `reconnect` (the
    /// configuration it was made with, how long to retry, its in-flight
    /// area) jobs follow the device across restarts.
    pub fn new(
        frontend: Frontend,
        mem: DriverMemory,
        reconnect: Option<(FrontendConfig, Duration, InflightRecord)>,
    ) -> Self {
        Self {
            mem,
            negotiated: frontend.negotiated().clone(),
            reconnect: reconnect.map(|(config, timeout, record)| Reconnect {
                config,
                timeout,
                record,
            }),
            state: Mutex::new(State {
                frontend: Some(frontend),
                generation: 1,
            }),
        }
    }

    /// What was negotiated (the same on every connection).
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Whether jobs follow the device across restarts.
    pub fn reconnects(&self) -> bool {
        self.reconnect.is_some()
    }

    /// Connections made so far (1 for the first).
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A job's queue saw the device hang up, on connection `seen`: makes
    /// (or, if another job did already, reuses) the next connection and
    /// hands `queue` to it; `seen` becomes its generation. A device that
    /// goes away again before the queue is handed over is connected to
    /// once more, until the reconnect timeout.
    pub fn follow(&self, seen: &mut u64, queue: &mut IoQueue) -> Result<(), BenchError> {
        let Some(r) = &self.reconnect else {
            return Err(BenchError::Protocol("the device hung up"));
        };
        let deadline = Instant::now() + r.timeout;
        let mut state = self.lock();
        loop {
            if state.generation == *seen {
                // Drop the dead connection first.
                state.frontend = None;
                let frontend = self.connect(r, deadline)?;
                state.frontend = Some(frontend);
                state.generation += 1;
            }
            let frontend = state
                .frontend
                .as_mut()
                .ok_or(BenchError::Protocol("no connection"))?;
            match self.hand_over(frontend, queue) {
                Ok(()) => {
                    *seen = state.generation;
                    return Ok(());
                }
                Err(_) if Instant::now() < deadline => *seen = state.generation,
                Err(e) => return Err(e),
            }
        }
    }

    /// Hands `queue` to `frontend`, at the ring's used index as QEMU does
    /// after a backend died (the device adds the requests it records in
    /// flight); a packed ring at the used position the driver reached for
    /// both of its positions (the device continues from its record's,
    /// which alone can say where its lists in flight end: QEMU's own
    /// packed base after a crash is that of the connection's start).
    fn hand_over(&self, frontend: &mut Frontend, queue: &mut IoQueue) -> Result<(), BenchError> {
        let vq = queue.virtqueue();
        let base = vq.ring().restart_base();
        frontend.resume_queue(&self.mem, vq, base)?;
        frontend.sync()?;
        queue.reattach(frontend.hangup_fd()?);
        Ok(())
    }

    /// Connects again until `deadline`, with the features of the first
    /// connection, the same memory and the in-flight area; a device that
    /// goes away during the set-up is connected to again.
    fn connect(&self, r: &Reconnect, deadline: Instant) -> Result<Frontend, BenchError> {
        loop {
            match self.set_up(r) {
                Err(BenchError::Protocol(e)) => return Err(BenchError::Protocol(e)),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                result => return result,
            }
        }
    }

    fn set_up(&self, r: &Reconnect) -> Result<Frontend, BenchError> {
        let mut frontend = Frontend::connect(&r.config)?;
        let now = frontend.negotiated();
        if now.acked != self.negotiated.acked
            || now.protocol_acked != self.negotiated.protocol_acked
        {
            return Err(BenchError::Protocol(
                "the restarted device negotiates other features",
            ));
        }
        frontend.set_mem_table(&self.mem)?;
        frontend.resume_inflight(&r.record)?;
        Ok(frontend)
    }

    /// Sends the memory table again on the present connection (the same
    /// memory: the device maps it anew and swaps its map while the queues
    /// run). `Ok(false)`: no connection (a reconnect is under way).
    pub fn resend_mem_table(&self) -> Result<bool, BenchError> {
        match &self.lock().frontend {
            Some(f) => {
                f.set_mem_table(&self.mem)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Takes the vrings back and disconnects.
    pub fn close(&self) -> Result<(), BenchError> {
        if let Some(f) = self.lock().frontend.take() {
            f.stop()?;
        }
        Ok(())
    }
}
