//! The virtio-scsi wire format (virtio 1.2, section 5.6): the LUN field,
//! command requests and responses, task management and asynchronous
//! notification requests, events and the configuration space.
//!
//! Sizes and field offsets are those of `virtio-bindings`' `virtio_scsi`
//! structures; decoders take fixed-size arrays (the caller has gathered
//! that many bytes from the descriptor chain) and accept any value, so a
//! malformed request decodes to something the device can answer.

use core::fmt;
use core::mem::{offset_of, size_of};

use virtio_bindings::virtio_scsi::{
    self as vs, virtio_scsi_cmd_req, virtio_scsi_cmd_resp, virtio_scsi_config,
    virtio_scsi_ctrl_an_req, virtio_scsi_ctrl_an_resp, virtio_scsi_ctrl_tmf_req,
    virtio_scsi_ctrl_tmf_resp, virtio_scsi_event,
};

use crate::{bytes_at, le16, le32, le64, put};

/// Feature bit: the device reports hot plug and hot unplug events.
pub const VIRTIO_SCSI_F_HOTPLUG: u32 = vs::VIRTIO_SCSI_F_HOTPLUG;
/// Feature bit: the device reports LUN parameter changes.
pub const VIRTIO_SCSI_F_CHANGE: u32 = vs::VIRTIO_SCSI_F_CHANGE;

/// The CDB size a device starts with (5.6.4).
pub const DEFAULT_CDB_SIZE: u32 = vs::VIRTIO_SCSI_CDB_DEFAULT_SIZE;
/// The sense size a device starts with.
pub const DEFAULT_SENSE_SIZE: u32 = vs::VIRTIO_SCSI_SENSE_DEFAULT_SIZE;
/// Largest CDB size either side accepts: a CDB is at most 260 bytes
/// (SPC-4 4.2.2, variable length CDBs).
pub const MAX_CDB_SIZE: u32 = 260;
/// Largest sense size either side accepts (SPC-4 4.5.1: 252 bytes).
pub const MAX_SENSE_SIZE: u32 = 252;
/// Smallest CDB size a driver can work with (a 16-byte CDB must fit).
pub const MIN_CDB_SIZE: u32 = 16;

/// Bytes of `virtio_scsi_cmd_req` before the CDB: `lun[8]`, tag,
/// task_attr, prio, crn.
pub const CMD_REQ_FIXED: usize = offset_of!(virtio_scsi_cmd_req, cdb);
/// Bytes of `virtio_scsi_cmd_resp` before the sense data: sense_len,
/// resid, status_qualifier, status, response.
pub const CMD_RESP_FIXED: usize = offset_of!(virtio_scsi_cmd_resp, sense);
/// A command request with the default CDB size.
pub const CMD_REQ_DEFAULT_SIZE: usize = size_of::<virtio_scsi_cmd_req>();
/// A command response with the default sense size.
pub const CMD_RESP_DEFAULT_SIZE: usize = size_of::<virtio_scsi_cmd_resp>();
/// Size of `virtio_scsi_ctrl_tmf_req`.
pub const TMF_REQ_SIZE: usize = size_of::<virtio_scsi_ctrl_tmf_req>();
/// Size of `virtio_scsi_ctrl_tmf_resp` (the `response` byte).
pub const TMF_RESP_SIZE: usize = size_of::<virtio_scsi_ctrl_tmf_resp>();
/// Size of `virtio_scsi_ctrl_an_req`.
pub const AN_REQ_SIZE: usize = size_of::<virtio_scsi_ctrl_an_req>();
/// Size of `virtio_scsi_ctrl_an_resp`.
pub const AN_RESP_SIZE: usize = size_of::<virtio_scsi_ctrl_an_resp>();
/// Size of `virtio_scsi_event`.
pub const EVENT_SIZE: usize = size_of::<virtio_scsi_event>();
/// The same, as the configuration space's `event_info_size`.
pub const EVENT_INFO_SIZE: u32 = small(EVENT_SIZE);
/// Size of the configuration space.
pub const CONFIG_SIZE: usize = size_of::<virtio_scsi_config>();
/// Offset of `sense_size` in the configuration space (driver-writable).
pub const CONFIG_SENSE_SIZE_OFFSET: usize = offset_of!(virtio_scsi_config, sense_size);
/// Offset of `cdb_size` in the configuration space (driver-writable).
pub const CONFIG_CDB_SIZE_OFFSET: usize = offset_of!(virtio_scsi_config, cdb_size);

