//! lw-radar: conflicts between live task branches, told before anyone merges.
//!
//! Contract: one pass (or one every `--every`) over the sandboxes of a root
//! (`--root`, else `$LW_ROOT`): each registered sandbox's task branch is
//! fetched as data into a host-owned repository (the transport push uses:
//! `git upload-pack` inside the sandbox, through `lw-sandbox exec`), every
//! pair whose heads changed is merged with `git merge-tree --write-tree`
//! from its merge base, and a new set of conflicts or scope overlaps puts
//! one `conflict` message to both sandboxes into `ROOT/mediator-outbox`, a
//! set that went away one `conflict-cleared`; lw-mediate routes them as its
//! own.  stdout: one line per message put (`conflict ID A B FILES`), with
//! `--json` JSON Lines.  A sandbox or pair left out of a pass is on stderr
//! as `lw-radar: skipped NAME: why` and does not fail the pass.  The work
//! is in crates/repo/src/radar/; the contract in man/lw-radar.1.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use base::cli::out_err;
use base::config;
use base::{Error, Exit, Result};
use clap::Parser;
use loopwright::sandbox::Record;
use mailbox::layout::Root;
use mailbox::registry::Registry;
use repo::radar::{Event, Limits, Live, Radar, Report, Source};

const PROG: &str = "lw-radar";

/// Tell sandboxes whose task branches conflict, before anyone merges.
#[derive(Parser, Debug)]
#[command(name = "lw-radar", version, max_term_width = 100)]
struct Args {
    /// The mailbox root [default: $LW_ROOT]
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,

    /// Pass again every DURATION (90s, 15m) instead of once
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    every: Option<Duration>,

    /// Read each sandbox NAME's branch from the repository DIR/NAME on this
    /// host instead of from inside the sandbox (trusted repositories only:
    /// tests and benchmarks)
    #[arg(long, value_name = "DIR")]
    from: Option<PathBuf>,

    /// A mirror whose objects the branches borrow, repeatable [default: the
    /// sandboxes' own]
    #[arg(long, value_name = "PATH")]
    mirror: Vec<PathBuf>,

    /// The current base, a revision of the first mirror: a branch's own
    /// changes (for scopes) are counted from its merge base with it
    /// [default: the mirror's HEAD]
    #[arg(long, value_name = "REV")]
    base: Option<String>,

    /// Address every message to the person (human) as well
    #[arg(long)]
    cc_human: bool,

    /// Time cap of each git the radar runs (a fetch, a merge)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "20s")]
    time_cap: Duration,

    /// Bytes of new objects one sandbox's branch may bring
    #[arg(long, value_name = "BYTES", default_value_t = 256 << 20)]
    size_cap: u64,

    /// Bytes of data memory each git the radar runs may use
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30)]
    memory_cap: u64,

    /// Threads fetching heads and merging pairs [default: the CPUs]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// Print JSON Lines (one record per message and skip, then the pass)
    #[arg(long)]
    json: bool,
}

fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    config::parse_duration(s)
        .ok_or_else(|| format!("'{s}' is not a duration (use e.g. 90s, 15m, 2h)"))
}

fn main() -> ExitCode {
    base::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let root = Root::resolve(args.root.as_deref())?;
    root.check_exists()?;
    let mut radar = Radar::open(root.clone(), vec![])?;
    radar.limits = Limits {
        time: args.time_cap,
        output: Limits::default().output,
        fetch: args.size_cap,
        memory: args.memory_cap,
    };
    radar.cc_human = args.cc_human;
    if let Some(n) = args.threads {
        radar.threads = n.max(1);
    }
    let mut told: Vec<(String, String)> = vec![];
    loop {
        // The registry is read again at every pass: a sandbox registered,
        // removed or rescoped while a daemon runs counts from its next pass.
        let (live, mirrors, skipped) = live(&root, &args)?;
        if skipped != told {
            for (name, why) in &skipped {
                eprintln!("{PROG}: skipped {name}: {why}");
            }
            told = skipped;
        }
        radar.upstream = upstream(&mirrors, args.base.as_deref());
        radar.mirrors = mirrors;
        let report = radar.pass(&live)?;
        print(&report, args.json, out)?;
        out.flush().map_err(out_err)?;
        match args.every {
            // Heads change inside sandboxes, where the host has nothing to
            // watch: the interval is the contract.
            Some(d) => std::thread::sleep(d),
            None => return Ok(Exit::Ok),
        }
    }
}

