//! lw-service: shared services (one database or API) that chosen sandboxes
//! reach, and nothing else.
//!
//! Contract: a service is declared in `.loopwright/services/NAME` (`key =
//! value`, as `.loopwright/config`).  `up NAME` builds or finds its image,
//! runs it hardened on an internal network of its own and waits for its
//! readiness check; `lw-sandbox create --service NAME` attaches a sandbox
//! to that network, where the service answers to NAME.  `down` removes the
//! container (network and data stay), `rm` the rest (data only with
//! `--volumes`), `ls` shows each service's state and sandboxes, `logs` its
//! output, `gc` the services whose declaration is gone.  Services belong to
//! a mailbox root (`--root`, else `$LW_ROOT`), like sandboxes.  The library
//! (lib/service/) holds the logic; man/lw-service.1 documents both.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use base::cli::{self, out_err};
use base::config::Project;
use base::{Error, Exit};
use clap::{Parser, Subcommand};
use engine::Engines;
use loopwright::service::{Services, decl};
use mailbox::layout::Root;

const PROG: &str = "lw-service";

/// Shared services (a database, an API) that chosen sandboxes reach, and nothing else.
#[derive(Parser, Debug)]
#[command(name = "lw-service", version)]
struct Args {
    /// The mailbox root [default: $LW_ROOT]
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,
    /// The project's checkout [default: the git checkout holding the current directory]
    #[arg(long, global = true, value_name = "DIR")]
    project: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start the service declared in .loopwright/services/NAME; wait until it is ready
    Up {
        name: String,
        /// Print a JSON Lines record instead of the name
        #[arg(long)]
        json: bool,
    },
    /// Stop and remove the service's container; its network and data stay
    Down { name: String },
    /// List services: name, state, address, sandboxes using it[, why]
    Ls {
        /// Print JSON Lines records
        #[arg(long)]
        json: bool,
    },
    /// Print what the service wrote (standard output, then standard error)
    Logs { name: String },
    /// Remove the service and its network (sandboxes detached); data kept unless --volumes
    Rm {
        name: String,
        /// Remove its data volume too
        #[arg(long)]
        volumes: bool,
    },
    /// Remove the services whose declaration is gone (data kept unless --volumes)
    Gc {
        /// Remove their data volumes too
        #[arg(long)]
        volumes: bool,
    },
}

fn main() -> ExitCode {
    let args: Args = match cli::parse_args(PROG) {
        Ok(a) => a,
        Err(code) => return code,
    };
    cli::main_with(PROG, |out| run(args, out))
}

fn project(flag: Option<&std::path::Path>) -> Result<Option<Project>, Error> {
    let cwd = std::env::current_dir()
        .map_err(|e| Error::new(Exit::IoErr, "cannot find the current directory").with_source(e))?;
    let start = flag.map(PathBuf::from).unwrap_or(cwd);
    let found = wall::config::project(&start)?;
    if flag.is_some() && found.is_none() {
        return Err(Error::usage(format!(
            "'{}' is not inside a git checkout",
            start.display()
        )));
    }
    Ok(found)
}

fn need(p: Option<Project>) -> Result<Project, Error> {
    p.ok_or_else(|| {
        Error::usage("not inside a project: run in the project's checkout or pass --project DIR")
    })
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit, Error> {
    let root = Root::resolve(args.root.as_deref())?;
    // A bad name is refused before the engine is asked anything.
    if let Cmd::Up { name, .. } | Cmd::Down { name } | Cmd::Logs { name } | Cmd::Rm { name, .. } =
        &args.cmd
    {
        decl::check_name(name)?;
    }
    let proj = project(args.project.as_deref())?;
    // The engines lw-sandbox chooses for the same project (engine::select),
    // so that its sandboxes find the services on their own runner.
    let engines = Engines::connect(proj.as_ref().map(|p| &p.config))?;
    let svc = Services::new(&root.dir, engines.pair());
    let line = |out: &mut dyn Write, s: &str| writeln!(out, "{s}").map_err(out_err);
    let mut say = |m: &str| eprintln!("{PROG}: {m}");
    match args.cmd {
        Cmd::Up { name, json } => {
            let p = need(proj)?;
            let d = decl::load(&p, &name)?;
            let up = svc.up(&p, &d, &mut say)?;
            if json {
                let v = serde_json::json!({
                    "type": "service", "name": name, "state": "ready", "image": up.image,
                    "built": up.built.is_some(), "already": up.already,
                    "took_ms": up.took.as_secs_f64() * 1e3,
                    "sandboxes": svc.sandboxes_of(&name)?,
                });
                line(out, &v.to_string())?;
            } else {
                line(out, &name)?;
            }
        }
        Cmd::Down { name } => {
            svc.down(&name)?;
            line(out, &name)?;
        }
        Cmd::Ls { json } => {
            for s in svc.list(proj.as_ref())? {
                line(out, &if json { s.json().to_string() } else { s.line() })?;
            }
        }
        Cmd::Logs { name } => {
            let log = svc.logs(&name)?;
            // The service's own text: its control characters made visible.
            let text = String::from_utf8_lossy(&log);
            out.write_all(base::visible::visible(&text).as_bytes())
                .map_err(out_err)?;
        }
        Cmd::Rm { name, volumes } => {
            svc.remove(&name, volumes, &mut |what| {
                if what.starts_with("detached ") || what.starts_with("kept ") {
                    say(what)
                }
            })?;
            line(out, &name)?;
        }
        Cmd::Gc { volumes } => {
            let mut lines = Vec::new();
            svc.gc(volumes, &mut |w| lines.push(w.to_string()))?;
            for l in lines {
                line(out, &l)?;
            }
        }
    }
    Ok(Exit::Ok)
}
