//! Layered runtime images, each tagged by the hash of its declared inputs.
//!
//! A project describes its runtime in `.loopwright/runtime/runtime.conf`: an
//! image to start `from` and a chain of layers (base -> toolchain -> deps by
//! default), each with a Dockerfile and an explicit list of inputs.  A layer's
//! tag is the sha256 of its *manifest*, a small text that names:
//!
//! - the layer and its parent (the parent's hash, or the `from` image's id),
//! - the toolchain provider and its pinned version,
//! - the Dockerfile and every input file: path, mode and content hash.
//!
//! The build context sent to the engine is made from the very bytes that were
//! hashed and holds nothing else, so a file the hash does not cover cannot
//! reach the build: a Dockerfile that COPYs an undeclared file fails, with an
//! error that points at the input list, instead of building from stale
//! content.  Modes are recorded as git records them (755 when any execute bit
//! is set, else 644) so a checkout's umask does not change a tag.
//!
//! An image is built only when its tag is missing.  The tag is applied by the
//! engine when, and only when, the build succeeds, so a failed build leaves
//! nothing behind that a later run could mistake for a result.  Each image
//! carries its manifest as a label, which is how `lw-build --explain` says
//! what changed since the image a build would replace.

// The image builder by concern: the definition file (definition), the
// inputs found and hashed into tags (inputs), building a layer (build) and
// explaining a rebuild (explain); the image cache off the machine: a
// registry (cache) and archives (archive).  This file holds the constants, `init`
// and the project's root.
pub mod archive;
mod build;
pub mod cache;
mod definition;
pub mod dockerfile;
pub mod dockerignore;
mod explain;
mod inputs;

pub use build::*;
pub use definition::*;
pub use explain::*;
pub use inputs::*;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use base::error::{Error, Exit, Result};

/// Where a project keeps its runtime definition, relative to its root.
pub const RUNTIME_DIR: &str = ".loopwright/runtime";
/// The definition file inside [`RUNTIME_DIR`].
pub const RUNTIME_FILE: &str = ".loopwright/runtime/runtime.conf";

/// Image labels; `lw-sandbox` reads them too.
pub const LABEL_LAYER: &str = "org.loopwright.layer";
/// The manifest the tag hashes: parent, provider, and every input's path,
/// mode and sha256.  Two labels only: the legacy builder spends one step per
/// label.
pub const LABEL_MANIFEST: &str = "org.loopwright.manifest";
/// A devcontainer.json's postStartCommand, as the sh script lw-sandbox runs
/// at each start (a JSON string; lw init writes it into a layer's
/// Dockerfile, so the image carries it and no clone can change it).
pub const LABEL_POST_START: &str = "org.loopwright.post-start";

/// Manifest format version: bump it when the manifest's meaning changes, so
/// every tag changes with it.
const MANIFEST_VERSION: &str = "loopwright-layer 1";

/// Length of the hash prefix used as a tag (96 bits).
const TAG_HEX: usize = 24;

/// The default runtime shipped with the toolkit; `lw-build init` writes it.
pub const DEFAULT_RUNTIME: &[(&str, &str, u32)] = &[
    (
        "runtime.conf",
        include_str!("../../../../runtime/runtime.conf"),
        0o644,
    ),
    (
        "base.Dockerfile",
        include_str!("../../../../runtime/base.Dockerfile"),
        0o644,
    ),
    (
        "toolchain.Dockerfile",
        include_str!("../../../../runtime/toolchain.Dockerfile"),
        0o644,
    ),
    (
        "deps.Dockerfile",
        include_str!("../../../../runtime/deps.Dockerfile"),
        0o644,
    ),
    (
        "mise.toml",
        include_str!("../../../../runtime/mise.toml"),
        0o644,
    ),
    (
        "deps.sh",
        include_str!("../../../../runtime/deps.sh"),
        0o755,
    ),
    (
        "entry.sh",
        include_str!("../../../../runtime/entry.sh"),
        0o755,
    ),
    (
        "ca-certificates/README",
        include_str!("../../../../runtime/ca-certificates/README"),
        0o644,
    ),
];

