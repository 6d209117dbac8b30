//! lw-build: build a project's layered sandbox image, only the layers whose inputs changed.
//!
//! Contract: reads `.loopwright/runtime/runtime.conf` in the project (the
//! nearest directory at or above the current one that has it, or `-C DIR`),
//! computes every layer's tag from the hash of its declared inputs, and builds
//! the missing ones through the container engine, in order.  Prints one line
//! per layer on stdout: `LAYER TAG cached|pulled|built`.  Nothing is tagged
//! unless its build succeeded, so a failed run is simply retried by the next one.
//!
//! With an image cache (`build.cache = HOST[:PORT]/REPO` in
//! `.loopwright/config`, or `--cache`), a missing layer is first pulled from
//! the cache by its input hash and built only when the cache lacks it; a
//! cached image whose recorded inputs differ is refused and built, with a
//! warning; a cache that cannot be reached is warned about and the build goes
//! on locally.  `push` and `pull` move every layer to and from the cache;
//! `save FILE` and `load FILE` carry them in one archive instead.
//!
//! `--print-tag` prints the final layer's tag without building; `--explain`
//! says, per layer, whether it is cached, would be pulled or built, its inputs
//! and what changed since the image it would replace.  `init` writes the
//! default runtime.
//!
//! Exit status: 0 done; 64 usage; 65 a build step failed (its output shown),
//! a pulled layer was refused (`pull`), or an archive is incomplete (`load`,
//! nothing loaded); 66 a declared input, the `from` image or a layer to push
//! or save is missing; 69 the engine, or for `push`/`pull` the cache, cannot be
//! reached; 73 `init` would overwrite a file; 77 the cache refused the
//! credentials; 78 the runtime definition or the cache setting is wrong, or
//! `.loopwright/config` holds an unknown key.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use base::cli::out_err;
use base::error::{Error, Exit, Result};
use base::visible::{visible, visible_line};
use clap::{Parser, Subcommand};
use engine::distribution::Client;
use engine::{BuildEvent, DockerEngine, connect_docker};
use serde_json::json;
use wall::image::cache::{self, Fetch, Probe, Puller, Push};
use wall::image::{self, BuildOptions, InputKind, Layer, LayerResult, Plan, Runtime};

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
    #[arg(long, global = true)]
    json: bool,
    /// Also build the agent layer of this kit (repeatable; lw-sandbox kits lists them).
    #[arg(long, value_name = "KIT")]
    agent: Vec<String>,
    /// The image cache, HOST[:PORT]/REPO (default: build.cache in .loopwright/config; '' for none).
    #[arg(long, value_name = "REF", global = true)]
    cache: Option<String>,
    /// Trust the CA certificates in this PEM file for the cache (default: build.cache-ca, else the system's).
    #[arg(long, value_name = "FILE", global = true)]
    cache_ca: Option<PathBuf>,
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
    /// Push every layer to the image cache (each built first by lw-build).
    Push,
    /// Pull every missing layer from the image cache; build nothing.
    Pull,
    /// Write the layers and the `from` image, with their tags, into one archive FILE.
    Save {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Load an archive made by `lw-build save`, after checking it whole.
    Load {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    base::cli::run_main(PROG, run)
}

fn run(args: Args, out: &mut dyn Write) -> Result<Exit> {
    let start = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().map_err(|e| Error::io("cannot read", Path::new("."), e))?,
    };
    if let Some(Cmd::Init { from, force }) = &args.cmd {
        return init(&start, from, *force, out);
    }
    if let Some(Cmd::Load { file }) = &args.cmd {
        // Outside a project too: then DOCKER_HOST, else the local engine.
        let config = match image::find_root(&start) {
            Some(root) => Some(wall::config::load(&root)?),
            None => None,
        };
        return load(&connect_docker(config.as_ref())?, file, args.json, out);
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
    // The project's configuration is checked before anything is built or
    // the engine is reached: an unknown key is 78 naming it.
    let config = wall::config::load(&root)?;
    host_authorities(&root, &config)?;
    // The toolchain the project's declarations resolve to
    // (lib/init/versions.rs), rewritten from its files so that what the
    // toolchain layer installs, not how it is asked for, is its input; and
    // where a declaration cannot be had, what is taken instead.
    toolchain_versions(&root)?;
    let runtime = Runtime::load(&root)?;
    // Named kits are checked before anything is built (64 unknown, 78 bad).
    let kits = args
        .agent
        .iter()
        .map(|n| agent::kit::find(Some(&root), n))
        .collect::<Result<Vec<_>>>()?;
    // The image builder the project's settings choose (engine::select:
    // DOCKER_HOST, else engine.host, else the local engine), the one
    // lw-sandbox and lw-service pair with their runner.
    let engine = connect_docker(Some(&config))?;
    let mut plan = runtime.plan(&engine)?;
    let client = cache::configured(&root, args.cache.as_deref(), args.cache_ca.as_deref())?;
    match &args.cmd {
        Some(Cmd::Push) => return push(&engine, client.as_ref(), &plan, args.json, out),
        Some(Cmd::Pull) => return pull(&engine, client.as_ref(), &plan, args.json, out),
        Some(Cmd::Save { file }) => return save(&engine, &runtime, &plan, file, args.json, out),
        _ => {}
    }
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
        return explain_plan(&engine, client.as_ref(), &plan, args.json, out);
    }
    build(
        &engine,
        client.as_ref(),
        &mut plan,
        args.verbose,
        args.json,
        out,
    )?;
    for kit in &kits {
        build_kit(&engine, &runtime, &plan, kit, args.verbose, args.json, out)?;
    }
    Ok(Exit::Ok)
}

