//! lw-doctor (`lw doctor`): checks the Docker engine, git, the mirror, the
//! image, the mailbox, the mediator and sync locks, and the GitHub token, and
//! prints one finding per line with its fix.  It changes nothing.
//!
//! With `--kube-role` it prints instead the Role and ClusterRole the
//! Kubernetes engine needs (from crates/engine/src/kubernetes/access.rs).
//!
//! Exit status: 0 when nothing failed (warnings allowed), 69 when a check
//! failed, 64 on usage errors.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use base::{Error, Exit, Result, cli};
use clap::Parser;
use loopwright::doctor::{self, Status};

/// Check that everything loopwright needs is in place, and say how to fix what is not
#[derive(Parser, Debug)]
#[command(name = "lw-doctor", version, max_term_width = 100)]
struct Args {
    /// The mailbox root [default: $LW_ROOT, then the project's .loopwright/cache/mailbox]
    #[arg(long, env = "LW_ROOT", value_name = "DIR")]
    root: Option<PathBuf>,

    /// Run as if started in DIR
    #[arg(short = 'C', long = "directory", value_name = "DIR")]
    directory: Option<PathBuf>,

    /// A mirror fetched longer ago than this is reported stale (e.g. 90s, 15m, 1h)
    #[arg(long, value_name = "AGE", default_value = "1h")]
    fresh: String,

    /// Print JSON Lines ({"type":"finding",...}) instead of text
    #[arg(long)]
    json: bool,

    /// Print the Kubernetes Role (and ClusterRole) loopwright needs, as YAML
    /// for kubectl apply, instead of checking
    #[arg(long, conflicts_with_all = ["json", "fresh"])]
    kube_role: bool,

    /// The Role's namespace [default: engine.namespace, then the kubeconfig
    /// context's]
    #[arg(long, value_name = "NS", requires = "kube_role")]
    namespace: Option<String>,
}

fn main() -> ExitCode {
    base::cli::run_main("lw-doctor", run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let fresh: Duration = base::config::parse_duration(&args.fresh).ok_or_else(|| {
        Error::usage(format!(
            "--fresh '{}': give a duration such as 90s, 15m or 1h",
            args.fresh
        ))
    })?;
    let cwd = match args.directory {
        Some(d) => d,
        None => std::env::current_dir().map_err(|e| {
            Error::new(Exit::IoErr, "cannot read the current directory").with_source(e)
        })?,
    };
    if args.kube_role {
        out.write_all(doctor::kube_role(&cwd, args.namespace)?.as_bytes())
            .map_err(cli::out_err)?;
        return Ok(Exit::Ok);
    }
    let findings = doctor::run(&doctor::Inputs {
        cwd,
        root: args.root,
        fresh,
    });
    for fd in &findings {
        let line = if args.json {
            let mut v = serde_json::to_value(fd)?;
            v["type"] = "finding".into();
            v.to_string()
        } else {
            match &fd.fix {
                Some(fix) if fd.status != Status::Ok => format!(
                    "{:<4}  {:<9} {}\n                fix: {fix}",
                    fd.status.as_str(),
                    fd.check,
                    fd.detail
                ),
                _ => format!("{:<4}  {:<9} {}", fd.status.as_str(), fd.check, fd.detail),
            }
        };
        writeln!(out, "{line}").map_err(cli::out_err)?;
    }
    let failed = findings.iter().filter(|f| f.status == Status::Fail).count();
    Ok(if failed > 0 {
        Exit::Unavailable
    } else {
        Exit::Ok
    })
}
