//! Who holds an image's exclusive lock, written into the image's metadata
//! (`rbd image-meta get P/I sqcq.lock-owner`), so that a restarted
//! `sqcqd` can tell that the client holding the lock is its own dead
//! predecessor and take the lock over at once.
//!
//! Without this, a daemon killed with `kill -9` leaves the lock to a dead
//! client, and the next writer waits until the OSD drops that client's
//! watch (`osd_client_watch_timeout`, 30 s) before librbd breaks it: 30 s
//! of a guest without its disk on every daemon restart after a crash.
//! Ceph cannot know sooner that the client is dead; on the same host, in
//! the same PID namespace and the same boot, we can: the process is gone,
//! or its PID now belongs to a process that started later.
//!
//! What is judged, and nothing more: the record must name the client that
//! holds the lock now (a stale record from before a hand-over is
//! ignored), and the boot and PID namespace must be ours (anything else
//! is another host or container, whose processes we cannot see: librbd's
//! own wait applies). Breaking the lock blocklists the dead client first
//! (`rbd_lock_break` with `rbd_blocklist_on_break_lock`, on by default),
//! so nothing it still had in flight can land afterwards: the fencing is
//! Ceph's, only the moment is ours. Even a wrong judgement could not
//! corrupt data: the blocklisted client would lose its access, not share
//! it.

use std::fs;

/// The image metadata key of the record.
pub(crate) const KEY: &str = "sqcq.lock-owner";

/// The process that took an image's exclusive lock, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    /// `/proc/sys/kernel/random/boot_id`.
    boot: String,
    /// `/proc/self/ns/pid`'s target, e.g. `pid:[4026531836]`.
    pidns: String,
    pid: u32,
    /// The process's start time (`/proc/PID/stat` field 22, clock ticks
    /// since boot): tells a reused PID apart.
    start: u64,
    /// The client that holds the lock, as `rbd_lock_get_owners` names it.
    pub(crate) client: String,
}

impl Owner {
    /// This process, holding the lock as `client`; `None` where `/proc`
    /// cannot say (no record is written then).
    pub(crate) fn this_process(client: &str) -> Option<Self> {
        let pid = std::process::id();
        if !proc_is_ours() {
            return None;
        }
        Some(Owner {
            boot: boot_id()?,
            pidns: pid_namespace()?,
            pid,
            start: start_time(pid)?,
            client: client.to_owned(),
        })
    }

    /// The record as stored: `key=value` pairs separated by spaces.
    pub(crate) fn to_record(&self) -> String {
        format!(
            "boot={} pidns={} pid={} start={} client={}",
            self.boot, self.pidns, self.pid, self.start, self.client
        )
    }

    /// Reads a record; `None` for anything malformed (it comes from the
    /// cluster, where anyone with the image's caps may write it).
    pub(crate) fn parse(record: &str) -> Option<Self> {
        let (mut boot, mut pidns, mut pid, mut start, mut client) = (None, None, None, None, None);
        for field in record.split_ascii_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "boot" => boot = Some(value.to_owned()),
                "pidns" => pidns = Some(value.to_owned()),
                "pid" => pid = Some(value.parse().ok()?),
                "start" => start = Some(value.parse().ok()?),
                "client" => client = Some(value.to_owned()),
                _ => {}
            }
        }
        Some(Owner {
            boot: boot?,
            pidns: pidns?,
            pid: pid?,
            start: start?,
            client: client?,
        })
    }

    /// The recorded PID.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the recorded process is known to be dead: it ran in this
    /// boot and PID namespace, and its PID is now free or taken by a
    /// process that started at another time. `false` whenever that cannot
    /// be known (another host or container, `/proc` unreadable, of
    /// another PID namespace than ours, or hiding other users' processes).
    pub(crate) fn is_dead_here(&self) -> bool {
        if !proc_is_ours()
            || boot_id().as_deref() != Some(&self.boot)
            || pid_namespace().as_deref() != Some(&self.pidns)
        {
            return false;
        }
        match fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(stat) => parse_start_time(&stat).is_some_and(|start| start != self.start),
            // Absent from /proc: gone, or hidden from us (`hidepid`,
            // systemd's ProtectProc=invisible) while alive under another
            // user. Only the kernel's "no such process" tells them apart.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => no_such_process(self.pid),
            Err(_) => false,
        }
    }
}

