//! The agent layer: a kit's CLI as its own image, shared by projects and
//! copied above each project's deps layer.
//!
//! Two images per kit, each built only when its tag is missing:
//!
//! - `loopwright/agent-KIT-cli:HASH`, one layer holding `/opt/lw-agent`:
//!   node, npm and the package at the kit's exact versions under
//!   `/opt/lw-agent/KIT`.  It is made in two builds: the install
//!   (runtime/agents/cli.Dockerfile) on the project's *first* layer, tagged
//!   `loopwright/agent-KIT-cli-build:HASH`, then `/opt/lw-agent` taken out
//!   of it onto an empty image (cli-copy.Dockerfile); the install image is
//!   removed after.  HASH covers the kit's install manifest (package,
//!   version, node, npm, program), both recipes and the first layer's input
//!   hash (its tag without the project's image name), and nothing of the
//!   project's name or deps layer: projects on the same first layer share
//!   one CLI image, and changing dependencies never reinstalls the agent.
//!   A kit with a `prepare` line gets runtime/agents/cli-prepare.Dockerfile
//!   appended to the install's recipe (and its hash and the line in HASH);
//!   a kit without one keeps the recipe and tag it had before that existed.
//! - `IMAGE-agent-KIT:HASH`, the project's final image plus the CLI image's
//!   root copied on top (runtime/agents/agent.Dockerfile).  That copy is
//!   the CLI image's layer byte for byte, the same diff ID in every project.
//!   HASH covers the final image's tag and the CLI image's tag: a deps
//!   change reruns the copy, a kit bump reruns the install and the copy.
//!
//! Each image carries its manifest in the label lw-build uses, so
//! `docker inspect` says what it was made of.

use std::collections::BTreeMap;

use super::kit::Kit;
use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use engine::{BuildEvent, BuildOutcome, BuildRequest, ImageBuilder, Images};
use wall::image::{LABEL_LAYER, LABEL_MANIFEST};

pub const CLI_DOCKERFILE: &str = include_str!("../../../runtime/agents/cli.Dockerfile");
pub const CLI_COPY_DOCKERFILE: &str = include_str!("../../../runtime/agents/cli-copy.Dockerfile");
/// Follows cli.Dockerfile's text for a kit with a `prepare` line.
pub const CLI_PREPARE_DOCKERFILE: &str =
    include_str!("../../../runtime/agents/cli-prepare.Dockerfile");
pub const AGENT_DOCKERFILE: &str = include_str!("../../../runtime/agents/agent.Dockerfile");

/// Bump when the meaning of the manifests changes.
const VERSION: &str = "loopwright-agent-layer 2";
const TAG_HEX: usize = 24;
/// The CLI images' name, shared by every project: `CLI_REPO-KIT-cli:HASH`.
pub const CLI_REPO: &str = "loopwright/agent";

