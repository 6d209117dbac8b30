//! lw-sandbox: one hardened container per task, holding its own clone.
//!
//! Contract: `create` makes a sandbox from the project's current image
//! (lw-build) with its clone on the task's branch, registered for the
//! mediator, and prints its name; `push` sends that branch, and nothing
//! else, to the upstream; `exec` runs a command in it and exits with the
//! command's status (128+n when signal n ended it); `shell` attaches a
//! terminal; `ls`, `port`, `stop`, `start`, `rm` and `gc` manage the rest.
//! With `--network egress` the sandbox reaches only its allow-list's
//! HOST:PORT pairs, through a proxy of its own (crates/wall/src/egress/); `logs --egress`
//! prints what that proxy refused.  `create --agent KIT` installs a coding
//! agent's CLI (an image layer above deps) and gives it a model proxy that
//! holds its key; `run` runs it headless with a transcript and exits with
//! its status; `kits` lists the kits (crates/agent/).
//! The sandboxes of a mailbox root (`--root`, else `$LW_ROOT`) are that
//! root's.  The library (lib/sandbox/) holds the logic and the contract;
//! man/lw-sandbox.1 documents both.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use agent::run::RunOptions;
use agent::{Credential, kit};
use base::cli::{self, out_err};
use base::{Error, Exit};
use clap::{Parser, Subcommand, ValueEnum};
use engine::Engines;
use loopwright::sandbox::{self, CreateOptions, Network, Sandboxes};
use mailbox::layout::Root;

const PROG: &str = "lw-sandbox";

