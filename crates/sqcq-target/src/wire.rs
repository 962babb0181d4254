//! The virtio-scsi wire format (virtio 1.2, section 5.6).
//!
//! Every structure the guest reads or writes is encoded and decoded here,
//! byte by byte in little endian, from plain byte arrays: nothing in this
//! module trusts a length or a value that came from the guest.

use crate::lun::LunAddress;

/// Virtio-scsi feature bit: the device reports hot plug and unplug events.
pub const VIRTIO_SCSI_F_HOTPLUG: u32 = 1;
/// Virtio-scsi feature bit: the device reports LUN parameter changes.
pub const VIRTIO_SCSI_F_CHANGE: u32 = 2;

/// Default size of the CDB field of a command request.
pub const DEFAULT_CDB_SIZE: u32 = 32;
/// Default size of the sense field of a command response.
pub const DEFAULT_SENSE_SIZE: u32 = 96;
/// Largest CDB size a driver may configure: a CDB is at most 260 bytes
/// (SPC-4 4.2.2, variable length CDBs).
pub const MAX_CDB_SIZE: u32 = 260;
/// Largest sense size a driver may configure (SPC-4: 252 bytes).
pub const MAX_SENSE_SIZE: u32 = 252;

/// Bytes of `virtio_scsi_cmd_req` before the CDB: `lun[8]`, tag, task_attr,
/// prio, crn.
pub const CMD_REQ_FIXED: usize = 19;
/// Bytes of `virtio_scsi_cmd_resp` before the sense data: sense_len, resid,
/// status_qualifier, status, response.
pub const CMD_RESP_FIXED: usize = 12;
/// Size of `virtio_scsi_ctrl_tmf_req`.
pub const TMF_REQ_SIZE: usize = 24;
/// Size of `virtio_scsi_ctrl_an_req`.
pub const AN_REQ_SIZE: usize = 16;
/// Size of `virtio_scsi_event`.
pub const EVENT_SIZE: usize = 16;
/// The same, as the config space's `event_info_size`.
pub const EVENT_INFO_SIZE: u32 = 16;

/// `virtio_scsi_ctrl_*` request types.
pub const CTRL_TMF: u32 = 0;
/// Asynchronous notification query.
pub const CTRL_AN_QUERY: u32 = 1;
/// Asynchronous notification subscription.
pub const CTRL_AN_SUBSCRIBE: u32 = 2;

/// Event type: transport reset (hot plug, hot unplug, rescan).
pub const EVT_TRANSPORT_RESET: u32 = 1;
/// Event type: a LUN parameter changed (capacity, mode parameters).
pub const EVT_PARAM_CHANGE: u32 = 3;
/// Flag set in an event when the device dropped events for lack of
/// buffers.
pub const EVT_EVENTS_MISSED: u32 = 0x8000_0000;
/// Transport reset reason: a LUN appeared, rescan it.
pub const EVT_RESET_RESCAN: u32 = 1;
/// Transport reset reason: a LUN went away.
pub const EVT_RESET_REMOVED: u32 = 2;

/// The `response` byte of command, TMF and AN responses (virtio 5.6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Response {
    /// The command completed (its SCSI status tells how); for a TMF:
    /// FUNCTION COMPLETE.
    Ok = 0,
    /// The data buffers were too small for the transfer.
    Overrun = 1,
    /// The command was aborted by a task management function.
    Aborted = 2,
    /// The LUN field addresses a target that does not exist.
    BadTarget = 3,
    /// The command was cleared by a reset.
    Reset = 4,
    /// The device is busy; the driver may retry.
    Busy = 5,
    /// The transport failed.
    TransportFailure = 6,
    /// The target failed.
    TargetFailure = 7,
    /// The I_T nexus failed.
    NexusFailure = 8,
    /// Any other failure, among them a malformed request.
    Failure = 9,
    /// A task management function succeeded (QUERY TASK found the task).
    FunctionSucceeded = 10,
    /// A task management function is not supported.
    FunctionRejected = 11,
    /// A task management function addressed a LUN that does not exist.
    IncorrectLun = 12,
}

/// The fixed part of a command request, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdReqHeader {
    /// The addressed target and LUN.
    pub lun: LunAddress,
    /// The driver's tag for the command.
    pub tag: u64,
    /// SAM task attribute.
    pub task_attr: u8,
}

