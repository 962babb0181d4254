//! The SCSI target a device presents: its logical units, each an emulated
//! disk (`sqcq_scsi::LogicalUnit`) over a backstore.

use std::sync::Arc;

use sqcq_backstore::{Backstore, BackstoreError};
use sqcq_scsi::{ConfigError, LogicalUnit, LuConfig, Provisioning};
use thiserror::Error;

use crate::runtime::lun_stats::LunStats;
use crate::runtime::qos::{Qos, QosLimits};
use crate::spec::{LunSpec, OpenError};

/// One logical unit of the target.
pub struct LunEntry {
    /// Its LUN.
    pub lun: u16,
    /// The SCSI emulation, shared by every worker.
    pub unit: Arc<LogicalUnit>,
    /// Where its blocks live; each worker opens its own queue to it.
    pub backstore: Arc<dyn Backstore>,
    /// Its I/O figures, one slot per request queue.
    pub stats: Arc<LunStats>,
    /// Its IOPS and bandwidth limits (`runtime::qos`), shared by every
    /// queue.
    pub qos: Arc<Qos>,
}

impl std::fmt::Debug for LunEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LunEntry")
            .field("lun", &self.lun)
            .field("geometry", &self.backstore.geometry())
            .finish_non_exhaustive()
    }
}

/// Why a LUN could not be set up.
#[derive(Debug, Error)]
pub enum TargetError {
    /// The backstore could not be created or opened.
    #[error("LUN {lun}: backstore")]
    Backstore {
        /// The LUN.
        lun: u16,
        /// What failed.
        #[source]
        source: BackstoreError,
    },
    /// The logical unit configuration was refused.
    #[error("LUN {lun}: configuration")]
    Config {
        /// The LUN.
        lun: u16,
        /// What was wrong.
        #[source]
        source: ConfigError,
    },
    /// A LUN spec lacks a field its kind needs.
    #[error("LUN {lun}: {what}")]
    Spec {
        /// The LUN.
        lun: u16,
        /// What is missing.
        what: &'static str,
    },
    /// Two LUN specs name the same LUN.
    #[error("LUN {0} is configured twice")]
    Duplicate(u16),
}

/// The logical units of one device, sorted by LUN: an immutable snapshot.
/// A LUN change makes a new snapshot with a higher generation (see
/// [`crate::scsi::hotplug`]).
#[derive(Debug, Default)]
pub struct Target {
    luns: Vec<LunEntry>,
    generation: u64,
}

impl Target {
    /// Builds every LUN of `specs`; `wwn_seed` makes default WWNs differ
    /// between devices.
    pub fn build(specs: &[LunSpec], wwn_seed: u64) -> Result<Self, TargetError> {
        let mut luns: Vec<LunEntry> = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let lun = spec
                .lun
                .unwrap_or_else(|| u16::try_from(i).unwrap_or(u16::MAX));
            if luns.iter().any(|e| e.lun == lun) {
                return Err(TargetError::Duplicate(lun));
            }
            luns.push(build_lun(lun, spec, wwn_seed)?);
        }
        luns.sort_by_key(|e| e.lun);
        Ok(Target {
            luns,
            generation: 0,
        })
    }

    /// A target made of ready entries (tests, embedding).
    pub fn from_entries(mut luns: Vec<LunEntry>) -> Self {
        luns.sort_by_key(|e| e.lun);
        Target {
            luns,
            generation: 0,
        }
    }

    /// Which snapshot this is: every LUN change counts one up.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The next snapshot: these LUNs plus `added`, minus `removed`.
    pub(crate) fn next(&self, added: Option<LunEntry>, removed: Option<u16>) -> Target {
        let mut luns: Vec<LunEntry> = self
            .luns
            .iter()
            .filter(|e| Some(e.lun) != removed)
            .map(|e| LunEntry {
                lun: e.lun,
                unit: Arc::clone(&e.unit),
                backstore: Arc::clone(&e.backstore),
                stats: Arc::clone(&e.stats),
                qos: Arc::clone(&e.qos),
            })
            .collect();
        luns.extend(added);
        luns.sort_by_key(|e| e.lun);
        Target {
            luns,
            generation: self.generation + 1,
        }
    }

    /// The logical units, sorted by LUN.
    pub fn luns(&self) -> &[LunEntry] {
        &self.luns
    }

    /// Index of `lun` in [`Target::luns`].
    pub fn find(&self, lun: u16) -> Option<usize> {
        self.luns.binary_search_by_key(&lun, |e| e.lun).ok()
    }

    /// The LUN numbers, for REPORT LUNS.
    pub fn lun_numbers(&self) -> impl Iterator<Item = u16> + '_ {
        self.luns.iter().map(|e| e.lun)
    }
}

/// Builds one logical unit and its backstore.
pub(crate) fn build_lun(lun: u16, spec: &LunSpec, wwn_seed: u64) -> Result<LunEntry, TargetError> {
    let backstore = spec.open_backstore().map_err(|e| match e {
        OpenError::Spec(what) => TargetError::Spec { lun, what },
        OpenError::Backstore(source) => TargetError::Backstore { lun, source },
    })?;
    let geometry = backstore.geometry();
    let wwn = spec.wwn.unwrap_or_else(|| default_wwn(wwn_seed, lun));
    let mut config = LuConfig::new(geometry.block_size, geometry.blocks, wwn);
    config.read_only = spec.read_only || geometry.read_only;
    if let Some(serial) = &spec.serial {
        config.serial.clone_from(serial);
    }
    if geometry.supports_unmap {
        config.provisioning = Some(Provisioning {
            unmapped_reads_zero: geometry.unmapped_reads_zero,
            ..Provisioning::default()
        });
    }
    let unit = LogicalUnit::new(config).map_err(|source| TargetError::Config { lun, source })?;
    Ok(LunEntry {
        lun,
        unit: Arc::new(unit),
        backstore,
        stats: Arc::default(),
        qos: Arc::new(lun_qos(spec)),
    })
}

/// The limits `spec` gives its LUN.
pub fn lun_qos(spec: &LunSpec) -> Qos {
    let qos = Qos::default();
    qos.set(spec_limits(spec));
    qos
}

/// The QoS keys of `spec` (`iops=`, `bps=`, `burst-ms=`).
pub fn spec_limits(spec: &LunSpec) -> QosLimits {
    QosLimits {
        iops: spec.iops,
        bps: spec.bps,
        burst_ms: spec.burst_ms,
    }
    .normalized()
}

/// The seed of a device's default WWNs, from its socket path.
pub fn wwn_seed(socket_path: &str) -> u64 {
    socket_path
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

/// A NAA 5 (IEEE registered) WWN: the locally administered company ID
/// 0x0014050 that Linux TCM also uses, then 36 bits from the seed and LUN.
pub fn default_wwn(seed: u64, lun: u16) -> u64 {
    // FNV-1a over the seed and the LUN.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.to_le_bytes().iter().chain(lun.to_le_bytes().iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0x5_001_405u64 << 36) | (h & 0xf_ffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_wwns_are_naa5_and_differ() {
        let a = default_wwn(1, 0);
        let b = default_wwn(1, 1);
        let c = default_wwn(2, 0);
        assert_eq!(a >> 60, 5);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }
}
