//! Persistent reservations (SPC-4): registrations per I_T nexus, one
//! logical-unit-scope reservation, PERSISTENT RESERVE IN and OUT, and the
//! conflict rules that other commands are checked against.

use crate::error::ScsiError;
use crate::resp::{Response, len32};
use crate::ua::{NexusId, UnitAttention, UnitAttentions};

/// Registrations kept at most; one more gets INSUFFICIENT REGISTRATION
/// RESOURCES. Bounds READ KEYS to 8 + 8 × 128 bytes.
pub const MAX_REGISTRANTS: usize = 128;

/// PERSISTENT RESERVE OUT parameter list length without SPEC_I_PT.
const PARAM_LEN: usize = 24;

/// Reservation types (SPC-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrType {
    /// Write Exclusive (1h).
    WriteExclusive,
    /// Exclusive Access (3h).
    ExclusiveAccess,
    /// Write Exclusive – Registrants Only (5h).
    WriteExclusiveRegistrantsOnly,
    /// Exclusive Access – Registrants Only (6h).
    ExclusiveAccessRegistrantsOnly,
    /// Write Exclusive – All Registrants (7h).
    WriteExclusiveAllRegistrants,
    /// Exclusive Access – All Registrants (8h).
    ExclusiveAccessAllRegistrants,
}

impl PrType {
    /// The type for a TYPE field value.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::WriteExclusive,
            3 => Self::ExclusiveAccess,
            5 => Self::WriteExclusiveRegistrantsOnly,
            6 => Self::ExclusiveAccessRegistrantsOnly,
            7 => Self::WriteExclusiveAllRegistrants,
            8 => Self::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// The TYPE field value.
    pub const fn code(self) -> u8 {
        match self {
            Self::WriteExclusive => 1,
            Self::ExclusiveAccess => 3,
            Self::WriteExclusiveRegistrantsOnly => 5,
            Self::ExclusiveAccessRegistrantsOnly => 6,
            Self::WriteExclusiveAllRegistrants => 7,
            Self::ExclusiveAccessAllRegistrants => 8,
        }
    }

    const fn write_exclusive(self) -> bool {
        matches!(
            self,
            Self::WriteExclusive
                | Self::WriteExclusiveRegistrantsOnly
                | Self::WriteExclusiveAllRegistrants
        )
    }

    const fn all_registrants(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants
        )
    }

    const fn registrants_only(self) -> bool {
        matches!(
            self,
            Self::WriteExclusiveRegistrantsOnly | Self::ExclusiveAccessRegistrantsOnly
        )
    }
}

/// PERSISTENT RESERVE IN service actions supported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrInAction {
    /// READ KEYS (00h).
    ReadKeys,
    /// READ RESERVATION (01h).
    ReadReservation,
    /// REPORT CAPABILITIES (02h).
    ReportCapabilities,
}

impl PrInAction {
    /// The action for a SERVICE ACTION value.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::ReadKeys,
            1 => Self::ReadReservation,
            2 => Self::ReportCapabilities,
            _ => return None,
        })
    }
}

/// PERSISTENT RESERVE OUT service actions supported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrOutAction {
    /// REGISTER (00h).
    Register,
    /// RESERVE (01h).
    Reserve,
    /// RELEASE (02h).
    Release,
    /// CLEAR (03h).
    Clear,
    /// PREEMPT (04h).
    Preempt,
    /// PREEMPT AND ABORT (05h): handled as PREEMPT; commands of the
    /// preempted nexuses are not aborted here (the daemon owns tasks).
    PreemptAndAbort,
    /// REGISTER AND IGNORE EXISTING KEY (06h).
    RegisterAndIgnore,
}

impl PrOutAction {
    /// The action for a SERVICE ACTION value.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::Register,
            1 => Self::Reserve,
            2 => Self::Release,
            3 => Self::Clear,
            4 => Self::Preempt,
            5 => Self::PreemptAndAbort,
            6 => Self::RegisterAndIgnore,
            _ => return None,
        })
    }
}

