//! Man pages and shell completions, generated from the clap definitions
//! of the command line ([`crate::Cli`], [`crate::client::RpcCli`]) by
//! `clap_mangen` and `clap_complete`: `sqcqd man [rpc]` prints a page,
//! `sqcqd completions bash|zsh|fish` a completion script. The Debian
//! package (`scripts/build-deb.sh`) runs them when it is built and
//! installs what they print, so pages and completions always describe the
//! binary they come with.

use clap::CommandFactory;
use clap_complete::Shell;

use crate::Cli;
use crate::client::RpcCli;

/// The words `sqcqd` takes before its options, as subcommands, so that
/// completions and the man page know them (`help` is clap's own).
fn command() -> clap::Command {
    Cli::command()
        .subcommand(RpcCli::command().name("rpc"))
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
                .about("Print a man page (sqcqd(8), or sqcqd-rpc(8) with rpc)")
                .arg(clap::Arg::new("page").value_parser(["rpc"])),
        )
}

/// The man page of `sqcqd` (`rpc`: of `sqcqd rpc`), in roff.
pub fn man_page(rpc: bool) -> std::io::Result<Vec<u8>> {
    let cmd = if rpc {
        RpcCli::command().name("sqcqd-rpc")
    } else {
        command()
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd).section("8").render(&mut out)?;
    Ok(out)
}

/// The completion script of `shell`.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command(), "sqcqd", &mut out);
    out
}

/// `sqcqd completions SHELL` / `sqcqd man [rpc]`: the text to print, or
/// the usage error.
pub fn run(args: &[String]) -> Result<Vec<u8>, String> {
    match args {
        [what, shell] if what == "completions" => {
            shell.parse::<Shell>().map(completions).map_err(|_| {
                format!("sqcqd completions {shell}: bash, zsh, fish, elvish or powershell")
            })
        }
        [what] if what == "man" => man_page(false).map_err(|e| e.to_string()),
        [what, page] if what == "man" && page == "rpc" => man_page(true).map_err(|e| e.to_string()),
        _ => Err("usage: sqcqd completions bash|zsh|fish, sqcqd man [rpc]".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_completions_name_every_option() {
        let man = String::from_utf8(man_page(false).unwrap()).unwrap();
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
        let rpc = String::from_utf8(man_page(true).unwrap()).unwrap();
        assert!(rpc.contains(".TH sqcqd-rpc 8"), "{rpc}");
        assert!(rpc.contains("admin\\-socket"));
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completions(shell)).unwrap();
            assert!(script.contains("save-config"), "{shell}");
            assert!(script.contains("rpc"), "{shell}");
        }
        assert!(run(&["completions".into(), "tcsh".into()]).is_err());
        assert!(run(&["man".into(), "x".into()]).is_err());
    }
}
