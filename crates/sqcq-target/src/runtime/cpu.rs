//! CPU placement: binding a worker (poll thread) to a CPU, and the CPUs
//! left for backstore completion work.
//!
//! The RFC's lesson: completion work scheduled on the CPU of a busy poll
//! thread starves, and steering it to a free CPU closed its QD1 gap. Here a
//! worker bound with `--poll-cpus` runs on its CPU only, and io_uring
//! backstore queues of polled queues get the CPUs that no worker is bound
//! to for their io-wq threads (`IORING_REGISTER_IOWQ_AFF`). When every CPU
//! has a poll thread there is nothing to steer to, and that is logged.
//!
//! A bound worker keeps watch over its CPU ([`CpuWatch`]). The kernel
//! moves a thread off a CPU that goes offline, or that leaves the
//! daemon's cpuset, to the CPUs it still may use, so the worker keeps
//! serving there; but it never moves the thread back after an offline
//! (nor, before Linux 6.2, after a cpuset change). Once a second the
//! worker reads its affinity (one `sched_getaffinity`, never on the
//! request path): when it finds itself off its CPU it reports that (a
//! warning, the `cpu_displaced` figures) and tries to bind again at every
//! check, which succeeds as soon as the CPU is back.

use std::io;
use std::time::Duration;

use crate::runtime::pass::nanos;

/// Binds the calling thread to `cpu` (`sched_setaffinity`).
pub fn bind_current_thread(cpu: usize) -> io::Result<()> {
    let set = cpu_set(&[cpu])?;
    // SAFETY: pid 0 is the calling thread; `set` is a valid cpu_set_t of
    // the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs this process may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is the empty set; it is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the kernel writes at most the
    // size passed into `set`.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..capacity())
        // SAFETY: `c` is below the set's capacity in bits.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// How often a bound worker checks that it still runs on its CPU.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What a check of [`CpuWatch`] found that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuChange {
    /// The thread runs off its CPU, on `allowed`, and cannot be bound
    /// back yet (the CPU is offline or outside the cpuset).
    Displaced { allowed: Vec<usize> },
    /// The thread is on its CPU again (bound back by this check, or by
    /// the kernel) after a [`CpuChange::Displaced`].
    Back,
    /// The thread had been moved off its CPU since the last check, and
    /// was bound back at once: the CPU went and came back in between.
    Rebound { allowed: Vec<usize> },
}

/// A bound worker's watch over its CPU (see the module documentation).
#[derive(Debug)]
pub struct CpuWatch {
    cpu: usize,
    /// Next check, on the pass clock (ns).
    next: u64,
    displaced: bool,
}

impl CpuWatch {
    /// A watch for a thread bound to `cpu` at `now` (pass clock, ns).
    pub fn new(cpu: usize, now: u64) -> Self {
        CpuWatch {
            cpu,
            next: now.saturating_add(nanos(WATCH_INTERVAL)),
            displaced: false,
        }
    }

    /// The CPU the thread is bound to.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// Whether the thread was off its CPU at the last check.
    pub fn displaced(&self) -> bool {
        self.displaced
    }

    /// Time from `now` to the next check.
    pub fn timeout(&self, now: u64) -> Duration {
        Duration::from_nanos(self.next.saturating_sub(now))
    }

    /// Checks at `now` if a check is due: `affinity` reads the thread's
    /// allowed CPUs, `bind` binds it to one. Returns what changed.
    pub fn check(
        &mut self,
        now: u64,
        affinity: impl FnOnce() -> io::Result<Vec<usize>>,
        bind: impl FnOnce(usize) -> io::Result<()>,
    ) -> Option<CpuChange> {
        if now < self.next {
            return None;
        }
        self.next = now.saturating_add(nanos(WATCH_INTERVAL));
        // Unreadable: nothing is known, nothing changes.
        let allowed = affinity().ok()?;
        if allowed == [self.cpu] {
            return std::mem::take(&mut self.displaced).then_some(CpuChange::Back);
        }
        let was = std::mem::take(&mut self.displaced);
        match bind(self.cpu) {
            Ok(()) if was => Some(CpuChange::Back),
            Ok(()) => Some(CpuChange::Rebound { allowed }),
            Err(_) => {
                self.displaced = true;
                (!was).then_some(CpuChange::Displaced { allowed })
            }
        }
    }
}

fn capacity() -> usize {
    8 * std::mem::size_of::<libc::cpu_set_t>()
}

fn cpu_set(cpus: &[usize]) -> io::Result<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is the empty set; it is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c >= capacity() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: `c` is below the set's capacity in bits (checked above).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn unreachable_bind(_: usize) -> io::Result<()> {
        panic!("bound although on its CPU")
    }

    fn offline(_: usize) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }

    #[test]
    fn a_watch_checks_once_per_interval() {
        let mut w = CpuWatch::new(1, 0);
        assert_eq!(w.timeout(0), WATCH_INTERVAL);
        let not_due = w.check(S / 2, || panic!("read before due"), unreachable_bind);
        assert_eq!(not_due, None);
        assert_eq!(w.check(S, || Ok(vec![1]), unreachable_bind), None);
        assert_eq!(
            w.timeout(S),
            WATCH_INTERVAL,
            "the next check is an interval on"
        );
    }

    #[test]
    fn a_displaced_thread_is_reported_once_and_rebound_when_its_cpu_is_back() {
        let mut w = CpuWatch::new(1, 0);
        // The CPU went away: reported once, retried at every check.
        let gone = w.check(S, || Ok(vec![0]), offline);
        assert_eq!(gone, Some(CpuChange::Displaced { allowed: vec![0] }));
        assert!(w.displaced());
        assert_eq!(w.check(2 * S, || Ok(vec![0]), offline), None);
        assert!(w.displaced());
        // It came back: the next check binds the thread again.
        let mut bound = None;
        let back = w.check(
            3 * S,
            || Ok(vec![0, 1]),
            |c| {
                bound = Some(c);
                Ok(())
            },
        );
        assert_eq!((back, bound), (Some(CpuChange::Back), Some(1)));
        assert!(!w.displaced());
    }

    #[test]
    fn a_thread_the_kernel_put_back_is_reported_back_without_a_bind() {
        let mut w = CpuWatch::new(1, 0);
        assert!(w.check(S, || Ok(vec![0]), offline).is_some());
        // Linux 6.2 and later restore the affinity a cpuset took away.
        let back = w.check(2 * S, || Ok(vec![1]), unreachable_bind);
        assert_eq!(back, Some(CpuChange::Back));
    }

    #[test]
    fn a_move_between_two_checks_is_reported_as_a_rebind() {
        let mut w = CpuWatch::new(1, 0);
        let r = w.check(S, || Ok(vec![0, 1]), |_| Ok(()));
        assert_eq!(
            r,
            Some(CpuChange::Rebound {
                allowed: vec![0, 1]
            })
        );
        assert!(!w.displaced());
        // An unreadable affinity changes nothing.
        let err = || Err(io::Error::from_raw_os_error(libc::ESRCH));
        assert_eq!(w.check(2 * S, err, unreachable_bind), None);
    }

    #[test]
    fn a_thread_can_be_bound_to_an_allowed_cpu() {
        let allowed = allowed_cpus().unwrap();
        let cpu = allowed[0];
        std::thread::spawn(move || {
            bind_current_thread(cpu).unwrap();
            assert_eq!(allowed_cpus().unwrap(), vec![cpu]);
        })
        .join()
        .unwrap();
        assert!(bind_current_thread(usize::MAX).is_err());
    }
}
