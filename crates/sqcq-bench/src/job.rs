//! One job: a thread with its own request queue, keeping `iodepth` I/Os
//! in flight until its size or time is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqcq_driver::{Buffer, NotifyCounters, NotifyError, QueueFailure};
use sqcq_protocol::clock::now_ns;
use vm_memory::{Bytes, GuestMemoryMmap};

use crate::cpu::{CpuTime, thread_cpu_time};
use crate::device::JobQueue;
use crate::error::BenchError;
use crate::io::{IoDone, IoError, IoQueue};
use crate::link::Link;
use crate::stats::JobStats;
use crate::verify;
use crate::workload::{Dir, Workload};

/// What a job does.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Job number.
    pub id: usize,
    /// First LBA of the job's region.
    pub first_lba: u64,
    /// Blocks per I/O.
    pub blocks: u32,
    /// Bytes per I/O.
    pub bs: u64,
    /// The I/O order and mix over the region's units.
    pub workload: Workload,
    /// Write, then read back and check every unit.
    pub verify: bool,
    /// Verify: only read back and check every unit (`--verify_only`).
    pub verify_only: bool,
    /// The seed written into verify headers, and expected back.
    pub verify_seed: u32,
    /// Stop after this many bytes (unless time based).
    pub size: u64,
    /// Keep going until the runtime ends.
    pub time_based: bool,
    /// Measured time limit.
    pub runtime: Option<Duration>,
    /// Unmeasured time before.
    pub ramp: Duration,
    /// Bursts the load pass is split into (1: one continuous run).
    pub bursts: u32,
    /// Publish the new I/Os every this many (at least 1).
    pub batch_submit: u16,
    /// Bound on the wait for the poll threads to fall asleep between two
    /// bursts.
    pub idle_timeout: Duration,
    /// Hold new I/Os back while the device sets THROTTLE and some are in
    /// flight (D1, D2 of the spec's "Backpressure").
    pub honour_throttle: bool,
    /// `--rate_iops`: nanoseconds between two I/Os (`None`: no limit).
    pub rate_interval: Option<u64>,
}

/// Progress counters a job shares with the progress line.
#[derive(Debug, Default)]
pub struct Progress {
    /// Completed reads.
    pub reads: AtomicU64,
    /// Completed writes.
    pub writes: AtomicU64,
    /// Bytes completed.
    pub bytes: AtomicU64,
    /// Set when the job has finished.
    pub done: AtomicBool,
}

/// Shared between all jobs: set when one of them failed, so that the
/// others stop too.
#[derive(Debug, Default)]
pub struct Abort(AtomicBool);

impl Abort {
    fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn raised(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What an I/O in flight is.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    /// When it was submitted ([`now_ns`]).
    submitted: u64,
    dir: Dir,
    lba: u64,
    measured: bool,
    /// Times it was submitted again after a unit attention.
    retries: u8,
}

/// Times an I/O is submitted again when the LUN answers UNIT ATTENTION
/// (Linux's SCSI layer retries it too: the condition is reported once,
/// to the first command that meets it, e.g. after a resize).
const UA_RETRIES: u8 = 5;

/// Which pass a job is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The workload of `--rw`.
    Load,
    /// Verify: writing every unit once.
    Write,
    /// Verify: reading every written unit back.
    Check,
}

/// A job ready to run on its own thread.
#[derive(Debug)]
pub struct Job {
    spec: JobSpec,
    q: JobQueue,
    guest: GuestMemoryMmap,
    inflight: Vec<Option<InFlight>>,
    free: Vec<u16>,
    done: Vec<IoDone>,
    scratch: Vec<u8>,
    stats: JobStats,
    /// Units the verify write pass issued, which the check pass reads.
    checked_limit: u64,
    /// With THROTTLE honoured, at most this many I/Os in flight: what the
    /// job had out when it last saw the bit, grown by one at every look
    /// that finds it clear. A one-bit signal otherwise lets a clear
    /// release every free slot at once, before the device can set it
    /// again (docs/benchmarks.md, "Backpressure").
    window: u16,
    /// I/Os that met a unit attention, to submit again (buffer, I/O).
    retry: Vec<(u16, InFlight)>,
    /// The device connection (followed across restarts with
    /// `--reconnect`).
    link: Arc<Link>,
    /// The connection the job's queue is on.
    generation: u64,
    /// With `--rate_iops`, when the next I/O is due.
    pace: Option<Pace>,
}

