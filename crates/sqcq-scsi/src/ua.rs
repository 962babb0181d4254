//! Unit attention conditions (SAM-5): established per I_T
//! nexus, reported once by the next command that is not INQUIRY, REPORT
//! LUNS or REQUEST SENSE, and cleared by that report.

use std::collections::HashMap;

use crate::sense::{Sense, SenseKey};

/// One I_T nexus: the daemon gives every virtio-scsi connection its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NexusId(pub u64);

/// A unit attention condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitAttention {
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29h/00h): the
    /// logical unit was created, or the nexus is new to it.
    PowerOn,
    /// BUS DEVICE RESET FUNCTION OCCURRED (29h/03h): LOGICAL UNIT RESET.
    LogicalUnitReset,
    /// MODE PARAMETERS CHANGED (2Ah/01h): another nexus changed them.
    ModeParametersChanged,
    /// RESERVATIONS PREEMPTED (2Ah/03h): another nexus cleared them.
    ReservationsPreempted,
    /// RESERVATIONS RELEASED (2Ah/04h).
    ReservationsReleased,
    /// REGISTRATIONS PREEMPTED (2Ah/05h): another nexus removed this one's
    /// registration.
    RegistrationsPreempted,
    /// CAPACITY DATA HAS CHANGED (2Ah/09h): the logical unit was resized.
    CapacityChanged,
    /// REPORTED LUNS DATA HAS CHANGED (3Fh/0Eh): LUNs were added or removed.
    ReportedLunsChanged,
}

impl UnitAttention {
    /// The sense data that report this condition.
    pub const fn sense(self) -> Sense {
        let (asc, ascq) = match self {
            Self::PowerOn => (0x29, 0x00),
            Self::LogicalUnitReset => (0x29, 0x03),
            Self::ModeParametersChanged => (0x2a, 0x01),
            Self::ReservationsPreempted => (0x2a, 0x03),
            Self::ReservationsReleased => (0x2a, 0x04),
            Self::RegistrationsPreempted => (0x2a, 0x05),
            Self::CapacityChanged => (0x2a, 0x09),
            Self::ReportedLunsChanged => (0x3f, 0x0e),
        };
        Sense::new(SenseKey::UnitAttention, asc, ascq)
    }
}

/// Pending conditions of every nexus the logical unit knows. Each queue
/// holds a condition at most once, so it never grows past the number of
/// kinds of condition.
#[derive(Debug, Default)]
pub(crate) struct UnitAttentions {
    pending: HashMap<NexusId, Vec<UnitAttention>>,
}

impl UnitAttentions {
    /// True when some nexus has a condition pending.
    #[cfg(test)]
    pub(crate) fn any(&self) -> bool {
        self.pending.values().any(|q| !q.is_empty())
    }

    /// The nexuses with a condition pending.
    pub(crate) fn pending_nexuses(&self) -> impl Iterator<Item = NexusId> + '_ {
        self.pending
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(n, _)| *n)
    }

    /// A new nexus: it sees the logical unit as just powered on.
    pub(crate) fn add_nexus(&mut self, nexus: NexusId) {
        self.pending.insert(nexus, vec![UnitAttention::PowerOn]);
    }

    /// A nexus that continues one the logical unit knew before the
    /// process restarted (the frontend handed back its in-flight
    /// requests): no power-on condition, since for the initiator nothing
    /// was powered off.
    pub(crate) fn continue_nexus(&mut self, nexus: NexusId) {
        if let Some(q) = self.pending.get_mut(&nexus) {
            q.retain(|ua| *ua != UnitAttention::PowerOn);
        }
    }

    /// The nexus is gone; forget its conditions.
    pub(crate) fn remove_nexus(&mut self, nexus: NexusId) {
        self.pending.remove(&nexus);
    }

    /// Establishes `ua` for `nexus`.
    pub(crate) fn establish(&mut self, nexus: NexusId, ua: UnitAttention) {
        let q = self.pending.entry(nexus).or_default();
        if !q.contains(&ua) {
            q.push(ua);
        }
    }

    /// Establishes `ua` for every known nexus except `except`.
    pub(crate) fn establish_all(&mut self, ua: UnitAttention, except: Option<NexusId>) {
        for (n, q) in &mut self.pending {
            if Some(*n) != except && !q.contains(&ua) {
                q.push(ua);
            }
        }
    }

    /// A logical unit reset: every nexus is told, and older conditions are
    /// superseded by it.
    pub(crate) fn reset(&mut self) {
        for q in self.pending.values_mut() {
            q.clear();
            q.push(UnitAttention::LogicalUnitReset);
        }
    }

    /// Takes the oldest condition pending for `nexus`.
    pub(crate) fn take(&mut self, nexus: NexusId) -> Option<UnitAttention> {
        let q = self.pending.get_mut(&nexus)?;
        if q.is_empty() {
            None
        } else {
            Some(q.remove(0))
        }
    }

    /// Clears `ua` for `nexus` if pending.
    pub(crate) fn clear(&mut self, nexus: NexusId, ua: UnitAttention) {
        if let Some(q) = self.pending.get_mut(&nexus) {
            q.retain(|u| *u != ua);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: NexusId = NexusId(1);
    const B: NexusId = NexusId(2);

    #[test]
    fn new_nexus_sees_power_on_once() {
        let mut u = UnitAttentions::default();
        assert!(!u.any());
        u.add_nexus(A);
        assert!(u.any());
        assert_eq!(u.take(A), Some(UnitAttention::PowerOn));
        assert_eq!(u.take(A), None);
        assert!(!u.any());
    }

    #[test]
    fn establish_all_skips_the_originator_and_dedups() {
        let mut u = UnitAttentions::default();
        u.add_nexus(A);
        u.add_nexus(B);
        u.take(A);
        u.take(B);
        u.establish_all(UnitAttention::ModeParametersChanged, Some(A));
        u.establish_all(UnitAttention::ModeParametersChanged, Some(A));
        assert_eq!(u.take(A), None);
        assert_eq!(u.take(B), Some(UnitAttention::ModeParametersChanged));
        assert_eq!(u.take(B), None);
    }

    #[test]
    fn fifo_order_and_reset_supersedes() {
        let mut u = UnitAttentions::default();
        u.establish(A, UnitAttention::CapacityChanged);
        u.establish(A, UnitAttention::ReservationsReleased);
        assert_eq!(u.take(A), Some(UnitAttention::CapacityChanged));
        u.reset();
        assert_eq!(u.take(A), Some(UnitAttention::LogicalUnitReset));
        assert_eq!(u.take(A), None);
    }

    #[test]
    fn clear_and_remove() {
        let mut u = UnitAttentions::default();
        u.establish(A, UnitAttention::ReportedLunsChanged);
        u.establish(A, UnitAttention::CapacityChanged);
        u.clear(A, UnitAttention::ReportedLunsChanged);
        assert_eq!(u.take(A), Some(UnitAttention::CapacityChanged));
        u.establish(B, UnitAttention::PowerOn);
        u.remove_nexus(B);
        assert!(!u.any());
    }

    #[test]
    fn sense_codes() {
        let s = UnitAttention::ReportedLunsChanged.sense();
        assert_eq!(
            (s.key, s.asc, s.ascq),
            (SenseKey::UnitAttention, 0x3f, 0x0e)
        );
        assert_eq!(UnitAttention::PowerOn.sense().asc, 0x29);
        assert_eq!(UnitAttention::RegistrationsPreempted.sense().ascq, 0x05);
    }
}
