//! lw-mcp: the sandbox's mailbox as a Model Context Protocol server on
//! standard input and output, for agents that reach tools through MCP.
//!
//! Contract: one session per process, newline-delimited JSON-RPC 2.0 on
//! stdin/stdout (the MCP stdio transport); diagnostics only on stderr.  The
//! tools are post, inbox, show, ack, wait and whoami (crates/mcp/src/); `post` is
//! lw-post's code, so when its result reaches the client the message is in
//! `outbox/new/` and on disk, and a refused or interrupted post leaves
//! nothing in `new/`.  Malformed input is answered (-32700, -32600, -32601,
//! -32602) and the session goes on.  The process ends when the client closes
//! stdin, exiting 0.

use std::path::PathBuf;
use std::process::ExitCode;

use base::{Error, Exit, Result};
use clap::Parser;
use mcp::{self, Door, Rate, stdio::Stdio};
use rmcp::ServiceExt;

/// Serve this sandbox's mailbox as MCP tools on standard input and output.
#[derive(Parser, Debug)]
#[command(name = "lw-mcp", version, max_term_width = 100)]
struct Args {
    /// The sandbox's mailbox directory (holds outbox/ and inbox/)
    #[arg(short, long, env = "LW_MAILBOX", value_name = "DIR")]
    mailbox: Option<PathBuf>,

    /// Sender name written into posted messages; the mediator always uses
    /// the outbox's owner instead [default: $LW_SANDBOX, else the mailbox directory's name]
    #[arg(long, value_name = "NAME")]
    from: Option<String>,

    /// The registry directory whoami reads [default: /lw/registry when it exists]
    #[arg(long, env = "LW_REGISTRY", value_name = "DIR")]
    registry: Option<PathBuf>,

    /// Refuse posts beyond COUNT in any DURATION (e.g. 120/1m), or `off`
    #[arg(
        long,
        env = "LW_MCP_RATE",
        value_name = "RATE",
        default_value = "120/1m"
    )]
    rate: String,
}

fn main() -> ExitCode {
    // Not cli::run_main: it holds the stdout lock for the whole run, and
    // here stdout belongs to the protocol, written from the runtime.
    match base::cli::parse_args::<Args>("lw-mcp") {
        Ok(args) => match run(args) {
            Ok(exit) => ExitCode::from(exit.code()),
            Err(e) => {
                eprintln!("lw-mcp: {e}");
                ExitCode::from(e.exit.code())
            }
        },
        Err(code) => code,
    }
}

fn run(args: Args) -> Result<Exit> {
    let rate = Rate::parse(&args.rate).map_err(|m| Error::usage(format!("--rate: {m}")))?;
    let mailbox = mailbox::post::mailbox_given(args.mailbox)?;
    let from = mailbox::post::sender(&mailbox, args.from);
    let registry = args.registry.or_else(|| {
        let d = PathBuf::from(mcp::REGISTRY_DIR);
        d.is_dir().then_some(d)
    });
    let branch = std::env::var("LW_BRANCH").ok().filter(|b| !b.is_empty());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::new(Exit::Software, "cannot start the runtime").with_source(e))?;
    rt.block_on(async move {
        let (closed_tx, closed_rx) = tokio::sync::watch::channel(false);
        let transport = Stdio::new(tokio::io::stdin(), tokio::io::stdout(), closed_tx);
        let door = Door::new(mailbox, from, branch, registry, rate, closed_rx);
        let running = match door.serve(transport).await {
            Ok(r) => r,
            // The client left before initializing: nothing was asked.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(Exit::Ok),
            Err(e) => {
                return Err(Error::new(
                    Exit::DataErr,
                    format!("the client did not start an MCP session: {e}"),
                ));
            }
        };
        running.waiting().await.map_err(|e| {
            Error::new(Exit::Software, "the session ended abnormally").with_source(e)
        })?;
        Ok(Exit::Ok)
    })
}
