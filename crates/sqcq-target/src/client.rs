//! `sqcqd rpc`: the command-line client of the management API.
//!
//! Parameters are typed by the method's schema, the OpenRPC document that
//! `rpc.discover` answers ([`crate::rpc::discover`], built from the table
//! that dispatches the methods): `serial=12345` stays a string because
//! `serial` is one, `device=x` is refused because `device` is an integer,
//! an unknown name is refused with the names the method takes. The same
//! document gives the help (`sqcqd rpc help [METHOD]`, `sqcqd rpc METHOD
//! --help`), so help, checks and server cannot disagree.
//!
//! Without `--admin-socket` the client calls `$SQCQ_ADMIN_SOCKET`, else
//! [`DEFAULT_ADMIN_SOCKET`] (root), else `$XDG_RUNTIME_DIR/sqcq/sqcqd.sock`.
//!
//! For a person at a terminal: `sqcqd rpc stats_get --human` prints the
//! totals as a table ([`stats_table`]), and `sqcqd top` ([`top`]) shows
//! them as rates, refreshed every second. Both read a [`Sample`], four
//! methods' answers to one batch, and render it with pure functions.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::rpc::discover;
use crate::runtime::events::Event;

mod rates;
mod sample;
pub mod top;
mod totals;
mod units;

pub use sample::{DaemonInfo, Device, FetchError, Latency, Queue, Sample, Worker};

/// The methods `--human` prints as a table.
const TABLES: &[&str] = &["stats_get"];

/// The admin socket of the packaged daemon (`contrib/sqcqd.toml`), and
/// the client's default for root.
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/sqcq/sqcqd.sock";

/// `sqcqd rpc`: the command line of the client.
#[derive(Debug, clap::Parser)]
#[command(
    name = "sqcqd rpc",
    about = "Call a method of a running sqcqd's management API (JSON-RPC 2.0 on its admin socket)",
    after_help = "PARAMS: key=value, typed by the method's schema (sqcqd rpc help METHOD), or \
                  key:=JSON. An array parameter takes key=value once per element.\n\
                  Examples:\n  sqcqd rpc help                 (every method)\n  \
                  sqcqd rpc help lun_add         (its parameters)\n  \
                  sqcqd rpc device_list\n  \
                  sqcqd rpc lun_add device=0 lun=1 kind=ram size=64M serial=00042\n  \
                  sqcqd rpc device_create socket-path=/run/sqcq/vm1.sock type=blk lun=kind=ram,size=1G\n  \
                  sqcqd rpc --admin-socket /tmp/a.sock queue_attach_worker device=0 rq=1 worker=1",
    // Our own --help: clap's would answer `METHOD --help` with this help
    // instead of the method's.
    disable_help_flag = true
)]
pub struct RpcCli {
    /// Print help (after METHOD: the method's).
    #[arg(short, long)]
    pub help: bool,
    /// The daemon's admin socket [default: $SQCQ_ADMIN_SOCKET, else
    /// /run/sqcq/sqcqd.sock for root, else $XDG_RUNTIME_DIR/sqcq/sqcqd.sock].
    #[arg(long, value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,
    /// The method (`help`: the methods, `help METHOD`: one of them).
    pub method: Option<String>,
    /// Print a table for a person instead of JSON (stats_get: the totals
    /// of every device, queue and worker, in 80 columns).
    #[arg(long)]
    pub human: bool,
    /// Its parameters (`--help` after the method: its help; `--human`
    /// there too).
    #[arg(
        value_name = "PARAMS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub params: Vec<String>,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub enum Request {
    /// Print this help text.
    Help(String),
    /// Call the method with these parameters.
    Call(String, Map<String, Value>),
    /// Print the events named (every one if none) as they come, `count`
    /// of them if given (`sqcqd rpc events`).
    Follow {
        /// The events.
        only: Vec<String>,
        /// How many to print before exiting.
        count: Option<u64>,
    },
    /// Call the method with these parameters and print its table
    /// (`--human`).
    Table(String, Map<String, Value>),
}