/// `--rate_iops`: I/Os due at even intervals ([`now_ns`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pace {
    /// Nanoseconds between two I/Os.
    interval: u64,
    /// When the next is due.
    next: u64,
}

impl Pace {
    /// Whether an I/O may go at `now`; if so, the next one is due an
    /// interval later, counted from `now` when the job is late by an
    /// interval or more (no catch-up burst after a stall).
    fn due(&mut self, now: u64) -> bool {
        if now < self.next {
            return false;
        }
        self.next = if now - self.next < self.interval {
            self.next + self.interval
        } else {
            now + self.interval
        };
        true
    }
}

impl Job {
    /// A job over `q`'s queue and buffers.
    pub fn new(
        spec: JobSpec,
        q: JobQueue,
        guest: GuestMemoryMmap,
        link: Arc<Link>,
    ) -> Result<Self, BenchError> {
        let depth = q.buffers.len();
        let depth16 =
            u16::try_from(depth).map_err(|_| BenchError::Usage("--iodepth too large".into()))?;
        let bs =
            usize::try_from(spec.bs).map_err(|_| BenchError::Usage("--bs too large".into()))?;
        let pace = spec
            .rate_interval
            .map(|interval| Pace { interval, next: 0 });
        Ok(Self {
            spec,
            q,
            guest,
            inflight: vec![None; depth],
            free: (0..depth16).rev().collect(),
            done: Vec::with_capacity(depth),
            scratch: vec![0; bs],
            stats: JobStats::default(),
            checked_limit: 0,
            window: u16::MAX,
            retry: Vec::new(),
            generation: link.generation(),
            link,
            pace,
        })
    }

    /// Runs the job; on failure every I/O in flight has been failed and
    /// the error says why.
    pub fn run(mut self, progress: &Progress, abort: &Abort) -> Result<JobStats, BenchError> {
        let result = self.run_passes(progress, abort);
        progress.done.store(true, Ordering::Relaxed);
        if result.is_err() {
            abort.raise();
            self.q.queue.abandon();
        }
        result.map(|()| self.stats)
    }

    fn run_passes(&mut self, progress: &Progress, abort: &Abort) -> Result<(), BenchError> {
        let start = Instant::now();
        // Verify runs are measured whole: their passes are defined by the
        // region, not by time.
        let ramp = if self.spec.verify {
            Duration::ZERO
        } else {
            self.spec.ramp
        };
        let measure_from = now_ns().saturating_add(nanos(ramp));
        let end = self
            .spec
            .runtime
            .map(|r| measure_from.saturating_add(nanos(r)));
        let mut clock = Clock {
            measure_from,
            end,
            measuring: ramp.is_zero(),
            since: Snapshot::take(&mut self.q.queue),
            started: start,
        };
        if self.spec.verify_only {
            self.checked_limit = self.spec.workload.units();
            let t = Instant::now();
            self.pass(Pass::Check, &mut clock, progress, abort)?;
            self.stats.read.active = Some(t.elapsed());
        } else if self.spec.verify {
            let t = Instant::now();
            self.pass(Pass::Write, &mut clock, progress, abort)?;
            let t_check = Instant::now();
            self.pass(Pass::Check, &mut clock, progress, abort)?;
            self.stats.write.active = Some(t_check - t);
            self.stats.read.active = Some(t_check.elapsed());
        } else {
            self.pass(Pass::Load, &mut clock, progress, abort)?;
        }
        let now = Snapshot::take(&mut self.q.queue);
        self.stats.runtime = Instant::now().saturating_duration_since(clock.measured_since());
        self.stats.notify = now.notify - clock.since.notify;
        self.stats.cpu = now.cpu.since(&clock.since.cpu);
        Ok(())
    }