/// Whether `/proc` shows our PID namespace: `/proc/self` names our PID
/// (not so under `unshare -p` without a new `/proc`, or in a container
/// given the host's).
fn proc_is_ours() -> bool {
    fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// Whether no process has `pid` (`kill(pid, 0)` fails with ESRCH; EPERM
/// means one exists, another user's).
fn no_such_process(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; it only checks that `pid` exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

fn boot_id() -> Option<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

fn pid_namespace() -> Option<String> {
    let ns = fs::read_link("/proc/self/ns/pid").ok()?;
    ns.to_str().map(str::to_owned)
}

fn start_time(pid: u32) -> Option<u64> {
    parse_start_time(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 of `/proc/PID/stat`, counted after the command name, which
/// is in parentheses and may itself hold spaces and parentheses.
fn parse_start_time(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name: the start time is the 20th of them.
    after_comm.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let me = Owner::this_process("127.0.0.1:0/1234").expect("/proc is readable");
        assert_eq!(Owner::parse(&me.to_record()), Some(me.clone()));
        assert_eq!(me.pid(), std::process::id());
    }

    #[test]
    fn malformed_records_are_refused() {
        let good = "boot=b pidns=pid:[1] pid=7 start=9 client=c";
        assert!(Owner::parse(good).is_some());
        for bad in [
            "",
            "boot=b pidns=pid:[1] pid=7 start=9",
            "boot=b pidns=pid:[1] pid=seven start=9 client=c",
            "boot=b pidns=pid:[1] pid=7 start=-1 client=c",
            "boot=b pidns pid=7 start=9 client=c",
        ] {
            assert_eq!(Owner::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_start_time_is_found_after_a_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("42 (x) S 1"), None);
    }

    #[test]
    fn only_a_process_known_gone_from_this_boot_and_namespace_is_dead() {
        let me = Owner::this_process("c").unwrap();
        assert!(!me.is_dead_here(), "this process is alive");
        // A child that has exited and been reaped: its PID is free (or,
        // reused meanwhile, belongs to a process started later).
        let mut child = {
            let _spawning = crate::test_fork::spawning();
            std::process::Command::new("true").spawn().unwrap()
        };
        let child_pid = child.id();
        let child_start = start_time(child_pid);
        child.wait().unwrap();
        let dead = Owner {
            pid: child_pid,
            start: child_start.unwrap_or(me.start),
            ..me.clone()
        };
        assert!(dead.is_dead_here(), "an exited child is dead");
        // Our own PID with another start time: the PID was reused.
        let reused = Owner {
            start: me.start + 1,
            ..me.clone()
        };
        assert!(reused.is_dead_here());
        // Another boot or PID namespace cannot be judged from here.
        let elsewhere = Owner {
            boot: "another-boot".into(),
            ..dead.clone()
        };
        assert!(!elsewhere.is_dead_here());
        let container = Owner {
            pidns: "pid:[1]".into(),
            ..dead
        };
        assert!(!container.is_dead_here());
    }

    #[test]
    fn the_kernel_says_whether_a_process_exists() {
        assert!(!no_such_process(std::process::id()));
        // init exists, whoever we are (EPERM for a user: still alive).
        assert!(!no_such_process(1));
        let mut child = {
            let _spawning = crate::test_fork::spawning();
            std::process::Command::new("true").spawn().unwrap()
        };
        let pid = child.id();
        child.wait().unwrap();
        // Reaped: free, unless reused meanwhile by a process that lives.
        assert!(no_such_process(pid) || start_time(pid).is_some());
        assert!(!no_such_process(u32::MAX), "not a PID: not judged");
        assert!(proc_is_ours());
    }
}
