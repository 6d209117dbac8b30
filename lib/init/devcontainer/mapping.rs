//! What a devcontainer.json became: the keys taken, the refusals with
//! their reasons, and the parts of the runtime (map.rs fills it, features.rs
//! adds the local features, render.rs writes it out).

use super::vars::{self, Piece};

/// A key taken, and what it became.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub key: String,
    pub how: String,
}

/// A key refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub key: String,
    pub reason: String,
    /// The runtime cannot be made without it.
    pub fatal: bool,
}

/// A lifecycle command in one of its forms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// A string: run by `/bin/sh -c`.
    Shell(String),
    /// An array: the program and its arguments, no shell.
    Exec(Vec<String>),
}

/// One command of the deps layer's script: its hook
/// (`onCreateCommand`…), the name it has in the object form, the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub hook: &'static str,
    pub name: Option<String>,
    pub command: Command,
}

/// One environment variable the image sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: Vec<Piece>,
    /// From `remoteEnv` (else `containerEnv`).
    pub remote: bool,
}

/// A port the configuration forwards, with its label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub port: u16,
    pub label: Option<String>,
}

/// A local feature (`./NAME` beside the configuration): a layer of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Feature {
    /// As written in `features`.
    pub id: String,
    /// Its folder, relative to the checkout's top.
    pub dir: String,
    /// The options as install.sh reads them: `NAME=value`, defaults filled.
    pub options: Vec<(String, String)>,
    /// The feature's own `containerEnv`.
    pub env: Vec<(String, String)>,
    /// What it installs after (`installsAfter`, `dependsOn`): identifiers
    /// without their version.
    pub after: Vec<String>,
    /// Of those, the ones it cannot go without (`dependsOn`).
    pub depends: Vec<String>,
    /// `dependsOn` as written: each identifier with its version and the
    /// options it is given (`NAME=value`); lw init fetches one not listed.
    pub wants: Vec<(String, Vec<(String, String)>)>,
    /// From a registry: fetched by lw init, written into `dir`.
    pub remote: Option<Remote>,
}

/// A feature from a registry, and what lw init fetched of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    pub reference: super::registry::FeatureRef,
    /// The options given, as install.sh reads them (before the
    /// feature's defaults are known).
    pub given: Vec<(String, String)>,
    /// The manifest's digest, once fetched.
    pub digest: Option<String>,
    /// The feature's files, relative to its folder, once fetched.
    pub files: Vec<(String, Vec<u8>, u32)>,
}

/// The configuration's own Dockerfile (`build`): the runtime's first
/// layer.  Paths are relative to the checkout's top (`context` empty: the
/// top itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    pub dockerfile: String,
    pub context: String,
    pub args: Vec<(String, String)>,
    pub target: Option<String>,
    /// The files its COPY and ADD lines read.
    pub inputs: Vec<String>,
    /// The image its last (or target) stage starts from.
    pub from: String,
    /// The last stage's last `USER`, when it is not root: the layers after
    /// it switch back to root (base installs packages).
    pub user: Option<String>,
}

/// What loopwright takes of one configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    /// The configuration, relative to the checkout's top.
    pub source: String,
    pub name: Option<String>,
    /// The base image (`image`), when it names one.
    pub image: Option<String>,
    /// The Dockerfile it builds (`build`), when it names one.
    pub build: Option<Build>,
    pub features: Vec<Feature>,
    pub env: Vec<EnvVar>,
    pub steps: Vec<Step>,
    pub ports: Vec<Port>,
    /// `remoteUser`, else `containerUser`: the name the configuration
    /// expects; the sandbox's user stands for it.
    pub user: Option<String>,
    pub taken: Vec<Taken>,
    pub refused: Vec<Refusal>,
    /// The sandbox's uid (`sandbox.uid` as the project's config had it at
    /// lw init, else the default): remoteUser is given it in the image.
    pub uid: Option<u32>,
    /// `devcontainer.feature-ca` as the project's config had it (lw init
    /// writes it again).
    pub feature_ca: Option<String>,
    /// `devcontainer.fetch-timeout`, likewise.
    pub fetch_timeout: Option<String>,
}

/// The lifecycle commands run while the image is made, in the
/// specification's order.
pub const HOOKS: &[&str] = &[
    "onCreateCommand",
    "updateContentCommand",
    "postCreateCommand",
];

/// The lifecycle command run at each start of a sandbox (and at its
/// create): not a layer's; the image carries it as a label
/// ([`wall::image::LABEL_POST_START`]).
pub const POST_START: &str = "postStartCommand";

/// Variables lw-sandbox sets itself: a configuration does not replace them.
pub(super) const OWN_ENV: &[&str] = &["HOME", "TMPDIR"];

impl Mapping {
    pub(super) fn take(&mut self, key: &str, how: impl Into<String>) {
        self.taken.push(Taken {
            key: key.into(),
            how: how.into(),
        });
    }

    pub(super) fn refuse(&mut self, key: &str, reason: impl Into<String>) {
        self.refused.push(Refusal {
            key: key.into(),
            reason: reason.into(),
            fatal: false,
        });
    }

    pub(super) fn fatal(&mut self, key: &str, reason: impl Into<String>) {
        self.refused.push(Refusal {
            key: key.into(),
            reason: reason.into(),
            fatal: true,
        });
    }

    pub(super) fn var(&mut self, key: &str, e: vars::Refused) {
        self.fatal(
            key,
            format!("{} is not substituted: {}", e.variable, e.reason),
        );
    }

    /// Starts from `from` (lw init --from) whatever the configuration
    /// names: a missing image, a Dockerfile or a Compose file no longer
    /// stops lw init; the reasons stay in the report.
    pub fn start_from(&mut self, from: &str) {
        for r in &mut self.refused {
            if r.fatal
                && matches!(
                    r.key.as_str(),
                    "image" | "build" | "dockerFile" | "dockerfile" | "dockerComposeFile"
                )
            {
                r.fatal = false;
                r.reason = format!("{}; starting from {from} (--from) instead", r.reason);
            }
        }
        self.image = Some(from.to_string());
        if self.build.take().is_some() {
            for t in &mut self.taken {
                if matches!(t.key.as_str(), "build" | "dockerFile" | "dockerfile") {
                    t.how = format!("not built: starting from {from} (--from) instead");
                }
            }
        }
    }

    /// The image the runtime's chain starts from: `image`, else the one the
    /// Dockerfile's last stage starts from.
    pub fn base_image(&self) -> Option<String> {
        self.image
            .clone()
            .or_else(|| self.build.as_ref().map(|b| b.from.clone()))
    }

    /// The refusals that stop lw init.
    pub fn fatal_refusals(&self) -> impl Iterator<Item = &Refusal> {
        self.refused.iter().filter(|r| r.fatal)
    }
}
