//! A queue's notifiers: the driver's kick, the device's call and error
//! eventfds, and the call owed while there is no call eventfd.

use std::os::fd::{AsRawFd, RawFd};

use crate::runtime::eventfd::{PeerEventFd, Signal};

/// What became of a call to the driver.
#[derive(Debug)]
pub(crate) enum Called {
    /// Sent, or merged into one the driver has not read yet.
    Signalled(Signal),
    /// No call eventfd yet: owed, sent when one arrives.
    Owed,
    /// No call eventfd, and none is owed (a broken queue).
    Dropped,
}

/// The eventfds of one queue.
#[derive(Debug)]
pub(crate) struct Notifiers {
    kick: PeerEventFd,
    call: Option<PeerEventFd>,
    err: Option<PeerEventFd>,
    /// A notification fell due while there was no call eventfd: sent as
    /// soon as one arrives. QEMU starts a ring with SET_VRING_KICK and only
    /// then sends SET_VRING_CALL, so a request the driver makes available
    /// right after DRIVER_OK can complete before the call fd is here.
    call_owed: bool,
}

impl Notifiers {
    /// The notifiers of a queue starting now.
    pub(crate) fn new(
        kick: PeerEventFd,
        call: Option<PeerEventFd>,
        err: Option<PeerEventFd>,
    ) -> Self {
        Notifiers {
            kick,
            call,
            err,
            call_owed: false,
        }
    }

    /// The kick eventfd, for the worker's epoll set.
    pub(crate) fn kick_fd(&self) -> RawFd {
        self.kick.as_raw_fd()
    }

    /// Reads the kicks counted since the last read (never blocks, see
    /// `PeerEventFd::drain`).
    pub(crate) fn drain_kicks(&self) -> Option<u64> {
        self.kick.drain()
    }

    /// Calls the driver, or owes it the call (`owe`) while there is no
    /// call eventfd. A call eventfd that failed is dropped: the caller
    /// stops the queue.
    pub(crate) fn call(&mut self, owe: bool) -> Called {
        let Some(call) = &self.call else {
            self.call_owed = owe;
            return if owe { Called::Owed } else { Called::Dropped };
        };
        let signal = call.signal();
        if matches!(signal, Signal::Failed(_) | Signal::Stalled) {
            self.call = None;
        }
        Called::Signalled(signal)
    }

    /// Replaces the call eventfd; true if a call is owed and can now be
    /// sent.
    pub(crate) fn set_call(&mut self, call: Option<PeerEventFd>) -> bool {
        self.call = call;
        self.call.is_some() && std::mem::take(&mut self.call_owed)
    }

    /// Replaces the error eventfd.
    pub(crate) fn set_err(&mut self, err: Option<PeerEventFd>) {
        self.err = err;
    }

    /// Tells the driver the queue broke, if it gave an error eventfd
    /// (whatever that does, the queue is stopped already).
    pub(crate) fn signal_err(&self) {
        if let Some(err) = &self.err {
            let _ = err.signal();
        }
    }
}
