//! lw-mirror: the local bare mirror every sandbox clones from.
//!
//! `lw-mirror sync [URL]` makes the mirror (every ref, as `git clone
//! --mirror` would) or fetches into it, and prints its path; `lw-mirror
//! path` prints the path; `lw-mirror status` describes it.  The mirror never
//! prunes a ref or an object, so clones that borrow its objects through
//! alternates stay whole; several syncs at once make one fetch.  The contract
//! is in crates/repo/src/mirror/ and man/lw-mirror.1.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use base::cli::out_err;
use base::config::{self, Project};
use base::{Error, Exit, time};
use clap::{Parser, Subcommand};
use repo::git::Remote;
use repo::mirror::{self, Mirror, Outcome, SyncOptions};

const PROG: &str = "lw-mirror";

/// The local bare mirror every sandbox clones from.
#[derive(Parser, Debug)]
#[command(name = "lw-mirror", version)]
struct Args {
    /// The mirror's path [default: $LW_MIRROR, then mirror.path in
    /// .loopwright/config, then .loopwright/cache/mirror.git in the project]
    #[arg(long, global = true, value_name = "PATH")]
    mirror: Option<PathBuf>,

    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create the mirror, or fetch into it; print its path
    Sync {
        /// The upstream [default: mirror.url in .loopwright/config, then the
        /// project's origin, then the URL the mirror was made from]
        url: Option<String>,

        /// Do nothing when the last fetch finished less than DURATION ago
        /// (90s, 15m, 2h, 1d, 1h30m)
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        if_older_than: Option<Duration>,

        /// Show git's progress even when stderr is not a terminal
        #[arg(long, conflicts_with = "quiet")]
        progress: bool,

        /// Show no progress, even on a terminal
        #[arg(short, long)]
        quiet: bool,

        /// Print a JSON Lines record instead of the path
        #[arg(long)]
        json: bool,
    },
    /// Print the mirror's path (whether or not it exists yet)
    Path,
    /// Describe the mirror: upstream URL, HEAD, refs, size, last fetch
    Status {
        /// Print a JSON Lines record
        #[arg(long)]
        json: bool,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    config::parse_duration(s)
        .ok_or_else(|| format!("'{s}' is not a duration (use e.g. 90s, 15m, 2h, 1d)"))
}

fn main() -> ExitCode {
    base::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit, Error> {
    let cwd = std::env::current_dir()
        .map_err(|e| Error::new(Exit::IoErr, "cannot find the current directory").with_source(e))?;
    let env = std::env::var_os(mirror::ENV_PATH).map(PathBuf::from);
    // The project is looked up only when it is needed (it costs a git process).
    let project =
        if args.mirror.is_none() && env.as_deref().is_none_or(|e| e.as_os_str().is_empty()) {
            wall::config::project(&cwd)?
        } else {
            None
        };
    let path = mirror::locate(
        args.mirror.as_deref(),
        env.as_deref(),
        project.as_ref(),
        &cwd,
    )?;
    let m = Mirror::new(path);
    match args.cmd {
        Cmd::Path => {
            writeln!(out, "{}", m.path.display()).map_err(out_err)?;
        }
        Cmd::Status { json } => status(&m, json, out)?,
        Cmd::Sync {
            url,
            if_older_than,
            progress,
            quiet,
            json,
        } => {
            let progress = !quiet && (progress || std::io::stderr().is_terminal());
            sync(&m, url, project, &cwd, if_older_than, progress, json, out)?;
        }
    }
    Ok(Exit::Ok)
}

#[allow(clippy::too_many_arguments)]
fn sync(
    m: &Mirror,
    url: Option<String>,
    project: Option<Project>,
    cwd: &Path,
    if_older_than: Option<Duration>,
    progress: bool,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), Error> {
    if let Some(p) = project.as_ref().filter(|p| m.path.starts_with(p.cache())) {
        mirror::ignore_cache(p)?;
    }
    let mut project = project;
    let mut remote = |stored: Option<&str>| -> Result<Remote, Error> {
        if let Some(u) = &url {
            return Remote::parse(u, cwd);
        }
        if project.is_none() {
            project = wall::config::project(cwd)?;
        }
        mirror::default_remote(project.as_ref(), stored, cwd)
    };
    let outcome = m.sync(&mut SyncOptions {
        if_older_than,
        progress,
        report: &base::cli::stderr_report(PROG),
        remote: &mut remote,
    })?;
    if json {
        let rec = serde_json::json!({
            "type": "sync",
            "path": m.path.to_string_lossy(),
            "outcome": outcome.as_str(),
        });
        writeln!(out, "{rec}").map_err(out_err)?;
    } else {
        writeln!(out, "{}", m.path.display()).map_err(out_err)?;
    }
    if progress && outcome == Outcome::Waited {
        eprintln!("{PROG}: another sync fetched while this one waited");
    }
    Ok(())
}

fn status(m: &Mirror, json: bool, out: &mut dyn Write) -> Result<(), Error> {
    let s = m.status()?;
    let ago = time::now().saturating_sub(s.last_fetch).as_secs();
    if json {
        let rec = serde_json::json!({
            "type": "status",
            "path": s.path.to_string_lossy(),
            "url": s.url,
            "head": s.head,
            "refs": s.refs,
            "size_bytes": s.size,
            "created": time::rfc3339(s.created),
            "last_fetch": time::rfc3339(s.last_fetch),
            "last_fetch_age_secs": ago,
        });
        writeln!(out, "{rec}").map_err(out_err)?;
        return Ok(());
    }
    let lines = [
        ("path", s.path.display().to_string()),
        ("url", s.url.clone()),
        (
            "head",
            s.head.clone().unwrap_or_else(|| "(detached)".into()),
        ),
        ("refs", s.refs.to_string()),
        ("size", mirror::human_size(s.size)),
        ("created", time::rfc3339(s.created)),
        (
            "last-fetch",
            format!("{} ({ago}s ago)", time::rfc3339(s.last_fetch)),
        ),
    ];
    for (k, v) in lines {
        writeln!(out, "{k:<11}{v}").map_err(out_err)?;
    }
    Ok(())
}
