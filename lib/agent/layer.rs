//! The agent layer: a kit's CLI as its own image, copied above the deps layer.
//!
//! Two images per kit, each built only when its tag is missing:
//!
//! - `IMAGE-agent-KIT-cli:HASH`, from the project's *first* layer
//!   (runtime/agents/cli.Dockerfile): node, npm and the package at the kit's
//!   exact versions under `/opt/lw-agent/KIT`.  HASH covers the kit's
//!   install manifest (package, version, node, npm, program), the recipe and
//!   the first layer's tag, and nothing of the deps layer, so changing the
//!   project's dependencies never reinstalls the agent.
//! - `IMAGE-agent-KIT:HASH`, the project's final image plus a copy of
//!   `/opt/lw-agent` (runtime/agents/agent.Dockerfile).  HASH covers the
//!   final image's tag and the CLI image's tag: a deps change reruns the
//!   copy, a kit bump reruns the install and the copy.
//!
//! Each image carries its manifest in the label lw-build uses, so
//! `docker inspect` says what it was made of.

use std::collections::BTreeMap;

use super::kit::Kit;
use crate::digest::sha256_hex;
use crate::engine::{BuildEvent, BuildOutcome, BuildRequest, ImageBuilder, Images};
use crate::error::{Error, Exit, Result};
use crate::image::{LABEL_LAYER, LABEL_MANIFEST};

pub const CLI_DOCKERFILE: &str = include_str!("../../runtime/agents/cli.Dockerfile");
pub const AGENT_DOCKERFILE: &str = include_str!("../../runtime/agents/agent.Dockerfile");

/// Bump when the meaning of the manifests changes.
const VERSION: &str = "loopwright-agent-layer 1";
const TAG_HEX: usize = 24;

/// One image of the agent layer, planned.
#[derive(Clone, Debug)]
pub struct Planned {
    pub tag: String,
    pub manifest: String,
    pub dockerfile: &'static str,
    pub args: BTreeMap<String, String>,
    pub built: bool,
}

/// The two images for `kit`: `cli_parent` is the project's first layer,
/// `parent` its final image; `repo` the project's image prefix.
pub fn plan(
    engine: &dyn Images,
    repo: &str,
    kit: &Kit,
    cli_parent: &str,
    parent: &str,
) -> Result<(Planned, Planned)> {
    let (mut cli, mut top) = recipe(repo, kit, cli_parent, parent);
    cli.built = engine.image_exists(&cli.tag)?;
    top.built = engine.image_exists(&top.tag)?;
    Ok((cli, top))
}

/// The two images' tags, manifests and build arguments, from the hashes alone.
pub fn recipe(repo: &str, kit: &Kit, cli_parent: &str, parent: &str) -> (Planned, Planned) {
    let mut m = format!(
        "{VERSION}\nlayer agent-{}-cli\nparent {cli_parent}\n",
        kit.name
    );
    m.push_str(&kit.install_manifest());
    m.push_str(&format!(
        "dockerfile cli.Dockerfile {}\n",
        sha256_hex(CLI_DOCKERFILE.as_bytes())
    ));
    let cli_tag = format!(
        "{repo}-agent-{}-cli:{}",
        kit.name,
        &sha256_hex(m.as_bytes())[..TAG_HEX]
    );
    let cli = Planned {
        built: false,
        tag: cli_tag.clone(),
        manifest: m,
        dockerfile: CLI_DOCKERFILE,
        args: BTreeMap::from([
            ("LW_PARENT".into(), cli_parent.to_string()),
            ("LW_AGENT_KIT".into(), kit.name.clone()),
            ("LW_AGENT_PACKAGE".into(), kit.package.clone()),
            ("LW_AGENT_VERSION".into(), kit.version.clone()),
            ("LW_AGENT_NODE".into(), kit.node.clone()),
            ("LW_AGENT_NPM".into(), kit.npm.clone()),
            ("LW_AGENT_PROGRAM".into(), kit.program.clone()),
        ]),
    };
    let m = format!(
        "{VERSION}\nlayer agent-{}\nparent {parent}\ncli {cli_tag}\ndockerfile agent.Dockerfile {}\n",
        kit.name,
        sha256_hex(AGENT_DOCKERFILE.as_bytes())
    );
    let tag = format!(
        "{repo}-agent-{}:{}",
        kit.name,
        &sha256_hex(m.as_bytes())[..TAG_HEX]
    );
    let top = Planned {
        built: false,
        tag,
        manifest: m,
        dockerfile: AGENT_DOCKERFILE,
        args: BTreeMap::from([
            ("LW_PARENT".into(), parent.to_string()),
            ("LW_AGENT_CLI".into(), cli_tag),
            ("LW_AGENT_KIT".into(), kit.name.clone()),
            ("LW_AGENT_PROGRAM".into(), kit.program.clone()),
        ]),
    };
    (cli, top)
}