/// Control request type: task management function.
pub const CTRL_TMF: u32 = vs::VIRTIO_SCSI_T_TMF;
/// Control request type: asynchronous notification query.
pub const CTRL_AN_QUERY: u32 = vs::VIRTIO_SCSI_T_AN_QUERY;
/// Control request type: asynchronous notification subscription.
pub const CTRL_AN_SUBSCRIBE: u32 = vs::VIRTIO_SCSI_T_AN_SUBSCRIBE;

/// Event type: no event (a buffer the device returned empty).
pub const EVT_NO_EVENT: u32 = vs::VIRTIO_SCSI_T_NO_EVENT;
/// Event type: transport reset (hot plug, hot unplug, rescan).
pub const EVT_TRANSPORT_RESET: u32 = vs::VIRTIO_SCSI_T_TRANSPORT_RESET;
/// Event type: a LUN parameter changed (capacity, mode parameters).
pub const EVT_PARAM_CHANGE: u32 = vs::VIRTIO_SCSI_T_PARAM_CHANGE;
/// Flag set in an event when the device dropped events for lack of
/// buffers.
pub const EVT_EVENTS_MISSED: u32 = vs::VIRTIO_SCSI_T_EVENTS_MISSED;
/// Transport reset reason: a LUN appeared, rescan it.
pub const EVT_RESET_RESCAN: u32 = vs::VIRTIO_SCSI_EVT_RESET_RESCAN;
/// Transport reset reason: a LUN went away.
pub const EVT_RESET_REMOVED: u32 = vs::VIRTIO_SCSI_EVT_RESET_REMOVED;

/// A structure size as a 32-bit field.
#[allow(clippy::cast_possible_truncation)]
const fn small(v: usize) -> u32 {
    assert!(v <= u32::MAX as usize);
    v as u32
}

/// A virtio-scsi constant that the specification defines as a byte.
#[allow(clippy::cast_possible_truncation)]
const fn byte(v: u32) -> u8 {
    assert!(v <= 0xff);
    v as u8
}

/// A logical unit as virtio-scsi addresses it (5.6.6.1): byte 0 is 1,
/// byte 1 the target, bytes 2-3 the LUN in SAM single-level format, bytes
/// 4-7 zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lun {
    target: u8,
    lun: u16,
}

impl Lun {
    /// The highest LUN of single-level (flat space) addressing.
    pub const MAX_LUN: u16 = 0x3fff;

    /// LUN `lun` of target `target`; `None` beyond [`Self::MAX_LUN`].
    pub const fn new(target: u8, lun: u16) -> Option<Self> {
        if lun <= Self::MAX_LUN {
            Some(Self { target, lun })
        } else {
            None
        }
    }

    /// The target id.
    pub const fn target(self) -> u8 {
        self.target
    }

    /// The LUN.
    pub const fn lun(self) -> u16 {
        self.lun
    }

    /// Decodes the field; `None` when it is not in the virtio-scsi format
    /// (byte 0 is not 1) and so addresses no target. Flat space (`0x40 |
    /// hi, lo`) and peripheral (`0, lo`) addressing decode alike: like
    /// Linux's vhost-scsi, the LUN is `((b2 << 8) | b3) & 0x3fff`.
    pub const fn decode(b: &[u8; 8]) -> Option<Self> {
        if b[0] != 1 {
            return None;
        }
        Some(Self {
            target: b[1],
            lun: u16::from_be_bytes([b[2], b[3]]) & Self::MAX_LUN,
        })
    }

    /// Encodes the field with flat space addressing, as Linux's driver
    /// does.
    pub const fn encode(self) -> [u8; 8] {
        let [hi, lo] = self.lun.to_be_bytes();
        [1, self.target, 0x40 | hi, lo, 0, 0, 0, 0]
    }

    /// Encodes the field of an event (5.6.6.3): LUNs below 256 with
    /// peripheral addressing, as REPORT LUNS lists them, like QEMU and
    /// Linux's vhost-scsi. Linux's driver takes `(lun[2] << 8) | lun[3]`
    /// unmasked as the LUN to scan or remove, so flat addressing here
    /// would name LUN 0x4001 instead of 1.
    pub const fn encode_event(self) -> [u8; 8] {
        if self.lun < 0x100 {
            [1, self.target, 0, self.lun.to_be_bytes()[1], 0, 0, 0, 0]
        } else {
            self.encode()
        }
    }
}

impl fmt::Display for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.target, self.lun)
    }
}