impl CmdReqHeader {
    /// Decodes the 19 fixed bytes of `virtio_scsi_cmd_req`.
    pub fn decode(fixed: &[u8; CMD_REQ_FIXED]) -> Self {
        CmdReqHeader {
            lun: LunAddress::decode(&sub8(fixed, 0)),
            tag: u64::from_le_bytes(sub8(fixed, 8)),
            task_attr: fixed[16],
        }
    }
}

/// A command response, ready to be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdResp {
    /// Bytes of sense data that follow.
    pub sense_len: u32,
    /// Residual: bytes of the data buffer not transferred.
    pub resid: u32,
    /// SCSI status byte.
    pub status: u8,
    /// Virtio-scsi response.
    pub response: Response,
}

impl CmdResp {
    /// A response with only the virtio-scsi `response` set.
    pub const fn transport(response: Response, resid: u32) -> Self {
        CmdResp {
            sense_len: 0,
            resid,
            status: 0,
            response,
        }
    }

    /// Encodes the 12 fixed bytes of `virtio_scsi_cmd_resp`.
    pub fn encode(&self) -> [u8; CMD_RESP_FIXED] {
        let mut out = [0u8; CMD_RESP_FIXED];
        out[0..4].copy_from_slice(&self.sense_len.to_le_bytes());
        out[4..8].copy_from_slice(&self.resid.to_le_bytes());
        // status_qualifier (bytes 8..10) stays zero.
        out[10] = self.status;
        out[11] = self.response as u8;
        out
    }
}

/// A decoded `virtio_scsi_ctrl_tmf_req` (type already checked to be TMF).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmfReq {
    /// Task management function (`VIRTIO_SCSI_T_TMF_*`).
    pub subtype: u32,
    /// The addressed LUN.
    pub lun: LunAddress,
    /// Tag of the task to act on (ABORT TASK, QUERY TASK).
    pub tag: u64,
}

impl TmfReq {
    /// Decodes the request after its 4-byte type.
    pub fn decode(buf: &[u8; TMF_REQ_SIZE]) -> Self {
        TmfReq {
            subtype: u32::from_le_bytes(sub4(buf, 4)),
            lun: LunAddress::decode(&sub8(buf, 8)),
            tag: u64::from_le_bytes(sub8(buf, 16)),
        }
    }
}

/// A decoded `virtio_scsi_ctrl_an_req`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnReq {
    /// The addressed LUN.
    pub lun: LunAddress,
    /// Events the driver asks about.
    pub event_requested: u32,
}

impl AnReq {
    /// Decodes an asynchronous notification request.
    pub fn decode(buf: &[u8; AN_REQ_SIZE]) -> Self {
        AnReq {
            lun: LunAddress::decode(&sub8(buf, 4)),
            event_requested: u32::from_le_bytes(sub4(buf, 12)),
        }
    }
}

/// Encodes `virtio_scsi_ctrl_an_resp`.
pub fn encode_an_resp(event_actual: u32, response: Response) -> [u8; 5] {
    let mut out = [0u8; 5];
    out[0..4].copy_from_slice(&event_actual.to_le_bytes());
    out[4] = response as u8;
    out
}

/// One `virtio_scsi_event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Event type, possibly with [`EVT_EVENTS_MISSED`].
    pub event: u32,
    /// The LUN it concerns.
    pub lun: LunAddress,
    /// Reason code.
    pub reason: u32,
}

impl Event {
    /// Encodes the event.
    pub fn encode(&self) -> [u8; EVENT_SIZE] {
        let mut out = [0u8; EVENT_SIZE];
        out[0..4].copy_from_slice(&self.event.to_le_bytes());
        out[4..12].copy_from_slice(&self.lun.encode_event());
        out[12..16].copy_from_slice(&self.reason.to_le_bytes());
        out
    }
}

