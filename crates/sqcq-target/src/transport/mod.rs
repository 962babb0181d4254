//! vhost-user, for any device type ([`device_type`]): one control thread
//! per device socket ([`device`]), the session of a connected frontend
//! ([`session`], [`handler`]: features, protocol features, memory table,
//! vrings), and the guards that keep a hostile frontend to its own
//! connection ([`vhost_socket`], [`listen`], [`memory`], [`sigbus`]).

pub mod device;
pub mod device_type;
pub mod handler;
pub mod listen;
pub mod memory;
pub mod session;
pub mod sigbus;
pub mod vhost_socket;