/// The current base: `rev` (default HEAD) of the first mirror, when it names a commit.
fn upstream(mirrors: &[PathBuf], rev: Option<&str>) -> Option<String> {
    let m = mirrors.first()?;
    let mut c = repo::radar::run::git(m);
    c.args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
        .arg(format!("{}^{{commit}}", rev.unwrap_or("HEAD")));
    let r = repo::radar::run::run(c, &Limits::default()).ok()?;
    let h = String::from_utf8_lossy(&r.stdout).trim().to_string();
    (r.status.success() && h.len() >= 40).then_some(h)
}

/// The live sandboxes: registered on this host, with a branch, and (unless
/// `--from`) a sandbox record to reach them by.  Returns them, the mirrors
/// and the registered ones left out, with why.
#[allow(clippy::type_complexity)]
fn live(root: &Root, args: &Args) -> Result<(Vec<Live>, Vec<PathBuf>, Vec<(String, String)>)> {
    let (records, _bad) = Registry::new(root).list()?;
    let mut mirrors = args.mirror.clone();
    let mut live = Vec::new();
    let mut skipped = Vec::new();
    let lw_sandbox = sibling("lw-sandbox")?;
    for r in records {
        if r.host.is_some() {
            continue; // another host's sandbox: that host's radar sees it
        }
        if let Some(dir) = &args.from {
            let Some(branch) = r.branch.clone() else {
                skipped.push((r.name.clone(), "its record names no branch".into()));
                continue;
            };
            live.push(Live {
                source: Source::Path(dir.join(&r.name)),
                refs: Some((dir.join(&r.name), PathBuf::from(".git"))),
                name: r.name,
                branch,
                scope: r.scope,
            });
            continue;
        }
        let p = root
            .state_dir()
            .join("sandbox")
            .join(format!("{}.json", r.name));
        let rec: Record = match std::fs::read(&p)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
        {
            Some(rec) => rec,
            None => {
                skipped.push((
                    r.name.clone(),
                    "no sandbox record (registered by hand?)".into(),
                ));
                continue;
            }
        };
        if !rec.ready {
            skipped.push((r.name.clone(), "still being created".into()));
            continue;
        }
        if args.mirror.is_empty() && !mirrors.contains(&rec.mirror) {
            mirrors.push(rec.mirror.clone());
        }
        // Its workspace filesystem, where the host sees it (not in volume
        // mode): the ref files are the hint that its head did not move.
        let refs = (!rec.volume_mode).then(|| {
            let work = loopwright::sandbox::disk::work(root, &rec.name).mount;
            let repo = Path::new(wall::REPO)
                .strip_prefix(wall::WORK)
                .map_or_else(|_| PathBuf::from("repo"), Path::to_path_buf);
            (work, repo.join(".git"))
        });
        live.push(Live {
            source: Source::Ext(transport(&lw_sandbox, &root.dir, &rec.name)),
            refs,
            name: rec.name,
            branch: rec.branch,
            scope: r.scope,
        });
    }
    Ok((live, mirrors, skipped))
}

/// The `ext::` URL push uses: `git upload-pack` of the sandbox's clone, run
/// inside it.
fn transport(lw_sandbox: &Path, root: &Path, name: &str) -> String {
    let esc = |s: &str| s.replace('%', "%%").replace(' ', "% ");
    format!(
        "ext::{} exec --root {} {} -- git upload-pack {}",
        esc(&lw_sandbox.to_string_lossy()),
        esc(&root.to_string_lossy()),
        esc(name),
        wall::REPO
    )
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| {
        Error::new(Exit::Software, "cannot find this program's path").with_source(e)
    })?;
    Ok(exe.with_file_name(name))
}

fn print(r: &Report, json: bool, out: &mut dyn Write) -> Result<()> {
    for e in &r.events {
        match e {
            Event::Skipped { name, why } => {
                eprintln!("{PROG}: skipped {name}: {why}");
                if json {
                    writeln!(
                        out,
                        "{}",
                        serde_json::to_string(e).expect("events serialise")
                    )
                    .map_err(out_err)?;
                }
            }
            Event::Sent { .. } if json => {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string(e).expect("events serialise")
                )
                .map_err(out_err)?;
            }
            Event::Sent {
                kind,
                id,
                a,
                b,
                files,
            } => {
                writeln!(out, "{kind} {id} {a} {b} {}", files.join(" ")).map_err(out_err)?;
            }
        }
    }
    if json {
        let v = serde_json::json!({
            "type": "pass",
            "sandboxes": r.sandboxes,
            "heads_changed": r.heads_changed,
            "heads_read": r.heads_read,
            "fetched": r.fetched,
            "pairs": r.pairs,
            "pairs_computed": r.pairs_computed,
            "conflicts": r.conflicts,
            "cleared": r.cleared,
        });
        writeln!(out, "{v}").map_err(out_err)?;
    }
    Ok(())
}