/// One hardened container per task, holding its own clone of the repository.
#[derive(Parser, Debug)]
#[command(name = "lw-sandbox", version)]
struct Args {
    /// The mailbox root [default: $LW_ROOT]
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,
    /// The project's checkout [default: the git checkout holding the current directory]
    #[arg(long, global = true, value_name = "DIR")]
    project: Option<PathBuf>,
    /// The mirror [default: $LW_MIRROR, then the project's, as lw-mirror finds it]
    #[arg(long, global = true, value_name = "PATH")]
    mirror: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Net {
    None,
    Bridge,
    Egress,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Cred {
    Proxy,
    Env,
}

// Parsed once per run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// List the agent kits: name, package@version, key variable, source
    Kits {
        /// Print JSON Lines records
        #[arg(long)]
        json: bool,
    },
    /// Run the sandbox's agent headless on PROMPT; exit with its status
    Run {
        name: String,
        /// Continue the agent's last conversation in this sandbox
        #[arg(long)]
        resume: bool,
        /// Print the transcript's JSON Lines instead of a summary
        #[arg(long)]
        json: bool,
        /// Stop the agent after DUR (90s, 15m, 1h); exit 124
        #[arg(long, value_name = "DUR")]
        timeout: Option<String>,
        #[arg(required = true, last = true, value_name = "PROMPT")]
        prompt: Vec<String>,
    },
    /// Create a sandbox with its clone on BRANCH; print its name
    Create {
        name: String,
        /// The task's branch (made from --from when the upstream lacks it)
        #[arg(short, long, value_name = "BRANCH")]
        branch: String,
        /// Where a new branch starts [default: the upstream's HEAD]
        #[arg(long, value_name = "REF")]
        from: Option<String>,
        /// Paths or contracts the task owns, for the mediator (repeatable)
        #[arg(long, value_name = "GLOB")]
        scope: Vec<String>,
        /// A container port to publish on 127.0.0.1 at a leased port (repeatable)
        #[arg(short, long, value_name = "PORT")]
        port: Vec<String>,
        /// A secret, allowed by sandbox.secrets, from this environment (repeatable)
        #[arg(long, value_name = "NAME")]
        secret: Vec<String>,
        /// none: loopback only; bridge: the host's networks (warned);
        /// egress: only the allow-list's HOST:PORT pairs, through a proxy
        /// [default: none, egress with --agent]
        #[arg(long, value_enum)]
        network: Option<Net>,
        /// Install and set up this agent kit (lw-sandbox kits lists them)
        #[arg(long, value_name = "KIT")]
        agent: Option<String>,
        /// The OCI runtime: runc (the host's kernel) or runsc (gVisor, a
        /// user-space kernel) [default: sandbox.runtime, else the engine's]
        #[arg(long, value_name = "NAME")]
        runtime: Option<String>,
        /// proxy: the model proxy holds the key; env: the key is in the
        /// agent's environment, inside the sandbox (weaker, warned)
        #[arg(long, value_enum, default_value = "proxy", requires = "agent")]
        credential: Cred,
        /// Add HOST:PORT to the project's egress allow-list (repeatable)
        #[arg(long, value_name = "HOST:PORT")]
        allow: Vec<String>,
        /// Attach to this shared service's network; it answers to NAME (repeatable; lw-service)
        #[arg(long, value_name = "NAME")]
        service: Vec<String>,
        /// Run this image instead of the project's current one
        #[arg(long, value_name = "REF")]
        image: Option<String>,
        /// When the current image is not built, use the newest earlier one
        #[arg(long)]
        allow_stale: bool,
        /// Do not fetch into the mirror first (it must exist)
        #[arg(long)]
        no_fetch: bool,
        /// Print a JSON Lines record instead of the name
        #[arg(long)]
        json: bool,
        /// Say on standard error how long each step took
        #[arg(short, long)]
        verbose: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Push the sandbox's branch, and nothing else, to the upstream
    Push {
        name: String,
        /// Replace the upstream branch even when it is not an ancestor
        #[arg(long)]
        force: bool,
        /// Then find or open the branch's pull request (a draft) [default: sandbox.push-pr]
        #[arg(long, conflicts_with = "no_pr")]
        pr: bool,
        /// Do not open a pull request, whatever sandbox.push-pr says
        #[arg(long)]
        no_pr: bool,
        /// With the pull request: mark it ready for review, not a draft
        #[arg(long)]
        ready: bool,
        /// Print a JSON Lines record
        #[arg(long)]
        json: bool,
    },
    /// Run a command in the sandbox; exit with its status
    Exec {
        name: String,
        /// Allocate a terminal
        #[arg(short, long)]
        tty: bool,
        /// The directory to run in [default: /work/repo]
        #[arg(short, long, value_name = "DIR")]
        workdir: Option<String>,
        #[arg(required = true, last = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// An interactive shell in the sandbox's clone
    Shell { name: String },
    /// List sandboxes: name, branch, state, ports, network, age, unpushed commits, services, agent
    Ls {
        /// Print JSON Lines records
        #[arg(long)]
        json: bool,
        /// Leave out the header line (for scripts that read the columns)
        #[arg(long, conflicts_with = "json")]
        no_header: bool,
    },
    /// Print a sandbox's published ports: CONTAINER-PORT -> 127.0.0.1:HOST-PORT
    Port { name: String },
    /// Stop sandboxes (their workspace stays)
    Stop {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Start stopped sandboxes, writing their secrets again
    Start {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Remove sandboxes; refused while work would be lost
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
        /// Remove even with unpushed commits or uncommitted changes
        #[arg(short, long)]
        force: bool,
    },
    /// Print what a sandbox's egress proxy refused: TIME CLIENT METHOD HOST:PORT
    Logs {
        name: String,
        /// The egress proxy's denials (the only log there is so far)
        #[arg(long, required = true)]
        egress: bool,
        /// Print JSON Lines records
        #[arg(long)]
        json: bool,
    },
    /// Reclaim what crashed creates and vanished containers left behind
    Gc,
    /// Carry mail between remote-engine sandboxes and the root, until stopped
    Courier {
        /// One pass, then exit
        #[arg(long, conflicts_with_all = ["ensure", "stop"])]
        once: bool,
        /// How often the outboxes of sandboxes without a live ring are looked at, in milliseconds
        #[arg(long, value_name = "MS", default_value = "200")]
        interval: u64,
        /// Keep no ring: look at every outbox each interval
        #[arg(long, conflicts_with_all = ["ensure", "stop", "once", "detached"])]
        poll: bool,
        /// Start the root's detached courier unless one runs; print its pid
        #[arg(long, conflicts_with = "stop")]
        ensure: bool,
        /// Stop the root's courier and wait until it is gone
        #[arg(long)]
        stop: bool,
        /// Run as the root's detached courier (what --ensure starts)
        #[arg(long, hide = true)]
        detached: bool,
    },
}

/// `create`'s limits (over `.loopwright/config`'s) and install rule.
#[derive(clap::Args, Debug)]
struct LimitArgs {
    /// CPUs it may use, e.g. 0.5 [default: sandbox.cpus, else half the host's]
    #[arg(long, value_name = "N")]
    cpus: Option<String>,
    /// Memory limit, e.g. 2g [default: sandbox.memory]
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// Process limit [default: sandbox.pids]
    #[arg(long, value_name = "N")]
    pids: Option<String>,
    /// Disk quota of its workspace, e.g. 8g [default: sandbox.disk]
    #[arg(long, value_name = "SIZE")]
    disk: Option<String>,
    /// Disk quota of its mail dir, e.g. 64m [default: sandbox.mail-disk]
    #[arg(long, value_name = "SIZE")]
    mail_disk: Option<String>,
    /// Run the branch's install script when it differs from the image's
    #[arg(long)]
    allow_install_change: bool,
}

impl LimitArgs {
    fn overrides(&self) -> sandbox::limits::Overrides {
        sandbox::limits::Overrides {
            cpus: self.cpus.clone(),
            memory: self.memory.clone(),
            pids: self.pids.clone(),
            disk: self.disk.clone(),
            mail_disk: self.mail_disk.clone(),
        }
    }
}

fn main() -> ExitCode {
    let args: Args = match cli::parse_args(PROG) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if matches!(
        args.cmd,
        Cmd::Exec { .. } | Cmd::Shell { .. } | Cmd::Run { .. }
    ) {
        return match exec(args) {
            Ok(code) => ExitCode::from(code),
            Err(e) => {
                eprintln!("{PROG}: {e}");
                ExitCode::from(e.exit.code())
            }
        };
    }
    cli::main_with(PROG, |out| run(args, out))
}

fn root_of(args: &Args) -> Result<Root, Error> {
    Root::resolve(args.root.as_deref())
}

/// The engines the project's settings choose (engine::select: the runner,
/// Docker or Kubernetes, and the builder paired with it).
fn connect(args: &Args) -> Result<Engines, Error> {
    let start = match &args.project {
        Some(p) => p.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    };
    // A configuration that does not parse (an unknown key) is refused here,
    // before any engine is reached: 78, not a 69 that hides it.
    let project = wall::config::project(&start)?;
    Engines::connect(project.as_ref().map(|p| &p.config))
}

/// What can be refused before any engine is reached: a bad argument is a
/// usage error (64) whether or not an engine is up.
fn check_args(cmd: &Cmd) -> Result<(), Error> {
    if let Cmd::Create { scope, .. } = cmd {
        for s in scope {
            mailbox::policy::check_scope(s)?;
        }
    }
    Ok(())
}

fn warn(msg: &str) {
    eprintln!("{PROG}: warning: {msg}");
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit, Error> {
    if let Cmd::Kits { json } = args.cmd {
        kits(&args, json, out)?;
        return Ok(Exit::Ok);
    }
    let root = root_of(&args)?;
    if let Cmd::Courier {
        ensure,
        stop,
        interval,
        ..
    } = args.cmd
        && (ensure || stop)
    {
        // Neither needs the engine: the courier it starts connects itself.
        let l = sandbox::courier::control(&root, args.project.as_deref(), interval, stop)?;
        writeln!(out, "{l}").map_err(out_err)?;
        return Ok(Exit::Ok);
    }
    check_args(&args.cmd)?;
    let engines = connect(&args)?;
    let sb = Sandboxes::new(root, engines.pair());
    let line = |out: &mut dyn Write, s: &str| writeln!(out, "{s}").map_err(out_err);
    match args.cmd {
        cmd @ Cmd::Create { .. } => {
            create(
                &sb,
                args.project.as_deref(),
                args.mirror.as_deref(),
                cmd,
                out,
            )?;
        }
        Cmd::Push {
            name,
            force,
            pr,
            no_pr,
            ready,
            json,
        } => {
            let pr = !no_pr && (pr || ready || sb.push_pr_by_default(&name)?);
            push(&sb, &name, force, (pr, ready), json, out)?
        }
        Cmd::Ls { json, no_header } => ls(&sb, json, no_header, out)?,
        Cmd::Port { name } => {
            for p in sb.ports(&name)? {
                line(
                    out,
                    &format!("{} -> {}:{}", p.container, p.host_ip, p.host_port),
                )?;
            }
        }
        Cmd::Stop { names } => {
            for n in names {
                line(out, &sb.stop(&n)?.name)?;
            }
        }
        Cmd::Start { names } => {
            for n in names {
                line(out, &sb.start(&n, &mut |m| warn(m))?.name)?;
            }
        }
        Cmd::Rm { names, force } => rm(&sb, &names, force, out)?,
        Cmd::Logs {
            name,
            egress: _,
            json,
        } => {
            for d in sb.egress_denials(&name)? {
                line(out, &denial_line(&name, &d, json))?;
            }
        }
        Cmd::Gc => {
            let mut lines = Vec::new();
            sb.gc(&mut |what| lines.push(what.to_string()))?;
            for l in lines {
                line(out, &l)?;
            }
        }
        Cmd::Courier {
            detached: true,
            interval,
            ..
        } => sandbox::courier::detached(&sb, std::time::Duration::from_millis(interval.max(1)))?,
        Cmd::Courier {
            once,
            interval,
            poll,
            ..
        } => sandbox::courier::foreground(&sb, once, !poll, interval, out, &mut |m| warn(m))?,
        Cmd::Kits { .. } => unreachable!("kits needs neither a root nor an engine"),
        Cmd::Exec { .. } | Cmd::Shell { .. } | Cmd::Run { .. } => {
            unreachable!("exec, shell and run are run by main")
        }
    }
    Ok(Exit::Ok)
}

/// `kits`: the toolkit's and the project's; no root, no engine.
fn kits(args: &Args, json: bool, out: &mut dyn Write) -> Result<(), Error> {
    let (project, _) = sandbox::find_project(args.project.as_deref(), args.mirror.as_deref())
        .unwrap_or((None, PathBuf::new()));
    for k in kit::all(project.as_ref().map(|p| p.top.as_path()))? {
        writeln!(out, "{}", kit_line(&k, json)).map_err(out_err)?;
    }
    Ok(())
}

/// `ls`: listed first, so that an engine that fails leaves no header behind.
fn ls(sb: &Sandboxes, json: bool, no_header: bool, out: &mut dyn Write) -> Result<(), Error> {
    let listed = sb.list(true)?;
    if !json && !no_header {
        writeln!(out, "{}", sandbox::LS_HEADER).map_err(out_err)?;
    }
    for s in listed {
        let l = if json { s.json().to_string() } else { s.line() };
        writeln!(out, "{l}").map_err(out_err)?;
    }
    Ok(())
}

/// `rm`: each name once removed; an archive kept is warned about.
fn rm(sb: &Sandboxes, names: &[String], force: bool, out: &mut dyn Write) -> Result<(), Error> {
    for n in names {
        sb.remove(n, force, &mut |what| {
            if what.starts_with("archived ") {
                warn(what);
            }
        })?;
        writeln!(out, "{n}").map_err(out_err)?;
    }
    Ok(())
}

/// `push`: the sandbox's branch to the upstream; its line (or JSON
/// record), then with `pr.0` its pull request's (crates/sync/src/pr), out of draft
/// with `pr.1`.
fn push(
    sb: &Sandboxes,
    name: &str,
    force: bool,
    pr: (bool, bool),
    json: bool,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let me = std::env::current_exe()
        .map_err(|e| Error::new(Exit::Software, "cannot find lw-sandbox itself").with_source(e))?;
    let p = sb.push(name, &me, force, &base::cli::stderr_report(PROG))?;
    let line = |out: &mut dyn Write, s: &str| writeln!(out, "{s}").map_err(out_err);
    line(
        out,
        &if json {
            p.json(name).to_string()
        } else {
            format!("{} {} {}", p.branch, p.commit, p.outcome)
        },
    )?;
    if pr.0 {
        let o = sb.open_pull_request(name, &p.commit, pr.1)?;
        let draft = if o.draft { "draft" } else { "ready" };
        line(
            out,
            &if json {
                o.json(name).to_string()
            } else {
                format!("pull-request {} {} {draft} {}", o.number, o.url, o.outcome)
            },
        )?;
    }
    Ok(())
}

/// One refused request of `logs --egress`.
fn denial_line(name: &str, d: &wall::egress::Request, json: bool) -> String {
    if json {
        serde_json::json!({
            "type": "denial", "sandbox": name, "time": d.time, "client": d.client, "method": d.method,
            "host": d.host, "port": d.port, "status": d.status, "result": d.result,
        })
        .to_string()
    } else {
        // What the sandbox asked for: its control characters shown.
        base::visible::visible_line(&format!(
            "{} {} {} {}:{}",
            d.time, d.client, d.method, d.host, d.port
        ))
        .into_owned()
    }
}

/// One kit of `kits`.
fn kit_line(k: &kit::Kit, json: bool) -> String {
    if json {
        serde_json::json!({
            "type": "kit", "name": k.name, "package": k.package, "version": k.version,
            "node": k.node, "upstream": k.upstream, "endpoint": k.endpoint(),
            "key_env": k.key_env, "context_file": k.context_file, "state_dir": k.state_dir,
            "mcp": k.mcp.as_str(), "source": k.source,
        })
        .to_string()
    } else {
        format!(
            "{}\t{}@{}\t{}\t{}",
            k.name, k.package, k.version, k.key_env, k.source
        )
    }
}

/// `create`: makes the sandbox, prints its name (or its JSON record).
fn create(
    sb: &Sandboxes,
    project: Option<&std::path::Path>,
    mirror: Option<&std::path::Path>,
    cmd: Cmd,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let Cmd::Create {
        name,
        branch,
        from,
        scope,
        port,
        secret,
        network,
        agent,
        runtime,
        credential,
        allow,
        service,
        image,
        allow_stale,
        no_fetch,
        json,
        verbose,
        limits,
    } = cmd
    else {
        unreachable!("create is given a create command")
    };
    let line = |out: &mut dyn Write, s: &str| writeln!(out, "{s}").map_err(out_err);
    let project_flag = project;
    let (project, mirror_path) = sandbox::find_project(project, mirror)?;
    let bins = sandbox::mailbox_commands();
    let network = match network {
        None if agent.is_some() => Network::Egress,
        None | Some(Net::None) => Network::None,
        Some(Net::Bridge) => Network::Bridge,
        Some(Net::Egress) => Network::Egress,
    };
    let agent = agent.map(|k| {
        let c = match credential {
            Cred::Proxy => Credential::Proxy,
            Cred::Env => Credential::Env,
        };
        (k, c)
    });
    let opts = CreateOptions {
        name,
        branch,
        from,
        scope,
        ports: port,
        secrets: secret,
        network,
        allow,
        image,
        allow_stale,
        no_fetch,
        agent,
        allow_install_change: limits.allow_install_change,
        limits: limits.overrides(),
        services: service,
        runtime,
    };
    let c = sb.create(&opts, project.as_ref(), &mirror_path, &bins, &warn)?;
    if c.record.volume_mode {
        // Its mail moves only while a courier runs: one is made sure of.
        // The sandbox stands either way; `courier --ensure` tries again.
        if let Err(e) = sandbox::courier::ensure_from(&sb.root, project_flag, 200) {
            warn(&format!(
                "sandbox '{}' was made, but its mail does not move until a courier runs: {e}; run 'lw-sandbox courier --ensure'",
                c.record.name
            ));
        }
    }
    if verbose {
        eprintln!("{PROG}: {}", c.timings_line());
    }
    if json {
        line(
            out,
            &c.json(&sb.root.sandbox(&c.record.name).dir).to_string(),
        )?;
    } else {
        line(out, &c.record.name)?;
    }
    Ok(())
}

/// `exec` and `shell`: the command's status is ours.
fn exec(args: Args) -> Result<u8, Error> {
    let root = root_of(&args)?;
    let engines = connect(&args)?;
    let sb = Sandboxes::new(root, engines.pair());
    let code = match args.cmd {
        Cmd::Exec {
            name,
            tty,
            workdir,
            cmd,
        } => sb.attach(&name, cmd, tty, workdir)?,
        Cmd::Run {
            name,
            resume,
            json,
            timeout,
            prompt,
        } => {
            let timeout = match timeout {
                None => None,
                Some(t) => Some(base::config::parse_duration(&t).ok_or_else(|| {
                    Error::usage(format!("--timeout '{t}' is not a duration (90s, 15m, 1h)"))
                })?),
            };
            let opts = RunOptions {
                prompt: prompt.join(" "),
                resume,
                json,
                timeout,
            };
            let mut stdout = std::io::stdout().lock();
            let ran = sb.run_agent(&name, &opts, &mut stdout, &mut |m| warn(m))?;
            if !json {
                eprintln!("{PROG}: transcript {}", ran.transcript.display());
            }
            ran.status
        }
        Cmd::Shell { name } => {
            if !std::io::stdin().is_terminal() {
                return Err(Error::usage(
                    "shell needs a terminal; use: lw-sandbox exec NAME -- CMD",
                ));
            }
            sb.attach(&name, sandbox::login_shell(), true, None)?
        }
        _ => unreachable!("main routes only exec and shell here"),
    };
    Ok(u8::try_from(code).unwrap_or(if code < 0 { 128 } else { 255 }))
}
