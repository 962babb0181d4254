//! [`LogicalUnit`]: one emulated direct-access block device, and
//! [`LogicalUnit::execute`], the entry point for every command.
//!
//! Concurrency: several workers execute commands for the same unit at once.
//! The medium path (READ/WRITE) reads atomics only. Administrative state
//! (persistent reservations, unit attentions) sits behind one mutex, and two
//! kinds of atomic flags say whether it needs looking at: `ua_pending`, a
//! small bitmap with one bit per hash bucket of nexus ids ("some nexus of
//! this bucket has a unit attention", so an idle nexus with a pending
//! condition does not send every other nexus to the lock), and `reserved`
//! ("a persistent reservation exists"). The flags are hints written under
//! the mutex; a command racing with a change sees the state before or
//! after it, as if it had been ordered before or after.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::cdb::Command;
use crate::completion::{Completion, ReportLunsRequest};
use crate::config::{ConfigError, LuConfig, check_capacity};
use crate::error::ScsiError;
use crate::medium::{Medium, WriteSame};
use crate::mode::{Parameters, SenseRequest};
use crate::pr::{Access, OutRequest, Reservations};
use crate::resp::Response;
use crate::sense::{Sense, SenseFormat};
use crate::ua::{NexusId, UnitAttention, UnitAttentions};
use crate::usage::op;

#[derive(Debug, Default)]
pub(crate) struct Admin {
    pub(crate) ua: UnitAttentions,
    pub(crate) pr: Reservations,
}

/// An emulated SBC direct-access logical unit. `Sync`: share it between
/// workers behind an `Arc`.
#[derive(Debug)]
pub struct LogicalUnit {
    pub(crate) config: LuConfig,
    blocks: AtomicU64,
    write_cache: AtomicBool,
    ua_pending: [AtomicU64; UA_WORDS],
    reserved: AtomicBool,
    admin: Mutex<Admin>,
}

/// Words of the unit attention bitmap: 256 buckets.
const UA_WORDS: usize = 4;

/// The word and bit of `nexus`'s bucket (Fibonacci hashing).
fn ua_bucket(nexus: NexusId) -> (usize, u64) {
    let h = nexus.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56;
    (usize::try_from(h >> 6).unwrap_or(0), 1 << (h & 63))
}

/// Commands a pending unit attention does not stop (SAM-5): INQUIRY,
/// REPORT LUNS and REQUEST SENSE (which reports it instead).
const fn ua_exempt(opcode: u8) -> bool {
    matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE)
}

