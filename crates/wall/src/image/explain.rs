//! Why a layer would rebuild: the manifest recorded in its label against
//! the one computed now.

use base::error::Result;
use engine::Images;
use std::collections::BTreeMap;

use super::*;

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
pub fn explain(engine: &dyn Images, layer: &Layer) -> Result<Explanation> {
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
