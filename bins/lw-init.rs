//! lw-init: make a git repository ready for loopwright.
//!
//! Contract: finds the top of the git checkout around DIR, the stacks it
//! holds and the host's extra certificate authorities, picks the base image
//! (`--from`, else the first Debian image the engine already has), and
//! writes `.loopwright/` — the runtime lw-build(1) builds, a commented
//! config, the built-in policy to edit — plus the `.gitignore` line for the
//! cache; one path per line on stdout, what it found and what to run next on
//! stderr.  `--dry-run` prints what it would write and writes nothing.
//! Nothing is overwritten without `--force` (73, naming the file).  Not in a
//! git checkout: 66.  No `origin` remote: a warning with the fix, since
//! lw-mirror(1) needs one.  The plan and its files are lib/init.rs.
//!
//! `--check` writes nothing: it runs the project's detected test command
//! once in a throwaway sandbox of the built image, network off, and reports
//! on stdout `pass`/`fail`, the command, its exit status, the time and the
//! output's last lines; 0 when the tests pass, 1 when they fail, 66 when no
//! test command is found or lw init has not run, 69 when the sandbox cannot
//! be made (the image not built).  lib/init/check.rs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use base::cli::out_err;
use base::{Error, Exit, Result};
use clap::{Parser, ValueEnum};
use engine::{Images, connect_docker};
use loopwright::init::{self, Options, check, devcontainer};

const PROG: &str = "lw-init";

/// Make a git repository ready for loopwright: write .loopwright/ to fit its stack
#[derive(Parser, Debug)]
#[command(name = "lw-init", version, max_term_width = 100)]
struct Args {
    /// Print what would be written; write nothing
    #[arg(long)]
    dry_run: bool,

    /// The image the base layer starts from [default: debian:bookworm-slim,
    /// else the first Debian image the engine has]
    #[arg(long, value_name = "IMAGE")]
    from: Option<String>,

    /// The devcontainer configuration to start from, when the repository
    /// has several [default: the only one]
    #[arg(long, value_name = "PATH", conflicts_with = "no_devcontainer")]
    devcontainer: Option<PathBuf>,

    /// Ignore the repository's devcontainer configuration; detect the stack
    #[arg(long)]
    no_devcontainer: bool,

    /// A host variable the devcontainer configuration may read as
    /// ${localEnv:NAME}; its value is written into the runtime (repeatable)
    #[arg(long, value_name = "NAME")]
    local_env: Vec<String>,

    /// A file the lifecycle commands read, declared as a deps layer input
    /// beside the lockfiles found (repeatable)
    #[arg(long, value_name = "PATH")]
    input: Vec<String>,

    /// Replace the files lw init writes when they exist
    #[arg(long)]
    force: bool,

    /// The host's extra certificate authorities (/usr/local/share/ca-certificates):
    /// copied into every build (build.ca = host), or left out
    #[arg(long, value_enum, default_value = "host", value_name = "WHICH")]
    ca: Ca,

    /// Write nothing; run the project's test command once in a throwaway
    /// sandbox of the built image, network off, and report it (exit 1 when
    /// the tests fail)
    #[arg(long, conflicts_with_all = ["dry_run", "force", "from"])]
    check: bool,

    /// With --check: end the tests after this many seconds
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 1800,
        requires = "check"
    )]
    timeout: u64,

    /// A directory inside the repository [default: the current one]
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Ca {
    Host,
    None,
}

/// Base images tried in the engine, in order, when `--from` is not given.
const BASES: &[&str] = &[
    "debian:bookworm-slim",
    "debian:bookworm",
    "debian:12-slim",
    "debian:12",
    "debian:stable-slim",
    "loopwright/test-debian:latest",
];

fn main() -> ExitCode {
    // The tests' failing is not lw init's: 1, not one of its 64-78.
    let failed = std::cell::Cell::new(false);
    let code = base::cli::run_main(PROG, |args: Args, out| {
        if args.check {
            let (exit, passed) = check(&args, out)?;
            failed.set(!passed);
            return Ok(exit);
        }
        run(args, out)
    });
    if failed.get() && code == ExitCode::SUCCESS {
        return ExitCode::from(check::TESTS_FAILED);
    }
    code
}

fn say(m: &str) {
    eprintln!("{PROG}: {m}");
}

/// The top of the git checkout around DIR (66 when there is none).
fn top(args: &Args) -> Result<PathBuf> {
    let start = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| Error::io("cannot read", Path::new("."), e))?,
    };
    match base::config::find_checkout(&start) {
        Some((top, _)) => Ok(top),
        None => Err(Error::new(
            Exit::NoInput,
            format!(
                "'{}' is not in a git repository; run 'git init' there (and 'git remote add origin URL') first",
                start.display()
            ),
        )),
    }
}