/// How a command is treated in the presence of a reservation (the tables
/// of SPC-4 and SBC-3 that list commands allowed under each type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Allowed whatever the reservation.
    Allowed,
    /// Allowed for non-holders under the Write Exclusive types.
    Read,
    /// Allowed only to holders (and registrants of the RO/AR types).
    Write,
}

/// A decoded PERSISTENT RESERVE OUT request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutRequest<'a> {
    pub(crate) action: PrOutAction,
    pub(crate) scope: u8,
    pub(crate) pr_type: u8,
    pub(crate) param_len: u32,
    pub(crate) data: &'a [u8],
}

/// Registrations and the reservation of one logical unit.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    generation: u32,
    registrants: Vec<(NexusId, u64)>,
    /// Holder and type. For the All Registrants types every registrant holds
    /// it and the stored holder is only the nexus that reserved.
    reservation: Option<(NexusId, PrType)>,
}

impl Reservations {
    pub(crate) fn is_reserved(&self) -> bool {
        self.reservation.is_some()
    }

    fn key_of(&self, nexus: NexusId) -> Option<u64> {
        self.registrants
            .iter()
            .find(|(n, _)| *n == nexus)
            .map(|(_, k)| *k)
    }

    fn is_holder(&self, nexus: NexusId) -> bool {
        match self.reservation {
            Some((_, t)) if t.all_registrants() => self.key_of(nexus).is_some(),
            Some((h, _)) => h == nexus,
            None => false,
        }
    }

    /// RESERVATION CONFLICT when `nexus` may not run a command of class
    /// `access` now.
    pub(crate) fn check(&self, nexus: NexusId, access: Access) -> Result<(), ScsiError> {
        let Some((_, t)) = self.reservation else {
            return Ok(());
        };
        if access == Access::Allowed || self.is_holder(nexus) {
            return Ok(());
        }
        if t.registrants_only() && self.key_of(nexus).is_some() {
            return Ok(());
        }
        if access == Access::Read && t.write_exclusive() {
            return Ok(());
        }
        Err(ScsiError::ReservationConflict)
    }

    /// PERSISTENT RESERVE IN.
    pub(crate) fn read(&self, action: PrInAction, r: &mut Response<'_>) {
        match action {
            PrInAction::ReadKeys => {
                r.be32(self.generation);
                r.be32(len32(self.registrants.len() * 8));
                for (_, key) in &self.registrants {
                    r.be64(*key);
                }
            }
            PrInAction::ReadReservation => {
                r.be32(self.generation);
                match self.reservation {
                    None => r.be32(0),
                    Some((holder, t)) => {
                        r.be32(16);
                        // All Registrants: the key field is zero (SPC-4).
                        let key = if t.all_registrants() {
                            0
                        } else {
                            self.key_of(holder).unwrap_or(0)
                        };
                        r.be64(key);
                        r.zeros(5);
                        r.u8(t.code()); // scope 0 (LU_SCOPE) in bits 7:4
                        r.zeros(2);
                    }
                }
            }
            PrInAction::ReportCapabilities => {
                r.be16(8);
                r.u8(0x00); // no CRH, SIP_C, ATP_C, PTPL_C
                r.u8(0x80); // TMV: the type mask is valid
                r.u8(0xea); // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
                r.u8(0x01); // EX_AC_AR
                r.zeros(2);
            }
        }
    }