/// The `response` byte of command, TMF and AN responses (5.6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response {
    /// The command completed (its SCSI status tells how); for a TMF:
    /// FUNCTION COMPLETE.
    Ok,
    /// The data buffers were too small for the transfer.
    Overrun,
    /// The command was aborted by a task management function.
    Aborted,
    /// The LUN field addresses a target that does not exist.
    BadTarget,
    /// The command was cleared by a reset.
    Reset,
    /// The device is busy; the driver may retry.
    Busy,
    /// The transport failed (the path, not the target).
    TransportFailure,
    /// The target failed.
    TargetFailure,
    /// The I_T nexus failed.
    NexusFailure,
    /// Any other failure, among them a malformed request.
    Failure,
    /// A task management function succeeded (QUERY TASK found the task).
    FunctionSucceeded,
    /// A task management function is not supported.
    FunctionRejected,
    /// A task management function addressed a LUN that does not exist.
    IncorrectLun,
    /// A value the specification does not define (decoded from a device).
    Unknown(u8),
}

/// Every defined response with its `VIRTIO_SCSI_S_*` value.
const RESPONSES: [(Response, u8); 13] = [
    (Response::Ok, byte(vs::VIRTIO_SCSI_S_OK)),
    (Response::Overrun, byte(vs::VIRTIO_SCSI_S_OVERRUN)),
    (Response::Aborted, byte(vs::VIRTIO_SCSI_S_ABORTED)),
    (Response::BadTarget, byte(vs::VIRTIO_SCSI_S_BAD_TARGET)),
    (Response::Reset, byte(vs::VIRTIO_SCSI_S_RESET)),
    (Response::Busy, byte(vs::VIRTIO_SCSI_S_BUSY)),
    (
        Response::TransportFailure,
        byte(vs::VIRTIO_SCSI_S_TRANSPORT_FAILURE),
    ),
    (
        Response::TargetFailure,
        byte(vs::VIRTIO_SCSI_S_TARGET_FAILURE),
    ),
    (
        Response::NexusFailure,
        byte(vs::VIRTIO_SCSI_S_NEXUS_FAILURE),
    ),
    (Response::Failure, byte(vs::VIRTIO_SCSI_S_FAILURE)),
    (
        Response::FunctionSucceeded,
        byte(vs::VIRTIO_SCSI_S_FUNCTION_SUCCEEDED),
    ),
    (
        Response::FunctionRejected,
        byte(vs::VIRTIO_SCSI_S_FUNCTION_REJECTED),
    ),
    (
        Response::IncorrectLun,
        byte(vs::VIRTIO_SCSI_S_INCORRECT_LUN),
    ),
];

impl Response {
    /// Decodes the `response` byte.
    pub fn from_byte(b: u8) -> Self {
        RESPONSES
            .iter()
            .find(|&&(_, v)| v == b)
            .map_or(Self::Unknown(b), |&(r, _)| r)
    }

    /// The `response` byte.
    pub fn to_byte(self) -> u8 {
        match self {
            Self::Unknown(b) => b,
            known => RESPONSES
                .iter()
                .find(|&&(r, _)| r == known)
                .map_or(byte(vs::VIRTIO_SCSI_S_FAILURE), |&(_, v)| v),
        }
    }
}

/// The SAM task attribute of a command (`VIRTIO_SCSI_S_SIMPLE` ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum TaskAttr {
    /// SIMPLE.
    #[default]
    Simple = byte(vs::VIRTIO_SCSI_S_SIMPLE),
    /// ORDERED.
    Ordered = byte(vs::VIRTIO_SCSI_S_ORDERED),
    /// HEAD OF QUEUE.
    HeadOfQueue = byte(vs::VIRTIO_SCSI_S_HEAD),
    /// ACA.
    Aca = byte(vs::VIRTIO_SCSI_S_ACA),
}

/// The fixed part of a command request (the CDB follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdReqHeader {
    /// The addressed LUN; `None` when the field is not in the virtio-scsi
    /// format.
    pub lun: Option<Lun>,
    /// The driver's tag for the command.
    pub tag: u64,
    /// SAM task attribute, as sent.
    pub task_attr: u8,
}

impl CmdReqHeader {
    /// Decodes the fixed bytes of `virtio_scsi_cmd_req`.
    pub fn decode(fixed: &[u8; CMD_REQ_FIXED]) -> Self {
        Self {
            lun: Lun::decode(&bytes_at(fixed, offset_of!(virtio_scsi_cmd_req, lun))),
            tag: le64(fixed, offset_of!(virtio_scsi_cmd_req, tag)),
            task_attr: fixed[offset_of!(virtio_scsi_cmd_req, task_attr)],
        }
    }
}

