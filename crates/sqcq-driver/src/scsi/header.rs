//! The virtio-scsi request and response headers (virtio 1.2, 5.6.6) and
//! the task management request of the control queue (5.6.6.2).

use std::fmt;

use super::cdb::Cdb;

/// Bytes of a command request header before the CDB: lun[8], tag le64,
/// task_attr, prio, crn.
pub const CMD_REQ_PREFIX: usize = 19;
/// Bytes of a command response header before the sense data: sense_len
/// le32, resid le32, status_qualifier le16, status, response.
pub const CMD_RESP_PREFIX: usize = 12;
/// Bytes of a task management request.
pub const TMF_REQ_LEN: usize = 24;
/// Bytes of a task management response (the `response` byte).
pub const TMF_RESP_LEN: u32 = 1;

/// SCSI status GOOD.
pub const STATUS_GOOD: u8 = 0x00;
/// SCSI status CHECK CONDITION.
pub const STATUS_CHECK_CONDITION: u8 = 0x02;

/// A logical unit as virtio-scsi addresses it: `lun[0] = 1`, the target
/// in `lun[1]`, a flat-space LUN in `lun[2..4]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lun {
    target: u8,
    lun: u16,
}

impl Lun {
    /// The highest LUN of flat space addressing.
    pub const MAX_LUN: u16 = 0x3fff;

    /// LUN `lun` of target `target`; `None` beyond [`Self::MAX_LUN`].
    pub fn new(target: u8, lun: u16) -> Option<Self> {
        (lun <= Self::MAX_LUN).then_some(Self { target, lun })
    }

    /// The target id.
    pub fn target(&self) -> u8 {
        self.target
    }

    /// The LUN.
    pub fn lun(&self) -> u16 {
        self.lun
    }

    /// The 8 bytes of the `lun` field (as Linux's virtio_scsi builds it).
    pub fn to_bytes(self) -> [u8; 8] {
        let [hi, lo] = self.lun.to_be_bytes();
        [1, self.target, 0x40 | hi, lo, 0, 0, 0, 0]
    }
}

impl fmt::Display for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.target, self.lun)
    }
}

/// The SAM task attribute of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum TaskAttr {
    /// SIMPLE.
    #[default]
    Simple = 0,
    /// ORDERED.
    Ordered = 1,
    /// HEAD OF QUEUE.
    HeadOfQueue = 2,
    /// ACA.
    Aca = 3,
}

/// Writes a command request header for a device with `cdb_size`-byte CDBs
/// into `out`, which must hold [`CMD_REQ_PREFIX`] + `cdb_size` bytes; the
/// CDB is zero-padded. Returns the header's length.
pub fn encode_cmd_req(
    out: &mut [u8],
    lun: Lun,
    tag: u64,
    attr: TaskAttr,
    cdb: &Cdb,
    cdb_size: usize,
) -> usize {
    let len = CMD_REQ_PREFIX + cdb_size;
    let out = &mut out[..len];
    out[0..8].copy_from_slice(&lun.to_bytes());
    out[8..16].copy_from_slice(&tag.to_le_bytes());
    out[16] = attr as u8;
    out[17] = 0; // prio
    out[18] = 0; // crn
    let cdb_out = &mut out[CMD_REQ_PREFIX..];
    cdb_out.fill(0);
    let bytes = cdb.as_bytes();
    cdb_out[..bytes.len()].copy_from_slice(bytes);
    len
}

/// The virtio-scsi `response` of a command or task management function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    /// VIRTIO_SCSI_S_OK (also FUNCTION COMPLETE for a TMF).
    Ok,
    /// The data did not fit the buffers.
    Overrun,
    /// Aborted by a TMF.
    Aborted,
    /// No such target.
    BadTarget,
    /// Aborted by a reset.
    Reset,
    /// Retry.
    Busy,
    /// Transport failure (the path, not the target).
    TransportFailure,
    /// Target failure.
    TargetFailure,
    /// Nexus failure.
    NexusFailure,
    /// Any other failure.
    Failure,
    /// TMF: FUNCTION SUCCEEDED.
    FunctionSucceeded,
    /// TMF: FUNCTION REJECTED.
    FunctionRejected,
    /// TMF: INCORRECT LUN.
    IncorrectLun,
    /// A value the specification does not define.
    Unknown(u8),
}

impl Response {
    /// Decodes the `response` byte.
    pub fn from_byte(b: u8) -> Self {
        match b {
            0 => Self::Ok,
            1 => Self::Overrun,
            2 => Self::Aborted,
            3 => Self::BadTarget,
            4 => Self::Reset,
            5 => Self::Busy,
            6 => Self::TransportFailure,
            7 => Self::TargetFailure,
            8 => Self::NexusFailure,
            9 => Self::Failure,
            10 => Self::FunctionSucceeded,
            11 => Self::FunctionRejected,
            12 => Self::IncorrectLun,
            other => Self::Unknown(other),
        }
    }
}

