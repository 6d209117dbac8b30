//! lw-cockpit: one local web page over a mailbox root, live.
//!
//! Contract: serves the page for the root (`--root`, else `$LW_ROOT`; a
//! directory that is not a mailbox root is refused, 66) on the loopback
//! address `--listen` names, exactly (`--port`, else a free port), until
//! killed, and prints one line on stdout: the URL to open, whose one-time
//! ticket opens the page once; another line, a new URL, on each SIGUSR1.  The page lists the sandboxes, the log (paged, filtered,
//! each body on demand), the human and held queues with their actions
//! (answer, release, drop: lw-mediate's own, the person named in the log
//! by `--operator`), each sandbox's diff against its base, the sync state
//! and the radar's conflicts; it follows the root as it changes.  Only
//! loopback is served: another address would need TLS, which lw-cockpit
//! does not have (exit 64).  No cookie is ever set (crates/cockpit/src/auth.rs).  The work is in crates/cockpit; the contract in
//! man/lw-cockpit.1.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use base::cli::out_err;
use base::{Error, Exit, Result};
use clap::Parser;
use cockpit::{self, Options};
use mailbox::layout::Root;

/// Serve a local web page to watch the sandboxes and work the queues.
#[derive(Parser, Debug)]
#[command(name = "lw-cockpit", version, max_term_width = 100)]
struct Args {
    /// The mailbox root [default: $LW_ROOT]
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// The port [default: a free one]
    #[arg(long, value_name = "PORT")]
    port: Option<u16>,

    /// The address to serve, exactly; only a loopback address is accepted
    /// (another would need TLS, which lw-cockpit does not have)
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
    base::cli::run_main("lw-cockpit", run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    if !args.listen.is_loopback() {
        return Err(Error::usage(format!(
            "--listen {}: lw-cockpit serves a loopback address only (another would need TLS, \
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
        listen: SocketAddr::new(args.listen, args.port.unwrap_or(0)),
        operator,
        policy: args.policy,
        report: std::sync::Arc::new(|line: &str| eprintln!("lw-cockpit: {line}")),
        project: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    })?;
    out.flush().map_err(out_err)?;
    eprintln!(
        "lw-cockpit: each URL opens the page once, within {} minutes; `kill -USR1 {}` prints another",
        cockpit::auth::TICKET_LIFE.as_secs() / 60,
        std::process::id()
    );
    // The URLs go to standard output, one a line, as they are made; a
    // reader that went away does not stop the server.
    let urls = std::sync::Arc::new(|url: &str| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{url}").and_then(|()| o.flush());
    });
    let signal = cockpit::http::serve(listener, c, urls)?;
    eprintln!("lw-cockpit: stopped by {signal}; its port is free");
    Ok(Exit::Ok)
}
