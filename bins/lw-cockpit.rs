//! lw-cockpit: one local web page over a mailbox root, live.
//!
//! Contract: serves the page for the root (`--root`, else `$LW_ROOT`) on
//! 127.0.0.1 (`--port`, else a free port) until killed, and prints one
//! line on stdout: the URL to open, with a random access token, as
//! Jupyter does.  The page lists the sandboxes, the log (paged, filtered,
//! each body on demand), the human and held queues with their actions
//! (answer, release, drop: lw-mediate's own, the person named in the log
//! by `--operator`), each sandbox's diff against its base, the sync state
//! and the radar's conflicts; it follows the root as it changes.  Only
//! loopback is served: another address would need TLS, which lw-cockpit
//! does not have (exit 64).  The work is in lib/cockpit; the contract in
//! man/lw-cockpit.1.

use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use loopwright::cli::out_err;
use loopwright::cockpit::{self, Options};
use loopwright::layout::Root;
use loopwright::{Error, Exit, Result};

/// Serve a local web page to watch the sandboxes and work the queues.
#[derive(Parser, Debug)]
#[command(name = "lw-cockpit", version, max_term_width = 100)]
struct Args {
    /// The mailbox root [default: $LW_ROOT]
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// The port on 127.0.0.1 [default: a free one]
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,

    /// The address to serve; only a loopback address is accepted (another
    /// would need TLS, which lw-cockpit does not have)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    listen: IpAddr,

    /// The name the log records for answers and drops made on the page
    /// [default: $USER]
    #[arg(long, value_name = "NAME")]
    operator: Option<String>,

    /// lw-mediate's policy file, for releasing held messages [default:
    /// .loopwright/policy, built-in policy when absent]
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
}

fn main() -> ExitCode {
    loopwright::cli::run_main("lw-cockpit", run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    if !args.listen.is_loopback() || args.listen.is_ipv6() {
        return Err(Error::usage(format!(
            "--listen {}: lw-cockpit serves 127.0.0.1 only (another address would need TLS, \
             which it does not have); reach it from elsewhere through `ssh -L`",
            args.listen
        )));
    }
    let operator = args
        .operator
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .unwrap_or_else(|| "operator".into());
    let (listener, c) = cockpit::bind(Options {
        root: Root::resolve(args.root.as_deref())?,
        port: args.port.unwrap_or(0),
        operator,
        policy: args.policy,
        token: None,
        report: std::sync::Arc::new(|line: &str| eprintln!("lw-cockpit: {line}")),
        project: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    })?;
    writeln!(out, "{}", c.url()).map_err(out_err)?;
    out.flush().map_err(out_err)?;
    cockpit::http::serve(listener, c)?;
    Ok(Exit::Ok)
}