/// `build.ca = host`: the host's extra certificate authorities copied into
/// the base layer's inputs before the plan is made (lib/init.rs), so a new
/// or changed one rebuilds the image; `none` (or unset) leaves them out.
fn host_authorities(root: &Path, config: &base::config::Config) -> Result<()> {
    let path = root.join(base::config::FILE);
    match config.get(loopwright::init::KEY_CA) {
        None | Some("none") => Ok(()),
        Some("host") => {
            let cas = loopwright::init::host_authorities(Path::new(loopwright::init::HOST_CA_DIR));
            let changed = loopwright::init::sync_authorities(root, &cas)?;
            if changed > 0 {
                eprintln!(
                    "{PROG}: {} host certificate authorit{} copied into {} (build.ca = host)",
                    cas.len(),
                    if cas.len() == 1 { "y" } else { "ies" },
                    loopwright::init::HOST_CA_COPY
                );
            }
            Ok(())
        }
        Some(v) => Err(Error::config(format!(
            "'{} = {v}' in '{}' is neither 'host' nor 'none'",
            loopwright::init::KEY_CA,
            path.display()
        ))),
    }
}

/// `load FILE`: the archive checked, then loaded; prints the tags.
fn load(engine: &DockerEngine, file: &Path, as_json: bool, out: &mut dyn Write) -> Result<Exit> {
    for tag in image::archive::load_file(engine, file)? {
        let line = if as_json {
            json!({"type": "loaded", "tag": tag}).to_string()
        } else {
            tag
        };
        writeln!(out, "{line}").map_err(out_err)?;
    }
    Ok(Exit::Ok)
}

