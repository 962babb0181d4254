//! User and group names to ids (`getpwnam_r`, `getgrnam_r`), for the
//! owner and group of the daemon's sockets. Resolved once, when the
//! configuration is read: an unknown name is a configuration error, and
//! nothing is looked up once the daemon runs (under the seccomp filter a
//! lookup through NSS could not open what it needs).

use std::ffi::{CString, c_char, c_int};
use std::io;

use thiserror::Error;

/// Why a name could not be resolved.
#[derive(Debug, Error)]
pub enum AccountError {
    /// No user of that name.
    #[error("unknown user {0:?}")]
    UnknownUser(String),
    /// No group of that name.
    #[error("unknown group {0:?}")]
    UnknownGroup(String),
    /// The name cannot be a user or group name (a NUL byte, empty).
    #[error("invalid user or group name {0:?}")]
    Invalid(String),
    /// The lookup itself failed (NSS).
    #[error("cannot look up {0:?}")]
    Lookup(String, #[source] io::Error),
}

/// The uid of `name`: a user name, or a number taken as it is.
pub fn user_id(name: &str) -> Result<u32, AccountError> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    // SAFETY: an all-zero passwd (null pointers, zero ids) is a valid
    // output buffer for getpwnam_r, which fills it.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let found = lookup(name, |cname, buf, len, result| {
        let out = std::ptr::from_mut(&mut entry);
        let result = result.cast::<*mut libc::passwd>();
        // SAFETY: `cname` is a NUL-terminated string, `out` a valid passwd,
        // `buf` valid for `len` bytes, `result` a valid out pointer; all
        // outlive the call.
        unsafe { libc::getpwnam_r(cname, out, buf, len, result) }
    })?;
    if found {
        Ok(entry.pw_uid)
    } else {
        Err(AccountError::UnknownUser(name.to_owned()))
    }
}

/// The gid of `name`: a group name, or a number taken as it is.
pub fn group_id(name: &str) -> Result<u32, AccountError> {
    if let Ok(id) = name.parse() {
        return Ok(id);
    }
    // SAFETY: an all-zero group is a valid output buffer for getgrnam_r.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let found = lookup(name, |cname, buf, len, result| {
        let out = std::ptr::from_mut(&mut entry);
        let result = result.cast::<*mut libc::group>();
        // SAFETY: as for getpwnam_r above.
        unsafe { libc::getgrnam_r(cname, out, buf, len, result) }
    })?;
    if found {
        Ok(entry.gr_gid)
    } else {
        Err(AccountError::UnknownGroup(name.to_owned()))
    }
}

/// Calls a `get*nam_r` function, growing its buffer on ERANGE; true when
/// it found an entry (`*result` not null).
fn lookup(
    name: &str,
    mut call: impl FnMut(*const c_char, *mut c_char, usize, *mut *mut libc::c_void) -> c_int,
) -> Result<bool, AccountError> {
    let cname = match CString::new(name) {
        Ok(c) if !name.is_empty() => c,
        _ => return Err(AccountError::Invalid(name.to_owned())),
    };
    let mut buf = vec![0 as c_char; 1024];
    loop {
        let mut result: *mut libc::c_void = std::ptr::null_mut();
        let rc = call(cname.as_ptr(), buf.as_mut_ptr(), buf.len(), &raw mut result);
        match rc {
            0 => return Ok(!result.is_null()),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            // "Not found" as some NSS modules report it.
            libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => return Ok(false),
            e => {
                return Err(AccountError::Lookup(
                    name.to_owned(),
                    io::Error::from_raw_os_error(e),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_resolve() {
        assert_eq!(user_id("root").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert_eq!(user_id("4242").unwrap(), 4242);
        assert_eq!(group_id("107").unwrap(), 107);
    }

    #[test]
    fn unknown_and_invalid_names_are_errors() {
        let e = user_id("sqcq-no-such-user").unwrap_err();
        assert!(matches!(e, AccountError::UnknownUser(_)), "{e}");
        let e = group_id("sqcq-no-such-group").unwrap_err();
        assert!(matches!(e, AccountError::UnknownGroup(_)), "{e}");
        assert!(matches!(user_id(""), Err(AccountError::Invalid(_))));
        assert!(matches!(group_id("a\0b"), Err(AccountError::Invalid(_))));
    }
}