impl RpcCli {
    /// The socket to call.
    pub fn socket(&self) -> PathBuf {
        admin_socket(self.admin_socket.clone())
    }

    /// The call (or the help) the arguments ask for, checked against
    /// the schema.
    pub fn request(&self) -> Result<Request, String> {
        let doc = discover();
        let method = match self.method.as_deref() {
            None if self.help => {
                let help = <Self as clap::CommandFactory>::command().render_long_help();
                return Ok(Request::Help(help.to_string()));
            }
            None | Some("help" | "--help" | "-h") => {
                return match self.params.first() {
                    None => Ok(Request::Help(overview(&doc))),
                    Some(m) => Ok(Request::Help(method_help(find(&doc, m)?))),
                };
            }
            Some("events") if self.help => return Ok(Request::Help(FOLLOW_HELP.to_owned())),
            Some("events") => return follow(&self.params),
            Some(m) => find(&doc, m)?,
        };
        if self.help || self.params.iter().any(|p| p == "--help" || p == "-h") {
            return Ok(Request::Help(method_help(method)));
        }
        let name = method["name"].as_str().unwrap_or_default().to_owned();
        let human = self.human || self.params.iter().any(|p| p == "--human");
        let params: Vec<String> = self
            .params
            .iter()
            .filter(|p| *p != "--human")
            .cloned()
            .collect();
        let params = typed_params(method, &params)?;
        if !human {
            return Ok(Request::Call(name, params));
        }
        if !TABLES.contains(&name.as_str()) {
            return Err(format!(
                "--human: {name} has no table (only {}); without it, JSON",
                TABLES.join(", ")
            ));
        }
        Ok(Request::Table(name, params))
    }
}

/// `sqcqd rpc events [NAME]... [--count N]`.
fn follow(args: &[String]) -> Result<Request, String> {
    let (mut only, mut count) = (Vec::new(), None);
    let mut args = args.iter();
    while let Some(a) = args.next() {
        let n = match a.as_str() {
            "--help" | "-h" => return Ok(Request::Help(FOLLOW_HELP.to_owned())),
            "--count" => Some(args.next().ok_or("--count takes a number")?.as_str()),
            s => s.strip_prefix("--count="),
        };
        if let Some(n) = n {
            count = Some(
                n.parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--count {n}: not a number above 0"))?,
            );
        } else if Event::NAMES.contains(&a.as_str()) {
            only.push(a.clone());
        } else {
            return Err(format!(
                "no event {a:?}: the events are {}",
                Event::NAMES.join(", ")
            ));
        }
    }
    Ok(Request::Follow { only, count })
}

const FOLLOW_HELP: &str = "sqcqd rpc events [EVENT]... [--count N]\n\n\
    Prints the daemon's events as they happen, one JSON object per line (the parameters of \
    the JSON-RPC notifications events_subscribe asks for), until interrupted, or N of them.\n\
    Only the EVENTs named if any.\n";

/// `explicit` (`--admin-socket`), else the [`default_socket`] of this
/// process's environment.
pub fn admin_socket(explicit: Option<PathBuf>) -> PathBuf {
    explicit.unwrap_or_else(|| {
        default_socket(
            std::env::var_os("SQCQ_ADMIN_SOCKET").map(PathBuf::from),
            // SAFETY: geteuid() cannot fail.
            unsafe { libc::geteuid() } == 0,
            std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        )
    })
}

/// How long `--human` waits for the daemon's answer.
const TABLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The table of `sqcqd rpc stats_get --human`: the daemon at `socket`,
/// only device `params.device` if it is given.
pub fn stats_table(
    socket: &std::path::Path,
    params: &Map<String, Value>,
) -> Result<String, FetchError> {
    let device = params
        .get("device")
        .and_then(Value::as_u64)
        .and_then(|d| u32::try_from(d).ok());
    let sample = Sample::fetch(socket, device, TABLE_TIMEOUT)?;
    let mut text = totals::table(&sample).join("\n");
    text.push('\n');
    Ok(text)
}