/// The device configuration space (`virtio_scsi_config`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScsiConfig {
    /// Request queues.
    pub num_queues: u32,
    /// Most data segments in one command.
    pub seg_max: u32,
    /// Most sectors (512 bytes) in one command.
    pub max_sectors: u32,
    /// Commands per LUN the driver may queue.
    pub cmd_per_lun: u32,
    /// Size of an event buffer.
    pub event_info_size: u32,
    /// Sense bytes in a command response (driver-writable).
    pub sense_size: u32,
    /// CDB bytes in a command request (driver-writable).
    pub cdb_size: u32,
    /// Highest channel number (always 0).
    pub max_channel: u16,
    /// Highest target number.
    pub max_target: u16,
    /// Highest LUN number.
    pub max_lun: u32,
}

/// Size of the configuration space.
pub const CONFIG_SIZE: usize = 36;
/// Offset of `sense_size` in the configuration space.
pub const CONFIG_SENSE_SIZE_OFFSET: usize = 20;
/// Offset of `cdb_size` in the configuration space.
pub const CONFIG_CDB_SIZE_OFFSET: usize = 24;

impl ScsiConfig {
    /// Encodes the configuration space.
    pub fn encode(&self) -> [u8; CONFIG_SIZE] {
        let mut out = [0u8; CONFIG_SIZE];
        let words = [
            self.num_queues,
            self.seg_max,
            self.max_sectors,
            self.cmd_per_lun,
            self.event_info_size,
            self.sense_size,
            self.cdb_size,
        ];
        for (i, w) in words.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        out[28..30].copy_from_slice(&self.max_channel.to_le_bytes());
        out[30..32].copy_from_slice(&self.max_target.to_le_bytes());
        out[32..36].copy_from_slice(&self.max_lun.to_le_bytes());
        out
    }
}

fn sub8(buf: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&buf[at..at + 8]);
    out
}

fn sub4(buf: &[u8], at: usize) -> [u8; 4] {
    let mut out = [0u8; 4];
    out.copy_from_slice(&buf[at..at + 4]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmd_req_header_decodes_lun_tag_and_attr() {
        let mut b = [0u8; CMD_REQ_FIXED];
        b[0..4].copy_from_slice(&[1, 0, 0x40, 0x05]);
        b[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        b[16] = 2;
        let h = CmdReqHeader::decode(&b);
        assert_eq!(h.lun, LunAddress::Lun { target: 0, lun: 5 });
        assert_eq!(h.tag, 0x1122_3344_5566_7788);
        assert_eq!(h.task_attr, 2);
    }

    #[test]
    fn cmd_resp_encodes_little_endian() {
        let r = CmdResp {
            sense_len: 18,
            resid: 0x100,
            status: 2,
            response: Response::Ok,
        };
        assert_eq!(r.encode(), [18, 0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0]);
        assert_eq!(CmdResp::transport(Response::BadTarget, 0).encode()[11], 3);
    }

    #[test]
    fn config_space_layout() {
        let c = ScsiConfig {
            num_queues: 2,
            seg_max: 126,
            max_sectors: 0xffff,
            cmd_per_lun: 128,
            event_info_size: 16,
            sense_size: 96,
            cdb_size: 32,
            max_channel: 0,
            max_target: 0,
            max_lun: 16383,
        };
        let b = c.encode();
        assert_eq!(&b[0..4], &[2, 0, 0, 0]);
        assert_eq!(
            &b[CONFIG_SENSE_SIZE_OFFSET..CONFIG_SENSE_SIZE_OFFSET + 4],
            &[96, 0, 0, 0]
        );
        assert_eq!(
            &b[CONFIG_CDB_SIZE_OFFSET..CONFIG_CDB_SIZE_OFFSET + 4],
            &[32, 0, 0, 0]
        );
        assert_eq!(&b[32..36], &16383u32.to_le_bytes());
    }

    #[test]
    fn tmf_and_event_round_trip() {
        let mut b = [0u8; TMF_REQ_SIZE];
        b[4] = 5;
        b[8..12].copy_from_slice(&[1, 0, 0x40, 0x01]);
        b[16] = 9;
        let t = TmfReq::decode(&b);
        assert_eq!(t.subtype, 5);
        assert_eq!(t.tag, 9);
        let e = Event {
            event: EVT_TRANSPORT_RESET,
            lun: t.lun,
            reason: EVT_RESET_RESCAN,
        };
        let enc = e.encode();
        assert_eq!(
            &enc[4..8],
            &[1, 0, 0, 0x01],
            "peripheral addressing below 256"
        );
        assert_eq!(enc[12], 1);
    }
}
