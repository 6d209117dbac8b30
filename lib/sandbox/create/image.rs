//! The image a sandbox is made from: the project's current one (lw-build's
//! final tag), `--image`, or with `--allow-stale` the newest earlier one;
//! with the inputs its last layer was built from, and which of them the
//! task's branch changed (what the incremental install is for).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;

use sha2::{Digest, Sha256};

use base::config::Project;
use base::error::{Error, Exit, Result};
use engine::Images;
use wall::image::{LABEL_LAYER, LABEL_MANIFEST, Layer, Plan, Runtime};

/// The image a sandbox runs and what it was built from.
#[derive(Clone, Debug)]
pub struct ImageChoice {
    pub reference: String,
    /// Set when the image is not the current one: what to tell the user.
    pub stale: Option<String>,
    /// The last layer's inputs: project path and sha256.
    pub inputs: Vec<(String, String)>,
    /// The script its postStartCommand label holds (lib/sandbox/lifecycle.rs).
    pub post_start: Option<String>,
}

/// The project's current image (lw-build's final tag), or `flag`.  A current
/// tag that is not built is refused (66) unless `allow_stale`, which takes
/// the newest earlier image of the same layer, saying so.
pub fn resolve_image(
    engine: &dyn Images,
    project: Option<&Project>,
    flag: Option<&str>,
    allow_stale: bool,
) -> Result<ImageChoice> {
    if let Some(r) = flag {
        if !engine.image_exists(r)? {
            return Err(Error::new(
                Exit::NoInput,
                format!("image '{r}' is not in the engine; build it (lw-build) or load it"),
            ));
        }
        return Ok(ImageChoice {
            reference: r.to_string(),
            stale: None,
            inputs: image_inputs(engine, r)?,
            post_start: None,
        });
    }
    let Some(project) = project else {
        return Err(Error::usage(
            "not inside a project: run in the project's checkout, pass --project DIR, or name an --image",
        ));
    };
    let runtime = Runtime::load(&project.top)
        .map_err(|e| Error::new(e.exit, format!("{}; or name an image with --image", e.msg)))?;
    let plan = runtime.plan(engine)?;
    let last = plan
        .layers
        .last()
        .expect("a runtime definition has at least one layer");
    if last.cached() {
        return Ok(ImageChoice {
            reference: last.tag.clone(),
            stale: None,
            inputs: image_inputs(engine, &last.tag)?,
            post_start: None,
        });
    }
    not_built(engine, last, &plan, allow_stale)
}

/// The current image is not built: the newest earlier one when
/// `allow_stale`, else 66 saying what to run.
fn not_built(
    engine: &dyn Images,
    last: &Layer,
    plan: &Plan,
    allow_stale: bool,
) -> Result<ImageChoice> {
    let missing: Vec<&str> = plan
        .layers
        .iter()
        .filter(|l| !l.cached())
        .map(|l| l.def.name.as_str())
        .collect();
    let older = engine.images_with_label(&format!("{LABEL_LAYER}={}", last.repo))?;
    let why = format!(
        "the project's image '{}' is not built (layer(s) {} changed; lw-build --explain says which input)",
        last.tag,
        missing.join(", ")
    );
    match older.first() {
        Some(img) if allow_stale => {
            let reference = img
                .tags
                .iter()
                .find(|t| t.starts_with(&last.repo))
                .cloned()
                .unwrap_or_else(|| img.id.clone());
            Ok(ImageChoice {
                stale: Some(format!(
                    "{why}; using the stale image '{reference}' as --allow-stale asks"
                )),
                inputs: image_inputs(engine, &reference)?,
                reference,
                post_start: None,
            })
        }
        Some(img) => Err(Error::new(
            Exit::NoInput,
            format!(
                "{why}; run lw-build, or pass --allow-stale to use the stale image '{}'",
                img.tags.first().cloned().unwrap_or_else(|| img.id.clone())
            ),
        )),
        None => Err(Error::new(
            Exit::NoInput,
            format!("{why}; no earlier image exists either; run lw-build"),
        )),
    }
}