/// `--check`: the report on `out`; whether the tests passed.
fn check(args: &Args, out: &mut dyn Write) -> Result<(Exit, bool)> {
    let top = top(args)?;
    let conf = top.join(wall::image::RUNTIME_DIR).join("runtime.conf");
    if !conf.is_file() {
        return Err(Error::new(
            Exit::NoInput,
            format!(
                "no '{}'; run lw init, then lw-mirror sync && lw-build, first",
                conf.display()
            ),
        ));
    }
    let stacks = init::detect(&top);
    let Some(command) = check::test_command(&top, &stacks) else {
        return Err(Error::new(
            Exit::NoInput,
            "no test command found (npm's test script, pytest for python, cargo test, go test); run the tests with lw-sandbox exec",
        ));
    };
    // The sandbox is made in LW_ROOT, else the project's own mailbox root
    // (what lw-init(1)'s example uses).
    let root = std::env::var_os("LW_ROOT")
        .filter(|r| !r.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| top.join(".loopwright/cache/mailbox"));
    let bins = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    say(&format!(
        "running '{command}' in a new sandbox, network off (at most {} s)",
        args.timeout
    ));
    let outcome = check::Check {
        bins,
        top: &top,
        root: &root,
        command,
        timeout: Duration::from_secs(args.timeout),
    }
    .run()?;
    out.write_all(outcome.report().as_bytes())
        .map_err(out_err)?;
    Ok((Exit::Ok, outcome.passed()))
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let top = top(&args)?;
    let dc = if args.no_devcontainer {
        None
    } else {
        devcontainer::chosen(
            &top,
            args.devcontainer.as_deref(),
            &args.local_env,
            args.from.as_deref(),
        )?
    };
    // What it takes and refuses, then the refusals that stop it (78).
    if let Some((m, _)) = &dc {
        for line in devcontainer::report(m) {
            say(&line);
        }
        if let Some(e) = devcontainer::refusal_error(m) {
            return Err(e);
        }
    }
    let from = args
        .from
        .clone()
        .or_else(|| dc.as_ref().and_then(|(m, _)| m.base_image()))
        .unwrap_or_else(pick_base);
    let inputs = devcontainer::inputs(&top, &args.input)?;
    let authorities = match args.ca {
        Ca::Host => init::host_authorities(Path::new(init::HOST_CA_DIR)),
        Ca::None => vec![],
    };
    let plan = init::plan(
        &top,
        &Options {
            from: from.clone(),
            authorities: authorities.clone(),
            devcontainer: dc,
            inputs,
        },
    )?;
    for s in &plan.stacks {
        say(&format!("found {} ({})", s.name, s.evidence));
    }
    let from_devcontainer = plan.files.iter().any(|f| f.path == devcontainer::RECORD);
    if plan.stacks.is_empty() && !from_devcontainer {
        say(
            "found no stack (Cargo.toml, package.json, pyproject.toml, requirements*.txt, go.mod); the toolchain layer installs nothing yet",
        );
    }
    match &plan.mise {
        _ if from_devcontainer => {
            say("toolchain: the devcontainer configuration's image and features")
        }
        Some(f) => say(&format!("toolchain: the tools of {f}, through mise")),
        None => {
            say("toolchain: Debian's packages for the stacks found");
            // What a declaration that cannot be had takes instead (lw-build
            // and lw doctor say it again).
            let names: Vec<&str> = plan.stacks.iter().map(|s| s.name).collect();
            for d in init::versions::declared(&top, &names) {
                if let Some(n) = init::versions::resolve(&d).note {
                    say(&format!("toolchain: {n}"));
                }
            }
        }
    }
    say(&format!("base image: {from}"));
    if !authorities.is_empty() {
        say(&format!(
            "copied {} certificate authorit{} from {} into the base layer (build.ca = host: lw-build copies them again when they change)",
            authorities.len(),
            if authorities.len() == 1 { "y" } else { "ies" },
            init::HOST_CA_DIR
        ));
    }
    if !has_origin(&top) {
        say(
            "warning: no remote 'origin'; lw-mirror needs one: git remote add origin URL (or set mirror.url in .loopwright/config)",
        );
    }
    if args.dry_run {
        for f in &plan.files {
            let verb = if top.join(&f.path).exists() {
                "would replace"
            } else {
                "would write"
            };
            writeln!(out, "{verb} {}", f.path).map_err(out_err)?;
        }
        if plan.gitignore {
            writeln!(out, "would add {} to .gitignore", init::GITIGNORE_LINE).map_err(out_err)?;
        }
        return Ok(Exit::Ok);
    }
    for p in plan.write(args.force)? {
        writeln!(out, "{p}").map_err(out_err)?;
    }
    say("next: lw-mirror sync && lw-build, then lw-sandbox create NAME --branch BRANCH");
    Ok(Exit::Ok)
}

/// The first of [`BASES`] the engine has, else the first of them (lw-build
/// then says it is missing); an engine that cannot be reached is not
/// lw init's concern.  The engine is chosen as every command chooses it
/// (engine::select): the project has no `engine.host` yet, so `DOCKER_HOST`
/// or the local one.
fn pick_base() -> String {
    let found = connect_docker(None).ok().and_then(|e| {
        BASES
            .iter()
            .find(|b| e.image(b).ok().flatten().is_some())
            .map(|b| b.to_string())
    });
    found.unwrap_or_else(|| BASES[0].to_string())
}

fn has_origin(top: &Path) -> bool {
    let mut c = repo::git::command(Some(top));
    c.args(["config", "--get", "remote.origin.url"]);
    repo::git::output(&mut c, "read the origin remote").is_ok_and(|o| o.status.success())
}
