//! Layered runtime images, each tagged by the hash of its declared inputs.
//!
//! A project describes its runtime in `.loopwright/runtime/runtime.conf`: an
//! image to start `from` and a chain of layers (base -> toolchain -> deps by
//! default), each with a Dockerfile and an explicit list of inputs.  A layer's
//! tag is the sha256 of its *manifest*, a small text that names:
//!
//! - the layer and its parent (the parent's tag, or the `from` image's id),
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::digest::sha256_hex;
use crate::engine::{BuildEvent, BuildOutcome, BuildRequest, Engine};
use crate::error::{Error, Exit, Result};

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

/// Manifest format version: bump it when the manifest's meaning changes, so
/// every tag changes with it.
const MANIFEST_VERSION: &str = "loopwright-layer 1";

/// Length of the hash prefix used as a tag (96 bits).
const TAG_HEX: usize = 24;

/// The default runtime shipped with the toolkit; `lw-build init` writes it.
pub const DEFAULT_RUNTIME: &[(&str, &str, u32)] = &[
    (
        "runtime.conf",
        include_str!("../runtime/runtime.conf"),
        0o644,
    ),
    (
        "base.Dockerfile",
        include_str!("../runtime/base.Dockerfile"),
        0o644,
    ),
    (
        "toolchain.Dockerfile",
        include_str!("../runtime/toolchain.Dockerfile"),
        0o644,
    ),
    (
        "deps.Dockerfile",
        include_str!("../runtime/deps.Dockerfile"),
        0o644,
    ),
    ("mise.toml", include_str!("../runtime/mise.toml"), 0o644),
    ("deps.sh", include_str!("../runtime/deps.sh"), 0o755),
    ("entry.sh", include_str!("../runtime/entry.sh"), 0o755),
    (
        "ca-certificates/README",
        include_str!("../runtime/ca-certificates/README"),
        0o644,
    ),
];

/// How a layer gets its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// mise at a pinned version installs the tools its config declares.
    Mise { version: String },
    /// The Dockerfile installs tools itself.
    Native,
    /// A script (a declared input) installs them.
    Custom { script: String },
}

impl Provider {
    /// As the manifest and `--explain` write it: `mise 2026.9.15`, `native`, `custom PATH`.
    pub fn describe(&self) -> String {
        match self {
            Provider::Mise { version } => format!("mise {version}"),
            Provider::Native => "native".into(),
            Provider::Custom { script } => format!("custom {script}"),
        }
    }
}

/// One declared input, with the line that declared it.
#[derive(Clone, Debug)]
pub struct InputDecl {
    pub path: String,
    pub line: usize,
}

/// One layer of the definition.
#[derive(Clone, Debug)]
pub struct LayerDef {
    pub name: String,
    pub line: usize,
    pub dockerfile: String,
    pub dockerfile_line: usize,
    pub provider: Option<Provider>,
    pub inputs: Vec<InputDecl>,
}

/// A parsed runtime definition.
#[derive(Clone, Debug)]
pub struct Definition {
    /// Repository prefix of every tag: layer `deps` is tagged `IMAGE-deps:HASH`.
    pub image: Option<String>,
    /// The image the first layer starts from.
    pub from: String,
    pub layers: Vec<LayerDef>,
}

fn conf_err(file: &str, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::config(format!("{file}:{line}: {msg}"))
}

fn valid_layer_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 40
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'_')
        && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// True for a Docker repository name loopwright accepts (lower case, `/`-separated).
pub fn valid_repo(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.split('/').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(&c))
                && part.as_bytes()[0].is_ascii_alphanumeric()
                && part.as_bytes()[part.len() - 1].is_ascii_alphanumeric()
        })
}

fn pinned_version(v: &str) -> bool {
    !v.is_empty()
        && v.as_bytes()[0].is_ascii_digit()
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b".-+".contains(&c))
}