/// `--explain`: why each layer is cached or not, and what the cache holds.
fn explain_plan(
    engine: &DockerEngine,
    client: Option<&Client>,
    plan: &Plan,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit> {
    let mut online = false;
    if let Some(c) = client {
        match c.login(false) {
            Ok(()) => online = true,
            Err(e) if e.exit == Exit::Unavailable => {
                eprintln!("{PROG}: warning: {}; explaining a build without it", e.msg)
            }
            Err(e) => return Err(e),
        }
    }
    for layer in &plan.layers {
        let probe = match client {
            Some(c) if online && !layer.cached() => Some(cache::probe(c, layer)?),
            _ => None,
        };
        explain(engine, layer, probe, as_json, out)?;
    }
    Ok(Exit::Ok)
}

/// Rewrites toolchain.versions when what it resolves to changed, saying
/// so; says each declaration that cannot be had as asked (lw doctor says
/// it again).
fn toolchain_versions(root: &Path) -> Result<()> {
    use loopwright::init::versions;
    let resolved = match versions::sync(root)? {
        Some(r) => {
            let list: Vec<String> = r
                .iter()
                .map(|x| format!("{} {}", x.stack, x.toolchain))
                .collect();
            eprintln!("{PROG}: {} rewritten: {}", versions::FILE, list.join(", "));
            r
        }
        None => versions::current(root),
    };
    for note in resolved.iter().filter_map(|r| r.note.as_deref()) {
        eprintln!("{PROG}: toolchain: {note}");
    }
    Ok(())
}

/// Builds (or pulls) the missing layers, then prints one line per layer.
fn build(
    engine: &DockerEngine,
    client: Option<&Client>,
    plan: &mut Plan,
    verbose: bool,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let mut progress = Progress::new(verbose);
    let mut warn = |w: &str| eprintln!("{PROG}: warning: {w}");
    let mut puller = Puller::new(engine, client, &mut warn);
    let results = {
        let progress = std::cell::RefCell::new(&mut progress);
        let mut on_event = |l: &Layer, ev: &BuildEvent| progress.borrow_mut().event(l, ev);
        let mut on_start = |l: &Layer| progress.borrow_mut().start(l);
        let mut fetch = |l: &Layer| {
            progress.borrow_mut().pulling(l);
            puller.fetch(l)
        };
        image::build(
            engine,
            plan,
            &mut BuildOptions {
                on_event: &mut on_event,
                on_start: &mut on_start,
                fetch: Some(&mut fetch),
            },
        )
    };
    progress.clear();
    let results = results?;
    for (layer, r) in plan.layers.iter().zip(&results) {
        let (state, id, bytes) = match r {
            LayerResult::Cached(id) => ("cached", id, None),
            LayerResult::Pulled(id, n) => ("pulled", id, Some(*n)),
            LayerResult::Built(id) => ("built", id, None),
        };
        let refused = puller
            .refused
            .iter()
            .find(|(t, _)| t == &layer.tag)
            .map(|(_, why)| why);
        let line = layer_line(as_json, layer, state, Some(id), bytes, refused);
        writeln!(out, "{line}").map_err(out_err)?;
    }
    Ok(())
}

/// `--agent KIT`: the kit's CLI layer and agent image above the project's.
fn build_kit(
    engine: &DockerEngine,
    runtime: &Runtime,
    plan: &Plan,
    kit: &agent::Kit,
    verbose: bool,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let name = &kit.name;
    let first = plan.first_tag().to_string();
    let planned = agent::layer::plan(engine, &runtime.image, kit, &first, plan.final_tag())?;
    let (_, built) = agent::layer::ensure(
        engine,
        &planned,
        &mut |p| eprintln!("{PROG}: building {}", p.tag),
        &mut |ev| {
            if let (true, BuildEvent::Output(s)) = (verbose, &ev) {
                eprint!("{}", visible(s));
            }
        },
    )?;
    for (p, b, layer) in [
        (&planned.0, built[0], format!("agent-{name}-cli")),
        (&planned.1, built[1], format!("agent-{name}")),
    ] {
        let state = if b { "built" } else { "cached" };
        let line = if as_json {
            json!({"type": "layer", "layer": layer, "tag": p.tag, "state": state}).to_string()
        } else {
            format!("{layer} {} {state}", p.tag)
        };
        writeln!(out, "{line}").map_err(out_err)?;
    }
    Ok(())
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

/// `lw-build push`: every layer, which must be built, to the cache.
fn push(
    engine: &DockerEngine,
    client: Option<&Client>,
    plan: &Plan,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit> {
    let client = client.ok_or_else(no_cache)?;
    if let Some(l) = plan.layers.iter().find(|l| !l.cached()) {
        return Err(not_built(l, "push"));
    }
    client.login(true)?;
    for layer in &plan.layers {
        let (state, bytes) = match cache::push(engine, client, layer)? {
            Push::Pushed { bytes } => ("pushed", bytes),
            Push::Present => ("present", 0),
        };
        let remote = format!("{}:{}", client.cache, cache::remote_tag(layer));
        let line = if as_json {
            json!({"type": "push", "layer": layer.def.name, "tag": layer.tag, "remote": remote, "state": state, "bytes": bytes}).to_string()
        } else {
            format!("{} {} {state} {remote}", layer.def.name, layer.tag)
        };
        writeln!(out, "{line}").map_err(out_err)?;
    }
    Ok(Exit::Ok)
}

/// `lw-build pull`: every missing layer from the cache; builds nothing.
/// One layer's line of `lw-build` and `lw-build pull`: `LAYER TAG STATE`, or
/// its JSON record (with the image id, the bytes pulled and why the cache's
/// copy was refused, where known).
fn layer_line(
    as_json: bool,
    layer: &Layer,
    state: &str,
    id: Option<&String>,
    bytes: Option<u64>,
    refused: Option<&String>,
) -> String {
    if !as_json {
        return format!("{} {} {state}", layer.def.name, layer.tag);
    }
    let mut v = json!({"type": "layer", "layer": layer.def.name, "tag": layer.tag, "state": state});
    if let Some(id) = id {
        v["id"] = json!(id);
    }
    if let Some(n) = bytes {
        v["bytes"] = json!(n);
    }
    if let Some(why) = refused {
        v["refused"] = json!(why);
    }
    v.to_string()
}

fn pull(
    engine: &DockerEngine,
    client: Option<&Client>,
    plan: &Plan,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit> {
    let client = client.ok_or_else(no_cache)?;
    client.login(false)?;
    let mut exit = Exit::Ok;
    for layer in &plan.layers {
        let (state, bytes, why) = if layer.cached() {
            ("cached", None, None)
        } else {
            match cache::pull(engine, client, layer)? {
                Fetch::Pulled { bytes, .. } => ("pulled", Some(bytes), None),
                Fetch::Missing => ("missing", None, None),
                Fetch::Refused(why) => {
                    eprintln!(
                        "{PROG}: refused {}:{} from the image cache: {why}",
                        client.cache,
                        cache::remote_tag(layer)
                    );
                    exit = Exit::DataErr;
                    ("refused", None, Some(why))
                }
            }
        };
        let line = layer_line(as_json, layer, state, None, bytes, why.as_ref());
        writeln!(out, "{line}").map_err(out_err)?;
    }
    Ok(exit)
}

/// `lw-build save FILE`: the `from` image and every layer in one archive.
fn save(
    engine: &DockerEngine,
    runtime: &Runtime,
    plan: &Plan,
    file: &Path,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<Exit> {
    if let Some(l) = plan.layers.iter().find(|l| !l.cached()) {
        return Err(not_built(l, "save"));
    }
    let mut refs: Vec<&str> = vec![runtime.def.from.as_str()];
    refs.extend(plan.layers.iter().map(|l| l.tag.as_str()));
    let bytes = image::archive::save_file(engine, &refs, file)?;
    if as_json {
        let v = json!({"type": "save", "file": file, "bytes": bytes, "tags": refs});
        writeln!(out, "{v}").map_err(out_err)?;
    } else {
        for r in refs {
            writeln!(out, "{r}").map_err(out_err)?;
        }
    }
    Ok(Exit::Ok)
}

fn no_cache() -> Error {
    Error::config(
        "no image cache: set build.cache = HOST[:PORT]/REPO in .loopwright/config or pass --cache",
    )
}

fn not_built(l: &Layer, what: &str) -> Error {
    Error::new(
        Exit::NoInput,
        format!(
            "layer '{}' ({}) is not built; run lw-build first, then {what} again",
            l.def.name, l.tag
        ),
    )
}

fn explain(
    engine: &DockerEngine,
    layer: &Layer,
    probe: Option<Probe>,
    as_json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let replaces = if layer.cached() {
        None
    } else {
        image::explain(engine, layer)?.replaces
    };
    let inputs = layer.files.iter().filter(|f| f.kind != InputKind::Dir);
    let refused = match &probe {
        Some(Probe::Refused(why)) => Some(why.clone()),
        _ => None,
    };
    let state = match (layer.cached(), &probe) {
        (true, _) => "cached",
        (false, Some(Probe::Present)) => "to-pull",
        _ => "to-build",
    };
    if as_json {
        let v = json!({
            "type": "explain",
            "layer": layer.def.name,
            "tag": layer.tag,
            "state": state,
            "refused": refused,
            "parent": layer.parent,
            "provider": layer.def.provider.as_ref().map(|p| p.describe()),
            "dockerfile": layer.dockerfile.path,
            "inputs": inputs.map(|f| json!({"path": f.path, "mode": format!("{:o}", f.mode), "sha256": f.sha256})).collect::<Vec<_>>(),
            "replaces": replaces.as_ref().map(|(name, _)| name),
            "changes": replaces.as_ref().map(|(_, c)| c.iter().map(|c| c.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
        });
        return writeln!(out, "{v}").map_err(out_err);
    }
    let mut text = format!(
        "{} {} {}\n",
        layer.def.name,
        layer.tag,
        state.replace('-', " ")
    );
    if let Some(why) = &refused {
        text += &format!("  refused the image cache's copy: {why}\n");
    }
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

    fn pulling(&mut self, l: &Layer) {
        if self.verbose || self.tty {
            self.clear();
            eprintln!("{PROG}: looking for {} in the image cache", l.tag);
        }
    }

    fn event(&mut self, l: &Layer, ev: &BuildEvent) {
        let text = match ev {
            BuildEvent::Output(s) | BuildEvent::Status(s) => s,
        };
        if self.verbose {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(visible(text).as_bytes());
            if !text.ends_with('\n') && matches!(ev, BuildEvent::Status(_)) {
                let _ = e.write_all(b"\n");
            }
        } else if self.tty {
            let Some(step) = text.lines().find(|s| s.starts_with("Step ")) else {
                return;
            };
            let line: String = format!("{PROG}: {}: {}", l.def.name, visible_line(step))
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
