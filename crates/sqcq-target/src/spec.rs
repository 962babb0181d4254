//! What a disk is made of, from the command line or a configuration file:
//! the backstore (kind, path, size, whether to create the file), the
//! logical block size, read-only, and the identity a device reports
//! (serial, WWN, and for SCSI the LUN number). Shared by the device types
//! and the daemon's configuration; depends on nothing else in the crate.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqcq_backstore::{
    Backstore, BackstoreError, FileBackstore, FileOptions, NullBackstore, RamBackstore,
};
#[cfg(feature = "rbd")]
use sqcq_backstore::{RbdBackstore, RbdOptions};
use thiserror::Error;

/// Where a LUN stores its blocks.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackstoreKind {
    /// Drops writes; reads leave their buffers alone, or zero them with
    /// `zero` (measures the transport alone).
    Null,
    /// Keeps data in memory.
    Ram,
    /// A regular file or block device through io_uring.
    File,
    /// A Ceph RBD image through librbd (`pool`, `image`; the capacity is
    /// the image's size).
    Rbd,
}

/// One logical unit. It serializes (`config_save`) to the keys it is
/// read from, leaving out those at their defaults.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct LunSpec {
    /// Backstore kind.
    pub kind: BackstoreKind,
    /// LUN number (default: position in the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lun: Option<u16>,
    /// Size in bytes (`K`, `M`, `G`, `T` suffixes accepted); required for
    /// null and ram; for file, the bytes of the file to expose (at most
    /// its size: an existing file is never grown or shrunk) and the size
    /// of a file `create` makes.
    #[serde(
        default,
        deserialize_with = "de_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub size: Option<u64>,
    /// Backing file or block device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// File LUNs: create the file (of `size` bytes) if it is missing.
    #[serde(
        default,
        deserialize_with = "de_bool",
        skip_serializing_if = "is_false"
    )]
    pub create: bool,
    /// Logical block size: 512 or 4096.
    #[serde(
        default = "default_block_size",
        alias = "block_size",
        skip_serializing_if = "is_default_block_size"
    )]
    pub block_size: u32,
    /// Read-only LUN.
    #[serde(
        default,
        alias = "ro",
        alias = "read_only",
        deserialize_with = "de_bool",
        skip_serializing_if = "is_false"
    )]
    pub read_only: bool,
    /// Unit serial number (VPD page 0x80).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// NAA WWN (VPD page 0x83), `0x5...`.
    #[serde(
        default,
        deserialize_with = "de_wwn",
        serialize_with = "ser_wwn",
        skip_serializing_if = "Option::is_none"
    )]
    pub wwn: Option<u64>,
    /// Null LUNs: reads fill their buffers with zeros. Off by default, as
    /// for Linux's null_blk and SPDK's null bdev: a read leaves the
    /// initiator's buffer as it was.
    #[serde(
        default,
        deserialize_with = "de_bool",
        skip_serializing_if = "is_false"
    )]
    pub zero: bool,
    /// File LUNs: lock the image as QEMU does, so that no second daemon
    /// or QEMU writes it at the same time (on by default).
    #[serde(
        default = "default_lock",
        deserialize_with = "de_bool",
        skip_serializing_if = "is_true"
    )]
    pub lock: bool,
    /// File and RBD LUNs: take the image locks (RBD: the exclusive lock)
    /// when a frontend first starts a queue rather than at open (`sqcqd --incoming`, the destination of
    /// a live migration); not a key of its own.
    #[serde(skip)]
    pub defer_lock: bool,
    /// RBD LUNs: the pool that holds the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// RBD LUNs: the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// RBD LUNs: the pool namespace (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// RBD LUNs: serve this snapshot of the image, read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snap: Option<String>,
    /// RBD LUNs: the Ceph configuration file (default: `$CEPH_CONF`, then
    /// `/etc/ceph/ceph.conf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conf: Option<PathBuf>,
    /// RBD LUNs: the cephx user, without `client.` (default: `admin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// RBD LUNs: the keyring (default: the configuration's `keyring`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyring: Option<PathBuf>,
    /// SCSI LUNs: at most this many requests per second (QoS of the LUN;
    /// a blk device's is its device's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    /// SCSI LUNs: at most this many bytes per second (`K`/`M`/`G`
    /// suffixes).
    #[serde(
        default,
        deserialize_with = "de_size",
        skip_serializing_if = "Option::is_none"
    )]
    pub bps: Option<u64>,
    /// SCSI LUNs: the burst allowance of `iops` and `bps`, in ms.
    #[serde(default, alias = "burst_ms", skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u64>,
}

