//! The image cache off the machine: layers pushed to and pulled from one
//! repository of an OCI registry, tagged by their input hash.
//!
//! A layer `IMAGE-LAYER:HASH` is kept in the cache repository as the tag
//! `LAYER-HASH`, so two projects with the same layer inputs share it.  The
//! registry is trusted for nothing: a pulled image is loaded only when its
//! `org.loopwright.manifest` label hashes to the tag computed here from the
//! local inputs; anything else is refused, and `lw-build` builds the layer
//! instead.  Every blob is checked against its digest as it arrives.
//!
//! Bytes move between the registry (crates/engine/src/distribution) and the engine's image
//! archives (crates/engine/src/lib.rs, [`ImageBuilder`]): a push saves the layer image and
//! uploads the blobs the registry lacks; a pull downloads only the layers the
//! engine lacks (those under the parent image, which is already there, are
//! named in the archive but not carried: the engine skips a layer it holds)
//! and loads the result under the layer's tag.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use serde_json::Value;

use super::archive::{Scratch, scan};
use super::*;
use base::error::{Error, Result};
use engine::ImageBuilder;
use engine::distribution::{Client, Manifest};

/// The tag a layer has in the cache repository: `LAYER-HASH`.
pub fn remote_tag(layer: &Layer) -> String {
    let name: String = layer
        .def
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("{name}-{}", &layer.hash[..TAG_HEX])
}

/// What the cache holds for a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A tag whose label matches: it would be pulled.
    Present,
    Missing,
    /// A tag whose image is not this layer's: why.
    Refused(String),
}

/// How a pull ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Loaded under the layer's tag: the image id and the blob bytes read.
    Pulled {
        id: String,
        bytes: u64,
    },
    Missing,
    /// Not loaded: why.
    Refused(String),
}

/// How a push ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Push {
    /// Uploaded: the blob bytes sent (blobs the registry had are not sent).
    Pushed { bytes: u64 },
    /// The tag already pointed at this very image.
    Present,
}

/// Why a config is not this layer's, `Ok` when its label is.
pub fn check_label(layer: &Layer, config: &Value) -> std::result::Result<(), String> {
    let label = config
        .pointer("/config/Labels")
        .and_then(|l| l.get(LABEL_MANIFEST))
        .and_then(Value::as_str)
        .ok_or_else(|| format!("it carries no {LABEL_MANIFEST} label"))?;
    let got = base::digest::sha256_hex(label.as_bytes());
    if got != layer.hash {
        return Err(format!(
            "its label records input hash {}, not {} computed from the local inputs",
            &got[..TAG_HEX],
            &layer.hash[..TAG_HEX]
        ));
    }
    Ok(())
}

fn config_of(client: &Client, digest: &str) -> Result<(Vec<u8>, Value)> {
    let mut bytes = Vec::new();
    client.get_blob(digest, &mut bytes)?;
    let v = serde_json::from_slice(&bytes).map_err(|e| {
        Error::data(format!(
            "image cache at {}: config {digest} is not JSON: {e}",
            client.cache.host
        ))
    })?;
    Ok((bytes, v))
}

/// Says what the cache holds for `layer`, reading only its manifest and
/// config.
pub fn probe(client: &Client, layer: &Layer) -> Result<Probe> {
    let Some(m) = client.manifest(&remote_tag(layer))? else {
        return Ok(Probe::Missing);
    };
    let (_, config) = config_of(client, &m.config)?;
    Ok(match check_label(layer, &config) {
        Ok(()) => Probe::Present,
        Err(why) => Probe::Refused(why),
    })
}