/// Builds what is missing of the two images; returns the final tag and,
/// per image, whether it was built now.  Build output goes to `on_event`.
pub fn ensure(
    engine: &dyn ImageBuilder,
    images: &(Planned, Planned),
    on_start: &mut dyn FnMut(&Planned),
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<(String, [bool; 2])> {
    let mut built = [false; 2];
    for (i, p) in [&images.0, &images.1].into_iter().enumerate() {
        if p.built || engine.image_exists(&p.tag)? {
            continue;
        }
        on_start(p);
        build_one(engine, p, on_event)?;
        built[i] = true;
    }
    Ok((images.1.tag.clone(), built))
}

fn build_one(
    engine: &dyn ImageBuilder,
    p: &Planned,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<()> {
    let mut b = tar::Builder::new(Vec::new());
    let tar_err = |e: std::io::Error| {
        Error::new(Exit::Software, "cannot make the build context").with_source(e)
    };
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_size(p.dockerfile.len() as u64);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "Dockerfile", p.dockerfile.as_bytes())
        .map_err(tar_err)?;
    let context = b.into_inner().map_err(tar_err)?;
    let repo = p.tag.split(':').next().unwrap_or_default().to_string();
    let req = BuildRequest {
        context,
        dockerfile: "Dockerfile".into(),
        tag: p.tag.clone(),
        labels: BTreeMap::from([
            (LABEL_LAYER.to_string(), repo),
            (LABEL_MANIFEST.to_string(), p.manifest.clone()),
        ]),
        args: p.args.clone(),
    };
    let mut tail: Vec<String> = Vec::new();
    let outcome = engine.build(&req, &mut |ev| {
        if let BuildEvent::Output(s) = &ev {
            tail.extend(s.lines().map(str::to_string));
            let n = tail.len().saturating_sub(30);
            tail.drain(..n);
        }
        on_event(ev);
    })?;
    match outcome {
        BuildOutcome::Built(_) => Ok(()),
        BuildOutcome::Failed(msg) => Err(Error::new(
            Exit::DataErr,
            format!(
                "cannot build the agent image '{}': {}; no tag was applied\n--- build output (last lines) ---\n{}",
                p.tag,
                msg.trim(),
                tail.join("\n")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deps_change_keeps_the_cli_and_a_kit_bump_reinstalls_it() {
        let kit = super::super::kit::find(None, "claude").unwrap();
        let (cli, top) = recipe("p", &kit, "p-base:1", "p-deps:1");
        assert!(cli.tag.starts_with("p-agent-claude-cli:"), "{}", cli.tag);
        assert!(top.tag.starts_with("p-agent-claude:"), "{}", top.tag);
        // The project's dependencies change: only the copy above them does.
        let (cli2, top2) = recipe("p", &kit, "p-base:1", "p-deps:2");
        assert_eq!(cli2.tag, cli.tag);
        assert_ne!(top2.tag, top.tag);
        // The kit is bumped: the CLI is reinstalled, and copied again.
        let mut bumped = kit.clone();
        bumped.version = "2.1.333".into();
        let (cli3, top3) = recipe("p", &bumped, "p-base:1", "p-deps:1");
        assert_ne!(cli3.tag, cli.tag);
        assert_ne!(top3.tag, top.tag);
        assert_eq!(cli3.args["LW_AGENT_VERSION"], "2.1.333");
        // So is a new node.
        let mut node = kit.clone();
        node.node = "22.23.6".into();
        assert_ne!(recipe("p", &node, "p-base:1", "p-deps:1").0.tag, cli.tag);
        // Another kit never shares a tag.
        let codex = super::super::kit::find(None, "codex").unwrap();
        assert_ne!(recipe("p", &codex, "p-base:1", "p-deps:1").0.tag, cli.tag);
    }
}