/// Writes a command request for a device with `cdb_size`-byte CDBs into
/// `out`, which must hold [`CMD_REQ_FIXED`] + `cdb_size` bytes; the CDB
/// is zero-padded (at most `cdb_size` bytes of `cdb` are written).
/// Returns the request's length.
pub fn encode_cmd_req(
    out: &mut [u8],
    lun: Lun,
    tag: u64,
    attr: TaskAttr,
    cdb: &[u8],
    cdb_size: usize,
) -> usize {
    let len = CMD_REQ_FIXED + cdb_size;
    let out = &mut out[..len];
    put(out, offset_of!(virtio_scsi_cmd_req, lun), &lun.encode());
    put(
        out,
        offset_of!(virtio_scsi_cmd_req, tag),
        &tag.to_le_bytes(),
    );
    out[offset_of!(virtio_scsi_cmd_req, task_attr)] = attr as u8;
    out[offset_of!(virtio_scsi_cmd_req, prio)] = 0;
    out[offset_of!(virtio_scsi_cmd_req, crn)] = 0;
    let cdb_out = &mut out[CMD_REQ_FIXED..];
    cdb_out.fill(0);
    let n = cdb.len().min(cdb_size);
    cdb_out[..n].copy_from_slice(&cdb[..n]);
    len
}

/// The fixed part of a command response (the sense data follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmdResp {
    /// Bytes of sense data that follow.
    pub sense_len: u32,
    /// Residual: bytes of the data buffer not transferred.
    pub resid: u32,
    /// Status qualifier.
    pub status_qualifier: u16,
    /// SCSI status byte.
    pub status: u8,
    /// Virtio-scsi response.
    pub response: Response,
}

impl CmdResp {
    /// A response with only the virtio-scsi `response` set.
    pub const fn transport(response: Response, resid: u32) -> Self {
        Self {
            sense_len: 0,
            resid,
            status_qualifier: 0,
            status: 0,
            response,
        }
    }

    /// A command that reached its LUN: `response` OK, the SCSI `status`
    /// (any sense data is added with `sense_len`).
    pub const fn completed(status: u8, resid: u32) -> Self {
        Self {
            status,
            ..Self::transport(Response::Ok, resid)
        }
    }

    /// Encodes the fixed bytes of `virtio_scsi_cmd_resp`.
    pub fn encode(&self) -> [u8; CMD_RESP_FIXED] {
        let mut out = [0u8; CMD_RESP_FIXED];
        put(
            &mut out,
            offset_of!(virtio_scsi_cmd_resp, sense_len),
            &self.sense_len.to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_scsi_cmd_resp, resid),
            &self.resid.to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_scsi_cmd_resp, status_qualifier),
            &self.status_qualifier.to_le_bytes(),
        );
        out[offset_of!(virtio_scsi_cmd_resp, status)] = self.status;
        out[offset_of!(virtio_scsi_cmd_resp, response)] = self.response.to_byte();
        out
    }

    /// Parses the header at the start of `bytes` (at least
    /// [`CMD_RESP_FIXED`] bytes); `sense_len` is clamped to the sense bytes
    /// that follow it in `bytes`.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..CMD_RESP_FIXED)?;
        let sense_room = u32::try_from(bytes.len() - CMD_RESP_FIXED).unwrap_or(u32::MAX);
        Some(Self {
            sense_len: le32(b, offset_of!(virtio_scsi_cmd_resp, sense_len)).min(sense_room),
            resid: le32(b, offset_of!(virtio_scsi_cmd_resp, resid)),
            status_qualifier: le16(b, offset_of!(virtio_scsi_cmd_resp, status_qualifier)),
            status: b[offset_of!(virtio_scsi_cmd_resp, status)],
            response: Response::from_byte(b[offset_of!(virtio_scsi_cmd_resp, response)]),
        })
    }
}

/// A task management function (`VIRTIO_SCSI_T_TMF_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Tmf {
    /// ABORT TASK (the command with the given tag).
    AbortTask = vs::VIRTIO_SCSI_T_TMF_ABORT_TASK,
    /// ABORT TASK SET.
    AbortTaskSet = vs::VIRTIO_SCSI_T_TMF_ABORT_TASK_SET,
    /// CLEAR ACA.
    ClearAca = vs::VIRTIO_SCSI_T_TMF_CLEAR_ACA,
    /// CLEAR TASK SET.
    ClearTaskSet = vs::VIRTIO_SCSI_T_TMF_CLEAR_TASK_SET,
    /// I_T NEXUS RESET.
    ItNexusReset = vs::VIRTIO_SCSI_T_TMF_I_T_NEXUS_RESET,
    /// LOGICAL UNIT RESET.
    LogicalUnitReset = vs::VIRTIO_SCSI_T_TMF_LOGICAL_UNIT_RESET,
    /// QUERY TASK.
    QueryTask = vs::VIRTIO_SCSI_T_TMF_QUERY_TASK,
    /// QUERY TASK SET.
    QueryTaskSet = vs::VIRTIO_SCSI_T_TMF_QUERY_TASK_SET,
}