/// Why a spec's backstore could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// The spec lacks a field its kind needs.
    #[error("{0}")]
    Spec(&'static str),
    /// The backstore refused.
    #[error("backstore")]
    Backstore(#[source] BackstoreError),
}

impl LunSpec {
    /// Creates or opens the backstore the spec describes (a file only
    /// created when `create` says so, never resized).
    pub fn open_backstore(&self) -> Result<Arc<dyn Backstore>, OpenError> {
        let block_size = self.block_size;
        if self.zero && self.kind != BackstoreKind::Null {
            return Err(OpenError::Spec("zero is an option of null LUNs"));
        }
        if !self.lock && self.kind != BackstoreKind::File {
            return Err(OpenError::Spec("lock is an option of file LUNs"));
        }
        if let Some(why) = self.misplaced_rbd_key() {
            return Err(OpenError::Spec(why));
        }
        Ok(match self.kind {
            BackstoreKind::Null | BackstoreKind::Ram => {
                let size = self
                    .size
                    .ok_or(OpenError::Spec("null and ram LUNs need size="))?;
                if self.kind == BackstoreKind::Null {
                    Arc::new(
                        NullBackstore::new(size, block_size)
                            .map_err(OpenError::Backstore)?
                            .zero_reads(self.zero),
                    )
                } else {
                    Arc::new(RamBackstore::new(size, block_size).map_err(OpenError::Backstore)?)
                }
            }
            BackstoreKind::File => {
                let path = self
                    .path
                    .clone()
                    .ok_or(OpenError::Spec("file LUNs need path="))?;
                let options = FileOptions {
                    size: self.size,
                    create: self.create,
                    block_size,
                    read_only: self.read_only,
                    lock: self.lock,
                    defer_lock: self.defer_lock,
                    ..FileOptions::new(path)
                };
                Arc::new(FileBackstore::open(&options).map_err(OpenError::Backstore)?)
            }
            BackstoreKind::Rbd => self.open_rbd()?,
        })
    }

    /// Why the spec's RBD keys do not fit its kind, if they do not.
    fn misplaced_rbd_key(&self) -> Option<&'static str> {
        let any = self.pool.is_some()
            || self.image.is_some()
            || self.namespace.is_some()
            || self.snap.is_some()
            || self.conf.is_some()
            || self.id.is_some()
            || self.keyring.is_some();
        match self.kind {
            BackstoreKind::Rbd if self.pool.is_none() || self.image.is_none() => {
                Some("RBD LUNs need pool= and image=")
            }
            BackstoreKind::Rbd if self.path.is_some() || self.create => {
                Some("path and create are options of file LUNs")
            }
            BackstoreKind::Rbd => None,
            _ if any => {
                Some("pool, image, namespace, snap, conf, id and keyring are options of RBD LUNs")
            }
            _ => None,
        }
    }

    #[cfg(feature = "rbd")]
    fn open_rbd(&self) -> Result<Arc<dyn Backstore>, OpenError> {
        let options = RbdOptions {
            namespace: self.namespace.clone(),
            snap: self.snap.clone(),
            conf: self.conf.clone(),
            id: self.id.clone(),
            keyring: self.keyring.clone(),
            block_size: self.block_size,
            read_only: self.read_only,
            defer_lock: self.defer_lock,
            ..RbdOptions::new(
                self.pool.clone().unwrap_or_default(),
                self.image.clone().unwrap_or_default(),
            )
        };
        Ok(Arc::new(
            RbdBackstore::open(&options).map_err(OpenError::Backstore)?,
        ))
    }

    #[cfg(not(feature = "rbd"))]
    fn open_rbd(&self) -> Result<Arc<dyn Backstore>, OpenError> {
        Err(OpenError::Spec(
            "this sqcqd was built without RBD support (cargo feature rbd)",
        ))
    }
}

fn default_block_size() -> u32 {
    512
}

fn default_lock() -> bool {
    true
}

