//! The inputs of each layer, found on disk and hashed: the tag of a layer
//! is the hash of its Dockerfile, its parent's hash, its declared inputs and
//! its provider, so only a changed layer rebuilds.  The parent is named by
//! its hash, not its repository: two projects whose chains are the same
//! (the same base, the same resolved toolchain) get the same hashes, and
//! the same tags where they share an `image` repository.

use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use engine::Images;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::*;

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
    pub(super) fn read_input(
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
    pub fn plan(&self, engine: &dyn Images) -> Result<Plan> {
        let own = self.def.layers[0].context.is_some();
        let from_line = if own {
            String::new()
        } else {
            let from_img = engine.image(&self.def.from)?.ok_or_else(|| {
                Error::new(
                    Exit::NoInput,
                    format!(
                        "image '{}' ('from' in {RUNTIME_FILE}) is not in the engine; build or load it first (docker pull, docker load, or scripts/test-images)",
                        self.def.from
                    ),
                )
            })?;
            format!("{} {}", self.def.from, from_img.id)
        };
        let mut layers: Vec<Layer> = Vec::new();
        for def in &self.def.layers {
            let (dockerfile, files) = self.layer_inputs(def)?;
            let (parent_ref, parent_line) = match layers.last() {
                Some(p) => (p.tag.clone(), p.hash.clone()),
                None if own => (self.def.from.clone(), own_froms(engine, def, &dockerfile)?),
                None => (self.def.from.clone(), from_line.clone()),
            };
            let m = manifest(def, &parent_line, &dockerfile, &files);
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

    /// A layer's Dockerfile and its other inputs, read and hashed.
    fn layer_inputs(&self, def: &LayerDef) -> Result<(InputFile, BTreeMap<String, InputFile>)> {
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
        if let Some(c) = &def.context {
            self.ignore(def, c, &dockerfile.path, &mut files)?;
        }
        Ok((dockerfile, files))
    }

    /// Leaves out of `files` what the layer's `.dockerignore` excludes
    /// (image/dockerignore.rs), and adds the ignore file itself.
    fn ignore(
        &self,
        def: &LayerDef,
        c: &str,
        df: &str,
        files: &mut BTreeMap<String, InputFile>,
    ) -> Result<()> {
        let names = dockerignore::file_for(df, c);
        let Some(name) = names
            .iter()
            .find(|n| fs::symlink_metadata(self.root.join(n)).is_ok())
        else {
            return Ok(());
        };
        let decl = InputDecl {
            path: name.clone(),
            line: def.line,
        };
        let mut own = BTreeMap::new();
        self.read_input(def, &decl, &mut own)?;
        let text = own
            .get(name)
            .filter(|f| f.kind == InputKind::File)
            .map(|f| String::from_utf8_lossy(&f.data).into_owned())
            .ok_or_else(|| Error::config(format!("'{name}' is not a regular file")))?;
        let ig = dockerignore::Ignore::parse(&text);
        files.retain(|p, _| in_context(c, p).is_none_or(|rel| !ig.excludes(rel)));
        files.extend(own);
        Ok(())
    }
}

/// The images a project's own Dockerfile starts from, each with its id
/// (the manifest's parent line), every one found in the engine: lw-build
/// asks no registry, so a missing one is 66 naming it and the fix.
fn own_froms(engine: &dyn Images, def: &LayerDef, df: &InputFile) -> Result<String> {
    let text = String::from_utf8_lossy(&df.data);
    let mut v = Vec::new();
    for f in dockerfile::external_images(&text, &def.args) {
        if f.image.is_empty() || f.image.contains('$') {
            return Err(Error::config(format!(
                "{}:{}: FROM names no image once its arguments are substituted; give the argument with 'arg NAME=VALUE' under 'layer {}' ({RUNTIME_FILE}:{})",
                df.path, f.line, def.name, def.line
            )));
        }
        let Some(img) = engine.image(&f.image)? else {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "image '{}' (FROM in {}:{}) is not in the engine, and lw-build asks no registry; where one is reachable run 'docker pull {}' (or 'docker load -i FILE' with a saved copy), then lw-build again",
                    f.image, df.path, f.line, f.image
                ),
            ));
        };
        v.push(format!("{} {}", f.image, img.id));
    }
    if v.is_empty() {
        v.push("scratch".into());
    }
    Ok(v.join(", "))
}

