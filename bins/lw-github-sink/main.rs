//! lw-github-sink: a GitHub-compatible issue-comment server on 127.0.0.1,
//! for tests and demonstrations (lw-github-sink(1)).  It is a test peer,
//! not product: it lives in its own binary's modules, not in the library.
//!
//! Contract: serves the endpoints below on a loopback address, keeps its
//! state in DIR (it survives restarts), prints its base URL on stdout once
//! it listens, and runs until killed.  Tokens are given through the control
//! API or a tokens file, never on the command line.
//!
//! It speaks what lw-sync uses, as GitHub documents it: `GET /user`,
//! `GET /rate_limit`, `GET /repos/{o}/{r}`, `GET|POST /repos/{o}/{r}/issues`,
//! `GET /repos/{o}/{r}/issues/{n}`, `GET|POST /repos/{o}/{r}/issues/{n}/comments`
//! (`per_page`, `page`, `since`, `Link` with rel next/prev/first/last),
//! `GET|PATCH|DELETE /repos/{o}/{r}/issues/comments/{id}`; `x-ratelimit-*`
//! headers on every answer; an `ETag` on every 200 to a GET, and 304 (not
//! counted against the limit) for a GET whose `If-None-Match` names it; 401 for a missing or revoked token, 403 with
//! `x-accepted-github-permissions` for a read-only one, 404 for an unknown
//! repository or issue, 422 for a body over 65,536 characters (`api`, `comments`).
//! Pull requests, commit statuses, reviews and review comments, and the one
//! GraphQL mutation that takes a draft out of draft (`pulls`).
//!
//! The control API under `/_sink/` (no token) sets up repositories, tokens
//! and human comments, injects faults, and returns the record of every
//! request with its time and of every blocked window the server imposed, so
//! tests can check that a client honoured them (`control`).  State and its
//! journal: `state`; HTTP: `http`; what every module shares (a request, an
//! answer, GitHub's error shape, pages): `wire`, which names none of them.

mod api;
mod comments;
mod control;
mod http;
mod pulls;
mod state;
mod wire;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base::cli::out_err;
use base::{Error, Exit, Result};
use clap::Parser;

use crate::state::State;

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
    base::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    if !args.listen.ip().is_loopback() {
        return Err(Error::usage(format!(
            "refusing to listen on {}: lw-github-sink serves loopback addresses only",
            args.listen
        )));
    }
    let mut state = State::load(&args.dir)?;
    let listener = TcpListener::bind(args.listen).map_err(|e| {
        Error::new(
            Exit::Unavailable,
            format!("cannot listen on {}", args.listen),
        )
        .with_source(e)
    })?;
    let addr = listener.local_addr().map_err(|e| {
        Error::new(Exit::Unavailable, "cannot read the bound address").with_source(e)
    })?;
    let journal = args.dir.join("journal.jsonl");
    let journal_err = |e| Error::io("cannot write", &journal, e);
    for r in &args.repos {
        let (name, n) = parse_repo_arg(r)?;
        state.add_repo(name, n).map_err(journal_err)?;
    }
    if let Some(f) = &args.tokens {
        for (login, token, write) in read_tokens(f)? {
            state
                .add_token(&login, &token, write)
                .map_err(journal_err)?;
        }
    }
    writeln!(out, "http://{addr}").map_err(out_err)?;
    out.flush().map_err(out_err)?;
    let limits = wire::Limits {
        hourly_limit: args.hourly_limit,
    };
    match http::serve(listener, state, limits)? {}
}

/// `OWNER/NAME:N` (or `OWNER/NAME`, one issue).
fn parse_repo_arg(r: &str) -> Result<(&str, u64)> {
    let (name, n) = match r.rsplit_once(':') {
        Some((name, n)) => (
            name,
            n.parse::<u64>()
                .map_err(|_| Error::usage(format!("--repo '{r}': N is not a number")))?,
        ),
        None => (r, 1),
    };
    // GitHub's rule for owner and repository names (lw-sync's own check is
    // in crates/sync/src/github; the sink keeps GitHub's, not loopwright's).
    let part = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    match name.split_once('/') {
        Some((o, r)) if part(o) && part(r) => Ok((name, n)),
        _ => Err(Error::usage(format!(
            "repository '{}' is not of the form OWNER/NAME",
            name.escape_debug()
        ))),
    }
}

/// The tokens file: one `LOGIN TOKEN [read-only]` per line.
fn read_tokens(f: &Path) -> Result<Vec<(String, String, bool)>> {
    let text = std::fs::read_to_string(f)
        .map_err(|e| Error::io_as(Exit::NoInput, "cannot read tokens file", f, e))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            [] => {}
            [login, token] => out.push((login.to_string(), token.to_string(), true)),
            [login, token, "read-only"] => out.push((login.to_string(), token.to_string(), false)),
            _ => {
                return Err(Error::data(format!(
                    "tokens file '{}' line {}: want LOGIN TOKEN [read-only]",
                    f.display(),
                    i + 1
                )));
            }
        }
    }
    Ok(out)
}