// Serde's `skip_serializing_if` takes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_false(b: &bool) -> bool {
    !*b
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_true(b: &bool) -> bool {
    *b
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_default_block_size(b: &u32) -> bool {
    *b == default_block_size()
}

/// A WWN as it is written (`0x5...`): a TOML integer is signed, and a NAA
/// name reads better in hex anyway.
#[allow(clippy::ref_option)]
fn ser_wwn<S: serde::Serializer>(wwn: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match wwn {
        Some(w) => s.serialize_str(&format!("{w:#018x}")),
        None => s.serialize_none(),
    }
}

/// A `--lun` value that cannot be parsed.
#[derive(Debug, Error)]
#[error("invalid LUN spec {spec:?}: {why}")]
pub struct LunSpecError {
    /// The spec.
    pub spec: String,
    /// What is wrong.
    pub why: String,
}

impl LunSpec {
    /// A LUN of `kind` with every other key at its default (what a
    /// `--lun` string or a TOML table leaves out).
    pub fn new(kind: BackstoreKind) -> Self {
        LunSpec {
            kind,
            lun: None,
            size: None,
            path: None,
            create: false,
            block_size: 512,
            read_only: false,
            serial: None,
            wwn: None,
            zero: false,
            lock: true,
            defer_lock: false,
            pool: None,
            image: None,
            namespace: None,
            snap: None,
            conf: None,
            id: None,
            keyring: None,
            iops: None,
            bps: None,
            burst_ms: None,
        }
    }
}

impl FromStr for LunSpec {
    type Err = LunSpecError;

    /// Parses `kind=null|ram|file|rbd,size=..,path=..,create,
    /// block-size=512|4096,ro,serial=..,wwn=0x..,lun=N,zero,lock=off,
    /// pool=..,image=..,namespace=..,snap=..,conf=..,id=..,keyring=..,
    /// iops=N,bps=N,burst-ms=N`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why: String| LunSpecError {
            spec: s.to_owned(),
            why,
        };
        let mut kind = None;
        let mut spec = LunSpec::new(BackstoreKind::Null);
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            match key {
                "kind" => {
                    kind = Some(match value {
                        "null" => BackstoreKind::Null,
                        "ram" => BackstoreKind::Ram,
                        "file" => BackstoreKind::File,
                        "rbd" => BackstoreKind::Rbd,
                        _ => return Err(err(format!("unknown kind {value:?}"))),
                    })
                }
                "size" => spec.size = Some(parse_size(value).map_err(err)?),
                "path" => spec.path = Some(PathBuf::from(value)),
                "block-size" | "block_size" => {
                    spec.block_size = value
                        .parse()
                        .map_err(|_| err(format!("bad block size {value:?}")))?
                }
                "ro" | "read-only" => spec.read_only = flag(key, value).map_err(err)?,
                "create" => spec.create = flag(key, value).map_err(err)?,
                "zero" => spec.zero = flag(key, value).map_err(err)?,
                "lock" => spec.lock = flag(key, value).map_err(err)?,
                "pool" => spec.pool = Some(value.to_owned()),
                "image" => spec.image = Some(value.to_owned()),
                "namespace" => spec.namespace = Some(value.to_owned()),
                "snap" => spec.snap = Some(value.to_owned()),
                "conf" => spec.conf = Some(PathBuf::from(value)),
                "id" => spec.id = Some(value.to_owned()),
                "keyring" => spec.keyring = Some(PathBuf::from(value)),
                "serial" => spec.serial = Some(value.to_owned()),
                "wwn" => spec.wwn = Some(parse_wwn(value).map_err(err)?),
                "iops" | "burst-ms" => {
                    let n = value
                        .parse()
                        .map_err(|_| err(format!("{key}={value}: not a number")))?;
                    if key == "iops" {
                        spec.iops = Some(n);
                    } else {
                        spec.burst_ms = Some(n);
                    }
                }
                "bps" => spec.bps = Some(parse_size(value).map_err(err)?),
                "lun" => {
                    spec.lun = Some(
                        value
                            .parse()
                            .map_err(|_| err(format!("bad LUN {value:?}")))?,
                    )
                }
                _ => return Err(err(format!("unknown key {key:?}"))),
            }
        }
        spec.kind = kind.ok_or_else(|| err("kind= is required".to_owned()))?;
        if spec.zero && spec.kind != BackstoreKind::Null {
            return Err(err("zero is an option of null LUNs".to_owned()));
        }
        if !spec.lock && spec.kind != BackstoreKind::File {
            return Err(err("lock is an option of file LUNs".to_owned()));
        }
        if spec.block_size != 512 && spec.block_size != 4096 {
            return Err(err("block-size must be 512 or 4096".to_owned()));
        }
        if let Some(why) = spec.misplaced_rbd_key() {
            return Err(err(why.to_owned()));
        }
        if spec.kind == BackstoreKind::Rbd && spec.size.is_some() {
            return Err(err(
                "an RBD LUN's capacity is its image's size (rbd resize changes it), not size="
                    .to_owned(),
            ));
        }
        Ok(spec)
    }
}

