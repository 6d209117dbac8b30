//! Image archives as the engine saves them (`manifest.json`, one config per
//! image, one `layer.tar` per layer), checked before the engine sees them.
//!
//! `lw-build load FILE` reads the whole archive once before loading it:
//! every file `manifest.json` names must be there, every config must hash to
//! its name, every layer to the digest its config records, and a layer image
//! of ours must carry the input hash its tag says.  A truncated or tampered
//! archive is refused (65) before the engine is asked, so nothing of it is
//! half-loaded.  `lw-build save FILE` writes a temporary file beside FILE
//! and renames it over FILE only once the engine finished, so FILE is
//! either the old one or a whole archive.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use base::digest::hex;
use base::error::{Error, Exit, Result};
use engine::ImageBuilder;

use super::{LABEL_MANIFEST, TAG_HEX};

/// A directory removed on drop, for the files of one transfer.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Result<Scratch> {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("lw-build-{what}-{}-{t:x}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create", &dir, e))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One image of an archive, as its `manifest.json` lists it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The config file's name in the archive.
    pub config: String,
    pub repo_tags: Vec<String>,
    /// The layer files' names in the archive, bottom first.
    pub layers: Vec<String>,
}

/// What a pass over an archive found.
#[derive(Debug, Default)]
pub struct Scan {
    pub images: Vec<Entry>,
    /// Regular files: name to (sha256 hex, size).
    pub files: BTreeMap<String, (String, u64)>,
    /// Small JSON files' bytes (manifest.json, configs).
    pub json: BTreeMap<String, Vec<u8>>,
    /// Symbolic links: name to the name they point at.
    pub links: BTreeMap<String, String>,
}

fn clean(name: &str) -> String {
    name.trim_start_matches("./").to_string()
}

/// Reads an archive from `r` to its end, hashing every file.  An archive
/// that ends early or is not a tar is 65.
pub fn scan(r: impl Read, what: &str) -> Result<Scan> {
    let bad = |why: String| incomplete(what, why);
    let mut ar = tar::Archive::new(r);
    let mut s = Scan::default();
    for ent in ar.entries().map_err(|e| bad(e.to_string()))? {
        let mut ent = ent.map_err(|e| bad(e.to_string()))?;
        let name = clean(
            &ent.path()
                .map_err(|e| bad(e.to_string()))?
                .to_string_lossy(),
        );
        match ent.header().entry_type() {
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = ent
                    .link_name()
                    .map_err(|e| bad(e.to_string()))?
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                // Relative to the link's directory (docker writes ../ID/layer.tar).
                let base = Path::new(&name).parent().unwrap_or(Path::new(""));
                let joined = if ent.header().entry_type() == tar::EntryType::Link {
                    clean(&target)
                } else {
                    normalize(&base.join(&target))
                };
                s.links.insert(name, joined);
            }
            t if t.is_file() => {
                let keep = name.ends_with(".json") || name.starts_with("blobs/");
                let (sha, n, small) = hash_entry(&mut ent, &name, keep, what)?;
                if n != ent.header().size().unwrap_or(n) {
                    return Err(bad(format!("{name} ends after {n} bytes")));
                }
                if let Some(small) = small {
                    s.json.insert(name.clone(), small);
                }
                s.files.insert(name, (sha, n));
            }
            _ => {}
        }
    }
    let manifest = s
        .json
        .get("manifest.json")
        .ok_or_else(|| bad("no manifest.json".into()))?;
    s.images = entries(manifest, what)?;
    Ok(s)
}

/// `what is not a complete image archive (why)` (65).
fn incomplete(what: &str, why: String) -> Error {
    Error::data(format!(
        "{what} is not a complete image archive ({why}); nothing was loaded"
    ))
}