/// Parses the text of a runtime definition; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Definition> {
    let mut image = None;
    let mut from: Option<String> = None;
    let mut layers: Vec<LayerDef> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = match raw.find(" #").or_else(|| raw.find("\t#")) {
            Some(at) => &raw[..at],
            None => raw,
        };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let key = words.next().expect("a non-empty line has a first word");
        let args: Vec<&str> = words.collect();
        let one = |what: &str| -> Result<String> {
            match args.as_slice() {
                [a] => Ok(a.to_string()),
                [] => Err(conf_err(file, n, format!("'{key}' needs {what}"))),
                _ => Err(conf_err(
                    file,
                    n,
                    format!("'{key}' takes one {what}, got {}", args.len()),
                )),
            }
        };
        match key {
            "image" => {
                if !layers.is_empty() {
                    return Err(conf_err(
                        file,
                        n,
                        "'image' belongs before the first 'layer'",
                    ));
                }
                let v = one("repository name")?;
                if !valid_repo(&v) {
                    return Err(conf_err(
                        file,
                        n,
                        format!(
                            "invalid repository name '{v}' (lower case letters, digits, '._-', '/')"
                        ),
                    ));
                }
                image = Some(v);
            }
            "from" => {
                if !layers.is_empty() {
                    return Err(conf_err(file, n, "'from' belongs before the first 'layer'"));
                }
                if from.is_some() {
                    return Err(conf_err(file, n, "'from' given twice"));
                }
                from = Some(one("image reference")?);
            }
            "layer" => {
                let name = one("name")?;
                if !valid_layer_name(&name) {
                    return Err(conf_err(
                        file,
                        n,
                        format!(
                            "invalid layer name '{name}' (lower case letters, digits, '-', '_')"
                        ),
                    ));
                }
                if let Some(prev) = layers.iter().find(|l| l.name == name) {
                    return Err(conf_err(
                        file,
                        n,
                        format!("layer '{name}' already defined on line {}", prev.line),
                    ));
                }
                layers.push(LayerDef {
                    name,
                    line: n,
                    dockerfile: String::new(),
                    dockerfile_line: 0,
                    provider: None,
                    inputs: Vec::new(),
                });
            }
            "dockerfile" | "input" | "provider" => {
                let Some(layer) = layers.last_mut() else {
                    return Err(conf_err(
                        file,
                        n,
                        format!("'{key}' outside a layer; start one with 'layer NAME'"),
                    ));
                };
                match key {
                    "dockerfile" => {
                        if !layer.dockerfile.is_empty() {
                            return Err(conf_err(
                                file,
                                n,
                                format!("layer '{}' has two dockerfiles", layer.name),
                            ));
                        }
                        let p = one("path")?;
                        check_rel_path(&p).map_err(|m| conf_err(file, n, m))?;
                        layer.dockerfile = p;
                        layer.dockerfile_line = n;
                    }
                    "input" => {
                        if args.is_empty() {
                            return Err(conf_err(file, n, "'input' needs at least one path"));
                        }
                        for a in &args {
                            check_rel_path(a).map_err(|m| conf_err(file, n, m))?;
                            layer.inputs.push(InputDecl {
                                path: normalize(a),
                                line: n,
                            });
                        }
                    }
                    _ => {
                        if layer.provider.is_some() {
                            return Err(conf_err(
                                file,
                                n,
                                format!("layer '{}' has two providers", layer.name),
                            ));
                        }
                        let p = match args.as_slice() {
                            ["mise", v] if pinned_version(v) => Provider::Mise {
                                version: v.to_string(),
                            },
                            ["mise", v] => {
                                return Err(conf_err(
                                    file,
                                    n,
                                    format!(
                                        "mise version '{v}' is not pinned; write one like 'provider mise 2026.9.15'"
                                    ),
                                ));
                            }
                            ["mise"] => {
                                return Err(conf_err(
                                    file,
                                    n,
                                    "the mise provider needs a pinned version, e.g. 'provider mise 2026.9.15'",
                                ));
                            }
                            ["native"] => Provider::Native,
                            ["custom", script] => {
                                check_rel_path(script).map_err(|m| conf_err(file, n, m))?;
                                let script = normalize(script);
                                // The script decides what gets installed: it is an input.
                                layer.inputs.push(InputDecl {
                                    path: script.clone(),
                                    line: n,
                                });
                                Provider::Custom { script }
                            }
                            ["custom"] => {
                                return Err(conf_err(
                                    file,
                                    n,
                                    "the custom provider needs a script path",
                                ));
                            }
                            _ => {
                                return Err(conf_err(
                                    file,
                                    n,
                                    format!(
                                        "unknown provider '{}' (mise VERSION, native, custom SCRIPT)",
                                        args.join(" ")
                                    ),
                                ));
                            }
                        };
                        layer.provider = Some(p);
                    }
                }
            }
            other => {
                return Err(conf_err(
                    file,
                    n,
                    format!(
                        "unknown keyword '{other}' (image, from, layer, dockerfile, input, provider)"
                    ),
                ));
            }
        }
    }
    let last = text.lines().count().max(1);
    let Some(from) = from else {
        return Err(conf_err(
            file,
            1,
            "no 'from' line: name the image the first layer starts from",
        ));
    };
    if layers.is_empty() {
        return Err(conf_err(
            file,
            last,
            "no layers defined; add 'layer NAME' with a 'dockerfile'",
        ));
    }
    for l in &layers {
        if l.dockerfile.is_empty() {
            return Err(conf_err(
                file,
                l.line,
                format!("layer '{}' has no 'dockerfile'", l.name),
            ));
        }
    }
    Ok(Definition {
        image,
        from,
        layers,
    })
}

