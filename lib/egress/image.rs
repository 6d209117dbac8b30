//! The egress proxy's image: built from the recipe in runtime/egress
//! (squid from Debian's packages) on the configured base image, and tagged
//! by the hash of the recipe and the base image's id, so it is built once.

use sha2::{Digest, Sha256};

use super::{LABEL_EGRESS, LABEL_RECIPE, PROXY_REPO};
use crate::engine::{BuildEvent, BuildOutcome, BuildRequest, ImageBuilder, Images};
use crate::error::{Error, Exit, Result};

/// The proxy image's recipe: its build context, from the toolkit's runtime/egress.
pub const PROXY_FILES: &[(&str, &str, u32)] = &[
    (
        "proxy.Dockerfile",
        include_str!("../../runtime/egress/proxy.Dockerfile"),
        0o644,
    ),
    (
        "entry.sh",
        include_str!("../../runtime/egress/entry.sh"),
        0o755,
    ),
];

/// Bump when the recipe's meaning changes without its files changing.
const RECIPE_VERSION: &str = "loopwright-egress-proxy 1";

/// The proxy image's tag for the base image `from` (by its id), and the
/// recipe text it hashes.
pub fn proxy_tag(engine: &dyn Images, from: &str) -> Result<(String, String)> {
    let Some(base) = engine.image(from)? else {
        return Err(Error::new(
            Exit::NoInput,
            format!(
                "the egress proxy's base image '{from}' is not in the engine; load a Debian image (docker load, or \
                 debootstrap + docker import as scripts/test-images does) or name one in egress.proxy-from \
                 in .loopwright/config"
            ),
        ));
    };
    let mut recipe = format!("{RECIPE_VERSION}\nfrom {from} {}\n", base.id);
    for (path, text, mode) in PROXY_FILES {
        let h = Sha256::digest(text.as_bytes());
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        recipe.push_str(&format!("file {path} {mode:o} {hex}\n"));
    }
    let h = Sha256::digest(recipe.as_bytes());
    let hex: String = h.iter().take(12).map(|b| format!("{b:02x}")).collect();
    Ok((format!("{PROXY_REPO}:{hex}"), recipe))
}

/// Makes sure the proxy image for `from` exists, building it when missing;
/// build output goes to `on_event`.  Returns its tag.
pub fn ensure_proxy_image(
    engine: &dyn ImageBuilder,
    from: &str,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<String> {
    let (tag, recipe) = proxy_tag(engine, from)?;
    if engine.image_exists(&tag)? {
        return Ok(tag);
    }
    let mut b = tar::Builder::new(Vec::new());
    let tar_err = |e: std::io::Error| {
        Error::new(Exit::Software, "cannot make the proxy's build context").with_source(e)
    };
    for (path, text, mode) in PROXY_FILES {
        let mut h = tar::Header::new_gnu();
        h.set_mode(*mode);
        h.set_mtime(0);
        h.set_size(text.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, text.as_bytes())
            .map_err(tar_err)?;
    }
    let context = b.into_inner().map_err(tar_err)?;
    let req = BuildRequest {
        context,
        dockerfile: "proxy.Dockerfile".into(),
        tag: tag.clone(),
        labels: [
            (LABEL_EGRESS.to_string(), "proxy".to_string()),
            (LABEL_RECIPE.to_string(), recipe),
        ]
        .into(),
        args: [("LW_EGRESS_FROM".to_string(), from.to_string())].into(),
    };
    let mut tail: Vec<String> = Vec::new();
    let outcome = engine.build(&req, &mut |ev| {
        if let BuildEvent::Output(s) = &ev {
            tail.extend(s.lines().map(str::to_string));
            let n = tail.len().saturating_sub(15);
            tail.drain(..n);
        }
        on_event(ev);
    })?;
    match outcome {
        BuildOutcome::Built(_) => Ok(tag),
        BuildOutcome::Failed(msg) => Err(Error::new(
            Exit::Unavailable,
            format!(
                "cannot build the egress proxy image '{tag}' from '{from}': {msg}\n{}\n(the build installs squid with \
                 apt-get: the base must be Debian-like and reach its package archive)",
                tail.join("\n")
            ),
        )),
    }
}
