//! The virtio-scsi device configuration space (virtio 1.2, 5.6.4).

/// Bytes of `struct virtio_scsi_config`.
pub const CONFIG_SIZE: usize = 36;
/// The CDB size a device starts with (virtio 1.2, 5.6.4).
pub const DEFAULT_CDB_SIZE: u32 = 32;
/// The sense size a device starts with.
pub const DEFAULT_SENSE_SIZE: u32 = 96;
/// The largest CDB and sense sizes accepted from a device: beyond these a
/// per-request header would be absurd (the spec's own limits are 8 bits
/// for a CDB length and 252 bytes of sense).
pub const MAX_CDB_SIZE: u32 = 256;
/// See [`MAX_CDB_SIZE`].
pub const MAX_SENSE_SIZE: u32 = 256;

/// The device's configuration, as read with `GET_CONFIG`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScsiConfig {
    /// Request queues the device offers.
    pub num_queues: u32,
    /// Data segments the device accepts per command.
    pub seg_max: u32,
    /// Largest transfer in 512-byte sectors.
    pub max_sectors: u32,
    /// Commands the device accepts per LUN.
    pub cmd_per_lun: u32,
    /// Bytes of an event buffer.
    pub event_info_size: u32,
    /// Bytes of sense data in a response.
    pub sense_size: u32,
    /// Bytes of CDB in a request.
    pub cdb_size: u32,
    /// Highest channel (0).
    pub max_channel: u16,
    /// Highest target id.
    pub max_target: u16,
    /// Highest LUN.
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
            event_info_size: 16,
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
    /// Parses and checks the little-endian configuration space.
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let b: &[u8; CONFIG_SIZE] = bytes
            .get(..CONFIG_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or(ConfigError::TooShort(bytes.len()))?;
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let config = Self {
            num_queues: u32_at(0),
            seg_max: u32_at(4),
            max_sectors: u32_at(8),
            cmd_per_lun: u32_at(12),
            event_info_size: u32_at(16),
            sense_size: u32_at(20),
            cdb_size: u32_at(24),
            max_channel: u16_at(28),
            max_target: u16_at(30),
            max_lun: u32_at(32),
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
            (16..=MAX_CDB_SIZE).contains(&config.cdb_size),
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

    fn bytes(cdb_size: u32) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [1u32, 126, 0xffff, 128, 16, 96, cdb_size] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&255u16.to_le_bytes());
        b.extend_from_slice(&0x3fffu32.to_le_bytes());
        b
    }

    #[test]
    fn parses_the_layout() {
        let c = ScsiConfig::parse(&bytes(32)).unwrap();
        assert_eq!(c.num_queues, 1);
        assert_eq!(c.seg_max, 126);
        assert_eq!(c.max_sectors, 0xffff);
        assert_eq!(c.sense_size, 96);
        assert_eq!(c.cdb_size, 32);
        assert_eq!(c.max_target, 255);
        assert_eq!(c.max_lun, 0x3fff);
    }

    #[test]
    fn rejects_what_cannot_work() {
        assert_eq!(
            ScsiConfig::parse(&bytes(32)[..35]),
            Err(ConfigError::TooShort(35))
        );
        assert!(matches!(
            ScsiConfig::parse(&bytes(8)),
            Err(ConfigError::OutOfRange {
                field: "cdb_size",
                ..
            })
        ));
        assert!(ScsiConfig::parse(&bytes(100_000)).is_err());
    }
}