/// A `--lun` switch: bare (`ro`) means on, otherwise [`parse_bool`].
fn flag(key: &str, value: &str) -> Result<bool, String> {
    if value.is_empty() {
        return Ok(true);
    }
    parse_bool(value).map_err(|e| format!("{key}: {e}"))
}

/// Parses a boolean option the way operators spell it: `on`/`off`,
/// `true`/`false`, `yes`/`no`, `1`/`0` (ASCII case ignored). Anything
/// else is an error rather than `false`: a misspelt `ro=ture` must not
/// serve a writable disk.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    const TRUE: [&str; 4] = ["on", "true", "yes", "1"];
    const FALSE: [&str; 4] = ["off", "false", "no", "0"];
    if TRUE.iter().any(|t| s.eq_ignore_ascii_case(t)) {
        Ok(true)
    } else if FALSE.iter().any(|f| s.eq_ignore_ascii_case(f)) {
        Ok(false)
    } else {
        Err(format!(
            "{s:?} is not a boolean (on/off, true/false, yes/no, 1/0)"
        ))
    }
}

/// Parses a byte size with an optional binary suffix (K, M, G, T).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        Some((i, 't' | 'T')) => (&s[..i], 40),
        _ => (s, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

fn parse_wwn(s: &str) -> Result<u64, String> {
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(hex, 16).map_err(|_| format!("bad WWN {s:?}"))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(u64),
    Str(String),
}

/// A boolean in a configuration file or a JSON-RPC call: a TOML or JSON
/// boolean, the numbers 0 and 1, or a string [`parse_bool`] takes.
pub fn de_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Loose {
        Bool(bool),
        Int(i64),
        Str(String),
    }
    match Loose::deserialize(d)? {
        Loose::Bool(b) => Ok(b),
        Loose::Int(0) => Ok(false),
        Loose::Int(1) => Ok(true),
        Loose::Int(n) => Err(serde::de::Error::custom(format!(
            "{n} is not a boolean (on/off, true/false, yes/no, 1/0)"
        ))),
        Loose::Str(s) => parse_bool(&s).map_err(serde::de::Error::custom),
    }
}

/// [`de_bool`] for an optional key.
pub fn de_opt_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    de_bool(d).map(Some)
}

fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<IntOrString>::deserialize(d)? {
        None => Ok(None),
        Some(IntOrString::Int(n)) => Ok(Some(n)),
        Some(IntOrString::Str(s)) => parse_size(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

fn de_wwn<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    match Option::<IntOrString>::deserialize(d)? {
        None => Ok(None),
        Some(IntOrString::Int(n)) => Ok(Some(n)),
        Some(IntOrString::Str(s)) => parse_wwn(&s).map(Some).map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lun(s: &str) -> Result<LunSpec, LunSpecError> {
        s.parse()
    }

    #[test]
    fn every_spelling_of_a_switch_counts() {
        for on in [
            "ro",
            "ro=on",
            "ro=true",
            "ro=1",
            "ro=yes",
            "ro=YES",
            "read-only=True",
        ] {
            let spec = lun(&format!("kind=ram,size=16M,{on}")).unwrap();
            assert!(spec.read_only, "{on}");
        }
        for off in ["ro=off", "ro=false", "ro=0", "ro=no"] {
            let spec = lun(&format!("kind=ram,size=16M,{off}")).unwrap();
            assert!(!spec.read_only, "{off}");
        }
        assert!(lun("kind=file,path=/x,create=true").unwrap().create);
        assert!(lun("kind=null,size=1M,zero=yes").unwrap().zero);
    }

    #[test]
    fn rbd_luns_take_their_keys_in_every_form() {
        let cli =
            lun("kind=rbd,pool=p,image=i,namespace=n,snap=s,conf=/c,id=u,keyring=/k").unwrap();
        assert_eq!(cli.kind, BackstoreKind::Rbd);
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let got = |s: &LunSpec| {
            vec![
                s.pool.clone(),
                s.image.clone(),
                s.namespace.clone(),
                s.snap.clone(),
                path(&s.conf),
                s.id.clone(),
                path(&s.keyring),
            ]
        };
        let want: Vec<Option<String>> = ["p", "i", "n", "s", "/c", "u", "/k"]
            .map(|v| Some(v.to_owned()))
            .into();
        assert_eq!(got(&cli), want);
        let toml_spec: LunSpec = toml::from_str(
            "kind = \"rbd\"\npool = \"p\"\nimage = \"i\"\nnamespace = \"n\"\nsnap = \"s\"\n\
             conf = \"/c\"\nid = \"u\"\nkeyring = \"/k\"\n",
        )
        .unwrap();
        assert_eq!(toml_spec, cli);
        let json_spec: LunSpec = serde_json::from_str(
            r#"{"kind":"rbd","pool":"p","image":"i","namespace":"n","snap":"s","conf":"/c","id":"u","keyring":"/k"}"#,
        )
        .unwrap();
        assert_eq!(json_spec, cli);
        for (bad, why) in [
            ("kind=rbd,pool=p", "need pool= and image="),
            ("kind=rbd,image=i", "need pool= and image="),
            ("kind=rbd,pool=p,image=i,size=1G", "its image's size"),
            ("kind=rbd,pool=p,image=i,path=/x", "options of file LUNs"),
            ("kind=file,path=/x,pool=p", "options of RBD LUNs"),
            ("kind=ram,size=1M,snap=s", "options of RBD LUNs"),
        ] {
            let e = lun(bad).unwrap_err();
            assert!(e.why.contains(why), "{bad}: {e}");
        }
        let stray: LunSpec =
            serde_json::from_str(r#"{"kind":"ram","size":"1M","pool":"p"}"#).unwrap();
        assert!(matches!(
            stray.open_backstore(),
            Err(OpenError::Spec(why)) if why.contains("options of RBD LUNs")
        ));
    }

    #[test]
    fn a_luns_limits_parse_as_the_device_qos_does() {
        let spec = lun("kind=null,size=1M,iops=500,bps=4M,burst-ms=20").unwrap();
        assert_eq!(
            (spec.iops, spec.bps, spec.burst_ms),
            (Some(500), Some(4 << 20), Some(20))
        );
        let toml: LunSpec =
            toml::from_str("kind = \"null\"\nsize = \"1M\"\nbps = \"1K\"\nburst_ms = 5").unwrap();
        assert_eq!(
            (toml.iops, toml.bps, toml.burst_ms),
            (None, Some(1024), Some(5))
        );
        let e = lun("kind=null,size=1M,iops=fast").unwrap_err();
        assert!(e.why.contains("iops=fast: not a number"), "{e}");
    }

    #[test]
    fn a_misspelt_switch_is_refused() {
        for bad in ["ro=ture", "ro=2", "create=y es", "zero=enabled"] {
            let e = lun(&format!("kind=null,size=1M,{bad}")).unwrap_err();
            assert!(e.why.contains("is not a boolean"), "{bad}: {e}");
        }
    }

    #[test]
    fn files_and_json_take_the_same_spellings() {
        for (text, want) in [
            ("true", true),
            ("1", true),
            ("\"on\"", true),
            ("\"yes\"", true),
            ("false", false),
            ("0", false),
            ("\"off\"", false),
            ("\"no\"", false),
        ] {
            let toml_spec: LunSpec =
                toml::from_str(&format!("kind = \"ram\"\nsize = \"1M\"\nro = {text}\n")).unwrap();
            assert_eq!(toml_spec.read_only, want, "TOML {text}");
            let json_spec: LunSpec =
                serde_json::from_str(&format!(r#"{{"kind":"ram","size":"1M","ro":{text}}}"#))
                    .unwrap();
            assert_eq!(json_spec.read_only, want, "JSON {text}");
        }
        for bad in ["2", "\"maybe\"", "1.5"] {
            let toml_err = toml::from_str::<LunSpec>(&format!(
                "kind = \"ram\"\nsize = \"1M\"\ncreate = {bad}\n"
            ));
            assert!(toml_err.is_err(), "TOML {bad}");
            let json_err = serde_json::from_str::<LunSpec>(&format!(
                r#"{{"kind":"ram","size":"1M","create":{bad}}}"#
            ));
            assert!(json_err.is_err(), "JSON {bad}");
        }
    }
}