impl Tmf {
    /// Every function, in `VIRTIO_SCSI_T_TMF_*` order.
    pub const ALL: [Tmf; 8] = [
        Tmf::AbortTask,
        Tmf::AbortTaskSet,
        Tmf::ClearAca,
        Tmf::ClearTaskSet,
        Tmf::ItNexusReset,
        Tmf::LogicalUnitReset,
        Tmf::QueryTask,
        Tmf::QueryTaskSet,
    ];

    /// The function a `subtype` names, if any.
    pub fn from_u32(subtype: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|&t| t as u32 == subtype)
    }
}

/// A task management request (`virtio_scsi_ctrl_tmf_req`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmfReq {
    /// Function, as sent (see [`Tmf::from_u32`]).
    pub subtype: u32,
    /// The addressed LUN, if the field is well formed.
    pub lun: Option<Lun>,
    /// Tag of the task to act on (ABORT TASK, QUERY TASK).
    pub tag: u64,
}

impl TmfReq {
    /// Decodes the request (its `type` is read by the caller, who
    /// dispatched on it).
    pub fn decode(buf: &[u8; TMF_REQ_SIZE]) -> Self {
        Self {
            subtype: le32(buf, offset_of!(virtio_scsi_ctrl_tmf_req, subtype)),
            lun: Lun::decode(&bytes_at(buf, offset_of!(virtio_scsi_ctrl_tmf_req, lun))),
            tag: le64(buf, offset_of!(virtio_scsi_ctrl_tmf_req, tag)),
        }
    }
}

/// Encodes a task management request.
pub fn encode_tmf_req(tmf: Tmf, lun: Lun, tag: u64) -> [u8; TMF_REQ_SIZE] {
    let mut out = [0u8; TMF_REQ_SIZE];
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_tmf_req, type_),
        &CTRL_TMF.to_le_bytes(),
    );
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_tmf_req, subtype),
        &(tmf as u32).to_le_bytes(),
    );
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_tmf_req, lun),
        &lun.encode(),
    );
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_tmf_req, tag),
        &tag.to_le_bytes(),
    );
    out
}

/// The control request type of a control-queue buffer (its first four
/// bytes), whatever the request.
pub fn ctrl_type(first: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*first)
}

/// An asynchronous notification request (`virtio_scsi_ctrl_an_req`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnReq {
    /// The addressed LUN, if the field is well formed.
    pub lun: Option<Lun>,
    /// Events the driver asks about.
    pub event_requested: u32,
}

impl AnReq {
    /// Decodes the request.
    pub fn decode(buf: &[u8; AN_REQ_SIZE]) -> Self {
        Self {
            lun: Lun::decode(&bytes_at(buf, offset_of!(virtio_scsi_ctrl_an_req, lun))),
            event_requested: le32(buf, offset_of!(virtio_scsi_ctrl_an_req, event_requested)),
        }
    }
}

/// Encodes `virtio_scsi_ctrl_an_req`: `kind` is [`CTRL_AN_QUERY`] or
/// [`CTRL_AN_SUBSCRIBE`].
pub fn encode_an_req(kind: u32, lun: Lun, event_requested: u32) -> [u8; AN_REQ_SIZE] {
    let mut out = [0u8; AN_REQ_SIZE];
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_an_req, type_),
        &kind.to_le_bytes(),
    );
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_an_req, lun),
        &lun.encode(),
    );
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_an_req, event_requested),
        &event_requested.to_le_bytes(),
    );
    out
}

/// An asynchronous notification response (`virtio_scsi_ctrl_an_resp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnResp {
    /// Events the device supports (query) or subscribed (subscribe).
    pub event_actual: u32,
    /// The response.
    pub response: Response,
}

impl AnResp {
    /// Decodes a response a device wrote.
    pub fn decode(buf: &[u8; AN_RESP_SIZE]) -> Self {
        Self {
            event_actual: le32(buf, offset_of!(virtio_scsi_ctrl_an_resp, event_actual)),
            response: Response::from_byte(buf[offset_of!(virtio_scsi_ctrl_an_resp, response)]),
        }
    }
}