/// The manifest of a layer: what its tag hashes.
fn manifest(
    def: &LayerDef,
    parent_line: &str,
    dockerfile: &InputFile,
    files: &BTreeMap<String, InputFile>,
) -> String {
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
    // Written only for the project's own Dockerfile, so no other layer's
    // tag changes.
    if let Some(c) = &def.context {
        let _ = writeln!(m, "context {}", if c.is_empty() { "." } else { c });
        for (k, v) in &def.args {
            let _ = writeln!(m, "arg {k}={v}");
        }
        if let Some(t) = &def.target {
            let _ = writeln!(m, "target {t}");
        }
    }
    for f in files.values() {
        let kind = match f.kind {
            InputKind::File => "input",
            InputKind::Symlink => "link",
            InputKind::Dir => "dir",
        };
        let _ = writeln!(m, "{kind} {} {:o} {}", f.path, f.mode, f.sha256);
    }
    m
}

/// Lower-case repository component made of a directory's name.
pub(super) fn repo_component(root: &Path) -> String {
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

pub(super) fn walk(
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
        walk_dir(root, canon_root, rel, out)?;
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

/// A directory input: itself, then everything under it in name order.
fn walk_dir(
    root: &Path,
    canon_root: &Path,
    rel: &str,
    out: &mut BTreeMap<String, InputFile>,
) -> Result<()> {
    let path = root.join(rel);
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

    pub(super) fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_LAYER.to_string(), self.repo.clone()),
            (LABEL_MANIFEST.to_string(), self.manifest.clone()),
        ])
    }

    pub(super) fn build_args(&self) -> BTreeMap<String, String> {
        if self.def.context.is_some() {
            return self.def.args.iter().cloned().collect();
        }
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
        let (df_path, df_data) = self.request_dockerfile()?;
        let df = InputFile {
            path: df_path,
            data: df_data,
            ..self.dockerfile.clone()
        };
        let ctx = self.def.context.as_deref();
        let files = self.files.iter().filter_map(|f| match ctx {
            None => Some(f.clone()),
            Some(c) => in_context(c, &f.path).map(|p| InputFile {
                path: p.to_string(),
                ..f.clone()
            }),
        });
        for f in std::iter::once(df).chain(files) {
            let f = &f;
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

/// Project path `p` relative to context `c` (`c` empty: the top), when
/// inside it and not the context itself.
fn in_context<'a>(c: &str, p: &'a str) -> Option<&'a str> {
    if c.is_empty() {
        return Some(p);
    }
    p.strip_prefix(c)?
        .strip_prefix('/')
        .filter(|r| !r.is_empty())
}

impl Layer {
    /// The Dockerfile as the engine is asked to build it: its path in the
    /// context and its text.  A project's own Dockerfile sits at its path
    /// inside its context (`.loopwright.Dockerfile` when outside it), cut
    /// after its `target` stage (the engine request has no target).
    pub fn request_dockerfile(&self) -> Result<(String, Vec<u8>)> {
        let Some(c) = &self.def.context else {
            return Ok((self.dockerfile.path.clone(), self.dockerfile.data.clone()));
        };
        let path = in_context(c, &self.dockerfile.path)
            .unwrap_or(".loopwright.Dockerfile")
            .to_string();
        let Some(t) = &self.def.target else {
            return Ok((path, self.dockerfile.data.clone()));
        };
        let text = String::from_utf8_lossy(&self.dockerfile.data);
        match dockerfile::up_to_target(&text, t) {
            Some(cut) => Ok((path, cut.into_bytes())),
            None => Err(Error::config(format!(
                "layer '{}': target '{t}' is no stage of {} (no 'FROM IMAGE AS {t}'); name one of its stages with 'target' ({RUNTIME_FILE}:{})",
                self.def.name, self.dockerfile.path, self.def.line
            ))),
        }
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

    /// The tag of the first layer (the base): an agent CLI's own layer is
    /// built on it, beside the project's chain (crates/agent/src/layer.rs).
    pub fn first_tag(&self) -> &str {
        &self
            .layers
            .first()
            .expect("a definition has at least one layer")
            .tag
    }
}