/// Refuses paths that are absolute or climb out of the project.
fn check_rel_path(p: &str) -> std::result::Result<(), String> {
    let path = Path::new(p);
    if path.is_absolute() {
        return Err(format!(
            "path '{p}' is absolute; inputs are relative to the project root"
        ));
    }
    let mut depth: i64 = 0;
    for c in path.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return Err(format!("path '{p}' escapes the project"));
        }
    }
    if normalize(p).is_empty() {
        return Err(format!(
            "path '{p}' names the whole project; declare the files a layer needs"
        ));
    }
    Ok(())
}

/// `./a//b/../c` -> `a/c`.
fn normalize(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// What an input entry is.  Directories are entries too, so that a declared
/// directory that happens to be empty still exists in the build context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    File,
    Symlink,
    Dir,
}

/// A file of a build context, hashed.
#[derive(Clone, Debug)]
pub struct InputFile {
    /// Project-relative path.
    pub path: String,
    /// 0o755 or 0o644 (see the module comment); 0o777 for a symlink,
    /// 0o755 for a directory.
    pub mode: u32,
    /// Content, the link target for a symlink, nothing for a directory.
    pub data: Vec<u8>,
    pub kind: InputKind,
    pub sha256: String,
}

/// A project and its parsed runtime definition.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub root: PathBuf,
    pub def: Definition,
    /// Repository prefix (from `image`, else `loopwright/<project directory>`).
    pub image: String,
}