/// Encodes `virtio_scsi_ctrl_an_resp`.
pub fn encode_an_resp(event_actual: u32, response: Response) -> [u8; AN_RESP_SIZE] {
    let mut out = [0u8; AN_RESP_SIZE];
    put(
        &mut out,
        offset_of!(virtio_scsi_ctrl_an_resp, event_actual),
        &event_actual.to_le_bytes(),
    );
    out[offset_of!(virtio_scsi_ctrl_an_resp, response)] = response.to_byte();
    out
}

/// One `virtio_scsi_event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Event type, possibly with [`EVT_EVENTS_MISSED`].
    pub event: u32,
    /// The LUN it concerns (`None`: not in the virtio-scsi format, when
    /// decoded).
    pub lun: Option<Lun>,
    /// Reason code.
    pub reason: u32,
}

impl Event {
    /// Encodes the event; its LUN as [`Lun::encode_event`] does.
    pub fn encode(&self) -> [u8; EVENT_SIZE] {
        let mut out = [0u8; EVENT_SIZE];
        put(
            &mut out,
            offset_of!(virtio_scsi_event, event),
            &self.event.to_le_bytes(),
        );
        let lun = self.lun.map_or([0; 8], Lun::encode_event);
        put(&mut out, offset_of!(virtio_scsi_event, lun), &lun);
        put(
            &mut out,
            offset_of!(virtio_scsi_event, reason),
            &self.reason.to_le_bytes(),
        );
        out
    }

    /// Decodes an event a device wrote.
    pub fn decode(buf: &[u8; EVENT_SIZE]) -> Self {
        Self {
            event: le32(buf, offset_of!(virtio_scsi_event, event)),
            lun: Lun::decode(&bytes_at(buf, offset_of!(virtio_scsi_event, lun))),
            reason: le32(buf, offset_of!(virtio_scsi_event, reason)),
        }
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

impl Default for ScsiConfig {
    /// What a driver assumes of a device it cannot ask (no `CONFIG`
    /// protocol feature): one queue, the specification's default sizes.
    fn default() -> Self {
        Self {
            num_queues: 1,
            seg_max: 1,
            max_sectors: 0xffff,
            cmd_per_lun: 128,
            event_info_size: EVENT_INFO_SIZE,
            sense_size: DEFAULT_SENSE_SIZE,
            cdb_size: DEFAULT_CDB_SIZE,
            max_channel: 0,
            max_target: 0,
            max_lun: 0,
        }
    }
}

/// A configuration space no driver could work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Fewer than [`CONFIG_SIZE`] bytes.
    #[error("virtio-scsi config of {0} bytes, expected {CONFIG_SIZE}")]
    TooShort(usize),
    /// A field out of the range the driver accepts.
    #[error("virtio-scsi config field {field} = {value} is out of range")]
    OutOfRange {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: u32,
    },
}

impl ScsiConfig {
    /// Encodes the configuration space.
    pub fn encode(&self) -> [u8; CONFIG_SIZE] {
        let mut out = [0u8; CONFIG_SIZE];
        let words = [
            (offset_of!(virtio_scsi_config, num_queues), self.num_queues),
            (offset_of!(virtio_scsi_config, seg_max), self.seg_max),
            (
                offset_of!(virtio_scsi_config, max_sectors),
                self.max_sectors,
            ),
            (
                offset_of!(virtio_scsi_config, cmd_per_lun),
                self.cmd_per_lun,
            ),
            (
                offset_of!(virtio_scsi_config, event_info_size),
                self.event_info_size,
            ),
            (CONFIG_SENSE_SIZE_OFFSET, self.sense_size),
            (CONFIG_CDB_SIZE_OFFSET, self.cdb_size),
            (offset_of!(virtio_scsi_config, max_lun), self.max_lun),
        ];
        for (at, w) in words {
            put(&mut out, at, &w.to_le_bytes());
        }
        put(
            &mut out,
            offset_of!(virtio_scsi_config, max_channel),
            &self.max_channel.to_le_bytes(),
        );
        put(
            &mut out,
            offset_of!(virtio_scsi_config, max_target),
            &self.max_target.to_le_bytes(),
        );
        out
    }

