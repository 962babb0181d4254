//! Several devices in one started `sqcqd`: its TOML configuration, with
//! the request queues spread evenly over the daemon's workers.
//!
//! `sqcqd`'s default queue map is round robin within each device, so with
//! one queue per device every device's queue 0 would share worker 0. The
//! bench writes an explicit map instead: queue `q` of device `d` runs on
//! worker `(d × queues + q) mod workers`, the round robin of all the
//! daemon's queues, so that `workers` workers each serve
//! `devices × queues / workers` queues (one more for some when it does
//! not divide).

use std::fmt::Write as _;
use std::path::PathBuf;

use sqcq_driver::DeviceType;

/// What the daemon serves.
#[derive(Debug, Clone)]
pub struct MultiDevice {
    /// One vhost-user socket per device.
    pub sockets: Vec<PathBuf>,
    /// The device type of every device.
    pub device: DeviceType,
    /// Request queues per device.
    pub queues: u16,
    /// Worker threads of the daemon.
    pub workers: u16,
    /// Backstore of every device's one LUN or disk: `null` or `ram`.
    pub lun_kind: &'static str,
    /// Its size in bytes.
    pub lun_size: u64,
}

impl MultiDevice {
    /// The worker of each request queue of device `d`.
    pub fn queue_map(&self, d: usize) -> Vec<usize> {
        let queues = usize::from(self.queues);
        let workers = usize::from(self.workers.max(1));
        (0..queues).map(|q| (d * queues + q) % workers).collect()
    }

    /// The configuration file: one `[[device]]` per socket. Workers, poll
    /// mode and statistics stay on the command line.
    pub fn toml(&self) -> String {
        let mut out = String::new();
        for (d, socket) in self.sockets.iter().enumerate() {
            let map: Vec<String> = self
                .queue_map(d)
                .iter()
                .enumerate()
                .map(|(q, w)| format!("{q}:{w}"))
                .collect();
            out.push_str("[[device]]\n");
            if self.device == DeviceType::Blk {
                out.push_str("type = \"blk\"\n");
            }
            let _ = writeln!(
                out,
                "socket-path = {}",
                toml_string(&socket.to_string_lossy())
            );
            let _ = writeln!(out, "num-queues = {}", self.queues);
            let _ = writeln!(out, "queue-map = \"{}\"", map.join(","));
            let _ = writeln!(
                out,
                "[[device.lun]]\nkind = \"{}\"\nsize = {}\n",
                self.lun_kind, self.lun_size
            );
        }
        out
    }
}

/// A TOML basic string: JSON's string escapes (`\"`, `\\`, `\n`,
/// `\uXXXX`, ...) are all TOML escapes too.
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn multi(devices: usize, queues: u16, workers: u16) -> MultiDevice {
        MultiDevice {
            sockets: (0..devices)
                .map(|d| PathBuf::from(format!("/tmp/x/vhost{d}.sock")))
                .collect(),
            device: DeviceType::Scsi,
            queues,
            workers,
            lun_kind: "null",
            lun_size: 1 << 30,
        }
    }

    #[test]
    fn queues_of_all_devices_share_the_workers_evenly() {
        // One queue per device: device d's queue on worker d, not all on
        // worker 0 as per-device round robin would.
        let m = multi(2, 1, 2);
        assert_eq!((m.queue_map(0), m.queue_map(1)), (vec![0], vec![1]));
        let m = multi(2, 2, 2);
        assert_eq!((m.queue_map(0), m.queue_map(1)), (vec![0, 1], vec![0, 1]));
        let m = multi(3, 2, 4);
        let all: Vec<usize> = (0..3).flat_map(|d| m.queue_map(d)).collect();
        assert_eq!(all, [0, 1, 2, 3, 0, 1]);
        let m = multi(2, 3, 1);
        assert_eq!(m.queue_map(1), [0, 0, 0]);
    }

    #[test]
    fn toml_has_a_device_per_socket() {
        let mut m = multi(2, 2, 2);
        m.sockets[1] = PathBuf::from("/tmp/a \"b\"/vhost1.sock");
        m.device = DeviceType::Blk;
        let text = m.toml();
        assert_eq!(text.matches("[[device]]").count(), 2);
        assert_eq!(text.matches("type = \"blk\"").count(), 2);
        assert!(
            text.contains("socket-path = \"/tmp/x/vhost0.sock\"\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"socket-path = "/tmp/a \"b\"/vhost1.sock""#),
            "{text}"
        );
        assert_eq!(text.matches("queue-map = \"0:0,1:1\"").count(), 2);
        assert!(text.contains("[[device.lun]]\nkind = \"null\"\nsize = 1073741824\n"));
    }
}
