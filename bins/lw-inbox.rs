//! lw-inbox: read a sandbox's inbox.
//!
//! Contract: `lw-inbox` lists the messages in `inbox/new/`, one per line, in
//! arrival-name order (which is time order); `show` prints one; `ack` claims
//! it (moves it to `inbox/cur/`, which the mediator records as a read
//! receipt).  Entries that are not regular files or do not parse are reported
//! on stderr and left where they are for the mediator to quarantine: lw-inbox
//! never follows a symlink, never blocks on a FIFO, never stops the listing
//! for one bad entry.  `--wait` blocks on an inotify watch until a message
//! arrives; it never polls.

use loopwright::visible::{visible, visible_line};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use loopwright::layout::SandboxBox;
use loopwright::maildir::{Entry, Found, Maildir, Sub};
use loopwright::message::Message;
use loopwright::{Error, Exit, Result};
use loopwright::{cli, inbox};

/// List, show and acknowledge the messages delivered to this sandbox.
#[derive(Parser, Debug)]
#[command(name = "lw-inbox", version, max_term_width = 100)]
struct Args {
    /// The sandbox's mailbox directory (holds outbox/ and inbox/)
    #[arg(short, long, env = "LW_MAILBOX", value_name = "DIR", global = true)]
    mailbox: Option<PathBuf>,

    /// Print JSON Lines (each with a "type" field) instead of text
    #[arg(long, global = true)]
    json: bool,

    /// Block until at least one message is in the inbox, then list
    #[arg(short, long)]
    wait: bool,

    /// With --wait: give up after S seconds (exit 75)
    #[arg(long, value_name = "S", requires = "wait")]
    timeout: Option<f64>,

    /// Also list messages already acknowledged (in cur/)
    #[arg(short, long)]
    all: bool,

    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List new messages (the default)
    List,
    /// Print one message, new or acknowledged
    Show {
        /// The message id
        id: String,
    },
    /// Acknowledge messages: move them from new/ to cur/; `-` reads ids from stdin
    Ack {
        /// Message ids
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

fn main() -> ExitCode {
    loopwright::cli::run_main("lw-inbox", run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let dir = loopwright::post::mailbox_given(args.mailbox)?;
    if !dir.is_dir() {
        return Err(Error::new(
            Exit::NoInput,
            format!(
                "mailbox '{}' is not a directory; check LW_MAILBOX or --mailbox",
                dir.display()
            ),
        ));
    }
    let inbox = SandboxBox::new(&dir).inbox();
    // The mediator creates the inbox; creating missing parts here too lets a
    // reader start before the first delivery.
    inbox.create()?;
    match args.cmd.unwrap_or(Cmd::List) {
        Cmd::List => {
            if args.wait {
                let timeout = match args.timeout {
                    Some(s) if !(s.is_finite() && s >= 0.0) => {
                        return Err(Error::usage(format!(
                            "--timeout {s}: give a number of seconds >= 0"
                        )));
                    }
                    Some(s) => Some(Duration::from_secs_f64(s)),
                    None => None,
                };
                // Wait for a readable message, not for any entry: a planted
                // bad file must not turn a waiting agent into a busy loop.
                let arrived = inbox.wait_until(timeout, || inbox::has_message(&inbox))?;
                if !arrived {
                    return Err(Error::new(
                        Exit::TempFail,
                        format!("no message arrived within {}s", args.timeout.unwrap_or(0.0)),
                    ));
                }
            }
            list(&inbox, Sub::New, args.json, out)?;
            if args.all {
                list(&inbox, Sub::Cur, args.json, out)?;
            }
            Ok(Exit::Ok)
        }
        Cmd::Show { id } => {
            let m = inbox::find(&inbox, &id)?;
            show(&m.0, m.1, args.json, out)?;
            Ok(Exit::Ok)
        }
        Cmd::Ack { ids } => {
            let ids = if ids == ["-"] { read_ids()? } else { ids };
            for id in ids {
                let claimed = inbox::ack(&inbox, &id)?;
                let line = if args.json {
                    serde_json::json!({"type": "acked", "id": id, "already": !claimed}).to_string()
                } else {
                    id
                };
                writeln!(out, "{line}").map_err(cli::out_err)?;
            }
            Ok(Exit::Ok)
        }
    }
}

fn list(inbox: &Maildir, sub: Sub, json: bool, out: &mut dyn Write) -> Result<()> {
    for Entry { name, found } in inbox.scan(sub)? {
        let shown = loopwright::maildir::escape_name(&name);
        match found {
            Found::Message(m) => {
                let line = if json {
                    let mut v = serde_json::to_value(&m)?;
                    v["type"] = "message".into();
                    v["state"] = if sub == Sub::New { "new" } else { "read" }.into();
                    v.to_string()
                } else {
                    format!(
                        "{}\t{}\t{}\t{}",
                        m.id,
                        m.from,
                        m.kind,
                        visible_line(&m.subject)
                    )
                };
                writeln!(out, "{line}").map_err(cli::out_err)?;
            }
            Found::Gone => {}
            Found::Bad(reason) => report_bad(&inbox.sub(sub), &shown, &reason, json, out)?,
            Found::NotFile(what) => report_bad(
                &inbox.sub(sub),
                &shown,
                &format!("is a {what}, not a regular file"),
                json,
                out,
            )?,
        }
    }
    Ok(())
}

fn report_bad(
    dir: &std::path::Path,
    name: &str,
    reason: &str,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    eprintln!(
        "lw-inbox: skipping '{}/{name}': {reason} (left for quarantine)",
        dir.display()
    );
    if json {
        let v = serde_json::json!({"type": "bad", "name": name, "reason": reason});
        writeln!(out, "{v}").map_err(cli::out_err)?;
    }
    Ok(())
}

fn show(m: &Message, state: &str, json: bool, out: &mut dyn Write) -> Result<()> {
    if json {
        let mut v = serde_json::to_value(m)?;
        v["type"] = "message".into();
        v["state"] = state.into();
        writeln!(out, "{v}").map_err(cli::out_err)?;
        return Ok(());
    }
    // Everything here came from a sandbox: control characters are shown,
    // never sent to the terminal.
    let mut text = format!(
        "id: {}\nfrom: {}\nto: {}\nkind: {}\nsubject: {}\ncreated: {}\nstate: {state}\n",
        m.id,
        m.from,
        m.to.join(", "),
        m.kind,
        visible_line(&m.subject),
        visible_line(&m.created)
    );
    if !m.refs.is_empty() {
        let refs: Vec<_> = m.refs.iter().map(|r| visible_line(r)).collect();
        text += &format!("refs: {}\n", refs.join(", "));
    }
    if let Some(r) = &m.in_reply_to {
        text += &format!("in-reply-to: {}\n", visible_line(r));
    }
    text += "\n";
    text += &visible(&m.body);
    if !m.body.is_empty() && !m.body.ends_with('\n') {
        text.push('\n');
    }
    out.write_all(text.as_bytes()).map_err(cli::out_err)
}

fn read_ids() -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| {
            Error::new(Exit::IoErr, "cannot read ids from standard input").with_source(e)
        })?;
        // Accept `lw-inbox` output lines: the id is the first column.
        if let Some(id) = line.split('\t').next().filter(|s| !s.trim().is_empty()) {
            ids.push(id.trim().to_string());
        }
    }
    Ok(ids)
}
