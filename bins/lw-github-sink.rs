//! lw-github-sink: a GitHub-compatible issue-comment server on 127.0.0.1,
//! for tests and demonstrations (lw-github-sink(1)).
//!
//! Contract: serves the endpoints in `loopwright::ghserver` on a loopback
//! address, keeps its state in DIR (it survives restarts), prints its base
//! URL on stdout once it listens, and runs until killed.  Tokens are given
//! through the control API or a tokens file, never on the command line.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use loopwright::cli::out_err;
use loopwright::ghserver::{Options, Server};
use loopwright::{Error, Exit, Result};

const PROG: &str = "lw-github-sink";

/// Serve GitHub's issue-comment API on a loopback address, for tests.
#[derive(Parser, Debug)]
#[command(name = "lw-github-sink", version)]
struct Args {
    /// Directory holding the server's state (created when missing).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Loopback address and port to listen on (port 0 picks a free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Create repository OWNER/NAME with issues 1..N (repeatable), as OWNER/NAME:N.
    #[arg(long = "repo", value_name = "OWNER/NAME:N")]
    repos: Vec<String>,
    /// Accept the tokens in FILE: one `LOGIN TOKEN [read-only]` per line.
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// Requests per hour per token before the primary rate limit answers 403.
    #[arg(long, value_name = "N", default_value_t = 5000)]
    hourly_limit: u64,
}

fn main() -> ExitCode {
    loopwright::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let server = Server::start(Options {
        dir: args.dir.clone(),
        listen: args.listen,
        hourly_limit: args.hourly_limit,
        default_per_page: 30,
    })?;
    for r in &args.repos {
        let (name, n) = match r.rsplit_once(':') {
            Some((name, n)) => (
                name,
                n.parse::<u64>()
                    .map_err(|_| Error::usage(format!("--repo '{r}': N is not a number")))?,
            ),
            None => (r.as_str(), 1),
        };
        loopwright::github::Target::parse_repo(name).map_err(|e| Error::usage(e.msg))?;
        server.add_repo(name, n);
    }
    if let Some(f) = &args.tokens {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read tokens file", f, e))?;
        for (i, line) in text.lines().enumerate() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                [] => {}
                [login, token] => server.add_token(login, token, true),
                [login, token, "read-only"] => server.add_token(login, token, false),
                _ => {
                    return Err(Error::data(format!(
                        "tokens file '{}' line {}: want LOGIN TOKEN [read-only]",
                        f.display(),
                        i + 1
                    )));
                }
            }
        }
    }
    writeln!(out, "{}", server.url()).map_err(out_err)?;
    out.flush().map_err(out_err)?;
    server.wait()
}