impl Runtime {
    /// Reads `ROOT/.loopwright/runtime/runtime.conf`.
    pub fn load(root: &Path) -> Result<Runtime> {
        let file = root.join(RUNTIME_FILE);
        let text = match fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let _ = e;
                return Err(Error::new(
                    Exit::NoInput,
                    format!(
                        "no runtime definition at '{}'; run 'lw-build init' to write the default one",
                        file.display()
                    ),
                ));
            }
            Err(e) => return Err(Error::io_as(Exit::NoInput, "cannot read", &file, e)),
        };
        let def = parse(&text, RUNTIME_FILE)?;
        let image = match &def.image {
            Some(i) => i.clone(),
            None => format!("loopwright/{}", repo_component(root)),
        };
        Ok(Runtime {
            root: root.to_path_buf(),
            def,
            image,
        })
    }

    /// Reads a declared input (a file, or every file under a directory).
    fn read_input(
        &self,
        layer: &LayerDef,
        decl: &InputDecl,
        out: &mut BTreeMap<String, InputFile>,
    ) -> Result<()> {
        let canon_root = fs::canonicalize(&self.root)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot resolve", &self.root, e))?;
        let path = self.root.join(&decl.path);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::new(
                    Exit::NoInput,
                    format!(
                        "input '{}' of layer '{}' does not exist ({RUNTIME_FILE}:{}); create it or remove it from the layer's inputs",
                        decl.path, layer.name, decl.line
                    ),
                ));
            }
            Err(e) => return Err(Error::io_as(Exit::NoInput, "cannot read input", &path, e)),
        };
        // A symlink anywhere on the way may lead out of the project.
        let resolved = fs::canonicalize(&path)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot resolve input", &path, e))?;
        if !resolved.starts_with(&canon_root) {
            return Err(Error::config(format!(
                "input '{}' of layer '{}' ({RUNTIME_FILE}:{}) resolves to '{}', outside the project; refused",
                decl.path,
                layer.name,
                decl.line,
                resolved.display()
            )));
        }
        walk(&self.root, &canon_root, &decl.path, &meta, out)
    }

    /// Computes every layer's manifest and tag and asks the engine which exist.
    pub fn plan(&self, engine: &dyn Engine) -> Result<Plan> {
        let from_img = engine.image(&self.def.from)?.ok_or_else(|| {
            Error::new(
                Exit::NoInput,
                format!(
                    "image '{}' ('from' in {RUNTIME_FILE}) is not in the engine; build or load it first (docker pull, docker load, or scripts/test-images)",
                    self.def.from
                ),
            )
        })?;
        let mut layers: Vec<Layer> = Vec::new();
        for def in &self.def.layers {
            let mut files = BTreeMap::new();
            let df_decl = InputDecl {
                path: normalize(&def.dockerfile),
                line: def.dockerfile_line,
            };
            if !self.root.join(&df_decl.path).exists() {
                return Err(Error::new(
                    Exit::NoInput,
                    format!(
                        "dockerfile '{}' of layer '{}' does not exist ({RUNTIME_FILE}:{})",
                        def.dockerfile, def.name, def.dockerfile_line
                    ),
                ));
            }
            self.read_input(def, &df_decl, &mut files)?;
            let dockerfile = files
                .remove(&df_decl.path)
                .filter(|f| f.kind == InputKind::File)
                .ok_or_else(|| {
                    Error::config(format!(
                        "dockerfile '{}' of layer '{}' is not a regular file",
                        def.dockerfile, def.name
                    ))
                })?;
            for decl in &def.inputs {
                self.read_input(def, decl, &mut files)?;
            }
            files.remove(&dockerfile.path);
            let (parent_ref, parent_line) = match layers.last() {
                Some(p) => (p.tag.clone(), p.tag.clone()),
                None => (
                    self.def.from.clone(),
                    format!("{} {}", self.def.from, from_img.id),
                ),
            };
            let mut m = String::new();
            let _ = writeln!(m, "{MANIFEST_VERSION}");
            let _ = writeln!(m, "layer {}", def.name);
            let _ = writeln!(m, "parent {parent_line}");
            let _ = writeln!(
                m,
                "provider {}",
                def.provider
                    .as_ref()
                    .map_or("none".to_string(), Provider::describe)
            );
            let _ = writeln!(
                m,
                "dockerfile {} {:o} {}",
                dockerfile.path, dockerfile.mode, dockerfile.sha256
            );
            for f in files.values() {
                let kind = match f.kind {
                    InputKind::File => "input",
                    InputKind::Symlink => "link",
                    InputKind::Dir => "dir",
                };
                let _ = writeln!(m, "{kind} {} {:o} {}", f.path, f.mode, f.sha256);
            }
            let hash = sha256_hex(m.as_bytes());
            let repo = format!("{}-{}", self.image, def.name);
            let tag = format!("{repo}:{}", &hash[..TAG_HEX]);
            let image = engine.image(&tag)?;
            layers.push(Layer {
                def: def.clone(),
                parent: parent_ref,
                manifest: m,
                hash,
                repo,
                tag,
                dockerfile,
                files: files.into_values().collect(),
                image_id: image.map(|i| i.id),
            });
        }
        Ok(Plan { layers })
    }
}

/// Lower-case repository component made of a directory's name.
fn repo_component(root: &Path) -> String {
    let name = fs::canonicalize(root)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s = s.trim_matches('-').to_string();
    if s.is_empty() { "project".into() } else { s }
}