impl LogicalUnit {
    /// A logical unit with no nexus yet (see [`LogicalUnit::add_nexus`]).
    pub fn new(config: LuConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            blocks: AtomicU64::new(config.blocks),
            write_cache: AtomicBool::new(config.write_cache),
            ua_pending: Default::default(),
            reserved: AtomicBool::new(false),
            admin: Mutex::new(Admin::default()),
            config,
        })
    }

    /// The configuration it was created with (`blocks` is the initial
    /// capacity; see [`LogicalUnit::blocks`]).
    pub fn config(&self) -> &LuConfig {
        &self.config
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.config.block_size
    }

    /// Current capacity in blocks.
    pub fn blocks(&self) -> u64 {
        // Acquire pairs with the Release in `resize`: a command that sees a
        // new capacity also sees everything done before it was published.
        self.blocks.load(Ordering::Acquire)
    }

    /// The current WCE bit (MODE SELECT may change it).
    pub fn write_cache_enabled(&self) -> bool {
        // Relaxed: a single bit with no data published behind it.
        self.write_cache.load(Ordering::Relaxed)
    }

    fn set_write_cache(&self, on: bool) {
        self.write_cache.store(on, Ordering::Relaxed);
    }

    /// Largest data-out buffer a command here can need: the worker copies
    /// at most this much parameter data (see [`crate::takes_parameter_data`]).
    pub fn max_data_out_len(&self) -> usize {
        let unmap = self.config.provisioning.map_or(0, |p| {
            usize::try_from(p.max_unmap_descriptors)
                .unwrap_or(usize::MAX)
                .saturating_mul(16)
                .saturating_add(8)
        });
        let block = usize::try_from(self.config.block_size).unwrap_or(usize::MAX);
        // MODE SELECT needs well under 512 bytes, PERSISTENT RESERVE OUT 24.
        unmap.max(block).max(512)
    }

    /// Locks the administrative state, runs `f`, and republishes the flags.
    pub(crate) fn with_admin<R>(&self, f: impl FnOnce(&mut Admin) -> R) -> R {
        let mut admin = self.lock();
        let r = f(&mut admin);
        // Release pairs with the Acquire loads in `execute`. The flags only
        // say whether to take the lock; the state itself is under it.
        let mut words = [0u64; UA_WORDS];
        for n in admin.ua.pending_nexuses() {
            let (w, bit) = ua_bucket(n);
            if let Some(word) = words.get_mut(w) {
                *word |= bit;
            }
        }
        for (flag, word) in self.ua_pending.iter().zip(words) {
            flag.store(word, Ordering::Release);
        }
        self.reserved
            .store(admin.pr.is_reserved(), Ordering::Release);
        r
    }

    fn lock(&self) -> MutexGuard<'_, Admin> {
        // Nothing panics while holding the lock; recover anyway.
        self.admin.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new I_T nexus (a new connection): it sees POWER ON, RESET, OR BUS
    /// DEVICE RESET OCCURRED on its first command. Conditions that the unit
    /// establishes for "every nexus" go to the nexuses added here.
    pub fn add_nexus(&self, nexus: NexusId) {
        self.with_admin(|a| a.ua.add_nexus(nexus));
    }

    /// `nexus` continues an I_T nexus of an earlier run of the process
    /// (see `UnitAttentions::continue_nexus`): its power-on unit attention
    /// goes.
    pub fn continue_nexus(&self, nexus: NexusId) {
        self.with_admin(|a| a.ua.continue_nexus(nexus));
    }

    /// The I_T nexus is gone: its unit attentions are dropped.
    /// Registrations persist (they are persistent reservations).
    pub fn nexus_loss(&self, nexus: NexusId) {
        self.with_admin(|a| a.ua.remove_nexus(nexus));
    }

    /// LOGICAL UNIT RESET: mode parameters return to their defaults and
    /// every nexus gets BUS DEVICE RESET FUNCTION OCCURRED. Reservations
    /// are kept (SPC-4).
    pub fn reset(&self) {
        self.with_admin(|a| {
            self.set_write_cache(self.config.write_cache);
            a.ua.reset();
        });
    }

    /// Changes the capacity and tells every nexus CAPACITY DATA HAS CHANGED.
    pub fn resize(&self, blocks: u64) -> Result<(), ConfigError> {
        check_capacity(blocks, self.config.block_size)?;
        self.with_admin(|a| {
            // Release pairs with the Acquire in `blocks`.
            self.blocks.store(blocks, Ordering::Release);
            a.ua.establish_all(UnitAttention::CapacityChanged, None);
        });
        Ok(())
    }

    /// The daemon added or removed LUNs of the target: every nexus gets
    /// REPORTED LUNS DATA HAS CHANGED (cleared by REPORT LUNS).
    pub fn luns_changed(&self) {
        self.with_admin(|a| a.ua.establish_all(UnitAttention::ReportedLunsChanged, None));
    }

    /// Executes one command from `nexus`.
    ///
    /// `cdb` may be the whole fixed-size CDB field of the transport.
    /// `data_out` is the parameter data the initiator sent for the commands
    /// that [`crate::takes_parameter_data`] names, empty otherwise.
    /// `data_in` is the scratch buffer that response data are built in; see
    /// [`crate::DATA_IN_LEN`]. Any input is safe: errors come back as
    /// [`ScsiError`], never as a panic.
    pub fn execute<'d>(
        &self,
        nexus: NexusId,
        cdb: &[u8],
        data_out: &'d [u8],
        data_in: &mut [u8],
    ) -> Result<Completion<'d>, ScsiError> {
        let opcode = cdb.first().copied();
        if opcode.is_some_and(|o| !ua_exempt(o))
            && let Some(ua) = self.take_ua_if_any(nexus)
        {
            return Err(ScsiError::UnitAttention(ua));
        }
        let cmd = Command::parse(cdb)?;
        // Acquire pairs with the Release in `with_admin`.
        if self.reserved.load(Ordering::Acquire) {
            self.lock().pr.check(nexus, access(&cmd))?;
        }
        self.dispatch(nexus, cmd, data_out, data_in)
    }

    fn dispatch<'d>(
        &self,
        nexus: NexusId,
        cmd: Command,
        data_out: &'d [u8],
        data_in: &mut [u8],
    ) -> Result<Completion<'d>, ScsiError> {
        use Command as C;
        let mut r = Response::new(data_in);
        let medium = || Medium {
            config: &self.config,
            capacity: self.blocks(),
        };
        let len = match cmd {
            C::Read {
                lba,
                blocks,
                length_at,
            } => return medium().read(lba, blocks, length_at),
            C::Write {
                lba,
                blocks,
                fua,
                length_at,
            } => {
                // Durable before completing when the write cache is off.
                let fua = fua || !self.write_cache_enabled();
                return medium().write(lba, blocks, fua, length_at);
            }
            C::Verify { lba, blocks } => return medium().verify(lba, blocks),
            C::SynchronizeCache { lba, blocks } => {
                return medium().synchronize_cache(lba, blocks);
            }
            C::WriteSame {
                lba,
                blocks,
                unmap,
                ndob,
                length_at,
            } => {
                let req = WriteSame {
                    lba,
                    blocks,
                    unmap,
                    ndob,
                    fua: !self.write_cache_enabled(),
                    length_at,
                };
                return medium().write_same(req, data_out);
            }
            C::Unmap { param_len } => return medium().unmap(param_len, data_out),
            C::TestUnitReady | C::StartStopUnit { .. } => return Ok(Completion::Good),
            C::RequestSense {
                descriptor,
                alloc_len,
            } => {
                let sense = self
                    .take_ua_if_any(nexus)
                    .map_or(Sense::NONE, UnitAttention::sense);
                let format = if descriptor {
                    SenseFormat::Descriptor
                } else {
                    SenseFormat::Fixed
                };
                let out = data_in_prefix(data_in, usize::from(alloc_len));
                return Ok(Completion::Data {
                    len: sense.encode(format, out),
                });
            }
            C::Inquiry {
                evpd,
                page,
                alloc_len,
            } => {
                if evpd {
                    crate::vpd::page(&self.config, page, &mut r)?;
                } else {
                    crate::inquiry::standard(&self.config, &mut r);
                }
                r.finish(usize::from(alloc_len))
            }
            C::ReadCapacity10 => {
                crate::capacity::read_capacity_10(&self.config, self.blocks(), &mut r);
                r.finish(8)
            }
            C::ReadCapacity16 { alloc_len } => {
                crate::capacity::read_capacity_16(&self.config, self.blocks(), &mut r);
                r.finish(usize::try_from(alloc_len).unwrap_or(usize::MAX))
            }
            C::ModeSense {
                long,
                dbd,
                llbaa,
                control,
                page,
                subpage,
                alloc_len,
            } => {
                let req = SenseRequest {
                    long,
                    dbd,
                    llbaa,
                    control,
                    page,
                    subpage,
                };
                self.mode_parameters().sense(req, &mut r)?;
                r.finish(usize::from(alloc_len))
            }
            C::ModeSelect { long, param_len } => {
                let wce = self.mode_parameters().select(long, param_len, data_out)?;
                if let Some(wce) = wce {
                    self.with_admin(|a| {
                        if wce != self.write_cache_enabled() {
                            self.set_write_cache(wce);
                            a.ua.establish_all(UnitAttention::ModeParametersChanged, Some(nexus));
                        }
                    });
                }
                return Ok(Completion::Good);
            }
            C::PersistentReserveIn { action, alloc_len } => {
                self.lock().pr.read(action, &mut r);
                r.finish(usize::from(alloc_len))
            }
            C::PersistentReserveOut {
                action,
                scope,
                pr_type,
                param_len,
            } => {
                let req = OutRequest {
                    action,
                    scope,
                    pr_type,
                    param_len,
                    data: data_out,
                };
                self.with_admin(|a| a.pr.write(nexus, req, &mut a.ua))?;
                return Ok(Completion::Good);
            }
            C::ReportLuns {
                select_report,
                alloc_len,
            } => {
                // REPORT LUNS clears REPORTED LUNS DATA HAS CHANGED for the
                // nexus (SPC-4; Linux TCM does the same).
                if self.ua_maybe_pending(nexus) {
                    self.with_admin(|a| a.ua.clear(nexus, UnitAttention::ReportedLunsChanged));
                }
                return Ok(Completion::ReportLuns(ReportLunsRequest {
                    select_report,
                    alloc_len,
                }));
            }
            C::ReportSupportedOpcodes {
                timeouts,
                options,
                opcode,
                service_action,
                alloc_len,
            } => {
                let unmap = self.config.provisioning.is_some();
                crate::rsoc::report(timeouts, options, opcode, service_action, unmap, &mut r)?;
                r.finish(usize::try_from(alloc_len).unwrap_or(usize::MAX))
            }
            C::ReportTargetPortGroups {
                extended,
                alloc_len,
            } => {
                crate::alua::report_target_port_groups(extended, &mut r);
                r.finish(usize::try_from(alloc_len).unwrap_or(usize::MAX))
            }
        };
        Ok(Completion::Data { len })
    }

    /// What the mode pages report now.
    fn mode_parameters(&self) -> Parameters<'_> {
        Parameters {
            config: &self.config,
            blocks: self.blocks(),
            write_cache: self.write_cache_enabled(),
        }
    }

    /// Whether `nexus` may have a unit attention pending (false positives
    /// when another nexus of its bucket has one).
    fn ua_maybe_pending(&self, nexus: NexusId) -> bool {
        let (w, bit) = ua_bucket(nexus);
        // Acquire pairs with the Release in `with_admin`.
        self.ua_pending
            .get(w)
            .is_some_and(|word| word.load(Ordering::Acquire) & bit != 0)
    }

    fn take_ua_if_any(&self, nexus: NexusId) -> Option<UnitAttention> {
        if self.ua_maybe_pending(nexus) {
            self.with_admin(|a| a.ua.take(nexus))
        } else {
            None
        }
    }
}