    /// Runs one pass; returns how many units it issued. A verify check
    /// pass reads back the units the write pass issued.
    fn pass(
        &mut self,
        pass: Pass,
        clock: &mut Clock,
        progress: &Progress,
        abort: &Abort,
    ) -> Result<u64, BenchError> {
        let units = self.spec.workload.units();
        let limit = match pass {
            Pass::Load if self.spec.time_based => u64::MAX,
            Pass::Load => self.spec.size.div_ceil(self.spec.bs.max(1)),
            Pass::Write => units,
            Pass::Check => self.checked_limit,
        };
        let mut issued = 0u64;
        let burst = if pass == Pass::Load && limit != u64::MAX && self.spec.bursts > 1 {
            limit.div_ceil(u64::from(self.spec.bursts))
        } else {
            limit
        };
        let mut burst_end = burst.min(limit);
        loop {
            // The poll loops' clock (the TSC where the kernel trusts it):
            // `Instant::now` was two system-call-like reads per pass.
            let now = now_ns();
            clock.tick(now, &mut self.q.queue, &mut self.stats);
            let time_up = pass != Pass::Check && clock.end.is_some_and(|end| now >= end);
            let stop = time_up || abort.raised();
            // I/Os written and not yet published.
            let mut added = 0u16;
            while let Some((buf, io)) = self.retry.pop() {
                self.resubmit(buf, io)?;
                added = added.saturating_add(1);
            }
            // Backpressure: with I/Os in flight, none more while the
            // device asks to hold them (D1); read again after every reap
            // (D2), then after every publication with the flags it loads.
            let mut held = self.held(true);
            while !stop && issued < burst_end && !held && self.due(now) {
                let Some(buf) = self.free.pop() else { break };
                let (dir, unit) = match pass {
                    Pass::Load => self.spec.workload.next_io(),
                    Pass::Write => (Dir::Write, self.spec.workload.pass_unit(issued)),
                    Pass::Check => (Dir::Read, self.spec.workload.pass_unit(issued)),
                };
                self.issue(buf, dir, unit, now, clock.measuring)?;
                issued += 1;
                added += 1;
                if added >= self.spec.batch_submit {
                    let done = &mut self.done;
                    self.q.queue.publish(|c| done.push(c))?;
                    added = 0;
                    held = self.held(false);
                }
            }
            let done = &mut self.done;
            if added > 0 {
                self.q.queue.publish(|c| done.push(c))?;
            }
            let in_flight = self.q.queue.in_flight();
            self.stats.max_in_flight = self.stats.max_in_flight.max(in_flight);
            if self.q.queue.in_flight() == 0 {
                if stop || issued >= limit {
                    break;
                }
                if issued >= burst_end {
                    self.idle_gap()?;
                    burst_end = burst_end.saturating_add(burst).min(limit);
                } else {
                    self.sleep_until_due(clock.end);
                }
                continue;
            }
            let waited = self.q.queue.wait_and_reap(|c| done.push(c));
            let completed = self.complete(now_ns(), progress);
            match waited {
                Err(QueueFailure::Notify(NotifyError::Hangup)) if self.link.reconnects() => {
                    // The requests in flight stay; the device resubmits
                    // the ones it had taken.
                    self.link.follow(&mut self.generation, &mut self.q.queue)?;
                    self.stats.reconnects += 1;
                }
                other => {
                    other?;
                }
            }
            completed?;
        }
        if pass == Pass::Write {
            self.checked_limit = issued;
        }
        Ok(issued)
    }

    /// Whether `--rate_iops` lets an I/O go at `now`.
    fn due(&mut self, now: u64) -> bool {
        self.pace.as_mut().is_none_or(|p| p.due(now))
    }

    /// With nothing in flight and `--rate_iops`, sleeps until the next
    /// I/O is due (or the run ends), as an application between two I/Os.
    fn sleep_until_due(&self, end: Option<u64>) {
        let Some(pace) = self.pace else { return };
        let until = end.map_or(pace.next, |e| e.min(pace.next));
        let now = now_ns();
        if until > now {
            std::thread::sleep(Duration::from_nanos(until - now));
        }
    }