    /// PERSISTENT RESERVE OUT.
    pub(crate) fn write(
        &mut self,
        nexus: NexusId,
        req: OutRequest<'_>,
        ua: &mut UnitAttentions,
    ) -> Result<(), ScsiError> {
        if usize::try_from(req.param_len) != Ok(PARAM_LEN) {
            return Err(ScsiError::ParameterListLength);
        }
        let p = req
            .data
            .get(..PARAM_LEN)
            .ok_or(ScsiError::ParameterListLength)?;
        let key = u64::from_be_bytes(p[0..8].try_into().unwrap_or_default());
        let sa_key = u64::from_be_bytes(p[8..16].try_into().unwrap_or_default());
        let flags = p[20];
        if flags & 0xf2 != 0 {
            return Err(ScsiError::parameter_field(
                20,
                Some(crate::sense::top_bit(flags & 0xf2)),
            ));
        }
        if flags & 0x08 != 0 {
            // SPEC_I_PT: not supported (SIP_C = 0).
            return Err(ScsiError::parameter_field(20, Some(3)));
        }
        let typed = || -> Result<PrType, ScsiError> {
            if req.scope != 0 {
                return Err(ScsiError::cdb_field(2, Some(7)));
            }
            PrType::from_code(req.pr_type).ok_or(ScsiError::cdb_field(2, Some(3)))
        };
        match req.action {
            PrOutAction::Register | PrOutAction::RegisterAndIgnore => {
                if flags & 0x04 != 0 {
                    // ALL_TG_PT: not supported (ATP_C = 0).
                    return Err(ScsiError::parameter_field(20, Some(2)));
                }
                if flags & 0x01 != 0 {
                    // APTPL: nothing persists across power loss here.
                    return Err(ScsiError::parameter_field(20, Some(0)));
                }
                let ignore = req.action == PrOutAction::RegisterAndIgnore;
                self.register(nexus, key, sa_key, ignore, ua)
            }
            PrOutAction::Reserve => {
                let t = typed()?;
                self.registered_with(nexus, key)?;
                self.reserve(nexus, t)
            }
            PrOutAction::Release => {
                self.registered_with(nexus, key)?;
                self.release(nexus, req.scope, req.pr_type, ua)
            }
            PrOutAction::Clear => {
                self.registered_with(nexus, key)?;
                for (n, _) in &self.registrants {
                    if *n != nexus {
                        ua.establish(*n, UnitAttention::ReservationsPreempted);
                    }
                }
                self.registrants.clear();
                self.reservation = None;
                self.bump();
                Ok(())
            }
            PrOutAction::Preempt | PrOutAction::PreemptAndAbort => {
                let t = typed()?;
                self.registered_with(nexus, key)?;
                self.preempt(nexus, t, sa_key, ua)
            }
        }
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    fn registered_with(&self, nexus: NexusId, key: u64) -> Result<(), ScsiError> {
        match self.key_of(nexus) {
            Some(k) if k == key => Ok(()),
            _ => Err(ScsiError::ReservationConflict),
        }
    }

    fn register(
        &mut self,
        nexus: NexusId,
        key: u64,
        sa_key: u64,
        ignore: bool,
        ua: &mut UnitAttentions,
    ) -> Result<(), ScsiError> {
        match self.registrants.iter().position(|(n, _)| *n == nexus) {
            None => {
                if !ignore && key != 0 {
                    return Err(ScsiError::ReservationConflict);
                }
                if sa_key == 0 {
                    return Ok(());
                }
                if self.registrants.len() >= MAX_REGISTRANTS {
                    return Err(ScsiError::InsufficientRegistrationResources);
                }
                self.registrants.push((nexus, sa_key));
            }
            Some(i) => {
                if !ignore && key != self.registrants[i].1 {
                    return Err(ScsiError::ReservationConflict);
                }
                if sa_key == 0 {
                    self.unregister(i, ua);
                } else {
                    self.registrants[i].1 = sa_key;
                }
            }
        }
        self.bump();
        Ok(())
    }

    /// Removes registration `i`, releasing the reservation when its holder
    /// goes (SPC-4).
    fn unregister(&mut self, i: usize, ua: &mut UnitAttentions) {
        let (nexus, _) = self.registrants.remove(i);
        match self.reservation {
            Some((_, t)) if t.all_registrants() && self.registrants.is_empty() => {
                self.reservation = None;
            }
            Some((_, t)) if t.all_registrants() => {}
            Some((holder, t)) if holder == nexus => {
                self.reservation = None;
                if t.registrants_only() {
                    for (n, _) in &self.registrants {
                        ua.establish(*n, UnitAttention::ReservationsReleased);
                    }
                }
            }
            _ => {}
        }
    }

    fn reserve(&mut self, nexus: NexusId, t: PrType) -> Result<(), ScsiError> {
        match self.reservation {
            None => {
                self.reservation = Some((nexus, t));
                Ok(())
            }
            Some((_, cur)) if cur == t && self.is_holder(nexus) => Ok(()),
            Some(_) => Err(ScsiError::ReservationConflict),
        }
    }

    fn release(
        &mut self,
        nexus: NexusId,
        scope: u8,
        pr_type: u8,
        ua: &mut UnitAttentions,
    ) -> Result<(), ScsiError> {
        let Some((_, cur)) = self.reservation else {
            return Ok(());
        };
        if !self.is_holder(nexus) {
            return Ok(());
        }
        if scope != 0 || pr_type != cur.code() {
            return Err(ScsiError::InvalidRelease);
        }
        self.reservation = None;
        if cur.registrants_only() || cur.all_registrants() {
            for (n, _) in &self.registrants {
                if *n != nexus {
                    ua.establish(*n, UnitAttention::ReservationsReleased);
                }
            }
        }
        Ok(())
    }

    /// Removes every registration `pred` selects, telling each removed
    /// nexus other than `by`; returns how many went.
    fn remove_where(
        &mut self,
        by: NexusId,
        ua: &mut UnitAttentions,
        pred: impl Fn(NexusId, u64) -> bool,
    ) -> usize {
        let before = self.registrants.len();
        self.registrants.retain(|&(n, k)| {
            let remove = pred(n, k);
            if remove && n != by {
                ua.establish(n, UnitAttention::RegistrationsPreempted);
            }
            !remove
        });
        before - self.registrants.len()
    }

    /// PREEMPT (SPC-4).
    fn preempt(
        &mut self,
        nexus: NexusId,
        t: PrType,
        sa_key: u64,
        ua: &mut UnitAttentions,
    ) -> Result<(), ScsiError> {
        let holder_key = match self.reservation {
            Some((_, cur)) if cur.all_registrants() => (sa_key == 0).then_some(0),
            Some((holder, _)) => self.key_of(holder).filter(|k| *k == sa_key),
            None => None,
        };
        match (self.reservation, holder_key) {
            (Some((_, old)), Some(_)) => {
                // Preempt the reservation: remove the other registrations
                // with that key (all others for All Registrants), then
                // reserve for this nexus with the new type.
                let all = old.all_registrants();
                self.remove_where(nexus, ua, |n, k| n != nexus && (all || k == sa_key));
                self.reservation = Some((nexus, t));
                if old != t {
                    for (n, _) in &self.registrants {
                        if *n != nexus {
                            ua.establish(*n, UnitAttention::ReservationsReleased);
                        }
                    }
                }
            }
            _ => {
                // Only remove registrations.
                if sa_key == 0 {
                    return Err(ScsiError::parameter_field(8, Some(7)));
                }
                if self.remove_where(nexus, ua, |_, k| k == sa_key) == 0 {
                    return Err(ScsiError::ReservationConflict);
                }
                if let Some((holder, cur)) = self.reservation {
                    let gone = if cur.all_registrants() {
                        self.registrants.is_empty()
                    } else {
                        self.key_of(holder).is_none()
                    };
                    if gone {
                        self.reservation = None;
                    }
                }
            }
        }
        self.bump();
        Ok(())
    }
}

#[cfg(test)]
#[path = "pr_tests.rs"]
mod tests;
