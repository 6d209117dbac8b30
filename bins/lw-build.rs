//! lw-build: build a project's layered sandbox image, only the layers whose inputs changed.
//!
//! Contract: reads `.loopwright/runtime/runtime.conf` in the project (the
//! nearest directory at or above the current one that has it, or `-C DIR`),
//! computes every layer's tag from the hash of its declared inputs, and builds
//! the missing ones through the container engine, in order.  Prints one line
//! per layer on stdout: `LAYER TAG cached|built`.  Nothing is tagged unless its
//! build succeeded, so a failed run is simply retried by the next one.
//!
//! `--print-tag` prints the final layer's tag without building; `--explain`
//! says, per layer, whether it is cached, its inputs and what changed since
//! the image it would replace.  `init` writes the default runtime.
//!
//! Exit status: 0 done; 64 usage; 65 a build step failed (its output shown);
//! 66 a declared input or the `from` image is missing; 69 the engine cannot be
//! reached; 73 `init` would overwrite a file; 78 the runtime definition is
//! wrong (the line is named), including a Dockerfile reading an undeclared file.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use loopwright::agent;
use loopwright::cli::out_err;
use loopwright::engine::{BuildEvent, DockerEngine};
use loopwright::error::{Error, Exit, Result};
use loopwright::image::{self, BuildOptions, InputKind, Layer, LayerResult, Runtime};
use serde_json::json;

const PROG: &str = "lw-build";

/// Build the layered sandbox image of a project, rebuilding only layers whose declared inputs changed.
#[derive(Parser, Debug)]
#[command(name = "lw-build", version, args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Run as if started in DIR (the project root or below it).
    #[arg(short = 'C', long = "directory", value_name = "DIR", global = true)]
    dir: Option<PathBuf>,
    /// Say for each layer its tag, cached or to build, its inputs and what changed; build nothing.
    #[arg(long, conflicts_with = "print_tag")]
    explain: bool,
    /// Print only the final layer's tag; build nothing.
    #[arg(long)]
    print_tag: bool,
    /// Stream build output to standard error.
    #[arg(short, long)]
    verbose: bool,
    /// Write JSON Lines (one object per layer, with a "type" field) instead of text.
    #[arg(long)]
    json: bool,
    /// Also build the agent layer of this kit (repeatable; lw-sandbox kits lists them).
    #[arg(long, value_name = "KIT")]
    agent: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write the default runtime definition into .loopwright/runtime/.
    Init {
        /// The image the first layer starts from.
        #[arg(long, value_name = "IMAGE", default_value = "debian:bookworm-slim")]
        from: String,
        /// Replace existing files of the default runtime.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    loopwright::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let start = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| Error::io("cannot read", Path::new("."), e))?,
    };
    if let Some(Cmd::Init { from, force }) = &args.cmd {
        return init(&start, from, *force, out);
    }
    let root = image::find_root(&start).ok_or_else(|| {
        Error::new(
            Exit::NoInput,
            format!(
                "no {} in '{}' or above; run 'lw-build init' in the project root",
                image::RUNTIME_FILE,
                start.display()
            ),
        )
    })?;
    let runtime = Runtime::load(&root)?;
    // Named kits are checked before anything is built (64 unknown, 78 bad).
    let kits = args
        .agent
        .iter()
        .map(|n| agent::kit::find(Some(&root), n))
        .collect::<Result<Vec<_>>>()?;
    let engine = DockerEngine::connect()?;
    let mut plan = runtime.plan(&engine)?;
    if args.print_tag {
        let line = if args.json {
            json!({"type": "tag", "tag": plan.final_tag()}).to_string()
        } else {
            plan.final_tag().to_string()
        };
        writeln!(out, "{line}").map_err(out_err)?;
        return Ok(Exit::Ok);
    }
    if args.explain {
        for layer in &plan.layers {
            explain(&engine, layer, args.json, out)?;
        }
        return Ok(Exit::Ok);
    }
    let mut progress = Progress::new(args.verbose);
    let results = {
        let progress = std::cell::RefCell::new(&mut progress);
        let mut on_event = |l: &Layer, ev: &BuildEvent| progress.borrow_mut().event(l, ev);
        let mut on_start = |l: &Layer| progress.borrow_mut().start(l);
        image::build(
            &engine,
            &mut plan,
            &mut BuildOptions {
                on_event: &mut on_event,
                on_start: &mut on_start,
            },
        )
    };
    progress.clear();
    let results = results?;
    for (layer, r) in plan.layers.iter().zip(&results) {
        let (state, id) = match r {
            LayerResult::Cached(id) => ("cached", id),
            LayerResult::Built(id) => ("built", id),
        };
        let line = if args.json {
            json!({"type": "layer", "layer": layer.def.name, "tag": layer.tag, "state": state, "id": id}).to_string()
        } else {
            format!("{} {} {state}", layer.def.name, layer.tag)
        };
        writeln!(out, "{line}").map_err(out_err)?;
    }
    for kit in &kits {
        let name = &kit.name;
        let first = plan
            .layers
            .first()
            .expect("a runtime definition has at least one layer")
            .tag
            .clone();
        let planned = agent::layer::plan(&engine, &runtime.image, kit, &first, plan.final_tag())?;
        let verbose = args.verbose;
        let (_, built) = agent::layer::ensure(
            &engine,
            &planned,
            &mut |p| eprintln!("{PROG}: building {}", p.tag),
            &mut |ev| {
                if let (true, BuildEvent::Output(s)) = (verbose, &ev) {
                    eprint!("{s}");
                }
            },
        )?;
        for (p, b, layer) in [
            (&planned.0, built[0], format!("agent-{name}-cli")),
            (&planned.1, built[1], format!("agent-{name}")),
        ] {
            let state = if b { "built" } else { "cached" };
            let line = if args.json {
                json!({"type": "layer", "layer": layer, "tag": p.tag, "state": state}).to_string()
            } else {
                format!("{layer} {} {state}", p.tag)
            };
            writeln!(out, "{line}").map_err(out_err)?;
        }
    }
    Ok(Exit::Ok)
}

