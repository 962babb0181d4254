//! CPU placement: binding a worker (poll thread) to a CPU, and the CPUs
//! left for backstore completion work.
//!
//! The RFC's lesson: completion work scheduled on the CPU of a busy poll
//! thread starves, and steering it to a free CPU closed its QD1 gap. Here a
//! worker bound with `--poll-cpus` runs on its CPU only, and io_uring
//! backstore queues of polled queues get the CPUs that no worker is bound
//! to for their io-wq threads (`IORING_REGISTER_IOWQ_AFF`). When every CPU
//! has a poll thread there is nothing to steer to, and that is logged.

use std::io;

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

/// The CPUs of `allowed` that no poll thread is bound to.
pub fn free_cpus(allowed: &[usize], bound: &[usize]) -> Vec<usize> {
    allowed
        .iter()
        .copied()
        .filter(|c| !bound.contains(c))
        .collect()
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

    #[test]
    fn free_cpus_are_the_unbound_ones() {
        assert_eq!(free_cpus(&[0, 1, 2, 3], &[1, 3]), vec![0, 2]);
        assert!(free_cpus(&[0, 1], &[0, 1]).is_empty());
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
