//! lw-sync: mirror the mediator's log to GitHub issue comments, exactly once,
//! and bring a person's answers back (lw-sync(1)).
//!
//! Contract: every entry of `ROOT/log/new/` ends up in exactly one place on
//! GitHub (one comment section, or numbered parts), whatever crashes, kills or
//! lost answers happen in between; the work is in the `sync` crate.  Runs
//! hold `ROOT/state/sync.lock`, so cron (`--once`) and a watcher (`--watch`)
//! never post the same entry twice.  The token comes from the environment or
//! a file, never from the command line, and is never printed.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base::cli::out_err;
use base::{Error, Exit, Result};
use clap::{Parser, Subcommand};
use mailbox::layout::Root;
use mailbox::redact::Secrets;
use mailbox::registry::Registry;
use sync::github::{Client, DEFAULT_API, Limits, Token, default_token_file};
use sync::{Config, Event, Syncer};

const PROG: &str = "lw-sync";

/// Mirror the loopwright log to GitHub issue comments and pull answers back.
#[derive(Parser, Debug)]
#[command(name = "lw-sync", version)]
struct Args {
    /// Mailbox root (default: $LW_ROOT).
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Configuration file (default: .loopwright/sync.json here or in a parent).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Repository OWNER/NAME of the run's issue.
    #[arg(long, global = true, value_name = "OWNER/NAME")]
    repo: Option<String>,
    /// The run's issue or pull-request number.
    #[arg(long, global = true, value_name = "N")]
    issue: Option<u64>,
    /// API base URL (default: https://api.github.com; $LW_GITHUB_API_URL).
    #[arg(long, global = true, value_name = "URL")]
    api_url: Option<String>,
    /// Read the token from FILE when GH_TOKEN and GITHUB_TOKEN are unset.
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Print JSON Lines (one object per event, `type` field) instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Exit with status 75 instead of waiting when another lw-sync holds the lock.
    #[arg(long, global = true)]
    no_wait: bool,
    /// Longest wait for a rate limit before giving up with status 75.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 300)]
    max_wait: u64,
    /// Longest wait for a connection to the API.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 10)]
    connect_timeout: u64,
    /// Longest wait for each read of an answer.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 20)]
    read_timeout: u64,
    /// Stop starting requests and waits after SECS (status 75; for cron).
    #[arg(long, global = true, value_name = "SECS")]
    time_limit: Option<u64>,
    /// Sync once and exit (for cron); the default.
    #[arg(long, conflicts_with = "watch")]
    once: bool,
    /// Keep running: sync whenever the log changes.
    #[arg(long)]
    watch: bool,
    /// With --watch: pass over the log (and retry) at least every SECS; a federated host also pulls.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    interval: u64,
    /// Most log entries in one comment when a backlog is batched.
    #[arg(long, global = true, value_name = "N")]
    batch: Option<usize>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Deliver `/lw answer ID` replies and reviews of task pull requests into ROOT/human-outbox, and other hosts' messages (federation).
    Pull,
    /// Compare the log with GitHub both ways; report what is missing where.
    Verify {
        /// Append the entries found only on GitHub to the log.
        #[arg(long)]
        restore: bool,
    },
}