/// The project's image for a cluster, whose nodes build nothing: chosen on
/// `builder` (the Docker engine lw-build builds on), with its inputs from
/// there.  The pod names the image cache's copy when the project has
/// `build.cache` (`lw-build push` puts each layer there, as
/// `HOST/REPO:LAYER-HASH`, and the nodes pull it); without a cache, the
/// local tag, which must then be on the nodes (imported into their
/// runtime): a pod whose node has it not is 66 (engine/kubernetes).
pub(super) fn resolve_for_cluster(
    builder: &dyn Images,
    project: &Project,
    allow_stale: bool,
) -> Result<ImageChoice> {
    let mut choice = resolve_image(builder, Some(project), None, allow_stale)?;
    let cache = project
        .config
        .get("build.cache")
        .filter(|c| !c.trim().is_empty());
    if let (Some(spec), None) = (cache, &choice.stale) {
        let cache = engine::distribution::CacheRef::parse(spec)?;
        let plan = Runtime::load(&project.top)?.plan(builder)?;
        let last = plan.layers.last().expect("a runtime has a layer");
        choice.reference = format!(
            "{}/{}:{}",
            cache.host,
            cache.repo,
            wall::image::cache::remote_tag(last)
        );
        return Ok(choice);
    }
    // Whether the nodes have it is the pod's to say (its own status:
    // ErrImageNeverPull, ErrImagePull, ImagePullBackOff are 66 naming the
    // image): the nodes' `status.images` needs rights to list nodes, lists
    // only each kubelet's largest images, lags an import by its status
    // period, and "on some node" is not "on the node the pod lands on".
    Ok(choice)
}

/// `--image` on a cluster: taken as named (the pod says whether its node
/// has it); its inputs from the builder when it has the image.
pub(super) fn named_for_cluster(builder: &dyn Images, reference: &str) -> Result<ImageChoice> {
    Ok(ImageChoice {
        reference: reference.to_string(),
        stale: None,
        inputs: image_inputs(builder, reference)?,
        post_start: None,
    })
}

/// The postStartCommand script the image carries (a JSON string in its
/// label, which lw init wrote): 65 when the label is not one.
pub(super) fn post_start_of(engine: &dyn Images, reference: &str) -> Result<Option<String>> {
    let Some(label) = engine
        .image(reference)?
        .and_then(|i| i.labels.get(wall::image::LABEL_POST_START).cloned())
    else {
        return Ok(None);
    };
    serde_json::from_str::<String>(&label).map(Some).map_err(|e| {
        Error::data(format!(
            "image '{reference}': its label {} is not a JSON string ({e}); run lw init --force and lw-build",
            wall::image::LABEL_POST_START
        ))
    })
}

/// The last layer's inputs, from the manifest label lw-build wrote on the image.
fn image_inputs(engine: &dyn Images, reference: &str) -> Result<Vec<(String, String)>> {
    let img = engine.image(reference)?;
    let manifest = img
        .and_then(|i| i.labels.get(LABEL_MANIFEST).cloned())
        .unwrap_or_default();
    Ok(manifest
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "input").then_some(())?;
            let path = w.next()?.to_string();
            let _mode = w.next()?;
            Some((path, w.next()?.to_string()))
        })
        .collect())
}

/// Inputs whose content at `commit` differs from the image's.  Read from
/// the mirror (which lw-mirror made; no sandbox writes it).
pub(super) fn drifted_inputs(
    mirror: &Path,
    commit: &str,
    inputs: &[(String, String)],
) -> Result<Vec<String>> {
    if inputs.is_empty() {
        return Ok(vec![]);
    }
    let mut child = repo::git::command(None)
        .arg("--git-dir")
        .arg(mirror)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot run git cat-file").with_source(e))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let queries: String = inputs
        .iter()
        .map(|(p, _)| format!("{commit}:{p}\n"))
        .collect();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(queries.as_bytes());
    });
    let mut r = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut drift = Vec::new();
    for (path, sha) in inputs {
        let mut header = String::new();
        if r.read_line(&mut header).unwrap_or(0) == 0 {
            break;
        }
        let w: Vec<&str> = header.split_whitespace().collect();
        if w.len() == 3 && w[1] == "blob" {
            let size: usize = w[2].parse().unwrap_or(0);
            let mut data = vec![0u8; size + 1];
            if r.read_exact(&mut data).is_err() {
                break;
            }
            data.pop();
            let got: String = Sha256::digest(&data)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            if &got != sha {
                drift.push(path.clone());
            }
        }
    }
    let _ = writer.join();
    let _ = child.wait();
    Ok(drift)
}