fn walk(
    root: &Path,
    canon_root: &Path,
    rel: &str,
    meta: &fs::Metadata,
    out: &mut BTreeMap<String, InputFile>,
) -> Result<()> {
    let path = root.join(rel);
    let ft = meta.file_type();
    if ft.is_symlink() {
        let target = fs::read_link(&path)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read link", &path, e))?;
        if let Ok(r) = fs::canonicalize(&path)
            && !r.starts_with(canon_root)
        {
            return Err(Error::config(format!(
                "input '{rel}' links to '{}', outside the project; refused",
                r.display()
            )));
        }
        let data = target.as_os_str().as_encoded_bytes().to_vec();
        let sha256 = sha256_hex(&data);
        out.insert(
            rel.to_string(),
            InputFile {
                path: rel.to_string(),
                mode: 0o777,
                data,
                kind: InputKind::Symlink,
                sha256,
            },
        );
    } else if ft.is_dir() {
        let mut names: Vec<String> = Vec::new();
        for ent in fs::read_dir(&path)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read directory", &path, e))?
        {
            let ent =
                ent.map_err(|e| Error::io_as(Exit::NoInput, "cannot read directory", &path, e))?;
            names.push(ent.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        let sha256 = sha256_hex(b"");
        out.insert(
            rel.to_string(),
            InputFile {
                path: rel.to_string(),
                mode: 0o755,
                data: Vec::new(),
                kind: InputKind::Dir,
                sha256,
            },
        );
        for name in names {
            let child = format!("{rel}/{name}");
            let cp = root.join(&child);
            let m = fs::symlink_metadata(&cp)
                .map_err(|e| Error::io_as(Exit::NoInput, "cannot read input", &cp, e))?;
            walk(root, canon_root, &child, &m, out)?;
        }
    } else if ft.is_file() {
        let data = fs::read(&path)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read input", &path, e))?;
        let mode = if meta.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        let sha256 = sha256_hex(&data);
        out.insert(
            rel.to_string(),
            InputFile {
                path: rel.to_string(),
                mode,
                data,
                kind: InputKind::File,
                sha256,
            },
        );
    } else {
        return Err(Error::config(format!(
            "input '{rel}' is neither a file, a directory nor a symlink"
        )));
    }
    Ok(())
}

/// A layer with its tag computed.
#[derive(Clone, Debug)]
pub struct Layer {
    pub def: LayerDef,
    /// What its Dockerfile starts FROM (`LW_PARENT`).
    pub parent: String,
    pub manifest: String,
    pub hash: String,
    /// `IMAGE-LAYER`.
    pub repo: String,
    /// `IMAGE-LAYER:HASH`.
    pub tag: String,
    pub dockerfile: InputFile,
    pub files: Vec<InputFile>,
    /// The image the tag points at, when it exists.
    pub image_id: Option<String>,
}

impl Layer {
    pub fn cached(&self) -> bool {
        self.image_id.is_some()
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_LAYER.to_string(), self.repo.clone()),
            (LABEL_MANIFEST.to_string(), self.manifest.clone()),
        ])
    }

    fn build_args(&self) -> BTreeMap<String, String> {
        let mut a = BTreeMap::from([("LW_PARENT".to_string(), self.parent.clone())]);
        match &self.def.provider {
            Some(Provider::Mise { version }) => {
                a.insert("LW_MISE_VERSION".into(), version.clone());
            }
            Some(Provider::Custom { script }) => {
                a.insert("LW_TOOLCHAIN_SCRIPT".into(), script.clone());
            }
            Some(Provider::Native) | None => {}
        }
        a
    }

    /// The tar archive sent as build context: the Dockerfile and the inputs,
    /// from the bytes that were hashed, with fixed owners and times.
    pub fn context(&self) -> Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        let tar_err = |e: std::io::Error| {
            Error::new(Exit::Software, "cannot make the build context").with_source(e)
        };
        for f in std::iter::once(&self.dockerfile).chain(self.files.iter()) {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_mode(f.mode);
            if f.kind == InputKind::Dir {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, format!("{}/", f.path), std::io::empty())
                    .map_err(tar_err)?;
            } else if f.kind == InputKind::Symlink {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                let target = String::from_utf8_lossy(&f.data).into_owned();
                b.append_link(&mut h, &f.path, target).map_err(tar_err)?;
            } else {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(f.data.len() as u64);
                b.append_data(&mut h, &f.path, f.data.as_slice())
                    .map_err(tar_err)?;
            }
        }
        b.into_inner().map_err(tar_err)
    }
}