/// One image of the agent layer, planned.
#[derive(Clone, Debug)]
pub struct Planned {
    pub tag: String,
    pub manifest: String,
    pub dockerfile: String,
    pub args: BTreeMap<String, String>,
    pub built: bool,
    /// The CLI image's install step: built under this tag, taken out by
    /// [`CLI_COPY_DOCKERFILE`], then removed.
    pub stage: Option<String>,
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

/// What of the CLI image's parent its hash covers: a project's first layer
/// is named `REPO-LAYER:HASH` after the project's image, so the name goes
/// and the layer's name and input hash stay; any other parent (`--image`)
/// counts whole.
pub fn base_key(repo: &str, cli_parent: &str) -> String {
    cli_parent
        .strip_prefix(repo)
        .and_then(|r| r.strip_prefix('-'))
        .filter(|r| r.contains(':'))
        .unwrap_or(cli_parent)
        .to_string()
}

/// The two images' tags, manifests and build arguments, from the hashes alone.
pub fn recipe(repo: &str, kit: &Kit, cli_parent: &str, parent: &str) -> (Planned, Planned) {
    let mut m = format!(
        "{VERSION}\nlayer agent-{}-cli\nbase {}\n",
        kit.name,
        base_key(repo, cli_parent)
    );
    m.push_str(&kit.install_manifest());
    let mut recipes = vec![
        ("cli.Dockerfile", CLI_DOCKERFILE),
        ("cli-copy.Dockerfile", CLI_COPY_DOCKERFILE),
    ];
    let mut install = CLI_DOCKERFILE.to_string();
    if kit.prepare.is_some() {
        recipes.push(("cli-prepare.Dockerfile", CLI_PREPARE_DOCKERFILE));
        install.push_str(CLI_PREPARE_DOCKERFILE);
    }
    for (name, text) in recipes {
        m.push_str(&format!(
            "dockerfile {name} {}\n",
            sha256_hex(text.as_bytes())
        ));
    }
    let hash = &sha256_hex(m.as_bytes())[..TAG_HEX];
    let cli_tag = format!("{CLI_REPO}-{}-cli:{hash}", kit.name);
    let mut cli = Planned {
        built: false,
        tag: cli_tag.clone(),
        manifest: m,
        dockerfile: install,
        stage: Some(format!("{CLI_REPO}-{}-cli-build:{hash}", kit.name)),
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
    if let Some(p) = &kit.prepare {
        cli.args.insert("LW_AGENT_PREPARE".into(), p.clone());
    }
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
        dockerfile: AGENT_DOCKERFILE.to_string(),
        stage: None,
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
        match &p.stage {
            None => build_one(engine, p, &p.tag, &p.dockerfile, &p.args, on_event)?,
            Some(stage) => {
                build_one(engine, p, stage, &p.dockerfile, &p.args, on_event)?;
                let args = BTreeMap::from([("LW_BUILD".to_string(), stage.clone())]);
                let copied = build_one(engine, p, &p.tag, CLI_COPY_DOCKERFILE, &args, on_event);
                // The install image held a second copy of the CLI: it goes
                // whether or not the copy worked.
                engine.remove_image(stage, false)?;
                copied?;
            }
        }
        built[i] = true;
    }
    Ok((images.1.tag.clone(), built))
}

/// Builds `dockerfile` with `args` as `tag`, labelled with `p`'s manifest.
fn build_one(
    engine: &dyn ImageBuilder,
    p: &Planned,
    tag: &str,
    dockerfile: &str,
    args: &BTreeMap<String, String>,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<()> {
    let mut b = tar::Builder::new(Vec::new());
    let tar_err = |e: std::io::Error| {
        Error::new(Exit::Software, "cannot make the build context").with_source(e)
    };
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_size(dockerfile.len() as u64);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "Dockerfile", dockerfile.as_bytes())
        .map_err(tar_err)?;
    let context = b.into_inner().map_err(tar_err)?;
    let repo = tag.split(':').next().unwrap_or_default().to_string();
    let req = BuildRequest {
        context,
        dockerfile: "Dockerfile".into(),
        tag: tag.to_string(),
        labels: BTreeMap::from([
            (LABEL_LAYER.to_string(), repo),
            (LABEL_MANIFEST.to_string(), p.manifest.clone()),
        ]),
        args: args.clone(),
    };
    let (outcome, tail) = wall::egress::sidecar::build_with_tail(engine, &req, 30, on_event)?;
    match outcome {
        BuildOutcome::Built(_) => Ok(()),
        BuildOutcome::Failed(msg) => Err(Error::new(
            Exit::DataErr,
            format!(
                "cannot build the agent image '{}': {}; no tag was applied\n--- build output (last lines) ---\n{}",
                tag,
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
        assert!(
            cli.tag.starts_with("loopwright/agent-claude-cli:"),
            "{}",
            cli.tag
        );
        let stage = cli.stage.as_deref().unwrap();
        assert!(stage.starts_with("loopwright/agent-claude-cli-build:"));
        assert_eq!(stage.split(':').nth(1), cli.tag.split(':').nth(1));
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
        // Another project on the same first layer shares the CLI image, and
        // has its own image above it; another first layer does not share it.
        let (cli4, top4) = recipe("q", &kit, "q-base:1", "q-deps:7");
        assert_eq!(cli4.tag, cli.tag);
        assert_eq!(cli4.args["LW_PARENT"], "q-base:1");
        assert!(top4.tag.starts_with("q-agent-claude:"), "{}", top4.tag);
        assert_ne!(recipe("q", &kit, "q-base:2", "q-deps:7").0.tag, cli.tag);
        // An image given whole (--image) counts whole.
        assert_eq!(base_key("ubuntu", "ubuntu:24.04"), "ubuntu:24.04");
        assert_eq!(base_key("p", "p-base:1"), "base:1");
        assert_eq!(base_key("p", "pq-base:1"), "pq-base:1");
        // Another kit never shares a tag.
        let codex = super::super::kit::find(None, "codex").unwrap();
        assert_ne!(recipe("p", &codex, "p-base:1", "p-deps:1").0.tag, cli.tag);
    }

    /// Issue 45: a kit's `prepare` line follows the install in its own
    /// recipe; a kit without one keeps the recipe, manifest and tag it had.
    #[test]
    fn only_a_kit_with_a_prepare_line_gets_the_prepare_recipe() {
        let claude = super::super::kit::find(None, "claude").unwrap();
        assert!(claude.prepare.is_none());
        let (cli, _) = recipe("p", &claude, "p-base:1", "p-deps:1");
        assert_eq!(cli.dockerfile, CLI_DOCKERFILE);
        assert!(!cli.manifest.contains("prepare"), "{}", cli.manifest);
        assert!(!cli.args.contains_key("LW_AGENT_PREPARE"));
        let copilot = super::super::kit::find(None, "copilot").unwrap();
        let line = copilot
            .prepare
            .clone()
            .expect("copilot unpacks its package");
        let (cli, top) = recipe("p", &copilot, "p-base:1", "p-deps:1");
        assert_eq!(
            cli.dockerfile,
            format!("{CLI_DOCKERFILE}{CLI_PREPARE_DOCKERFILE}")
        );
        assert!(cli.manifest.contains("dockerfile cli-prepare.Dockerfile "));
        assert!(cli.manifest.contains(&format!("prepare {line}\n")));
        assert_eq!(cli.args["LW_AGENT_PREPARE"], line);
        // The line is part of what the tag covers.
        let mut other = copilot.clone();
        other.prepare = Some("true".into());
        let (cli2, top2) = recipe("p", &other, "p-base:1", "p-deps:1");
        assert_ne!(cli2.tag, cli.tag);
        assert_ne!(top2.tag, top.tag);
        other.prepare = None;
        let (cli3, _) = recipe("p", &other, "p-base:1", "p-deps:1");
        assert_eq!(cli3.dockerfile, CLI_DOCKERFILE);
    }
}
