//! lw-confine: `lw-confine [--] COMMAND [ARG...]` installs the sandboxes'
//! seccomp profile (runtime/seccomp.json, the one every sandbox container
//! is given) on itself, with no-new-privileges, then execs COMMAND (found
//! on PATH), which keeps the filter and passes it to all it starts.
//!
//! Mounted read-only at /usr/local/bin/lw-confine in every sandbox.
//! lw-sandbox starts every command it runs in a gVisor (runsc) sandbox
//! through it: that runsc applies the container's profile to its first
//! process only, never to one started by `docker exec` (crates/confine/src/seccomp says
//! more).  Under runc the container's own filter is already there; a second
//! one is harmless.
//!
//! Exit status: COMMAND's own (it replaces this process); 64 without a
//! command or with an unknown option before it; 77 when the filter cannot be installed (nothing is run
//! unconfined); 78 when the profile does not compile; 126 when COMMAND
//! cannot be run; 127 when it is not found.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: lw-confine [--] <command> [<args>...]\n       lw-confine --version\n";

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("--") => {
            args.remove(0);
        }
        Some("--help" | "-h") => {
            // The description first, as clap's commands print it: `lw help`
            // lists each command by the first line of its help.
            print!(
                "Run a command under the sandboxes' seccomp profile, with no-new-privileges\n\n{USAGE}"
            );
            return ExitCode::SUCCESS;
        }
        Some("--version" | "-V") => {
            println!("lw-confine {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some(flag) if flag.starts_with('-') => {
            eprint!("lw-confine: unknown option '{flag}'\n{USAGE}");
            return ExitCode::from(64);
        }
        _ => {}
    }
    if args.is_empty() {
        eprint!("{USAGE}");
        return ExitCode::from(64);
    }
    let prog = match confine::seccomp::compile(confine::SECCOMP_PROFILE) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("lw-confine: {e}");
            return ExitCode::from(e.exit.code());
        }
    };
    if let Err(e) = confine::seccomp::install(&prog) {
        eprintln!("lw-confine: {e}; not running {:?}", args[0]);
        return ExitCode::from(e.exit.code());
    }
    let err = Command::new(&args[0]).args(&args[1..]).exec();
    let cause = err.to_string();
    let cause = cause.split(" (os error").next().unwrap_or_default();
    eprintln!("lw-confine: cannot run {:?}: {cause}", args[0]);
    ExitCode::from(if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
