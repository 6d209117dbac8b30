//! lw-post: post one message into a sandbox's outbox.
//!
//! Contract: the message is validated completely before anything is written;
//! when lw-post exits 0 the message is in `outbox/new/` and on disk (file and
//! directory fsynced), and its id is on stdout.  On any error nothing is left
//! in `new/` and nothing in `tmp/` (a SIGKILL may leave a `tmp/` file, which no
//! reader ever looks at).  The delivery procedure is in crates/mailbox/src/post.rs and
//! crates/mailbox/src/maildir/, shared with lw-mcp, and mailbox-spec.md.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use base::cli;
use base::{Exit, Result};
use clap::Parser;
use mailbox::message;
use mailbox::post;

/// Post one message to the mediator (or named recipients) through the outbox.
///
/// The body comes from BODY, from standard input when BODY is `-`, or from
/// standard input when no BODY is given and standard input is not a terminal.
#[derive(Parser, Debug)]
#[command(name = "lw-post", version, max_term_width = 100)]
struct Args {
    /// Message kind: contract-change, request, handoff, question, answer, status
    #[arg(short, long, value_name = "KIND")]
    kind: String,

    /// One-line subject (at most 200 bytes)
    #[arg(short, long, value_name = "TEXT")]
    subject: String,

    /// Recipient (NAME, or HOST/NAME on another host), repeatable or comma-separated [default: mediator]
    #[arg(short, long = "to", value_name = "NAME", value_delimiter = ',')]
    to: Vec<String>,

    /// A path or named contract the message is about, repeatable
    #[arg(short, long = "ref", value_name = "REF")]
    refs: Vec<String>,

    /// Id of the message this one answers
    #[arg(long, value_name = "ID")]
    reply_to: Option<String>,

    /// The sandbox's mailbox directory (holds outbox/ and inbox/)
    #[arg(short, long, env = "LW_MAILBOX", value_name = "DIR")]
    mailbox: Option<PathBuf>,

    /// Sender name written into the message; the mediator always uses the
    /// outbox's owner instead [default: $LW_SANDBOX, else the mailbox directory's name]
    #[arg(long, value_name = "NAME")]
    from: Option<String>,

    /// Print a JSON line ({"type":"posted",...}) instead of the id
    #[arg(long)]
    json: bool,

    /// The body; `-` reads standard input
    #[arg(value_name = "BODY")]
    body: Option<String>,
}

fn main() -> ExitCode {
    base::cli::run_main("lw-post", run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    // The kind and the mailbox are checked before a body is read from
    // standard input.
    post::postable_kind(&args.kind)?;
    let mailbox = post::mailbox_given(args.mailbox)?;
    let body = match args.body.as_deref() {
        Some("-") => message::read_body(&mut std::io::stdin().lock())?,
        Some(b) => b.to_string(),
        None if !cli::stdin_is_tty() => message::read_body(&mut std::io::stdin().lock())?,
        None => String::new(),
    };
    let from = post::sender(&mailbox, args.from);
    let req = post::Request {
        kind: args.kind,
        subject: args.subject,
        body,
        to: args.to,
        refs: args.refs,
        in_reply_to: args.reply_to,
    };
    let posted = post::post(&mailbox, &from, req)?;
    let m = posted.message;
    let line = if args.json {
        serde_json::json!({
            "type": "posted",
            "id": m.id,
            "kind": m.kind,
            "to": m.to,
            "path": posted.path.to_string_lossy(),
        })
        .to_string()
    } else {
        m.id
    };
    writeln!(out, "{line}").map_err(cli::out_err)?;
    Ok(Exit::Ok)
}