/// Every layer of a runtime, in build order.
#[derive(Clone, Debug)]
pub struct Plan {
    pub layers: Vec<Layer>,
}

impl Plan {
    /// The tag of the last layer: the image a sandbox runs.
    pub fn final_tag(&self) -> &str {
        &self
            .layers
            .last()
            .expect("a definition has at least one layer")
            .tag
    }
}

/// Options of one build run.
pub struct BuildOptions<'a> {
    /// Every line of build output, as it arrives (`-v`, terminal progress).
    pub on_event: &'a mut dyn FnMut(&Layer, &BuildEvent),
    /// Called before a layer builds.
    pub on_start: &'a mut dyn FnMut(&Layer),
}

/// What happened to a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayerResult {
    Cached(String),
    Built(String),
}

/// Builds the layers whose tags are missing, in order.  Stops at the first
/// failure: a failed step is exit 65 with the step's output in the error.
pub fn build(
    engine: &dyn Engine,
    plan: &mut Plan,
    opts: &mut BuildOptions<'_>,
) -> Result<Vec<LayerResult>> {
    let mut results = Vec::new();
    for layer in plan.layers.iter_mut() {
        if let Some(id) = &layer.image_id {
            results.push(LayerResult::Cached(id.clone()));
            continue;
        }
        let df_text = String::from_utf8_lossy(&layer.dockerfile.data).into_owned();
        check_dockerfile(&df_text, layer)?;
        let req = BuildRequest {
            context: layer.context()?,
            dockerfile: layer.dockerfile.path.clone(),
            tag: layer.tag.clone(),
            labels: layer.labels(),
            args: layer.build_args(),
        };
        (opts.on_start)(layer);
        let mut log = String::new();
        let outcome = engine.build(&req, &mut |ev| {
            if let BuildEvent::Output(s) = &ev {
                log.push_str(s);
            }
            (opts.on_event)(layer, &ev);
        })?;
        match outcome {
            BuildOutcome::Built(id) => {
                layer.image_id = Some(id.clone());
                results.push(LayerResult::Built(id));
            }
            BuildOutcome::Failed(msg) => return Err(failure(layer, &msg, &log)),
        }
    }
    Ok(results)
}

/// The error for a failed build: a missing context file points at the input
/// list; anything else shows the step's output.
fn failure(layer: &Layer, msg: &str, log: &str) -> Error {
    let lower = msg.to_ascii_lowercase();
    let copy_step = lower.starts_with("copy failed") || lower.starts_with("add failed");
    if lower.contains("file not found in build context")
        || (copy_step
            && (lower.contains("no such file or directory")
                || lower.contains("no source files were specified")))
    {
        return Error::config(format!(
            "layer '{}': {}: the build context holds only the layer's declared inputs; declare the file with 'input PATH' under 'layer {}' in {RUNTIME_FILE} (line {})",
            layer.def.name,
            msg.trim(),
            layer.def.name,
            layer.def.line
        ));
    }
    let mut text = format!(
        "layer '{}' failed to build: {}; no tag was applied",
        layer.def.name,
        msg.trim()
    );
    let tail: Vec<&str> = log.lines().collect();
    let start = tail.len().saturating_sub(40);
    if !tail.is_empty() {
        text.push_str("\n--- build output (last lines) ---\n");
        text.push_str(&tail[start..].join("\n"));
    }
    Error::new(Exit::DataErr, text)
}

/// One COPY/ADD source found in a Dockerfile.
#[derive(Debug, PartialEq, Eq)]
pub struct Source {
    pub line: usize,
    pub instruction: String,
    pub path: String,
}