/// Pulls `layer` from the cache into the engine under its tag.
pub fn pull(engine: &dyn ImageBuilder, client: &Client, layer: &Layer) -> Result<Fetch> {
    let tag = remote_tag(layer);
    let Some(m) = client.manifest(&tag)? else {
        return Ok(Fetch::Missing);
    };
    let before = client.bytes_down.get();
    let (config_bytes, config) = config_of(client, &m.config)?;
    if let Err(why) = check_label(layer, &config) {
        return Ok(Fetch::Refused(why));
    }
    let diff_ids: Vec<String> = config
        .pointer("/rootfs/diff_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if diff_ids.len() != m.layers.len() {
        return Ok(Fetch::Refused(format!(
            "its config records {} layers and its manifest {}",
            diff_ids.len(),
            m.layers.len()
        )));
    }
    // The layers under the parent, which the engine holds, stay home.
    let have = engine.image_layers(&layer.parent)?.unwrap_or_default();
    let skip = have
        .iter()
        .zip(&diff_ids)
        .take_while(|(a, b)| a == b)
        .count();
    let scratch = Scratch::new("pull")?;
    let archive = load_archive(client, layer, &m, &config_bytes, skip, &scratch)?;
    let f = File::open(&archive).map_err(|e| Error::io("cannot read", &archive, e))?;
    engine.load_images(f)?;
    let id = engine.image(&layer.tag)?.map(|i| i.id).unwrap_or_default();
    if id != m.config {
        return Err(Error::data(format!(
            "loaded {tag} from the image cache at {}, but the engine has '{}' as {} (expected {})",
            client.cache.host, id, layer.tag, m.config
        )));
    }
    Ok(Fetch::Pulled {
        id,
        bytes: client.bytes_down.get() - before,
    })
}

/// An archive for the engine to load: the config, a manifest naming the
/// layer's tag, and every layer blob but the first `skip` (the engine has
/// those), written under `scratch`.
fn load_archive(
    client: &Client,
    layer: &Layer,
    m: &Manifest,
    config_bytes: &[u8],
    skip: usize,
    scratch: &Scratch,
) -> Result<PathBuf> {
    let cfg_hex = m.config.trim_start_matches("sha256:").to_string();
    let archive = scratch.0.join("load.tar");
    let out = File::create(&archive).map_err(|e| Error::io("cannot create", &archive, e))?;
    let mut tar = tar::Builder::new(BufWriter::new(out));
    let mut names = Vec::new();
    for (i, (digest, _, _)) in m.layers.iter().enumerate() {
        let name = format!("{i}/layer.tar");
        names.push(name.clone());
        if i < skip {
            continue;
        }
        let blob = scratch.0.join(format!("{i}.blob"));
        let mut f =
            BufWriter::new(File::create(&blob).map_err(|e| Error::io("cannot create", &blob, e))?);
        client.get_blob(digest, &mut f)?;
        drop(f);
        tar.append_path_with_name(&blob, &name)
            .map_err(|e| Error::io("cannot write", &archive, e))?;
        let _ = std::fs::remove_file(&blob);
    }
    let manifest = serde_json::json!([{
        "Config": format!("{cfg_hex}.json"),
        "RepoTags": [layer.tag],
        "Layers": names,
    }])
    .to_string();
    for (name, data) in [
        (format!("{cfg_hex}.json"), config_bytes),
        ("manifest.json".to_string(), manifest.as_bytes()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, &name, data)
            .map_err(|e| Error::io("cannot write", &archive, e))?;
    }
    tar.into_inner()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .map_err(|e| Error::io("cannot write", &archive, e))?;
    Ok(archive)
}

/// Pushes the local image of `layer` (which must exist) to the cache.
pub fn push(engine: &dyn ImageBuilder, client: &Client, layer: &Layer) -> Result<Push> {
    let tag = remote_tag(layer);
    let id = layer.image_id.clone().unwrap_or_default();
    if let Some(m) = client.manifest(&tag)?
        && m.config == id
    {
        return Ok(Push::Present);
    }
    let scratch = Scratch::new("push")?;
    let saved = scratch.0.join("save.tar");
    {
        let mut f = BufWriter::new(
            File::create(&saved).map_err(|e| Error::io("cannot create", &saved, e))?,
        );
        engine.save_images(&[&layer.tag], &mut f)?;
        std::io::Write::flush(&mut f).map_err(|e| Error::io("cannot write", &saved, e))?;
    }
    let what = format!("the engine's archive of {}", layer.tag);
    let f = File::open(&saved).map_err(|e| Error::io("cannot read", &saved, e))?;
    let s = scan(std::io::BufReader::new(f), &what)?;
    s.verify(&what)?;
    let img = s
        .images
        .first()
        .ok_or_else(|| Error::data(format!("{what} holds no image")))?;
    let unpacked = scratch.0.join("x");
    let f = File::open(&saved).map_err(|e| Error::io("cannot read", &saved, e))?;
    tar::Archive::new(std::io::BufReader::new(f))
        .unpack(&unpacked)
        .map_err(|e| Error::io("cannot unpack into", &unpacked, e))?;
    let before = client.bytes_up.get();
    let mut layers = Vec::new();
    for l in &img.layers {
        let (sum, size) = s.file(l).expect("verify found every layer");
        let digest = format!("sha256:{sum}");
        client.put_blob(&digest, *size, &unpacked.join(l))?;
        layers.push((digest, *size));
    }
    let (csum, csize) = s.file(&img.config).expect("verify found the config");
    let cdigest = format!("sha256:{csum}");
    client.put_blob(&cdigest, *csize, &unpacked.join(&img.config))?;
    client.put_manifest(&tag, (&cdigest, *csize), &layers)?;
    Ok(Push::Pushed {
        bytes: client.bytes_up.get() - before,
    })
}