/// A parsed command response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdResp {
    /// Bytes of valid sense data (clamped to what the buffer holds).
    pub sense_len: u32,
    /// Residual: bytes of data not transferred.
    pub resid: u32,
    /// Status qualifier.
    pub status_qualifier: u16,
    /// SCSI status.
    pub status: u8,
    /// virtio-scsi response.
    pub response: Response,
}

impl CmdResp {
    /// Parses the header at the start of `bytes` (at least
    /// [`CMD_RESP_PREFIX`] bytes); `sense_len` is clamped to the sense
    /// bytes that follow it in `bytes`.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..CMD_RESP_PREFIX)?;
        let sense_room = u32::try_from(bytes.len() - CMD_RESP_PREFIX).unwrap_or(u32::MAX);
        Some(Self {
            sense_len: u32::from_le_bytes([b[0], b[1], b[2], b[3]]).min(sense_room),
            resid: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            status_qualifier: u16::from_le_bytes([b[8], b[9]]),
            status: b[10],
            response: Response::from_byte(b[11]),
        })
    }
}

/// A task management function of the control queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Tmf {
    /// ABORT TASK (the command with the given tag).
    AbortTask = 0,
    /// ABORT TASK SET.
    AbortTaskSet = 1,
    /// CLEAR ACA.
    ClearAca = 2,
    /// CLEAR TASK SET.
    ClearTaskSet = 3,
    /// I_T NEXUS RESET.
    ItNexusReset = 4,
    /// LOGICAL UNIT RESET.
    LogicalUnitReset = 5,
    /// QUERY TASK.
    QueryTask = 6,
    /// QUERY TASK SET.
    QueryTaskSet = 7,
}

/// VIRTIO_SCSI_T_TMF, the control request type of task management.
const T_TMF: u32 = 0;

/// The 24 bytes of a task management request.
pub fn encode_tmf_req(tmf: Tmf, lun: Lun, tag: u64) -> [u8; TMF_REQ_LEN] {
    let mut out = [0; TMF_REQ_LEN];
    out[0..4].copy_from_slice(&T_TMF.to_le_bytes());
    out[4..8].copy_from_slice(&(tmf as u32).to_le_bytes());
    out[8..16].copy_from_slice(&lun.to_bytes());
    out[16..24].copy_from_slice(&tag.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_encoding_matches_linux() {
        assert_eq!(
            Lun::new(0, 0).unwrap().to_bytes(),
            [1, 0, 0x40, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            Lun::new(3, 0x1234).unwrap().to_bytes(),
            [1, 3, 0x52, 0x34, 0, 0, 0, 0]
        );
        assert_eq!(Lun::new(0, 0x4000), None);
    }

    #[test]
    fn cmd_req_is_byte_exact() {
        let mut out = [0xaa; 64];
        let lun = Lun::new(1, 2).unwrap();
        let cdb = Cdb::read_10(0x0102_0304, 8, false);
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
        expected.extend_from_slice(&[0x28, 0, 1, 2, 3, 4, 0, 0, 8, 0]);
        expected.extend_from_slice(&[0; 22]);
        assert_eq!(&out[..len], &expected[..]);
        assert_eq!(out[len], 0xaa, "nothing written past the header");
    }

    #[test]
    fn cmd_resp_parses_and_clamps() {
        let mut b = vec![0u8; CMD_RESP_PREFIX + 4];
        b[0..4].copy_from_slice(&200u32.to_le_bytes());
        b[4..8].copy_from_slice(&512u32.to_le_bytes());
        b[8..10].copy_from_slice(&7u16.to_le_bytes());
        b[10] = STATUS_CHECK_CONDITION;
        b[11] = 3;
        let r = CmdResp::parse(&b).unwrap();
        assert_eq!(r.sense_len, 4, "clamped to the sense bytes present");
        assert_eq!(r.resid, 512);
        assert_eq!(r.status_qualifier, 7);
        assert_eq!(r.status, STATUS_CHECK_CONDITION);
        assert_eq!(r.response, Response::BadTarget);
        assert_eq!(CmdResp::parse(&b[..11]), None);
        assert_eq!(Response::from_byte(200), Response::Unknown(200));
    }

    #[test]
    fn tmf_req_is_byte_exact() {
        let req = encode_tmf_req(Tmf::LogicalUnitReset, Lun::new(0, 1).unwrap(), 9);
        assert_eq!(
            req,
            [
                0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0x40, 1, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(
            encode_tmf_req(Tmf::AbortTask, Lun::new(0, 0).unwrap(), 0)[4],
            0
        );
    }
}
