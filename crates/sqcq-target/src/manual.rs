//! Man pages and shell completions, generated from the clap definitions
//! of the command line ([`crate::Cli`], [`crate::client::RpcCli`],
//! [`crate::client::top::TopCli`]) by `clap_mangen` and `clap_complete`:
//! `sqcqd man [rpc|top]` prints a page,
//! `sqcqd completions bash|zsh|fish` a completion script. The Debian
//! package (`scripts/build-deb.sh`) runs them when it is built and
//! installs what they print, so pages and completions always describe the
//! binary they come with.

use clap::CommandFactory;
use clap_complete::Shell;

use crate::Cli;
use crate::client::RpcCli;
use crate::client::top::TopCli;

/// The words `sqcqd` takes before its options, as subcommands, so that
/// completions and the man page know them (`help` is clap's own).
fn command() -> clap::Command {
    Cli::command()
        .subcommand(RpcCli::command().name("rpc"))
        .subcommand(TopCli::command().name("top"))
        .subcommand(clap::Command::new("version").about("Print the version"))
        .subcommand(
            clap::Command::new("completions")
                .about("Print a shell completion script")
                .arg(
                    clap::Arg::new("shell")
                        .value_parser(clap::value_parser!(Shell))
                        .required(true),
                ),
        )
        .subcommand(
            clap::Command::new("man")
                .about("Print a man page (sqcqd(8); sqcqd-rpc(8) with rpc, sqcqd-top(8) with top)")
                .arg(clap::Arg::new("page").value_parser(["rpc", "top"])),
        )
}

/// The man page of `sqcqd`, or of its word `page` (`rpc`, `top`), in
/// roff; `None` for a word that has none.
pub fn man_page(page: Option<&str>) -> Option<std::io::Result<Vec<u8>>> {
    let cmd = match page {
        None => command(),
        Some("rpc") => RpcCli::command().name("sqcqd-rpc"),
        Some("top") => TopCli::command().name("sqcqd-top"),
        Some(_) => return None,
    };
    let mut out = Vec::new();
    Some(
        clap_mangen::Man::new(cmd)
            .section("8")
            .render(&mut out)
            .map(|()| out),
    )
}

/// The completion script of `shell`.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command(), "sqcqd", &mut out);
    out
}

/// `sqcqd completions SHELL` / `sqcqd man [rpc|top]`: the text to
/// print, or the usage error.
pub fn run(args: &[String]) -> Result<Vec<u8>, String> {
    match args {
        [what, shell] if what == "completions" => {
            shell.parse::<Shell>().map(completions).map_err(|_| {
                format!("sqcqd completions {shell}: bash, zsh, fish, elvish or powershell")
            })
        }
        [what] if what == "man" => page(None),
        [what, p] if what == "man" => page(Some(p)),
        _ => Err(USAGE.into()),
    }
}

const USAGE: &str = "usage: sqcqd completions bash|zsh|fish, sqcqd man [rpc|top]";

fn page(name: Option<&str>) -> Result<Vec<u8>, String> {
    match man_page(name) {
        Some(text) => text.map_err(|e| e.to_string()),
        None => Err(USAGE.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_completions_name_every_option() {
        let man = String::from_utf8(man_page(None).unwrap().unwrap()).unwrap();
        assert!(
            man.starts_with(".ie") || man.contains(".TH sqcqd 8"),
            "{man}"
        );
        for option in [
            "socket\\-path",
            "save\\-config",
            "log\\-format",
            "poll\\-cpus",
        ] {
            assert!(man.contains(option), "{option}");
        }
        let rpc = String::from_utf8(man_page(Some("rpc")).unwrap().unwrap()).unwrap();
        assert!(rpc.contains(".TH sqcqd-rpc 8"), "{rpc}");
        assert!(rpc.contains("admin\\-socket"));
        assert!(rpc.contains("human"));
        let top = String::from_utf8(man_page(Some("top")).unwrap().unwrap()).unwrap();
        assert!(top.contains(".TH sqcqd-top 8"), "{top}");
        for option in ["interval", "iterations", "batch", "admin\\-socket"] {
            assert!(top.contains(option), "{option}");
        }
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).unwrap();
            assert!(script.contains("save-config"), "{shell}");
            assert!(script.contains("rpc"), "{shell}");
            assert!(script.contains("iterations"), "{shell}");
        }
        assert!(run(&["completions".into(), "tcsh".into()]).is_err());
        assert!(run(&["man".into(), "x".into()]).is_err());
        assert!(run(&["man".into(), "top".into()]).is_ok());
    }
}