/// The cache a project names: `flag` (`--cache`, where an empty value turns
/// the cache off) or `build.cache` in `ROOT/.loopwright/config`, with its CA
/// from `--cache-ca` or `build.cache-ca` (relative to ROOT).  `None` when no
/// cache is named.
pub fn configured(
    root: &std::path::Path,
    flag: Option<&str>,
    ca_flag: Option<&std::path::Path>,
) -> Result<Option<Client>> {
    let conf = crate::config::load(root)?;
    let spec = match flag {
        Some(f) => f.to_string(),
        None => conf.get("build.cache").unwrap_or("").to_string(),
    };
    if spec.trim().is_empty() {
        return Ok(None);
    }
    let cache = engine::distribution::CacheRef::parse(&spec)?;
    let ca_file = match ca_flag {
        Some(p) => Some(p.to_path_buf()),
        None => conf.get("build.cache-ca").map(|p| root.join(p)),
    };
    let opts = engine::distribution::Options {
        ca_file,
        credentials: None,
        // A layer of any size: bounded per read and write only.
        request_timeout: None,
    };
    Client::new(&cache, &opts).map(Some)
}

/// Pulls missing layers for a build: a cache that cannot be reached is
/// warned about once and then left alone (the build goes on locally); a
/// refused tag is warned about and built; refused credentials stop the run.
pub struct Puller<'a> {
    pub engine: &'a dyn ImageBuilder,
    pub client: Option<&'a Client>,
    online: bool,
    logged_in: bool,
    /// Layer tag and why its cached image was refused.
    pub refused: Vec<(String, String)>,
    pub warn: &'a mut dyn FnMut(&str),
}

impl<'a> Puller<'a> {
    pub fn new(
        engine: &'a dyn ImageBuilder,
        client: Option<&'a Client>,
        warn: &'a mut dyn FnMut(&str),
    ) -> Puller<'a> {
        Puller {
            engine,
            client,
            online: true,
            logged_in: false,
            refused: Vec::new(),
            warn,
        }
    }

    fn offline(&mut self, c: &Client, e: &Error) {
        self.online = false;
        (self.warn)(&format!(
            "{}; building locally without the image cache {}",
            e.msg, c.cache
        ));
    }

    /// The image of `layer` from the cache, `None` to build it.
    pub fn fetch(&mut self, layer: &Layer) -> Result<Option<(String, u64)>> {
        let Some(c) = self.client else {
            return Ok(None);
        };
        if !self.online {
            return Ok(None);
        }
        if !self.logged_in {
            match c.login(false) {
                Ok(()) => self.logged_in = true,
                Err(e) if e.exit == base::error::Exit::Unavailable => {
                    self.offline(c, &e);
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
        let why = match pull(self.engine, c, layer) {
            Ok(Fetch::Pulled { id, bytes }) => return Ok(Some((id, bytes))),
            Ok(Fetch::Missing) => return Ok(None),
            Ok(Fetch::Refused(why)) => why,
            Err(e) if e.exit == base::error::Exit::Unavailable => {
                self.offline(c, &e);
                return Ok(None);
            }
            Err(e) if e.exit == base::error::Exit::DataErr => e.msg,
            Err(e) => return Err(e),
        };
        (self.warn)(&format!(
            "refused {}:{} from the image cache: {why}; building layer '{}' instead",
            c.cache,
            remote_tag(layer),
            layer.def.name
        ));
        self.refused.push((layer.tag.clone(), why));
        Ok(None)
    }
}
