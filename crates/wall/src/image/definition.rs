//! The runtime definition (`.loopwright/runtime/runtime.conf`): its
//! grammar, its checks, and the layers and inputs it declares.

use base::error::{Error, Result};
use std::path::{Component, Path};

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
    /// `context DIR`: the project's own Dockerfile, built with DIR as its
    /// context; its FROM lines name their own images (the first layer only).
    pub context: Option<String>,
    /// `arg NAME=VALUE`: build arguments of a `context` layer.
    pub args: Vec<(String, String)>,
    /// `target STAGE`: the stage a `context` layer builds.
    pub target: Option<String>,
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

pub(super) fn conf_err(file: &str, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::config(format!("{file}:{line}: {msg}"))
}

pub(super) fn valid_layer_name(s: &str) -> bool {
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

pub(super) fn pinned_version(v: &str) -> bool {
    !v.is_empty()
        && v.as_bytes()[0].is_ascii_digit()
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b".-+".contains(&c))
}

/// One line of a definition: its number, keyword and arguments.
struct Line<'a> {
    file: &'a str,
    n: usize,
    key: &'a str,
    args: Vec<&'a str>,
}

impl Line<'_> {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        conf_err(self.file, self.n, msg)
    }

    /// The one argument of the keyword; `what` names it in the error.
    fn one(&self, what: &str) -> Result<String> {
        match self.args.as_slice() {
            [a] => Ok(a.to_string()),
            [] => Err(self.err(format!("'{}' needs {what}", self.key))),
            _ => Err(self.err(format!(
                "'{}' takes one {what}, got {}",
                self.key,
                self.args.len()
            ))),
        }
    }
}

/// Parses the text of a runtime definition; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<Definition> {
    let mut image = None;
    let mut from: Option<String> = None;
    let mut layers: Vec<LayerDef> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
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
        let l = Line {
            file,
            n: i + 1,
            key,
            args: words.collect(),
        };
        match key {
            "image" => image = Some(image_line(&l, &layers)?),
            "from" => {
                if !layers.is_empty() {
                    return Err(l.err("'from' belongs before the first 'layer'"));
                }
                if from.is_some() {
                    return Err(l.err("'from' given twice"));
                }
                from = Some(l.one("image reference")?);
            }
            "layer" => layers.push(layer_line(&l, &layers)?),
            "dockerfile" | "input" | "provider" | "context" | "arg" | "target" => {
                let Some(layer) = layers.last_mut() else {
                    return Err(l.err(format!(
                        "'{key}' outside a layer; start one with 'layer NAME'"
                    )));
                };
                in_layer(&l, layer)?;
            }
            other => {
                return Err(l.err(format!(
                    "unknown keyword '{other}' (image, from, layer, dockerfile, input, provider, context, arg, target)"
                )));
            }
        }
    }
    complete(text, file, image, from, layers)
}

/// `image REPO`, before the first layer.
fn image_line(l: &Line, layers: &[LayerDef]) -> Result<String> {
    if !layers.is_empty() {
        return Err(l.err("'image' belongs before the first 'layer'"));
    }
    let v = l.one("repository name")?;
    if !valid_repo(&v) {
        return Err(l.err(format!(
            "invalid repository name '{v}' (lower case letters, digits, '._-', '/')"
        )));
    }
    Ok(v)
}

/// `layer NAME`: a new layer, its name valid and not taken.
fn layer_line(l: &Line, layers: &[LayerDef]) -> Result<LayerDef> {
    let name = l.one("name")?;
    if !valid_layer_name(&name) {
        return Err(l.err(format!(
            "invalid layer name '{name}' (lower case letters, digits, '-', '_')"
        )));
    }
    if let Some(prev) = layers.iter().find(|p| p.name == name) {
        return Err(l.err(format!(
            "layer '{name}' already defined on line {}",
            prev.line
        )));
    }
    Ok(LayerDef {
        name,
        line: l.n,
        dockerfile: String::new(),
        dockerfile_line: 0,
        provider: None,
        inputs: Vec::new(),
        context: None,
        args: Vec::new(),
        target: None,
    })
}