/// The first `len` bytes of `buf` (all of it if shorter).
fn data_in_prefix(buf: &mut [u8], len: usize) -> &mut [u8] {
    let n = len.min(buf.len());
    &mut buf[..n]
}

/// The reservation class of a command (SPC-4, SBC-3).
/// PERSISTENT RESERVE OUT checks registrations itself.
fn access(cmd: &Command) -> Access {
    use Command as C;
    match cmd {
        C::TestUnitReady
        | C::RequestSense { .. }
        | C::Inquiry { .. }
        | C::ReadCapacity10
        | C::ReadCapacity16 { .. }
        | C::PersistentReserveIn { .. }
        | C::PersistentReserveOut { .. }
        | C::ReportLuns { .. }
        | C::ReportTargetPortGroups { .. } => Access::Allowed,
        C::Read { .. }
        | C::Verify { .. }
        | C::ModeSense { .. }
        | C::ReportSupportedOpcodes { .. }
        | C::StartStopUnit { .. } => Access::Read,
        C::Write { .. }
        | C::WriteSame { .. }
        | C::Unmap { .. }
        | C::SynchronizeCache { .. }
        | C::ModeSelect { .. } => Access::Write,
    }
}

#[cfg(test)]
#[path = "lun_tests.rs"]
mod tests;
