//! lw-mediate: the mediator between sandboxes, and its operator commands.
//!
//! Contract: without a subcommand, routes every message posted in the
//! outboxes of the mailbox root (`--root`, else `$LW_ROOT`): logs the message
//! and the decision, delivers, then claims the source; `--once` drains and
//! exits, otherwise it watches the root.  A SIGKILL at any instant followed
//! by a restart gives every log entry and every delivered copy exactly once
//! (crates/mailbox/src/mediate/).  Two mediators never run on one root (exit 75).  The
//! subcommands list and act on the queues, the registry, the policy and the
//! log.  Quiet by default; `-v` prints one line per logged event.

use std::io::{Read as _, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base::cli::{self, out_err};
use base::{Error, Exit, Result};
use clap::{Parser, Subcommand};
use mailbox::door_record::DoorRecord;
use mailbox::layout::Root;
use mailbox::log::Log;
use mailbox::mediate::{self, Mediator};
use mailbox::operator;
use mailbox::policy::{self, Policy};
use mailbox::redact::Secrets;
use mailbox::registry::{Registry, Sandbox};

/// Route messages between sandboxes by policy, and run the held and human queues.
#[derive(Parser, Debug)]
#[command(name = "lw-mediate", version, max_term_width = 100)]
struct Args {
    /// The mailbox root [default: $LW_ROOT]
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Policy file [default: .loopwright/policy, built-in policy when absent]
    #[arg(long, global = true, value_name = "FILE")]
    policy: Option<PathBuf>,

    /// Route everything waiting, then exit (for scripts and cron)
    #[arg(long)]
    once: bool,

    /// Seconds between full re-scans while watching
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    rescan: u64,

    /// Messages per batch (each batch is one group of fsyncs)
    #[arg(long, value_name = "N", default_value_t = mediate::DEFAULT_BATCH)]
    batch: usize,

    /// How a batch is made durable: `file` (an fsync of each file and
    /// directory it touched, issued together) or `fs` (one syncfs per phase)
    #[arg(long, value_name = "HOW", default_value = "file", value_parser = ["file", "fs"])]
    sync: String,

    /// Log bytes one sender may cause per hour, e.g. 8m [default:
    /// door.log-max as the root records it, else of the project around the
    /// current directory, else 8m]
    #[arg(long, value_name = "SIZE")]
    log_max: Option<String>,

    /// Bytes the quarantine keeps of one sender's bad files, e.g. 16m
    /// [default: door.quarantine-max as the root records it, else of the
    /// project around the current directory, else 16m]
    #[arg(long, value_name = "SIZE")]
    quarantine_max: Option<String>,

    /// Print one line per logged event
    #[arg(short, long)]
    verbose: bool,

    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List held messages
    Held {
        /// JSON Lines ({"type":"held",...})
        #[arg(long)]
        json: bool,
    },
    /// List questions waiting for a person
    Human {
        /// JSON Lines ({"type":"question",...})
        #[arg(long)]
        json: bool,
    },
    /// Release held messages to the recipients their route names now
    Release {
        #[arg(value_name = "ID", required = true)]
        ids: Vec<String>,
    },
    /// Drop held messages (logged; the file stays in held/cur)
    Drop {
        #[arg(value_name = "ID", required = true)]
        ids: Vec<String>,
        /// Why, recorded in the log
        #[arg(long, value_name = "TEXT", default_value = "no reason given")]
        reason: String,
    },
    /// Answer a question from the human queue; routed to whoever asked
    Answer {
        #[arg(value_name = "ID")]
        id: String,
        /// The answer; `-` or absent reads standard input
        #[arg(value_name = "TEXT")]
        text: Option<String>,
    },
    /// Print the log, oldest first
    Log {
        /// JSON Lines ({"type":"entry",...})
        #[arg(long)]
        json: bool,
    },
    /// Add or replace a sandbox in the registry
    Register {
        #[arg(value_name = "NAME")]
        name: String,
        /// The branch the sandbox pushes
        #[arg(long, value_name = "BRANCH")]
        branch: Option<String>,
        /// A path glob or named contract the sandbox owns, repeatable
        #[arg(long, value_name = "GLOB")]
        scope: Vec<String>,
        /// A secret the sandbox holds, by name, repeatable (its value: the door's environment)
        #[arg(long, value_name = "NAME")]
        secret: Vec<String>,
    },
    /// Remove a sandbox from the registry (messages to it then bounce)
    Unregister {
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// List the registered sandboxes
    Sandboxes {
        /// JSON Lines ({"type":"sandbox",...})
        #[arg(long)]
        json: bool,
    },
    /// Check or show a policy file
    #[command(subcommand)]
    Policy(PolicyCmd),
}

#[derive(Subcommand, Debug)]
enum PolicyCmd {
    /// Validate FILE; errors are FILE:LINE: message, exit 78
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Print the policy in force (FILE, --policy, or the built-in one)
    Show {
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

const PROG: &str = "lw-mediate";

fn main() -> ExitCode {
    base::cli::run_main(PROG, run)
}

/// Where the library's warnings and notes go: `lw-mediate: ...` on stderr.
fn reporter() -> mediate::Reporter {
    Box::new(cli::stderr_report(PROG))
}

/// The secret values the mediator keeps from leaving (crates/mailbox/src/redact): the
/// names the root records (each sandbox's secrets and its project's), the
/// project here, and the sync token, as this process's environment has them.
fn door_secrets(root: &Root) -> Result<Secrets> {
    let env = |n: &str| std::env::var_os(n);
    let here = std::env::current_dir().unwrap_or_default();
    let (mut s, mut warnings) = Secrets::for_root(root, &here, &env)?;
    warnings.extend(s.add_env(&["GH_TOKEN".into(), "GITHUB_TOKEN".into()], &env));
    for w in warnings {
        eprintln!("lw-mediate: warning: {w}");
    }
    Ok(s)
}

/// The door's budgets: the flags, else what the root records (lw-sandbox
/// create records its project's `door.log-max` and `door.quarantine-max`),
/// else the project around the current directory's, else 8 MiB of log per
/// sender and hour and 16 MiB of quarantine (crates/mailbox/src/mediate/budget.rs,
/// keep.rs).  The root wins over the project here, which warns when it
/// sets other values (crates/mailbox/src/door_record.rs).
fn door_budgets(root: &Root, log: Option<&str>, quarantine: Option<&str>) -> Result<(u64, u64)> {
    let size = mailbox::door_record::size;
    let log = log
        .map(|v| {
            size(v).filter(|n| *n > 0).ok_or_else(|| {
                Error::usage(format!(
                    "--log-max '{v}': expected a size above 0, such as 512k or 8m"
                ))
            })
        })
        .transpose()?;
    let quarantine = quarantine
        .map(|v| {
            size(v).ok_or_else(|| {
                Error::usage(format!(
                    "--quarantine-max '{v}': expected a size, such as 16m or 0 (keep nothing)"
                ))
            })
        })
        .transpose()?;
    let here = std::env::current_dir().unwrap_or_default();
    let (f, warnings) = DoorRecord::new(root).in_force(&here)?;
    for w in warnings {
        eprintln!("{PROG}: warning: {w}");
    }
    Ok((
        log.or(f.budgets.log_max)
            .unwrap_or(mediate::DEFAULT_LOG_MAX),
        quarantine
            .or(f.budgets.quarantine_max)
            .unwrap_or(mediate::DEFAULT_QUARANTINE_MAX),
    ))
}

/// `register`: the record, the digests of its secrets set here, and, run
/// in a project, that project's door budgets (as lw-sandbox create does).
fn register(root: &Root, s: &Sandbox) -> Result<PathBuf> {
    root.init()?;
    let door = DoorRecord::new(root);
    let values: Vec<(String, Vec<u8>)> = s
        .secrets
        .iter()
        .filter_map(|n| {
            let v = std::env::var_os(n).filter(|v| !v.is_empty())?;
            Some((n.clone(), v.into_encoded_bytes()))
        })
        .collect();
    door.record_secrets(&s.name, &values)?;
    let here = std::env::current_dir().unwrap_or_default();
    if let Some(p) = base::config::Project::find(&here, mailbox::config::CHECK)? {
        let b = mailbox::door_record::Budgets::of_project(&p)?;
        door.record_budgets(&b, &p.top.join(base::config::FILE))?;
    }
    Registry::new(root).register(s)
}

fn root_of(args: &Args) -> Result<Root> {
    Root::resolve(args.root.as_deref())
}

fn policy_of(args: &Args) -> (PathBuf, bool) {
    match &args.policy {
        Some(p) => (p.clone(), true),
        None => (PathBuf::from(policy::DEFAULT_PATH), false),
    }
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    if let Some(Cmd::Policy(p)) = &args.cmd {
        // Policy commands need no root.
        return run_policy(&args, p, out);
    }
    let root = root_of(&args)?;
    match &args.cmd {
        None => run_mediator(&args, root, out),
        Some(Cmd::Held { json }) | Some(Cmd::Human { json }) => {
            let held = matches!(args.cmd, Some(Cmd::Held { .. }));
            operator::print_queue(out, &root, held, *json)?;
            Ok(Exit::Ok)
        }
        Some(Cmd::Release { ids }) | Some(Cmd::Drop { ids, .. }) => {
            run_release_or_drop(&args, root, ids, out)
        }
        Some(Cmd::Answer { id, text }) => {
            let body = answer_body(text.as_deref())?;
            let m = operator::answer(&root, &Log::new(root.log_dir()), id, &body)?;
            writeln!(out, "{}", m.id).map_err(out_err)?;
            Ok(Exit::Ok)
        }
        Some(Cmd::Log { json }) => {
            operator::print_log(out, &root, *json, &cli::stderr_report(PROG))
        }
        Some(Cmd::Register {
            name,
            branch,
            scope,
            secret,
        }) => {
            for s in scope {
                policy::check_scope(s)?;
            }
            let mut s = Sandbox::new(name, branch.clone(), scope.clone());
            s.secrets = secret.clone();
            let p = register(&root, &s)?;
            writeln!(out, "{}", p.display()).map_err(out_err)?;
            Ok(Exit::Ok)
        }
        Some(Cmd::Unregister { name }) => {
            if !Registry::new(&root).unregister(name)? {
                return Err(Error::new(
                    Exit::NoInput,
                    format!("no sandbox '{name}' is registered"),
                ));
            }
            Ok(Exit::Ok)
        }
        Some(Cmd::Sandboxes { json }) => {
            operator::print_sandboxes(out, &root, *json, &cli::stderr_report(PROG))
        }
        Some(Cmd::Policy(_)) => unreachable!("handled above because policy commands need no root"),
    }
}

fn run_policy(args: &Args, cmd: &PolicyCmd, out: &mut dyn Write) -> Result<Exit> {
    match cmd {
        PolicyCmd::Check { file } => {
            Policy::load(file)?;
            writeln!(out, "{}: ok", file.display()).map_err(out_err)?;
        }
        PolicyCmd::Show { file } => {
            let (p, explicit) = match file {
                Some(f) => (f.clone(), true),
                None => policy_of(args),
            };
            let pol = if explicit || p.exists() {
                Policy::load(&p)?
            } else {
                Policy::default()
            };
            write!(out, "{}", pol.render()).map_err(out_err)?;
        }
    }
    Ok(Exit::Ok)
}

/// The mediator itself: drains once (`--once`) or watches.
fn run_mediator(args: &Args, root: Root, out: &mut dyn Write) -> Result<Exit> {
    let _lock = mediate::lock_mediator(&root)?;
    mediate::raise_open_files_limit();
    let (p, explicit) = policy_of(args);
    let mut m = Mediator::open(root.clone(), Some(p), explicit, reporter())?;
    m.state.secrets = door_secrets(&root)?;
    (m.state.log_max, m.state.quarantine_max) = door_budgets(
        &root,
        args.log_max.as_deref(),
        args.quarantine_max.as_deref(),
    )?;
    m.batch = args.batch;
    m.verbose = args.verbose;
    m.sync = if args.sync == "fs" {
        mailbox::batch::Sync::FileSystem
    } else {
        mailbox::batch::Sync::File
    };
    if !args.once {
        m.watch(Duration::from_secs(args.rescan.max(1)), out)?;
        return Ok(Exit::Ok);
    }
    let s = m.drain(out)?;
    if args.verbose {
        writeln!(
            out,
            "routed {} forwarded {} escalated {} held {} bounced {} quarantined {} receipts {}",
            s.routed, s.forwarded, s.escalated, s.held, s.bounced, s.quarantined, s.receipts
        )
        .map_err(out_err)?;
    }
    if s.waiting > 0 {
        eprintln!(
            "lw-mediate: {} messages or outboxes could not be routed yet (see above); they wait",
            s.waiting
        );
        return Ok(Exit::TempFail);
    }
    Ok(Exit::Ok)
}

fn run_release_or_drop(
    args: &Args,
    root: Root,
    ids: &[String],
    out: &mut dyn Write,
) -> Result<Exit> {
    let (p, explicit) = policy_of(args);
    let mut m = Mediator::open(root.clone(), Some(p), explicit, reporter())?;
    m.state.secrets = door_secrets(&root)?;
    for id in ids {
        let e = match &args.cmd {
            Some(Cmd::Drop { reason, .. }) => m.drop_held(id, reason, out)?,
            _ => m.release(id, out)?,
        };
        let to = e.decision.to.join(",");
        writeln!(out, "{} {} {to}", e.message_id, e.decision.action.as_str()).map_err(out_err)?;
    }
    Ok(Exit::Ok)
}

/// The text of an answer: TEXT, or standard input for `-` or no TEXT.
fn answer_body(text: Option<&str>) -> Result<String> {
    match text {
        Some("-") | None if cli::stdin_is_tty() && text.is_none() => Err(Error::usage(
            "no answer given: pass TEXT, or pipe it to standard input",
        )),
        Some("-") | None => {
            let mut b = Vec::new();
            std::io::stdin()
                .take(mailbox::message::MAX_BODY as u64 + 1)
                .read_to_end(&mut b)
                .map_err(|e| {
                    Error::new(Exit::IoErr, "cannot read standard input").with_source(e)
                })?;
            String::from_utf8(b)
                .map_err(|_| Error::data("the answer on standard input is not UTF-8"))
        }
        Some(t) => Ok(t.to_string()),
    }
}