/// The default admin socket: `env` (`$SQCQ_ADMIN_SOCKET`), else
/// [`DEFAULT_ADMIN_SOCKET`] for root or without `runtime_dir`
/// (`$XDG_RUNTIME_DIR`), else `runtime_dir/sqcq/sqcqd.sock`.
pub fn default_socket(env: Option<PathBuf>, root: bool, runtime_dir: Option<PathBuf>) -> PathBuf {
    match (env, root, runtime_dir) {
        (Some(p), _, _) => p,
        (None, false, Some(dir)) => dir.join("sqcq/sqcqd.sock"),
        _ => PathBuf::from(DEFAULT_ADMIN_SOCKET),
    }
}

/// The method `name` of the document.
fn find<'a>(doc: &'a Value, name: &str) -> Result<&'a Value, String> {
    let methods = doc["methods"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    methods
        .iter()
        .find(|m| m["name"] == name)
        .ok_or_else(|| format!("no method {name:?} (sqcqd rpc help lists them)"))
}

fn params_of(method: &Value) -> &[Value] {
    method["params"].as_array().map_or(&[], Vec::as_slice)
}

/// Every method, one line each.
fn overview(doc: &Value) -> String {
    let methods = doc["methods"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let width = methods
        .iter()
        .filter_map(|m| m["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    let mut out = String::from("Methods (sqcqd rpc help METHOD for one):\n");
    for m in methods {
        let summary = m["summary"].as_str().unwrap_or_default();
        // The first sentence: the rest is in the method's own help.
        let first = summary.split("; ").next().unwrap_or(summary);
        out.push_str(&format!(
            "  {:width$}  {first}\n",
            m["name"].as_str().unwrap_or_default()
        ));
    }
    out
}

/// A method's summary and parameters.
fn method_help(method: &Value) -> String {
    let name = method["name"].as_str().unwrap_or_default();
    let mut out = format!(
        "{name}: {}\n",
        method["summary"].as_str().unwrap_or_default()
    );
    let params = params_of(method);
    if params.is_empty() {
        out.push_str("\nNo parameters.\n");
        return out;
    }
    let width = params
        .iter()
        .filter_map(|p| p["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    out.push_str("\nParameters (key=value):\n");
    for p in params {
        out.push_str(&format!(
            "  {:width$}  {:7}  {:8}  {}\n",
            p["name"].as_str().unwrap_or_default(),
            p["schema"]["type"].as_str().unwrap_or_default(),
            if p["required"] == true {
                "required"
            } else {
                "optional"
            },
            p["summary"].as_str().unwrap_or_default(),
        ));
    }
    out
}

/// The `params` object of `key=value` / `key:=json` arguments, each
/// `key=value` typed by the schema of `method` (a document entry).
pub fn typed_params(method: &Value, args: &[String]) -> Result<Map<String, Value>, String> {
    let name = method["name"].as_str().unwrap_or_default();
    let params = params_of(method);
    let known = || {
        let names: Vec<&str> = params.iter().filter_map(|p| p["name"].as_str()).collect();
        if names.is_empty() {
            format!("{name} takes no parameter")
        } else {
            format!("{name} takes {}", names.join(", "))
        }
    };
    // `socket_path` for `socket-path`, as device_list prints the keys.
    let lookup = |key: &str| {
        params.iter().find(|p| {
            p["name"]
                .as_str()
                .is_some_and(|n| n == key || n.replace('-', "_") == key.replace('-', "_"))
        })
    };
    let mut out = Map::new();
    for a in args {
        if let Some((k, v)) = a.split_once(":=") {
            let v = serde_json::from_str(v).map_err(|e| format!("{a}: not JSON: {e}"))?;
            let key = lookup(k)
                .and_then(|p| p["name"].as_str())
                .unwrap_or(k)
                .to_owned();
            out.insert(key, v);
            continue;
        }
        let Some((k, v)) = a.split_once('=') else {
            return Err(format!(
                "{a}: expected key=value or key:=JSON ({})",
                known()
            ));
        };
        let p = lookup(k).ok_or_else(|| format!("{name} has no parameter {k:?}: {}", known()))?;
        let key = p["name"].as_str().unwrap_or(k).to_owned();
        let kind = p["schema"]["type"].as_str().unwrap_or("string");
        let bad = |what: &str| format!("{a}: {key} is {what}");
        let value = match kind {
            "integer" if v == "null" => Value::Null,
            "integer" => v
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| bad("an integer"))?,
            "boolean" => match v {
                "true" | "yes" | "on" | "1" => Value::Bool(true),
                "false" | "no" | "off" | "0" => Value::Bool(false),
                _ => return Err(bad("a boolean (true or false)")),
            },
            "array" if v.starts_with('[') => {
                let parsed: Value =
                    serde_json::from_str(v).map_err(|e| format!("{a}: not a JSON array: {e}"))?;
                if !parsed.is_array() {
                    return Err(bad("an array"));
                }
                parsed
            }
            "array" => {
                // key=element, once per element.
                let mut items = match out.remove(&key) {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                };
                items.push(Value::String(v.to_owned()));
                Value::Array(items)
            }
            "object" => serde_json::from_str(v)
                .ok()
                .filter(Value::is_object)
                .ok_or_else(|| bad("a JSON object (key:={...})"))?,
            _ => Value::String(v.to_owned()),
        };
        out.insert(key, value);
    }
    if let Some(missing) = params
        .iter()
        .filter(|p| p["required"] == true)
        .filter_map(|p| p["name"].as_str())
        .find(|n| !out.contains_key(*n))
    {
        return Err(format!("{name} needs {missing}= (sqcqd rpc help {name})"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    fn cli(args: &[&str]) -> RpcCli {
        RpcCli::parse_from(std::iter::once("sqcqd rpc").chain(args.iter().copied()))
    }

    fn call(args: &[&str]) -> Result<Map<String, Value>, String> {
        match cli(args).request()? {
            Request::Call(_, p) => Ok(p),
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn events_takes_names_and_a_count() {
        assert_eq!(
            cli(&["events", "io_error", "--count", "3", "lun_resized"]).request(),
            Ok(Request::Follow {
                only: vec!["io_error".into(), "lun_resized".into()],
                count: Some(3),
            })
        );
        assert_eq!(
            cli(&["events"]).request(),
            Ok(Request::Follow {
                only: vec![],
                count: None
            })
        );
        for bad in [
            &["events", "boom"][..],
            &["events", "--count", "0"],
            &["events", "--count"],
        ] {
            assert!(cli(bad).request().is_err(), "{bad:?}");
        }
        assert!(matches!(
            cli(&["events", "--help"]).request(),
            Ok(Request::Help(_))
        ));
    }

    #[test]
    fn human_asks_for_a_table_where_there_is_one() {
        let table = |args: &[&str]| cli(args).request();
        let p = json!({ "device": 1 }).as_object().cloned().unwrap();
        let want = Ok(Request::Table("stats_get".into(), p));
        assert_eq!(table(&["stats_get", "device=1", "--human"]), want);
        assert_eq!(table(&["--human", "stats_get", "device=1"]), want);
        let e = table(&["device_list", "--human"]).unwrap_err();
        assert!(
            e.contains("device_list has no table (only stats_get)"),
            "{e}"
        );
        assert_eq!(
            table(&["stats_get"]),
            Ok(Request::Call("stats_get".into(), Map::new()))
        );
    }

    #[test]
    fn values_take_the_type_of_their_parameter() {
        let p = call(&[
            "lun_add",
            "device=0",
            "lun=1",
            "kind=ram",
            "size=64M",
            "serial=12345",
            "ro=x",
        ]);
        assert!(p.unwrap_err().contains("lun_add has no parameter \"ro\""));
        let p = call(&[
            "lun_add",
            "device=0",
            "lun=1",
            "kind=ram",
            "size=64M",
            "serial=12345",
            "read-only=yes",
            "block-size=4096",
        ])
        .unwrap();
        assert_eq!(p["device"], json!(0));
        assert_eq!(
            p["serial"],
            json!("12345"),
            "a string, though it reads as a number"
        );
        assert_eq!(p["size"], json!("64M"));
        assert_eq!(p["read-only"], json!(true));
        assert_eq!(p["block-size"], json!(4096));
        let e = call(&["lun_add", "device=zero", "lun=1", "kind=ram"]).unwrap_err();
        assert!(e.contains("device is an integer"), "{e}");
        let e = call(&["lun_add", "device=0", "kind=ram"]).unwrap_err();
        assert!(e.contains("lun_add needs lun="), "{e}");
        let e = call(&["device_delete", "device=0", "force=maybe"]).unwrap_err();
        assert!(e.contains("force is a boolean"), "{e}");
        let e = call(&["device_list", "x=1"]).unwrap_err();
        assert!(e.contains("device_list takes no parameter"), "{e}");
        assert!(call(&["no_such_method"]).unwrap_err().contains("no method"));
    }

    #[test]
    fn arrays_nulls_json_and_snake_case() {
        let p = call(&[
            "device_create",
            "socket_path=/run/a.sock",
            "lun=kind=ram,size=1M",
            "lun=kind=null,size=1G",
            "num-queues=2",
        ])
        .unwrap();
        assert_eq!(p["socket-path"], json!("/run/a.sock"));
        assert_eq!(p["lun"], json!(["kind=ram,size=1M", "kind=null,size=1G"]));
        assert_eq!(p["num-queues"], json!(2));
        let p = call(&[
            "device_create",
            "socket-path=/a",
            r#"lun=[{"kind":"ram","size":"1M"}]"#,
        ])
        .unwrap();
        assert_eq!(p["lun"][0]["kind"], json!("ram"));
        let p = call(&["queue_attach_worker", "device=0", "rq=1", "worker=null"]).unwrap();
        assert_eq!(p["worker"], Value::Null);
        let p = call(&["lun_add", "device:=0", "lun:=2", "kind:=\"ram\"", "x:=[1]"]).unwrap();
        assert_eq!(p["x"], json!([1]), "key:=JSON passes anything through");
    }

    #[test]
    fn help_comes_from_the_schema() {
        let Request::Help(all) = cli(&["help"]).request().unwrap() else {
            panic!()
        };
        for m in crate::rpc::methods() {
            assert!(all.contains(&format!("  {}", m.name)), "{}: {all}", m.name);
        }
        assert_eq!(cli(&[]).request().unwrap(), Request::Help(all));
        let Request::Help(one) = cli(&["lun_add", "--help"]).request().unwrap() else {
            panic!()
        };
        assert!(one.starts_with("lun_add: Add a LUN"), "{one}");
        assert!(one.contains("serial"), "{one}");
        assert!(one.contains("required"), "{one}");
        assert_eq!(
            cli(&["help", "lun_add"]).request().unwrap(),
            Request::Help(one)
        );
        let Request::Help(usage) = cli(&["--help"]).request().unwrap() else {
            panic!()
        };
        assert!(usage.contains("--admin-socket <PATH>"), "{usage}");
    }

    #[test]
    fn the_default_socket() {
        let p = |e: Option<&str>, root, xdg: Option<&str>| {
            default_socket(e.map(PathBuf::from), root, xdg.map(PathBuf::from))
        };
        assert_eq!(
            p(None, true, Some("/run/user/0")),
            PathBuf::from(DEFAULT_ADMIN_SOCKET)
        );
        assert_eq!(
            p(None, false, Some("/run/user/1000")),
            PathBuf::from("/run/user/1000/sqcq/sqcqd.sock")
        );
        assert_eq!(p(None, false, None), PathBuf::from(DEFAULT_ADMIN_SOCKET));
        assert_eq!(p(Some("/x.sock"), true, None), PathBuf::from("/x.sock"));
    }
}