/// Lists the context paths a Dockerfile's COPY and ADD instructions read
/// (not those copied from another stage or fetched from a URL; not those
/// with variables, which only the engine can expand).
pub fn context_sources(dockerfile: &str) -> Vec<Source> {
    let mut out = Vec::new();
    let mut logical = String::new();
    let mut start = 0;
    for (i, raw) in dockerfile.lines().enumerate() {
        let t = raw.trim();
        if logical.is_empty() {
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            start = i + 1;
        } else if t.starts_with('#') {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            logical.push_str(body);
            logical.push(' ');
            continue;
        }
        logical.push_str(t);
        let line = std::mem::take(&mut logical);
        let mut words = line.splitn(2, char::is_whitespace);
        let instr = words.next().unwrap_or("").to_ascii_uppercase();
        if instr != "COPY" && instr != "ADD" {
            continue;
        }
        let rest = words.next().unwrap_or("").trim();
        let mut args: Vec<String> = Vec::new();
        let mut flags_done = false;
        let rest_words: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str::<Vec<String>>(rest).unwrap_or_default()
        } else {
            rest.split_whitespace().map(str::to_string).collect()
        };
        let mut from_stage = false;
        for w in rest_words {
            if !flags_done && w.starts_with("--") {
                if w.starts_with("--from") {
                    from_stage = true;
                }
                continue;
            }
            flags_done = true;
            args.push(w);
        }
        if from_stage || args.len() < 2 || args[0].starts_with("<<") {
            continue;
        }
        args.pop();
        for a in args {
            let is_url = a.contains("://") || a.starts_with("git@");
            if is_url || a.contains('$') {
                continue;
            }
            out.push(Source {
                line: start,
                instruction: instr.clone(),
                path: a,
            });
        }
    }
    out
}

/// Refuses a Dockerfile that reads a context path the layer did not declare,
/// before the engine is asked, naming the Dockerfile line and the input list.
fn check_dockerfile(text: &str, layer: &Layer) -> Result<()> {
    let df = &layer.dockerfile.path;
    if !text.lines().any(|l| {
        let t = l.trim_start();
        t.len() > 5 && t[..5].eq_ignore_ascii_case("FROM ") && t.contains("LW_PARENT")
    }) {
        return Err(Error::config(format!(
            "{df}: no 'FROM ${{LW_PARENT}}': a layer starts from its parent; write 'ARG LW_PARENT' then 'FROM ${{LW_PARENT}}'"
        )));
    }
    let mut present: BTreeSet<&str> = layer.files.iter().map(|f| f.path.as_str()).collect();
    present.insert(df.as_str());
    for src in context_sources(text) {
        let p = normalize(src.path.trim_start_matches('/'));
        if p.is_empty() {
            continue; // `.`: the whole context, whatever was declared.
        }
        let found = if p.contains(['*', '?', '[']) {
            present.iter().any(|f| {
                let depth = p.matches('/').count() + 1;
                let prefix: Vec<&str> = f.split('/').take(depth).collect();
                prefix.len() == depth && crate::glob::matches(&p, &prefix.join("/"))
            })
        } else {
            present.contains(p.as_str()) || present.iter().any(|f| f.starts_with(&format!("{p}/")))
        };
        if !found {
            let declared: Vec<String> = layer.def.inputs.iter().map(|i| i.path.clone()).collect();
            return Err(Error::config(format!(
                "{df}:{}: {} reads '{}', which is not an input of layer '{}'; the build context holds only the declared inputs ({}); add 'input {}' under 'layer {}' ({RUNTIME_FILE}:{})",
                src.line,
                src.instruction,
                src.path,
                layer.def.name,
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.join(", ")
                },
                p,
                layer.def.name,
                layer.def.line
            )));
        }
    }
    Ok(())
}

/// One difference between a layer and the image it would replace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Parent {
        was: String,
        now: String,
    },
    Provider {
        was: String,
        now: String,
    },
    Dockerfile(String),
    Content(String),
    Mode {
        path: String,
        was: String,
        now: String,
    },
    Added(String),
    Removed(String),
    Format,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Parent { was, now } => write!(f, "parent {was} -> {now}"),
            Change::Provider { was, now } => write!(f, "provider {was} -> {now}"),
            Change::Dockerfile(p) => write!(f, "dockerfile {p} (content)"),
            Change::Content(p) => write!(f, "{p} (content)"),
            Change::Mode { path, was, now } => write!(f, "{path} (mode {was} -> {now})"),
            Change::Added(p) => write!(f, "{p} (added)"),
            Change::Removed(p) => write!(f, "{p} (removed)"),
            Change::Format => write!(f, "manifest format"),
        }
    }
}