fn init(dir: &Path, from: &str, force: bool, out: &mut dyn Write) -> Result<Exit> {
    let deps: Vec<String> = image::KNOWN_DEPS_FILES
        .iter()
        .filter(|f| dir.join(f).is_file())
        .map(|f| f.to_string())
        .collect();
    for path in image::init(dir, from, &deps, force)? {
        writeln!(out, "{path}").map_err(out_err)?;
    }
    Ok(Exit::Ok)
}

fn explain(engine: &DockerEngine, layer: &Layer, as_json: bool, out: &mut dyn Write) -> Result<()> {
    let replaces = if layer.cached() {
        None
    } else {
        image::explain(engine, layer)?.replaces
    };
    let inputs = layer.files.iter().filter(|f| f.kind != InputKind::Dir);
    if as_json {
        let v = json!({
            "type": "explain",
            "layer": layer.def.name,
            "tag": layer.tag,
            "state": if layer.cached() { "cached" } else { "to-build" },
            "parent": layer.parent,
            "provider": layer.def.provider.as_ref().map(|p| p.describe()),
            "dockerfile": layer.dockerfile.path,
            "inputs": inputs.map(|f| json!({"path": f.path, "mode": format!("{:o}", f.mode), "sha256": f.sha256})).collect::<Vec<_>>(),
            "replaces": replaces.as_ref().map(|(name, _)| name),
            "changes": replaces.as_ref().map(|(_, c)| c.iter().map(|c| c.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
        });
        return writeln!(out, "{v}").map_err(out_err);
    }
    let state = if layer.cached() { "cached" } else { "to build" };
    let mut text = format!("{} {} {state}\n", layer.def.name, layer.tag);
    text += &format!("  parent {}\n", layer.parent);
    if let Some(p) = &layer.def.provider {
        text += &format!("  provider {}\n", p.describe());
    }
    text += &format!("  dockerfile {}\n", layer.dockerfile.path);
    for f in inputs {
        text += &format!("  input {} {:o} {}\n", f.path, f.mode, &f.sha256[..12]);
    }
    if !layer.cached() {
        match replaces {
            None => text += "  replaces nothing (no earlier image of this layer)\n",
            Some((name, changes)) => {
                text += &format!("  replaces {name}\n");
                for c in changes {
                    text += &format!("  changed {c}\n");
                }
            }
        }
    }
    out.write_all(text.as_bytes()).map_err(out_err)
}

/// Build feedback on standard error: every line with `-v`, one updating
/// status line on a terminal, nothing otherwise.
struct Progress {
    verbose: bool,
    tty: bool,
    dirty: bool,
}

impl Progress {
    fn new(verbose: bool) -> Self {
        Progress {
            verbose,
            tty: std::io::stderr().is_terminal(),
            dirty: false,
        }
    }

    fn start(&mut self, l: &Layer) {
        if self.verbose || self.tty {
            self.clear();
            eprintln!("{PROG}: building {} as {}", l.def.name, l.tag);
        }
    }

    fn event(&mut self, l: &Layer, ev: &BuildEvent) {
        let text = match ev {
            BuildEvent::Output(s) | BuildEvent::Status(s) => s,
        };
        if self.verbose {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(text.as_bytes());
            if !text.ends_with('\n') && matches!(ev, BuildEvent::Status(_)) {
                let _ = e.write_all(b"\n");
            }
        } else if self.tty {
            let Some(step) = text.lines().find(|s| s.starts_with("Step ")) else {
                return;
            };
            let line: String = format!("{PROG}: {}: {step}", l.def.name)
                .chars()
                .take(100)
                .collect();
            eprint!("\r\x1b[K{line}");
            self.dirty = true;
        }
    }

    fn clear(&mut self) {
        if self.dirty {
            eprint!("\r\x1b[K");
            self.dirty = false;
        }
    }
}