/// `dockerfile`, `input` and `provider`, inside the current layer.
fn in_layer(l: &Line, layer: &mut LayerDef) -> Result<()> {
    match l.key {
        "dockerfile" => {
            if !layer.dockerfile.is_empty() {
                return Err(l.err(format!("layer '{}' has two dockerfiles", layer.name)));
            }
            let p = l.one("path")?;
            check_rel_path(&p).map_err(|m| l.err(m))?;
            layer.dockerfile = p;
            layer.dockerfile_line = l.n;
        }
        "input" => {
            if l.args.is_empty() {
                return Err(l.err("'input' needs at least one path"));
            }
            for a in &l.args {
                check_rel_path(a).map_err(|m| l.err(m))?;
                layer.inputs.push(InputDecl {
                    path: normalize(a),
                    line: l.n,
                });
            }
        }
        "context" => {
            if layer.context.is_some() {
                return Err(l.err(format!("layer '{}' has two contexts", layer.name)));
            }
            let p = l.one("folder")?;
            // `.` is the project's top; what climbs out of it is refused.
            match check_rel_path(&p) {
                Err(m) if !m.contains("names the whole project") => return Err(l.err(m)),
                _ => layer.context = Some(normalize(&p)),
            }
        }
        "arg" => {
            for a in &l.args {
                let Some((k, v)) = a.split_once('=').filter(|(k, _)| valid_arg(k)) else {
                    return Err(l.err(format!("'arg {a}': write NAME=VALUE")));
                };
                layer.args.push((k.to_string(), v.to_string()));
            }
        }
        "target" => layer.target = Some(l.one("stage name")?),
        _ => {
            if layer.provider.is_some() {
                return Err(l.err(format!("layer '{}' has two providers", layer.name)));
            }
            layer.provider = Some(provider(l, layer)?);
        }
    }
    Ok(())
}

/// `provider mise VERSION | native | custom SCRIPT` (the script becomes an input).
fn provider(l: &Line, layer: &mut LayerDef) -> Result<Provider> {
    Ok(match l.args.as_slice() {
        ["mise", v] if pinned_version(v) => Provider::Mise {
            version: v.to_string(),
        },
        ["mise", v] => {
            return Err(l.err(format!(
                "mise version '{v}' is not pinned; write one like 'provider mise 2026.9.15'"
            )));
        }
        ["mise"] => {
            return Err(
                l.err("the mise provider needs a pinned version, e.g. 'provider mise 2026.9.15'")
            );
        }
        ["native"] => Provider::Native,
        ["custom", script] => {
            check_rel_path(script).map_err(|m| l.err(m))?;
            let script = normalize(script);
            // The script decides what gets installed: it is an input.
            layer.inputs.push(InputDecl {
                path: script.clone(),
                line: l.n,
            });
            Provider::Custom { script }
        }
        ["custom"] => return Err(l.err("the custom provider needs a script path")),
        _ => {
            return Err(l.err(format!(
                "unknown provider '{}' (mise VERSION, native, custom SCRIPT)",
                l.args.join(" ")
            )));
        }
    })
}

/// The whole definition's checks: a `from`, a layer, a dockerfile per layer.
fn complete(
    text: &str,
    file: &str,
    image: Option<String>,
    from: Option<String>,
    layers: Vec<LayerDef>,
) -> Result<Definition> {
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
    for (i, l) in layers.iter().enumerate() {
        if l.dockerfile.is_empty() {
            return Err(conf_err(
                file,
                l.line,
                format!("layer '{}' has no 'dockerfile'", l.name),
            ));
        }
        own_dockerfile(file, i, l)?;
    }
    Ok(Definition {
        image,
        from,
        layers,
    })
}

fn valid_arg(k: &str) -> bool {
    !k.is_empty()
        && !k.as_bytes()[0].is_ascii_digit()
        && k.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// A `context` layer (the project's own Dockerfile) comes first and reads
/// only inside its context; `arg` and `target` belong to one.
fn own_dockerfile(file: &str, i: usize, l: &LayerDef) -> Result<()> {
    let Some(ctx) = &l.context else {
        if !l.args.is_empty() || l.target.is_some() {
            return Err(conf_err(
                file,
                l.line,
                format!(
                    "layer '{}': 'arg' and 'target' belong to a layer with a 'context' (the project's own Dockerfile)",
                    l.name
                ),
            ));
        }
        return Ok(());
    };
    if i > 0 {
        return Err(conf_err(
            file,
            l.line,
            format!(
                "layer '{}': only the first layer has a 'context': the project's own Dockerfile starts from its own FROM",
                l.name
            ),
        ));
    }
    for inp in &l.inputs {
        if !within(ctx, &inp.path) {
            return Err(conf_err(
                file,
                inp.line,
                format!(
                    "input '{}' of layer '{}' is outside its context '{}'; the build sees only the context",
                    inp.path,
                    l.name,
                    if ctx.is_empty() { "." } else { ctx }
                ),
            ));
        }
    }
    Ok(())
}

/// True when project path `p` is `dir` or under it (`dir` empty: the top).
pub(super) fn within(dir: &str, p: &str) -> bool {
    dir.is_empty() || p == dir || p.starts_with(&format!("{dir}/"))
}

/// Refuses paths that are absolute or climb out of the project.
pub(super) fn check_rel_path(p: &str) -> std::result::Result<(), String> {
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
pub(super) fn normalize(p: &str) -> String {
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