fn main() -> ExitCode {
    base::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let root = Root::resolve(args.root.as_deref())?;
    if !root.path().is_dir() {
        return Err(Error::new(
            Exit::NoInput,
            format!(
                "mailbox root '{}' is not a directory",
                root.path().display()
            ),
        ));
    }
    let mut cfg = match args
        .config
        .clone()
        .or_else(|| Config::find(&std::env::current_dir().unwrap_or_default()))
    {
        Some(p) => Config::load(&p)?,
        None => Config::default(),
    };
    cfg.repo = args.repo.clone().or(cfg.repo);
    cfg.issue = args.issue.or(cfg.issue);
    cfg.batch = args.batch.or(cfg.batch);
    cfg.learn_pulls(&root.state_dir())?;
    let api = args
        .api_url
        .clone()
        .or_else(|| std::env::var("LW_GITHUB_API_URL").ok())
        .or(cfg.api_url.clone())
        .unwrap_or_else(|| DEFAULT_API.into());
    let token_file = args
        .token_file
        .clone()
        .or(cfg.token_file.clone())
        .or_else(default_token_file);
    let token = Token::load(token_file.as_deref())?;
    let mut limits = Limits::from_env()?;
    limits.max_wait = Duration::from_secs(args.max_wait);
    limits.connect_timeout = Duration::from_secs(args.connect_timeout.max(1));
    limits.read_timeout = Duration::from_secs(args.read_timeout.max(1));
    let mut secrets = door_secrets(&root, &token)?;
    let mut client = Client::new(&api, token, limits, Default::default())?;
    if args.watch && args.time_limit.is_some() {
        return Err(Error::usage(
            "--time-limit is for runs that end (--once, pull, verify), not --watch",
        ));
    }
    if let Some(t) = args.time_limit {
        client.deadline = Some(base::time::now_ms() + t * 1000);
    }
    let _lock = sync::lock(&root, !args.no_wait)?;
    let mut s = Syncer::new(root.clone(), cfg, client)?;
    s.secrets = std::mem::take(&mut secrets);
    let json = args.json;
    let mut status = Exit::Ok;
    let res = match args.cmd {
        Some(Cmd::Pull) => s.pull(),
        Some(Cmd::Verify { restore }) => s.verify(restore).map(|same| {
            if !same {
                status = Exit::DataErr;
            }
        }),
        None if args.watch => {
            drop(_lock);
            let dir = root.log_dir().join("new");
            let period = Duration::from_secs(args.interval.max(1));
            // A host of a federation also pulls, at most once per interval:
            // other hosts' messages raise no event here.
            let federated = s.cfg.federation()?.is_some();
            let mut last_pull: Option<std::time::Instant> = None;
            sync::watch_dir(&dir, period, &base::cli::stderr_report(PROG), || {
                let _l = sync::lock(&root, true)?;
                let mut r = s
                    .reload()
                    .and_then(|()| learn_secrets(&mut s))
                    .and_then(|()| s.sync());
                if r.is_ok() && federated && last_pull.is_none_or(|t| t.elapsed() >= period) {
                    last_pull = Some(std::time::Instant::now());
                    r = s.pull();
                }
                report(&mut s, out, json, false)?;
                r
            })
            .map(|_| ())
        }
        None => s.sync(),
    };
    report(&mut s, out, json, true)?;
    res?;
    if status == Exit::Ok {
        status = refused_statuses(&s);
    }
    if s.stats.bad > 0 && status == Exit::Ok {
        eprintln!(
            "{PROG}: {} log entries could not be synced (see above); the others were",
            s.stats.bad
        );
        status = Exit::DataErr;
    }
    Ok(status)
}

/// The secret values masked in everything posted (crates/mailbox/src/redact): the token,
/// the names the root records (each sandbox's secrets and its project's)
/// and the project here, as the environment has them.
fn door_secrets(root: &Root, token: &Token) -> Result<Secrets> {
    let env = |n: &str| std::env::var_os(n);
    let here = std::env::current_dir().unwrap_or_default();
    let (mut s, mut warnings) = Secrets::for_root(root, &here, &env)?;
    warnings.extend(s.add("SYNC_TOKEN", token.value_for_masking()));
    for w in warnings {
        eprintln!("{PROG}: warning: {w}");
    }
    Ok(s)
}

/// Looks up the secrets of sandboxes registered since the last pass (a
/// watcher's); one that cannot be resolved ends the watch with 78.
fn learn_secrets(s: &mut Syncer) -> Result<()> {
    let env = |n: &str| std::env::var_os(n);
    let (good, _) = Registry::new(&s.root).list()?;
    for w in s.secrets.add_recorded(&s.root, good.iter(), &env)? {
        eprintln!("{PROG}: warning: {w}");
    }
    Ok(())
}