/// A manifest (the `org.loopwright.manifest` label) split into its header
/// lines (`parent`, `provider`, ...) and its entries, path -> (mode, sha256);
/// the Dockerfile's path is prefixed with a NUL.  lw-sandbox can compare a
/// branch's lockfiles with the entries of the image's deps layer this way.
pub type ManifestParts = (BTreeMap<String, String>, BTreeMap<String, (String, String)>);

/// Splits a manifest; see [`ManifestParts`].
pub fn manifest_entries(m: &str) -> ManifestParts {
    let mut head = BTreeMap::new();
    let mut files = BTreeMap::new();
    for l in m.lines() {
        let mut w = l.splitn(2, ' ');
        let k = w.next().unwrap_or("");
        let v = w.next().unwrap_or("").to_string();
        match k {
            "dockerfile" | "input" | "link" | "dir" => {
                let parts: Vec<&str> = v.rsplitn(3, ' ').collect();
                if parts.len() == 3 {
                    let key = if k == "dockerfile" {
                        format!("\0{}", parts[2])
                    } else {
                        parts[2].to_string()
                    };
                    files.insert(key, (parts[1].to_string(), parts[0].to_string()));
                }
            }
            _ => {
                head.insert(k.to_string(), v);
            }
        }
    }
    (head, files)
}

/// Compares two manifests: what changed from `old` to `new`.
pub fn diff_manifests(old: &str, new: &str) -> Vec<Change> {
    let (oh, of) = manifest_entries(old);
    let (nh, nf) = manifest_entries(new);
    let mut out = Vec::new();
    if old.lines().next() != new.lines().next() {
        out.push(Change::Format);
    }
    let get = |m: &BTreeMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    if get(&oh, "parent") != get(&nh, "parent") {
        out.push(Change::Parent {
            was: get(&oh, "parent"),
            now: get(&nh, "parent"),
        });
    }
    if get(&oh, "provider") != get(&nh, "provider") {
        out.push(Change::Provider {
            was: get(&oh, "provider"),
            now: get(&nh, "provider"),
        });
    }
    for (k, (mode, sum)) in &nf {
        let name = k.trim_start_matches('\0').to_string();
        match of.get(k) {
            None if k.starts_with('\0') => out.push(Change::Dockerfile(name)),
            None => out.push(Change::Added(name)),
            Some((_, s)) if s != sum && k.starts_with('\0') => out.push(Change::Dockerfile(name)),
            Some((_, s)) if s != sum => out.push(Change::Content(name)),
            Some((m, _)) if m != mode => out.push(Change::Mode {
                path: name,
                was: m.clone(),
                now: mode.clone(),
            }),
            _ => {}
        }
    }
    for k in of.keys() {
        if !nf.contains_key(k) && !k.starts_with('\0') {
            out.push(Change::Removed(k.clone()));
        }
    }
    out
}

/// What `--explain` says about a layer.
pub struct Explanation {
    /// The newest other image of the same layer, if any.
    pub replaces: Option<(String, Vec<Change>)>,
}

/// Finds the image a build of `layer` would replace and what changed since.
pub fn explain(engine: &dyn Engine, layer: &Layer) -> Result<Explanation> {
    let label = format!("{LABEL_LAYER}={}", layer.repo);
    let prev = engine
        .images_with_label(&label)?
        .into_iter()
        .find(|i| Some(&i.id) != layer.image_id.as_ref());
    Ok(Explanation {
        replaces: prev.map(|img| {
            let name = img
                .tags
                .iter()
                .find(|t| t.starts_with(&format!("{}:", layer.repo)))
                .cloned()
                .unwrap_or_else(|| img.id.clone());
            let old = img.labels.get(LABEL_MANIFEST).cloned().unwrap_or_default();
            (name, diff_manifests(&old, &layer.manifest))
        }),
    })
}

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
        crate::fs::write_replace(&p, text.as_bytes(), *mode, crate::fs::Durability::Synced)
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
        let glob_match = crate::glob::matches;
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
