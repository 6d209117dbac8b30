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
//!
//! `--hook claude|codex|copilot|gemini|opencode` is the bell (crates/mailbox/src/bell.rs): the agent's CLI runs it
//! as a hook (the kits install it in the sandbox's `~/.claude/settings.json`,
//! `~/.codex/hooks.json`, `~/.copilot/hooks/loopwright-bell.json` or
//! `~/.gemini/settings.json`, or its opencode plugin in `~/.config/opencode/plugin/`);
//! it reads the hook's JSON on stdin and prints the answer that puts new
//! messages before the model, or blocks a stop while one that asks is
//! unread.  A hook that fails must never break the agent: on any error it
//! prints nothing, says why on stderr and exits 0.  It keeps what it
//! announced in `~/.lw-bell/CLI.json`.
//!
//! `--courier` is the courier's ring (lib ring.rs): in a volume-mode
//! sandbox the root's courier runs it over one exec that stays open, and
//! carries that sandbox's mail when it rings.

use base::visible::{visible, visible_line};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base::cli;
use base::{Error, Exit, Result};
use clap::{Parser, Subcommand};
use mailbox::layout::SandboxBox;
use mailbox::maildir::{Entry, Found, Maildir, Sub};
use mailbox::message::Message;
use mailbox::{bell, inbox, ring};

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

    /// Answer a hook of the agent's CLI: read its JSON on stdin, print new
    /// messages for the model or block its stop (always exit 0)
    #[arg(long, value_name = "CLI", value_parser = ["claude", "codex", "copilot", "gemini", "opencode"],
          conflicts_with_all = ["wait", "all", "json"])]
    hook: Option<String>,

    /// With --hook: block the agent's stop at most N times a session [default: 3]
    #[arg(long, value_name = "N", requires = "hook")]
    max_blocks: Option<u32>,

    /// Serve the root's courier: say `ready`, then `ring` whenever the
    /// outbox or the acknowledged messages change, `tick` when quiet, until
    /// stdin ends (used over a long-lived exec; see mailbox-spec.md)
    #[arg(long, conflicts_with_all = ["wait", "all", "json", "hook"])]
    courier: bool,

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
    base::cli::run_main("lw-inbox", run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    if let Some(cli) = &args.hook {
        if args.cmd.is_some() {
            return Err(Error::usage("--hook takes no subcommand"));
        }
        let max = args.max_blocks.unwrap_or(bell::DEFAULT_MAX_BLOCKS);
        // Whatever fails, the agent goes on: nothing on stdout, exit 0.
        if let Err(e) = hook(cli, args.mailbox, max, out) {
            eprintln!("lw-inbox: --hook {cli}: {e:#}; the agent goes on without the bell");
        }
        return Ok(Exit::Ok);
    }
    let dir = mailbox::post::mailbox_given(args.mailbox)?;
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
    if args.courier {
        if args.cmd.is_some() {
            return Err(Error::usage("--courier takes no subcommand"));
        }
        let stdin = std::io::stdin();
        ring::serve(&dir, std::os::fd::AsFd::as_fd(&stdin), out)?;
        return Ok(Exit::Ok);
    }
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
        let shown = mailbox::maildir::escape_name(&name);
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

/// The bell: the hook's JSON in, its answer out, the state under a lock in
/// `~/.lw-bell/CLI.json` (replaced atomically).
fn hook(cli: &str, mailbox: Option<PathBuf>, max: u32, out: &mut dyn Write) -> Result<()> {
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut raw).map_err(|e| {
        Error::new(
            Exit::IoErr,
            "cannot read the hook's input from standard input",
        )
        .with_source(e)
    })?;
    let mut input: bell::Input = serde_json::from_slice(&raw)
        .map_err(|e| Error::data(format!("the hook's input is not its JSON: {e}")))?;
    let asked = input.hook_event_name.clone();
    input.hook_event_name = bell::event_of(cli, &asked).to_string();
    let dir = mailbox::post::mailbox_given(mailbox)?;
    let inbox = SandboxBox::new(&dir).inbox();
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .ok_or_else(|| Error::usage("HOME is not set: the bell keeps its state there"))?;
    let state_dir = PathBuf::from(home).join(".lw-bell");
    base::fs::private_dir(&state_dir)
        .map_err(|e| Error::io_as(Exit::CantCreat, "cannot create", &state_dir, e))?;
    // Two hooks at once (parallel tool calls) would both announce a message.
    let lock_path = state_dir.join(format!("{cli}.lock"));
    let _lock = base::fs::lock(&lock_path)
        .map_err(|e| Error::io_as(Exit::IoErr, "cannot lock", &lock_path, e))?;
    let path = state_dir.join(format!("{cli}.json"));
    let state = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).unwrap_or_else(|e| {
            eprintln!(
                "lw-inbox: --hook: '{}' is not the bell's state ({e}); starting afresh",
                path.display()
            );
            bell::State::default()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bell::State::default(),
        Err(e) => return Err(Error::io_as(Exit::IoErr, "cannot read", &path, e)),
    };
    let new: Vec<Message> = if inbox.path.is_dir() {
        inbox
            .scan(Sub::New)?
            .into_iter()
            .filter_map(|Entry { found, .. }| match found {
                Found::Message(m) => Some(m),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    let (answer, state) = bell::answer(&input, state, &new, max, bell::budget(cli));
    // Told first, remembered second: a state that cannot be saved means a
    // message told twice, never one lost.
    if let Some(mut v) = answer {
        // Under the event's name as the CLI gave it.
        if let Some(h) = v.get_mut("hookSpecificOutput") {
            h["hookEventName"] = asked.into();
        }
        writeln!(out, "{}", bell::shaped(cli, v)).map_err(cli::out_err)?;
    }
    // A lost state costs a message told twice, never one lost: no fsync.
    let bytes = serde_json::to_vec(&state)?;
    base::fs::write_replace(&path, &bytes, 0o600, base::fs::Durability::Unsynced)
        .map_err(|e| Error::io_as(Exit::IoErr, "cannot write", &path, e))?;
    Ok(())
}