/// A file of the archive read to its end: its sha256, its size, and its
/// bytes when `keep` and small enough (at most 4 MiB).
fn hash_entry(
    ent: &mut impl Read,
    name: &str,
    keep: bool,
    what: &str,
) -> Result<(String, u64, Option<Vec<u8>>)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut n = 0u64;
    let mut small = Vec::new();
    loop {
        let k = ent
            .read(&mut buf)
            .map_err(|e| incomplete(what, format!("{name}: {e}")))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        if keep && small.len() < (4 << 20) {
            small.extend_from_slice(&buf[..k]);
        }
        n += k as u64;
    }
    Ok((
        hex(&h.finalize()),
        n,
        (keep && small.len() as u64 == n).then_some(small),
    ))
}

/// The images `manifest.json` lists.
fn entries(manifest: &[u8], what: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let list: Vec<Value> = serde_json::from_slice(manifest)
        .map_err(|e| incomplete(what, format!("manifest.json: {e}")))?;
    for m in list {
        let config = m
            .get("Config")
            .and_then(Value::as_str)
            .ok_or_else(|| incomplete(what, "manifest.json: an image without Config".into()))?;
        let strs = |k: &str| -> Vec<String> {
            m.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(clean))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        out.push(Entry {
            config: clean(config),
            repo_tags: strs("RepoTags"),
            layers: strs("Layers"),
        });
    }
    Ok(out)
}

fn normalize(p: &Path) -> String {
    let mut out: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    out.join("/")
}

impl Scan {
    /// The file `name`, following links: (sha256 hex, size).
    pub fn file(&self, name: &str) -> Option<&(String, u64)> {
        let mut n = name.to_string();
        for _ in 0..8 {
            if let Some(f) = self.files.get(&n) {
                return Some(f);
            }
            n = self.links.get(&n)?.clone();
        }
        None
    }

    /// Checks that every image is whole: its config hashes to its id, each
    /// layer to the digest the config records, and a loopwright layer's
    /// label to the hash its tag names.  Returns the tags it holds.
    pub fn verify(&self, what: &str) -> Result<Vec<String>> {
        let bad = |why: String| {
            Error::data(format!(
                "{what} is not a complete image archive ({why}); nothing was loaded"
            ))
        };
        let mut tags = Vec::new();
        for img in &self.images {
            let (sum, _) = self
                .file(&img.config)
                .ok_or_else(|| bad(format!("{} is missing", img.config)))?;
            let stem = img
                .config
                .rsplit('/')
                .next()
                .unwrap_or("")
                .trim_end_matches(".json");
            if stem.len() == 64 && stem != sum {
                return Err(bad(format!("{} does not hash to its name", img.config)));
            }
            let bytes = self
                .json
                .get(&img.config)
                .ok_or_else(|| bad(format!("{} is not a readable config", img.config)))?;
            let config: Value =
                serde_json::from_slice(bytes).map_err(|e| bad(format!("{}: {e}", img.config)))?;
            let diff_ids: Vec<&str> = config
                .pointer("/rootfs/diff_ids")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if diff_ids.len() != img.layers.len() {
                return Err(bad(format!(
                    "{} records {} layers, manifest.json lists {}",
                    img.config,
                    diff_ids.len(),
                    img.layers.len()
                )));
            }
            for (l, want) in img.layers.iter().zip(&diff_ids) {
                let (sum, _) = self
                    .file(l)
                    .ok_or_else(|| bad(format!("layer {l} is missing")))?;
                if want.strip_prefix("sha256:") != Some(sum.as_str()) {
                    return Err(bad(format!("layer {l} does not hash to {want}")));
                }
            }
            for t in &img.repo_tags {
                check_tag_label(t, &config).map_err(&bad)?;
                tags.push(t.clone());
            }
        }
        Ok(tags)
    }
}

/// A tag `REPO:HASH` whose image carries a loopwright manifest must name
/// that manifest's hash.
fn check_tag_label(tag: &str, config: &Value) -> std::result::Result<(), String> {
    let Some(label) = config
        .pointer("/config/Labels")
        .and_then(|l| l.get(LABEL_MANIFEST))
        .and_then(Value::as_str)
    else {
        return Ok(());
    };
    let Some((_, t)) = tag.rsplit_once(':') else {
        return Ok(());
    };
    let hash = base::digest::sha256_hex(label.as_bytes());
    if t.len() == TAG_HEX && t.bytes().all(|b| b.is_ascii_hexdigit()) && t != &hash[..TAG_HEX] {
        return Err(format!(
            "{tag} carries the inputs of {}, not of its tag",
            &hash[..TAG_HEX]
        ));
    }
    Ok(())
}