    /// Whether the job holds new I/Os back now: it honours THROTTLE and
    /// I/Os are in flight, whose completions will let it look again
    /// (never with nothing in flight: D1), and the device set the bit (as
    /// the last publication read it, or read again with `fresh`) or the
    /// job is at its window (see `window`).
    fn held(&mut self, fresh: bool) -> bool {
        let in_flight = self.q.queue.in_flight();
        if !self.spec.honour_throttle || in_flight == 0 || self.free.is_empty() {
            return false;
        }
        if self.q.queue.throttle(fresh) {
            self.window = in_flight;
            self.stats.throttle_holds += 1;
            return true;
        }
        if fresh {
            self.window = self.window.saturating_add(1);
        }
        in_flight >= self.window
    }

    /// Between two bursts, with nothing in flight: in the doorbell modes,
    /// waits until the driver's CQ consumer and the device's poller of
    /// this queue are both asleep with NEED_WAKEUP set (as the doorbells
    /// and the poll thread's flag say), bounded by the I/O timeout. In
    /// sqcq-inline the job is the CQ consumer: it parks first (sets CQ
    /// NEED_WAKEUP). The next burst's first submission must then wake both.
    fn idle_gap(&mut self) -> Result<(), BenchError> {
        self.q.queue.park();
        let vq = self.q.queue.virtqueue();
        let Some(mut state) = vq.idle_state() else {
            return Ok(());
        };
        let start = Instant::now();
        while !state.all_asleep() {
            if start.elapsed() > self.spec.idle_timeout {
                return Err(BenchError::NotIdle {
                    timeout: self.spec.idle_timeout,
                    state: format!("{state:?}"),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
            state = vq.idle_state().unwrap_or(state);
        }
        self.stats.idle_gaps += 1;
        Ok(())
    }

    fn issue(
        &mut self,
        buf: u16,
        dir: Dir,
        unit: u64,
        now: u64,
        measured: bool,
    ) -> Result<(), BenchError> {
        let lba = self.spec.first_lba + unit * u64::from(self.spec.blocks);
        let addr = self.q.buffers[usize::from(buf)];
        if dir == Dir::Write && self.spec.verify {
            verify::fill(&mut self.scratch, lba, self.spec.verify_seed);
            self.guest
                .write_slice(&self.scratch, addr)
                .map_err(BenchError::Memory)?;
        }
        let bs =
            u32::try_from(self.spec.bs).map_err(|_| BenchError::Usage("--bs too large".into()))?;
        self.q.queue.submit(
            dir,
            lba,
            self.spec.blocks,
            Buffer::new(addr, bs),
            u64::from(buf),
        )?;
        self.inflight[usize::from(buf)] = Some(InFlight {
            submitted: now,
            dir,
            lba,
            measured,
            retries: 0,
        });
        Ok(())
    }

    /// Submits `io` again through its buffer `buf` (a write's data is
    /// still there).
    fn resubmit(&mut self, buf: u16, io: InFlight) -> Result<(), BenchError> {
        let bs =
            u32::try_from(self.spec.bs).map_err(|_| BenchError::Usage("--bs too large".into()))?;
        let addr = self.q.buffers[usize::from(buf)];
        self.q.queue.submit(
            io.dir,
            io.lba,
            self.spec.blocks,
            Buffer::new(addr, bs),
            u64::from(buf),
        )?;
        self.inflight[usize::from(buf)] = Some(InFlight {
            retries: io.retries + 1,
            ..io
        });
        Ok(())
    }

    /// Accounts for the completions gathered in `self.done`.
    fn complete(&mut self, now: u64, progress: &Progress) -> Result<(), BenchError> {
        let mut first_error = None;
        let (mut reads, mut writes) = (0, 0);
        // Drained, not taken: the vector keeps its capacity, so that reaping
        // allocates nothing.
        for c in self.done.drain(..) {
            let buf = usize::try_from(c.token).unwrap_or(usize::MAX);
            let Some(io) = self.inflight.get_mut(buf).and_then(Option::take) else {
                first_error
                    .get_or_insert(BenchError::Protocol("completion for an I/O not in flight"));
                continue;
            };
            if io.retries < UA_RETRIES && c.result.as_ref().is_err_and(IoError::unit_attention) {
                self.retry
                    .push((u16::try_from(buf).unwrap_or(u16::MAX), io));
                continue;
            }
            self.free.push(u16::try_from(buf).unwrap_or(u16::MAX));
            if let Err(e) = c.result {
                let op = if io.dir == Dir::Read { "READ" } else { "WRITE" };
                first_error.get_or_insert(BenchError::Io {
                    what: format!("{op} at LBA {}", io.lba),
                    source: e,
                });
                continue;
            }
            if io.dir == Dir::Read && self.spec.verify {
                self.guest
                    .read_slice(&mut self.scratch, self.q.buffers[buf])
                    .map_err(BenchError::Memory)?;
                if let Err(m) = verify::check(&mut self.scratch, io.lba, self.spec.verify_seed) {
                    first_error.get_or_insert(BenchError::Verify(m));
                }
            }
            let stats = match io.dir {
                Dir::Read => {
                    reads += 1;
                    &mut self.stats.read
                }
                Dir::Write => {
                    writes += 1;
                    &mut self.stats.write
                }
            };
            if io.measured {
                stats.record(
                    self.spec.bs,
                    Duration::from_nanos(now.saturating_sub(io.submitted)),
                );
            }
        }
        // This job is the counters' only writer: a load and a store, not
        // a locked add per batch (a full barrier on x86, waiting for the
        // stores of the requests just submitted). Relaxed: the progress
        // printer only wants some recent value.
        let add = |c: &AtomicU64, n: u64| c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
        add(&progress.reads, reads);
        add(&progress.writes, writes);
        add(&progress.bytes, (reads + writes) * self.spec.bs);
        first_error.map_or(Ok(()), Err)
    }
}

/// `d` in whole nanoseconds, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The seed written into verify headers of job `id` of a run with
/// `--randseed randseed`.
pub fn verify_seed(id: usize, randseed: u32) -> u32 {
    0x5c9c_0000 ^ u32::try_from(id).unwrap_or(u32::MAX) ^ randseed.rotate_left(16)
}

/// Counters at one moment.
#[derive(Debug, Clone, Copy)]
struct Snapshot {
    notify: NotifyCounters,
    cpu: CpuTime,
}

impl Snapshot {
    fn take(queue: &mut IoQueue) -> Self {
        Self {
            notify: queue.counters(),
            cpu: thread_cpu_time(),
        }
    }
}

/// The job's sense of time: ramp, measured window, end.
#[derive(Debug)]
struct Clock {
    /// When measuring starts and the run ends ([`now_ns`]).
    measure_from: u64,
    end: Option<u64>,
    measuring: bool,
    since: Snapshot,
    started: Instant,
}

impl Clock {
    /// At the end of the ramp: forget what was measured, restart the
    /// counters.
    fn tick(&mut self, now: u64, queue: &mut IoQueue, stats: &mut JobStats) {
        if !self.measuring && now >= self.measure_from {
            self.measuring = true;
            self.since = Snapshot::take(queue);
            *stats = JobStats::default();
            self.started = Instant::now();
        }
    }

    fn measured_since(&self) -> Instant {
        self.started
    }
}

/// Runs `jobs` on their own threads; returns each one's outcome.
pub fn run_all(
    jobs: Vec<Job>,
    progress: &[Arc<Progress>],
    abort: &Arc<Abort>,
) -> Vec<Result<JobStats, BenchError>> {
    let handles: Vec<_> = jobs
        .into_iter()
        .zip(progress)
        .map(|(job, p)| {
            let p = Arc::clone(p);
            let abort = Arc::clone(abort);
            std::thread::Builder::new()
                .name(format!("job{}", job.spec.id))
                .spawn(move || job.run(&p, &abort))
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(i, h)| match h {
            Ok(h) => h.join().unwrap_or(Err(BenchError::Panic(i))),
            Err(e) => Err(BenchError::Eventfd(e)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Pace;

    #[test]
    fn paced_ios_are_due_at_even_intervals_without_catch_up() {
        let mut p = Pace {
            interval: 100,
            next: 0,
        };
        assert!(p.due(0));
        assert!(!p.due(50), "not before the interval");
        assert!(p.due(120), "a little late");
        assert_eq!(p.next, 200, "keeps the schedule");
        assert!(p.due(1000), "late by several intervals");
        assert_eq!(p.next, 1100, "counts from now: no burst");
        assert!(!p.due(1000));
    }
}
