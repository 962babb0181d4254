//! CPU time accounting: of this process and its threads (getrusage), and
//! of a target process and each of its threads (/proc).

use std::fs;
use std::time::Duration;

/// CPU time of a process, from /proc/PID/stat.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    /// User seconds.
    pub user: f64,
    /// System seconds.
    pub system: f64,
}

impl CpuTime {
    /// Total seconds.
    pub fn total(&self) -> f64 {
        self.user + self.system
    }

    /// The time spent between `earlier` and `self`.
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
        }
    }
}

/// One thread of a process, and its CPU time.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadCpu {
    /// Thread id.
    pub tid: u32,
    /// Its name (`comm`, at most 15 bytes: `sqcq-worker0`).
    pub name: String,
    /// Its CPU time.
    pub cpu: CpuTime,
}

/// utime and stime of process `pid` from /proc/PID/stat.
pub fn proc_cpu_time(pid: u32) -> Option<CpuTime> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, cpu)| cpu)
}

/// Every thread of process `pid` and its CPU time so far, in thread id
/// order (empty when /proc cannot tell).
pub fn thread_cpu_times(pid: u32) -> Vec<ThreadCpu> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut threads: Vec<ThreadCpu> = dir
        .flatten()
        .filter_map(|entry| {
            let tid: u32 = entry.file_name().to_str()?.parse().ok()?;
            // A thread may end between the listing and this read.
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            let (name, cpu) = parse_stat(&stat)?;
            Some(ThreadCpu { tid, name, cpu })
        })
        .collect();
    threads.sort_by_key(|t| t.tid);
    threads
}

/// The threads of `now` with the CPU time each spent since `earlier`: a
/// thread `earlier` does not list started since, and all its time counts.
/// Threads that ended in between are not in `now` and are lost.
pub fn threads_since(now: &[ThreadCpu], earlier: &[ThreadCpu]) -> Vec<ThreadCpu> {
    now.iter()
        .map(|t| {
            let before = earlier
                .iter()
                .find(|e| e.tid == t.tid)
                .map_or_else(CpuTime::default, |e| e.cpu);
            ThreadCpu {
                cpu: t.cpu.since(&before),
                ..t.clone()
            }
        })
        .collect()
}

/// The name and the utime and stime of a /proc/PID/stat (or
/// /proc/PID/task/TID/stat) line.
fn parse_stat(stat: &str) -> Option<(String, CpuTime)> {
    // The command name is in parentheses and may hold spaces and
    // parentheses: fields are counted after the last ')'. utime and stime
    // are fields 14 and 15.
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    let rest = &stat[close + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u32::try_from(ticks).ok().filter(|&t| t > 0)?;
    Some((
        name,
        CpuTime {
            user: ticks_to_secs(utime, ticks),
            system: ticks_to_secs(stime, ticks),
        },
    ))
}
fn ticks_to_secs(ticks: u64, per_sec: u32) -> f64 {
    Duration::from_secs(ticks / u64::from(per_sec)).as_secs_f64()
        + f64::from(u32::try_from(ticks % u64::from(per_sec)).unwrap_or(0)) / f64::from(per_sec)
}

/// CPU time of this process (all threads), from getrusage.
pub fn self_cpu_time() -> CpuTime {
    rusage(libc::RUSAGE_SELF)
}

/// CPU time of the calling thread.
pub fn thread_cpu_time() -> CpuTime {
    rusage(libc::RUSAGE_THREAD)
}

fn rusage(who: libc::c_int) -> CpuTime {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a struct rusage into the pointer, which
    // points at one; RUSAGE_SELF and RUSAGE_THREAD are valid `who` values.
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        return CpuTime::default();
    }
    // SAFETY: getrusage succeeded, so it initialised the struct (and it
    // was zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let secs = |tv: libc::timeval| {
        Duration::from_secs(u64::try_from(tv.tv_sec).unwrap_or(0)).as_secs_f64()
            + Duration::from_micros(u64::try_from(tv.tv_usec).unwrap_or(0)).as_secs_f64()
    };
    CpuTime {
        user: secs(usage.ru_utime),
        system: secs(usage.ru_stime),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_cpu_time() {
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        let cpu = proc_cpu_time(std::process::id()).unwrap();
        assert!(cpu.total() >= 0.0);
        assert!(self_cpu_time().total() >= 0.0);
        assert!(proc_cpu_time(u32::MAX).is_none());
    }

    #[test]
    fn lists_our_threads_and_what_each_spent() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel::<()>();
        // The thread names itself as it starts: listed once it runs.
        let named = std::thread::Builder::new()
            .name("cpu (test) 1".into())
            .spawn(move || {
                ready_tx.send(()).unwrap();
                let _ = rx.recv();
            })
            .unwrap();
        ready.recv().unwrap();
        let pid = std::process::id();
        let before = thread_cpu_times(pid);
        assert!(
            before.iter().any(|t| t.name == "cpu (test) 1"),
            "{before:?}"
        );
        let now = thread_cpu_times(pid);
        let spent = threads_since(&now, &before[1..]);
        assert_eq!(spent.len(), now.len());
        // The first thread (the lowest id: the main thread) is not in
        // `earlier`: all its time counts.
        assert_eq!(spent[0].cpu, now[0].cpu);
        assert!(spent.iter().all(|t| t.cpu.total() >= 0.0));
        assert!(thread_cpu_times(u32::MAX).is_empty());
        tx.send(()).unwrap();
        named.join().unwrap();
    }
}