    /// Decodes and checks the configuration space a device sent: at least
    /// one queue, CDB and sense sizes within what either side accepts.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let b: &[u8; CONFIG_SIZE] = bytes
            .get(..CONFIG_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or(ConfigError::TooShort(bytes.len()))?;
        let config = Self {
            num_queues: le32(b, offset_of!(virtio_scsi_config, num_queues)),
            seg_max: le32(b, offset_of!(virtio_scsi_config, seg_max)),
            max_sectors: le32(b, offset_of!(virtio_scsi_config, max_sectors)),
            cmd_per_lun: le32(b, offset_of!(virtio_scsi_config, cmd_per_lun)),
            event_info_size: le32(b, offset_of!(virtio_scsi_config, event_info_size)),
            sense_size: le32(b, CONFIG_SENSE_SIZE_OFFSET),
            cdb_size: le32(b, CONFIG_CDB_SIZE_OFFSET),
            max_channel: le16(b, offset_of!(virtio_scsi_config, max_channel)),
            max_target: le16(b, offset_of!(virtio_scsi_config, max_target)),
            max_lun: le32(b, offset_of!(virtio_scsi_config, max_lun)),
        };
        let check = |field, value, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange { field, value })
            }
        };
        check("num_queues", config.num_queues, config.num_queues >= 1)?;
        check(
            "cdb_size",
            config.cdb_size,
            (MIN_CDB_SIZE..=MAX_CDB_SIZE).contains(&config.cdb_size),
        )?;
        check(
            "sense_size",
            config.sense_size,
            config.sense_size <= MAX_SENSE_SIZE,
        )?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_the_specifications() {
        assert_eq!(CMD_REQ_FIXED, 19);
        assert_eq!(CMD_RESP_FIXED, 12);
        assert_eq!((CMD_REQ_DEFAULT_SIZE, CMD_RESP_DEFAULT_SIZE), (51, 108));
        assert_eq!((TMF_REQ_SIZE, TMF_RESP_SIZE), (24, 1));
        assert_eq!((AN_REQ_SIZE, AN_RESP_SIZE, EVENT_SIZE), (16, 5, 16));
        assert_eq!(
            (
                CONFIG_SIZE,
                CONFIG_SENSE_SIZE_OFFSET,
                CONFIG_CDB_SIZE_OFFSET
            ),
            (36, 20, 24)
        );
    }

    #[test]
    fn lun_addressing_decodes_flat_and_peripheral_alike() {
        let l = |t, n| Lun::new(t, n).unwrap();
        assert_eq!(Lun::decode(&[1, 0, 0x40, 7, 0, 0, 0, 0]), Some(l(0, 7)));
        assert_eq!(Lun::decode(&[1, 3, 0, 7, 0, 0, 0, 0]), Some(l(3, 7)));
        assert_eq!(
            Lun::decode(&[1, 0, 0x7f, 0xff, 0, 0, 0, 0]),
            Some(l(0, 0x3fff))
        );
        assert_eq!(Lun::decode(&[0; 8]), None);
        assert_eq!(Lun::decode(&[2, 0, 0x40, 0, 0, 0, 0, 0]), None);
        assert_eq!(Lun::new(0, 0x4000), None);
        assert_eq!(l(3, 0x1234).encode(), [1, 3, 0x52, 0x34, 0, 0, 0, 0]);
        assert_eq!(Lun::decode(&l(0, 300).encode()), Some(l(0, 300)));
        assert_eq!(l(0, 1).encode_event(), [1, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(l(0, 0x123).encode_event(), [1, 0, 0x41, 0x23, 0, 0, 0, 0]);
        assert_eq!(Lun::decode(&l(0, 7).encode_event()), Some(l(0, 7)));
        assert_eq!(l(2, 9).to_string(), "2:9");
    }

    #[test]
    fn a_command_request_round_trips_byte_exact() {
        let mut out = [0xaa; 64];
        let lun = Lun::new(1, 2).unwrap();
        let cdb = [0x28, 0, 1, 2, 3, 4, 0, 0, 8, 0];
        let len = encode_cmd_req(
            &mut out,
            lun,
            0x1122_3344_5566_7788,
            TaskAttr::Ordered,
            &cdb,
            32,
        );
        assert_eq!(len, 51);
        let mut expected = vec![1, 1, 0x40, 2, 0, 0, 0, 0];
        expected.extend_from_slice(&[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        expected.extend_from_slice(&[1, 0, 0]);
        expected.extend_from_slice(&cdb);
        expected.extend_from_slice(&[0; 22]);
        assert_eq!(&out[..len], &expected[..]);
        assert_eq!(out[len], 0xaa, "nothing written past the request");
        let h = CmdReqHeader::decode(&bytes_at(&out, 0));
        assert_eq!(h.lun, Some(lun));
        assert_eq!(h.tag, 0x1122_3344_5566_7788);
        assert_eq!(h.task_attr, TaskAttr::Ordered as u8);
    }

    #[test]
    fn a_command_response_round_trips_and_clamps_its_sense() {
        let r = CmdResp {
            sense_len: 18,
            resid: 0x100,
            status_qualifier: 7,
            status: 2,
            response: Response::Ok,
        };
        assert_eq!(r.encode(), [18, 0, 0, 0, 0, 1, 0, 0, 7, 0, 2, 0]);
        let mut b = r.encode().to_vec();
        b.extend_from_slice(&[0; 4]);
        let parsed = CmdResp::parse(&b).unwrap();
        assert_eq!(parsed.sense_len, 4, "clamped to the sense bytes present");
        assert_eq!(
            CmdResp {
                sense_len: 18,
                ..parsed
            },
            r
        );
        assert_eq!(CmdResp::parse(&b[..11]), None);
        assert_eq!(CmdResp::transport(Response::BadTarget, 0).encode()[11], 3);
    }

    #[test]
    fn responses_map_to_the_bindings_values_both_ways() {
        for b in 0..=u8::MAX {
            let r = Response::from_byte(b);
            assert_eq!(r.to_byte(), b);
            assert_eq!(matches!(r, Response::Unknown(_)), b > 12, "byte {b}");
        }
        assert_eq!(Response::IncorrectLun.to_byte(), 12);
    }

    #[test]
    fn task_management_round_trips() {
        let req = encode_tmf_req(Tmf::LogicalUnitReset, Lun::new(0, 1).unwrap(), 9);
        assert_eq!(
            req,
            [
                0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0x40, 1, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(ctrl_type(&bytes_at(&req, 0)), CTRL_TMF);
        let t = TmfReq::decode(&req);
        assert_eq!(Tmf::from_u32(t.subtype), Some(Tmf::LogicalUnitReset));
        assert_eq!((t.lun, t.tag), (Lun::new(0, 1), 9));
        assert_eq!(Tmf::from_u32(8), None);
    }

    #[test]
    fn events_and_notifications_encode_little_endian() {
        let e = Event {
            event: EVT_TRANSPORT_RESET,
            lun: Lun::new(0, 1),
            reason: EVT_RESET_RESCAN,
        };
        let enc = e.encode();
        assert_eq!(&enc[4..12], &[1, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!((enc[0], enc[12]), (1, 1));
        assert_eq!(Event::decode(&enc), e);
        let mut an = [0u8; AN_REQ_SIZE];
        an[0] = 1;
        an[4..12].copy_from_slice(&Lun::new(0, 0).unwrap().encode());
        an[12] = 0x40;
        let a = AnReq::decode(&an);
        assert_eq!((a.lun, a.event_requested), (Lun::new(0, 0), 0x40));
        assert_eq!(
            encode_an_req(CTRL_AN_QUERY, Lun::new(0, 0).unwrap(), 0x40),
            an
        );
        assert_eq!(encode_an_resp(0x40, Response::Ok), [0x40, 0, 0, 0, 0]);
        assert_eq!(
            AnResp::decode(&[0x40, 0, 0, 0, 9]),
            AnResp {
                event_actual: 0x40,
                response: Response::Failure
            }
        );
    }

    fn config_bytes(cdb_size: u32, sense_size: u32) -> [u8; CONFIG_SIZE] {
        ScsiConfig {
            num_queues: 2,
            seg_max: 126,
            max_sectors: 0xffff,
            cmd_per_lun: 128,
            event_info_size: 16,
            sense_size,
            cdb_size,
            max_channel: 0,
            max_target: 255,
            max_lun: 16383,
        }
        .encode()
    }

    #[test]
    fn the_config_space_round_trips_and_is_checked() {
        let b = config_bytes(32, 96);
        assert_eq!(&b[0..4], &[2, 0, 0, 0]);
        assert_eq!(&b[20..24], &[96, 0, 0, 0]);
        assert_eq!(&b[24..28], &[32, 0, 0, 0]);
        assert_eq!(&b[30..32], &[255, 0]);
        assert_eq!(&b[32..36], &16383u32.to_le_bytes());
        assert_eq!(ScsiConfig::parse(&b).unwrap().encode(), b);
        assert_eq!(ScsiConfig::parse(&b[..35]), Err(ConfigError::TooShort(35)));
        for (cdb, sense, ok) in [
            (MIN_CDB_SIZE, 0, true),
            (MAX_CDB_SIZE, MAX_SENSE_SIZE, true),
            (MIN_CDB_SIZE - 1, 96, false),
            (MAX_CDB_SIZE + 1, 96, false),
            (32, MAX_SENSE_SIZE + 1, false),
        ] {
            assert_eq!(
                ScsiConfig::parse(&config_bytes(cdb, sense)).is_ok(),
                ok,
                "cdb {cdb} sense {sense}"
            );
        }
    }
}
