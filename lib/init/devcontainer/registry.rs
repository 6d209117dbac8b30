//! Features from a registry (`ghcr.io/devcontainers/features/node:1`): lw
//! init fetches each through the OCI distribution API and writes it into
//! the runtime (`.loopwright/runtime/features/NAME/`), where it is a local
//! feature from then on; lw-build fetches nothing.
//!
//! A feature is an OCI artifact: a manifest whose one layer, of media type
//! `application/vnd.devcontainers.layer.v1+tar`, is the tar of the feature's
//! folder.  The manifest is read by tag or by digest (`NAME@sha256:…`, then
//! its bytes must hash to that digest), the layer's blob is checked against
//! its digest while it arrives and refused past [`MAX_BLOB`], and the tar is
//! unpacked in memory, hostile until shown otherwise: only regular files
//! and folders, no absolute path, no `..`, no link of any kind, at most
//! [`MAX_FILES`] entries.  The manifest's digest is written into the
//! feature's layer (a label of its Dockerfile, so the layer's tag hashes
//! it) and into lw init's record, so a tag moved since is noticed by the
//! next lw init.
//!
//! The identifier is read as the reference implementation (@devcontainers/cli,
//! `getRef`) reads it: lower-cased; `REGISTRY/PATH[:TAG|@sha256:HEX]`, the
//! tag `latest` when none is given; PATH as a repository name.  A registry
//! that cannot be reached, answers an error or nonsense is the old refusal
//! (vendor it by hand), with the cause.

use std::io::{Read, Write};

use base::error::{Error, Result};

/// The layer's media type (the Dev Container features distribution spec).
pub const LAYER_TYPE: &str = "application/vnd.devcontainers.layer.v1+tar";
/// A feature's tar larger than this is refused while it arrives.
pub const MAX_BLOB: u64 = 16 << 20;
/// A feature's tar with more entries than this is refused.
pub const MAX_FILES: usize = 2000;

/// A feature's identifier, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureRef {
    /// `HOST[:PORT]`.
    pub registry: String,
    /// The repository, e.g. `devcontainers/features/node`.
    pub path: String,
    /// A tag, or a digest `sha256:HEX`.
    pub version: String,
}

impl FeatureRef {
    /// The feature's own name: the last part of its path.
    pub fn name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// Pinned by digest (`@sha256:`), not by a tag.
    pub fn pinned(&self) -> bool {
        self.version.starts_with("sha256:")
    }

    /// The identifier without its version, as `installsAfter` and
    /// `dependsOn` name a feature.
    pub fn resource(&self) -> String {
        format!("{}/{}", self.registry, self.path)
    }
}

impl std::fmt::Display for FeatureRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sep = if self.pinned() { '@' } else { ':' };
        write!(f, "{}/{}{sep}{}", self.registry, self.path, self.version)
    }
}

fn path_ok(p: &str) -> bool {
    !p.is_empty()
        && p.split('/').all(|c| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
                && !c.contains("..")
        })
}

fn tag_ok(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 128
        && (t.as_bytes()[0].is_ascii_alphanumeric() || t.starts_with('_'))
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `id` as a registry feature, or `None` when it is none (a local `./`
/// path, a URL, a legacy bare name, a malformed reference).
pub fn parse_ref(id: &str) -> Option<FeatureRef> {
    let input = id.to_ascii_lowercase();
    if input.starts_with('.') || input.contains("://") {
        return None;
    }
    let (resource, version) = if let Some((r, d)) = input.rsplit_once('@') {
        let hex = d.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        (r.to_string(), d.to_string())
    } else {
        match input.rfind(':') {
            Some(i) if i > input.find('/').unwrap_or(usize::MAX) => {
                (input[..i].to_string(), input[i + 1..].to_string())
            }
            _ => (input.clone(), "latest".to_string()),
        }
    };
    if !resource_version_ok(&resource, &version) {
        return None;
    }
    let (registry, path) = resource.split_once('/')?;
    let host_ok = !registry.is_empty()
        && registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b));
    (host_ok && path_ok(path)).then(|| FeatureRef {
        registry: registry.to_string(),
        path: path.to_string(),
        version,
    })
}

fn resource_version_ok(resource: &str, version: &str) -> bool {
    resource.contains('/') && (version.starts_with("sha256:") || tag_ok(version))
}

/// A feature fetched: the manifest's digest and the folder's files
/// (`path`, bytes, mode), paths relative to the folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    pub digest: String,
    pub files: Vec<(String, Vec<u8>, u32)>,
}

/// How lw init reaches registries.
#[derive(Clone, Debug)]
pub struct Reach {
    /// A PEM file of CA certificates to trust instead of the system's
    /// (`devcontainer.feature-ca`).
    pub ca_file: Option<std::path::PathBuf>,
    /// The most each request of a fetch may take, its body included
    /// (`devcontainer.fetch-timeout`, default [`FETCH_TIMEOUT`]): a
    /// registry that trickles cannot hold lw init.
    pub timeout: std::time::Duration,
}

/// The default of `devcontainer.fetch-timeout`.
pub const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for Reach {
    fn default() -> Reach {
        Reach {
            ca_file: None,
            timeout: FETCH_TIMEOUT,
        }
    }
}