/// Writes one archive of `references` to `path`, replacing it only once the
/// archive is whole.  Returns its size.
pub fn save_file(engine: &dyn ImageBuilder, references: &[&str], path: &Path) -> Result<u64> {
    /// Why the archive was not written: the file, or the engine's save.
    enum Failed {
        File(std::io::Error),
        Save(Error),
    }
    impl From<std::io::Error> for Failed {
        fn from(e: std::io::Error) -> Self {
            Failed::File(e)
        }
    }
    base::fs::write_replace_with(path, 0o644, base::fs::Durability::Synced, |f| {
        engine.save_images(references, f).map_err(Failed::Save)
    })
    .map_err(|e| match e {
        Failed::File(e) => Error::io("cannot write", path, e),
        Failed::Save(e) => e,
    })
}

/// Checks the archive at `path` whole, then loads it.  Returns the tags
/// loaded.
pub fn load_file(engine: &dyn ImageBuilder, path: &Path) -> Result<Vec<String>> {
    let what = format!("'{}'", path.display());
    let f = File::open(path).map_err(|e| Error::io_as(Exit::NoInput, "cannot read", path, e))?;
    let scan = scan(std::io::BufReader::new(f), &what)?;
    let tags = scan.verify(&what)?;
    let f = File::open(path).map_err(|e| Error::io_as(Exit::NoInput, "cannot read", path, e))?;
    engine.load_images(f)?;
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).expect("append");
        }
        b.into_inner().expect("finish")
    }

    fn archive(label: &str, tag: &str) -> Vec<u8> {
        let layer = b"layer bytes".as_slice();
        let diff = base::digest::sha256_hex(layer);
        let config = serde_json::json!({
            "config": {"Labels": {LABEL_MANIFEST: label}},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff}")]},
        })
        .to_string();
        let cid = base::digest::sha256_hex(config.as_bytes());
        let manifest = serde_json::json!([{
            "Config": format!("{cid}.json"), "RepoTags": [tag], "Layers": ["l/layer.tar"]
        }])
        .to_string();
        tar_of(&[
            ("l/layer.tar", layer),
            (&format!("{cid}.json"), config.as_bytes()),
            ("manifest.json", manifest.as_bytes()),
        ])
    }

    #[test]
    fn a_whole_archive_verifies_and_a_truncated_one_is_65() {
        let label = "loopwright-layer 1\nlayer base\n";
        let hash = base::digest::sha256_hex(label.as_bytes());
        let tag = format!("loopwright/x-base:{}", &hash[..TAG_HEX]);
        let a = archive(label, &tag);
        let tags = scan(a.as_slice(), "a")
            .expect("scans")
            .verify("a")
            .expect("whole");
        assert_eq!(tags, [tag]);
        for cut in [a.len() / 3, a.len() - 1100, 700] {
            let e = scan(&a[..cut], "a")
                .and_then(|s| s.verify("a"))
                .expect_err("truncated");
            assert_eq!(e.exit, Exit::DataErr, "cut at {cut}: {}", e.msg);
            assert!(e.msg.contains("nothing was loaded"), "{}", e.msg);
        }
    }

    #[test]
    fn a_tag_whose_label_hashes_elsewhere_is_refused() {
        let a = archive(
            "loopwright-layer 1\nlayer base\n",
            "loopwright/x-base:0123456789abcdef01234567",
        );
        let e = scan(a.as_slice(), "a")
            .expect("scans")
            .verify("a")
            .expect_err("tampered");
        assert_eq!(e.exit, Exit::DataErr);
        assert!(e.msg.contains("not of its tag"), "{}", e.msg);
    }
}