/// Prints the events gathered so far: records on stdout, problems on stderr.
fn report(s: &mut Syncer, out: &mut dyn Write, json: bool, stats: bool) -> Result<()> {
    for ev in std::mem::take(&mut s.events) {
        if json {
            let line = serde_json::to_string(&ev).expect("events are plain data");
            writeln!(out, "{line}").map_err(out_err)?;
            continue;
        }
        match &ev {
            Event::Synced { entry, url, .. } => writeln!(out, "{entry} {url}").map_err(out_err)?,
            Event::Answer {
                id,
                in_reply_to,
                to,
                ..
            } => writeln!(out, "{id} answer to {in_reply_to} for {to}").map_err(out_err)?,
            Event::MissingOnGithub { entry, target } => {
                writeln!(out, "missing-on-github {target} {entry}").map_err(out_err)?
            }
            Event::MissingLocally { entry, target } => {
                writeln!(out, "missing-locally {target} {entry}").map_err(out_err)?
            }
            Event::Differs { entry, target } => {
                writeln!(out, "differs {target} {entry}").map_err(out_err)?
            }
            Event::Incomplete {
                entry,
                target,
                reason,
            } => writeln!(out, "incomplete {target} {entry}: {reason}").map_err(out_err)?,
            Event::Restored { entry } => writeln!(out, "restored {entry}").map_err(out_err)?,
            Event::Federated { id, from, to, .. } => {
                writeln!(out, "{id} from {from} to {}", to.join(",")).map_err(out_err)?
            }
            Event::LeftTo { id, comment, host } => {
                writeln!(out, "{id} answered in comment {comment}: left to {host}")
                    .map_err(out_err)?
            }
            Event::Receipt { id, reader, .. } => {
                writeln!(out, "{id} read by {reader}").map_err(out_err)?
            }
            Event::Review { .. } | Event::Ignored { .. } | Event::ReviewMissing { .. } => {
                review_line(&ev, out)?
            }
            Event::Refused { name, host, reason } => {
                eprintln!("{PROG}: sandbox {name} of host {host} refused: {reason}")
            }
            Event::Duplicate {
                entry,
                target,
                comments,
            } => {
                let ids: Vec<String> = comments.iter().map(u64::to_string).collect();
                writeln!(
                    out,
                    "duplicate {target} {entry} in comments {}",
                    ids.join(",")
                )
                .map_err(out_err)?
            }
            Event::Status { .. } | Event::StatusRefused { .. } | Event::StatusDiffers { .. } => {
                status_line(&ev, out)?
            }
            Event::Bad { entry, reason } => {
                eprintln!("{PROG}: skipping log entry '{entry}': {reason}")
            }
            Event::Unknown { target, reason } => {
                eprintln!("{PROG}: {target}: outcome unknown ({reason}); reconciling")
            }
            Event::Rejected {
                comment,
                target,
                reason,
            } => eprintln!("{PROG}: {target}: comment {comment}: {reason}"),
            Event::Unreadable {
                target,
                comment,
                reason,
            } => eprintln!(
                "{PROG}: {target}: comment {comment} is lw-sync's but unreadable: {reason}"
            ),
            Event::Failed { target, reason } => eprintln!("{PROG}: {target}: {reason}"),
        }
    }
    if json && stats {
        let st = s.finish_stats();
        let mut v = serde_json::to_value(&st).expect("stats are plain data");
        v["type"] = "stats".into();
        writeln!(out, "{v}").map_err(out_err)?;
    }
    out.flush().map_err(out_err)
}

/// Exit 65 when GitHub refused a radar status in this run (reported once).
fn refused_statuses(s: &Syncer) -> Exit {
    if s.stats.statuses_refused == 0 {
        return Exit::Ok;
    }
    eprintln!(
        "{PROG}: GitHub refused {} commit status(es) (see above); they are not sent again until the branch is pushed again",
        s.stats.statuses_refused
    );
    Exit::DataErr
}

/// The line of an event about the radar's commit statuses.
fn status_line(ev: &Event, out: &mut dyn Write) -> Result<()> {
    match ev {
        Event::Status {
            branch, sha, state, ..
        } => writeln!(out, "status {branch} {sha} {state}").map_err(out_err)?,
        Event::StatusDiffers {
            branch,
            sha,
            wanted,
            found,
        } => writeln!(
            out,
            "status-differs {branch} {sha}: wanted {wanted}, GitHub shows {found}"
        )
        .map_err(out_err)?,
        Event::StatusRefused {
            branch,
            sha,
            reason,
        } => eprintln!("{PROG}: status of branch {branch} at {sha} refused: {reason}"),
        _ => {}
    }
    Ok(())
}

/// The text of a review event (crates/sync/src/review.rs): a record on stdout, an
/// ignored item on stderr.
fn review_line(ev: &Event, out: &mut dyn Write) -> Result<()> {
    match ev {
        Event::Review {
            id,
            to,
            target,
            item,
            outside_scope,
        } => {
            let note = if *outside_scope {
                " (outside its scope)"
            } else {
                ""
            };
            writeln!(out, "{id} request to {to} from {target} {item}{note}").map_err(out_err)
        }
        Event::Ignored {
            target,
            item,
            login,
        } => {
            eprintln!(
                "{PROG}: {target}: {item} by @{login} ignored: not a trusted login (configure \"answerers\")"
            );
            Ok(())
        }
        Event::ReviewMissing { target, item, id } => {
            writeln!(out, "review-missing {target} {item} {id}").map_err(out_err)
        }
        _ => Ok(()),
    }
}