/// Fetches the feature `r`: manifest, then its layer, then the files.
/// The error's text is the cause; the caller names the feature.
pub fn fetch(r: &FeatureRef, reach: &Reach) -> Result<Fetched> {
    use engine::distribution::{CacheRef, Client, Options};
    let at = CacheRef {
        host: r.registry.clone(),
        repo: r.path.clone(),
    };
    let client = Client::new(
        &at,
        &Options {
            ca_file: reach.ca_file.clone(),
            credentials: None,
            request_timeout: Some(reach.timeout),
        },
    )?;
    client.login(false)?;
    let (_, bytes) = client.manifest_bytes(&r.version)?.ok_or_else(|| {
        Error::new(
            base::error::Exit::NoInput,
            format!(
                "{r}: no such feature (the registry has no manifest '{}')",
                r.version
            ),
        )
    })?;
    let (digest, layer, size) = layer_of(&bytes, r).map_err(Error::data)?;
    if size > MAX_BLOB {
        return Err(Error::data(format!(
            "{r}: its layer is {size} bytes, more than the {} MiB a feature may be",
            MAX_BLOB >> 20
        )));
    }
    let mut tar = Bounded(Vec::new());
    client.get_blob(&layer, &mut tar)?;
    let files = unpack(&tar.0).map_err(|e| Error::data(format!("{r}: {e}")))?;
    Ok(Fetched { digest, files })
}

/// A sink that refuses to hold more than [`MAX_BLOB`] bytes (a registry
/// may send more than the manifest said).
struct Bounded(Vec<u8>);

impl Write for Bounded {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if (self.0.len() + b.len()) as u64 > MAX_BLOB {
            return Err(std::io::Error::other(format!(
                "more than the {} MiB a feature may be",
                MAX_BLOB >> 20
            )));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// From a manifest's bytes: its digest, its feature layer's digest and
/// size.  A manifest asked for by digest must hash to it.
pub fn layer_of(
    bytes: &[u8],
    r: &FeatureRef,
) -> std::result::Result<(String, String, u64), String> {
    let digest = format!("sha256:{}", base::digest::sha256_hex(bytes));
    if r.pinned() && digest != r.version {
        return Err(format!(
            "{r}: the registry's manifest hashes to {digest}, not the digest asked for; refused"
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("{r}: the manifest is not JSON: {e}"))?;
    let layers = v.get("layers").and_then(|l| l.as_array());
    let found: Vec<(String, u64)> = layers
        .into_iter()
        .flatten()
        .filter(|l| l.get("mediaType").and_then(|m| m.as_str()) == Some(LAYER_TYPE))
        .filter_map(|l| {
            let d = l.get("digest")?.as_str()?;
            let hex = d.strip_prefix("sha256:")?;
            (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| {
                (
                    d.to_string(),
                    l.get("size").and_then(|s| s.as_u64()).unwrap_or(0),
                )
            })
        })
        .collect();
    match found.as_slice() {
        [(d, s)] => Ok((digest, d.clone(), *s)),
        _ => Err(format!(
            "{r}: not a feature (its manifest should hold one layer of type {LAYER_TYPE} with a sha256 digest)"
        )),
    }
}

/// The files of a feature's tar, refused whole when one entry is hostile.
pub fn unpack(tar: &[u8]) -> std::result::Result<Vec<(String, Vec<u8>, u32)>, String> {
    let mut files = Vec::new();
    let mut total = 0u64;
    let mut a = tar::Archive::new(tar);
    let entries = a.entries().map_err(|e| format!("not a tar: {e}"))?;
    for (n, e) in entries.enumerate() {
        let mut e = e.map_err(|e| format!("not a tar: {e}"))?;
        if n >= MAX_FILES {
            return Err(format!("more than {MAX_FILES} entries; refused"));
        }
        let raw = e.path_bytes().into_owned();
        let name =
            String::from_utf8(raw).map_err(|_| "a file name that is not UTF-8".to_string())?;
        let rel = clean(&name)
            .ok_or_else(|| format!("'{name}': a path outside the feature's folder; refused"))?;
        let kind = e.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(format!(
                "'{name}': a {} (only files and folders are unpacked); refused",
                if kind.is_symlink() || kind.is_hard_link() {
                    "link"
                } else {
                    "special file"
                }
            ));
        }
        if rel.is_empty() {
            return Err(format!("'{name}': a file named as the folder; refused"));
        }
        let size = e.header().size().map_err(|e| format!("'{name}': {e}"))?;
        total += size;
        if total > MAX_BLOB {
            return Err(format!(
                "more than {} MiB unpacked; refused",
                MAX_BLOB >> 20
            ));
        }
        let mode = e.header().mode().unwrap_or(0o644);
        let mut bytes = Vec::with_capacity(size as usize);
        e.read_to_end(&mut bytes)
            .map_err(|e| format!("'{name}': {e}"))?;
        let mode = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
        files.retain(|(p, _, _): &(String, Vec<u8>, u32)| *p != rel);
        files.push((rel, bytes, mode));
    }
    for need in ["devcontainer-feature.json", "install.sh"] {
        if !files.iter().any(|(p, _, _)| p == need) {
            return Err(format!("the feature has no {need}"));
        }
    }
    Ok(files)
}

/// `name` relative to the folder (`./` and empty parts dropped), `None`
/// when it is absolute or climbs.
fn clean(name: &str) -> Option<String> {
    if name.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for p in name.split('/') {
        match p {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests;