/// Writes the default runtime into `ROOT/.loopwright/runtime/`, with `from`
/// as the first layer's starting image and `deps_inputs` as the deps layer's
/// inputs.  Refuses to overwrite a file unless `force`.  Returns the paths
/// written, relative to `root`.
pub fn init(root: &Path, from: &str, deps_inputs: &[String], force: bool) -> Result<Vec<String>> {
    let dir = root.join(RUNTIME_DIR);
    if !force {
        for (name, _, _) in DEFAULT_RUNTIME {
            let p = dir.join(name);
            if p.exists() {
                return Err(Error::new(
                    Exit::CantCreat,
                    format!(
                        "'{}' exists; not overwriting it (use --force to replace the default files)",
                        p.display()
                    ),
                ));
            }
        }
    }
    fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create", &dir, e))?;
    let mut written = Vec::new();
    for (name, text, mode) in DEFAULT_RUNTIME {
        let mut text = text.to_string();
        if *name == "runtime.conf" {
            text = text.replace("@FROM@", from);
            let mut extra = String::new();
            for i in deps_inputs {
                let _ = writeln!(extra, "    input {i}");
            }
            text = text.replace("@DEPS_INPUTS@\n", &extra);
        }
        let p = dir.join(name);
        let parent = p.parent().expect("a runtime file has a parent directory");
        fs::create_dir_all(parent).map_err(|e| Error::io("cannot create", parent, e))?;
        base::fs::write_replace(&p, text.as_bytes(), *mode, base::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write", &p, e))?;
        written.push(format!("{RUNTIME_DIR}/{name}"));
    }
    Ok(written)
}

/// Lockfiles and manifests `init` declares as deps inputs when the project has them.
pub const KNOWN_DEPS_FILES: &[&str] = &[
    "package.json",
    "package-lock.json",
    "requirements.txt",
    "pyproject.toml",
    "Cargo.toml",
    "Cargo.lock",
    "go.mod",
    "go.sum",
];

/// Finds the project root: the nearest directory at or above `start` holding
/// a runtime definition.
pub fn find_root(start: &Path) -> Option<PathBuf> {
    let mut dir = Some(start);
    while let Some(d) = dir {
        if d.join(RUNTIME_FILE).is_file() {
            return Some(d.to_path_buf());
        }
        dir = d.parent();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
# comment
image loopwright/demo
from loopwright/test-busybox:latest

layer base
    dockerfile .loopwright/runtime/base.Dockerfile
layer toolchain
    dockerfile .loopwright/runtime/toolchain.Dockerfile   # trailing comment
    provider mise 2026.9.15
    input .loopwright/runtime/mise.toml
layer deps
    dockerfile deps.Dockerfile
    input a.lock b.lock
";

    #[test]
    fn parses_layers_in_order_with_inputs_and_lines() {
        let d = parse(GOOD, "runtime.conf").expect("the sample is valid");
        assert_eq!(d.image.as_deref(), Some("loopwright/demo"));
        assert_eq!(d.from, "loopwright/test-busybox:latest");
        let names: Vec<&str> = d.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["base", "toolchain", "deps"]);
        assert_eq!(
            d.layers[1].provider,
            Some(Provider::Mise {
                version: "2026.9.15".into()
            })
        );
        let deps: Vec<(&str, usize)> = d.layers[2]
            .inputs
            .iter()
            .map(|i| (i.path.as_str(), i.line))
            .collect();
        assert_eq!(deps, [("a.lock", 13), ("b.lock", 13)]);
    }

    fn err_of(text: &str) -> Error {
        parse(text, "runtime.conf").expect_err("the text is invalid")
    }

    #[test]
    fn errors_name_the_line_and_exit_78() {
        let e = err_of("from x\nlayer a\n  dockerfile D\n  inptu x\n");
        assert_eq!(e.exit, Exit::Config);
        assert!(
            e.msg.starts_with("runtime.conf:4: unknown keyword 'inptu'"),
            "{}",
            e.msg
        );
        assert!(
            err_of("from x\n  input a\n")
                .msg
                .starts_with("runtime.conf:2: 'input' outside a layer")
        );
        assert!(
            err_of("from x\nlayer a\n")
                .msg
                .contains("layer 'a' has no 'dockerfile'")
        );
        assert!(
            err_of("layer a\n dockerfile D\n")
                .msg
                .contains("no 'from' line")
        );
        assert!(
            err_of("from x\nlayer a\n dockerfile D\nlayer a\n")
                .msg
                .starts_with("runtime.conf:4: layer 'a' already defined on line 2")
        );
    }

    #[test]
    fn a_context_layer_comes_first_and_reads_inside_its_context() {
        let d = parse(
            "from x\nlayer project\n dockerfile .devcontainer/Dockerfile\n context .devcontainer\n arg A=1 B=\n target dev\n input .devcontainer/req.txt\nlayer deps\n dockerfile D\n",
            "f",
        )
        .expect("valid");
        let l = &d.layers[0];
        assert_eq!(l.context.as_deref(), Some(".devcontainer"));
        assert_eq!(
            l.args,
            [("A".into(), "1".into()), ("B".into(), String::new())]
        );
        assert_eq!(l.target.as_deref(), Some("dev"));
        assert_eq!(
            parse("from x\nlayer p\n dockerfile D\n context .\n", "f")
                .unwrap()
                .layers[0]
                .context
                .as_deref(),
            Some("")
        );
        for (text, want) in [
            (
                "from x\nlayer a\n dockerfile D\nlayer p\n dockerfile E\n context .\n",
                "f:4: layer 'p': only the first layer has a 'context'",
            ),
            (
                "from x\nlayer a\n dockerfile D\n arg A=1\n",
                "f:2: layer 'a': 'arg' and 'target' belong to a layer with a 'context'",
            ),
            (
                "from x\nlayer p\n dockerfile D\n context sub\n input other/x\n",
                "f:5: input 'other/x' of layer 'p' is outside its context 'sub'",
            ),
            (
                "from x\nlayer p\n dockerfile D\n context ..\n",
                "f:4: path '..' escapes the project",
            ),
            (
                "from x\nlayer p\n dockerfile D\n context .\n arg 1A=x\n",
                "f:5: 'arg 1A=x': write NAME=VALUE",
            ),
        ] {
            let e = parse(text, "f").expect_err(want);
            assert!(e.msg.starts_with(want), "{want}: {}", e.msg);
        }
    }

    #[test]
    fn mise_must_be_pinned() {
        assert!(
            err_of("from x\nlayer t\n dockerfile D\n provider mise\n")
                .msg
                .starts_with("runtime.conf:4:")
        );
        assert!(
            err_of("from x\nlayer t\n dockerfile D\n provider mise latest\n")
                .msg
                .contains("not pinned")
        );
    }

    #[test]
    fn custom_provider_script_is_an_input() {
        let d = parse(
            "from x\nlayer t\n dockerfile D\n provider custom tools/install.sh\n",
            "f",
        )
        .expect("valid");
        assert_eq!(d.layers[0].inputs[0].path, "tools/install.sh");
    }

    #[test]
    fn escaping_and_absolute_paths_are_refused() {
        assert!(
            err_of("from x\nlayer a\n dockerfile D\n input ../secret\n")
                .msg
                .contains("escapes the project")
        );
        assert!(
            err_of("from x\nlayer a\n dockerfile D\n input a/../../b\n")
                .msg
                .contains("escapes the project")
        );
        assert!(
            err_of("from x\nlayer a\n dockerfile D\n input /etc/passwd\n")
                .msg
                .contains("is absolute")
        );
        assert!(parse("from x\nlayer a\n dockerfile D\n input a/../b\n", "f").is_ok());
    }

    #[test]
    fn copy_sources_skip_stages_urls_and_flags() {
        let df = "FROM x\nCOPY --chown=1:1 a.lock b/ /dst/\nCOPY --from=build /x /y\nADD https://e/x /y\n\
                  COPY [\"c d\", \"/e\"]\nRUN echo \\\n  COPY no /x\nCOPY $V /x\ncopy ./e /f\n";
        let s: Vec<(usize, String)> = context_sources(df)
            .into_iter()
            .map(|s| (s.line, s.path))
            .collect();
        let want: Vec<(usize, String)> = [(2, "a.lock"), (2, "b/"), (5, "c d"), (9, "./e")]
            .into_iter()
            .map(|(l, p)| (l, p.to_string()))
            .collect();
        assert_eq!(s, want);
    }

    #[test]
    fn globs_match_within_a_component() {
        let glob_match = base::glob::matches;
        assert!(glob_match("*.lock", "a.lock"));
        assert!(!glob_match("*.lock", "d/a.lock"));
        assert!(glob_match("d/?.lock", "d/a.lock"));
        assert!(glob_match("req[a-z]*.txt", "requirements.txt"));
        assert!(!glob_match("x*", "y"));
    }

    #[test]
    fn diff_names_what_changed() {
        let old = "loopwright-layer 1\nlayer d\nparent p1\nprovider none\ndockerfile D 644 aa\ninput a 644 11\ninput b 644 22\ninput c 644 33\n";
        let new = "loopwright-layer 1\nlayer d\nparent p2\nprovider none\ndockerfile D 644 aa\ninput a 644 99\ninput b 755 22\ninput e 644 44\n";
        let d = diff_manifests(old, new);
        assert_eq!(
            d,
            [
                Change::Parent {
                    was: "p1".into(),
                    now: "p2".into()
                },
                Change::Content("a".into()),
                Change::Mode {
                    path: "b".into(),
                    was: "644".into(),
                    now: "755".into()
                },
                Change::Added("e".into()),
                Change::Removed("c".into()),
            ]
        );
        assert!(diff_manifests(old, old).is_empty());
    }

    #[test]
    fn default_runtime_parses() {
        let conf = DEFAULT_RUNTIME[0]
            .1
            .replace("@FROM@", "debian:bookworm-slim")
            .replace("@DEPS_INPUTS@\n", "    input Cargo.lock\n");
        let d = parse(&conf, RUNTIME_FILE).expect("the shipped runtime.conf is valid");
        let names: Vec<&str> = d.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["base", "toolchain", "deps"]);
        for (name, text, _) in DEFAULT_RUNTIME
            .iter()
            .filter(|(n, _, _)| n.ends_with(".Dockerfile"))
        {
            assert!(
                text.contains("FROM ${LW_PARENT}"),
                "{name} starts from its parent"
            );
        }
    }
}
