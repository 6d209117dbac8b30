//! The egress proxy's image: built from the recipe in runtime/egress
//! (squid from Debian's packages) on the configured base image, and tagged
//! by the hash of the recipe and the base image's id, so it is built once.

use super::sidecar::Recipe;
use super::{LABEL_EGRESS, LABEL_RECIPE, PROXY_REPO};
use base::error::{Error, Exit, Result};
use engine::{BuildEvent, ImageBuilder, Images};

/// The proxy image's recipe: its build context, from the toolkit's runtime/egress.
pub const PROXY_FILES: &[(&str, &[u8], u32)] = &[
    (
        "proxy.Dockerfile",
        include_bytes!("../../../../runtime/egress/proxy.Dockerfile"),
        0o644,
    ),
    (
        "entry.sh",
        include_bytes!("../../../../runtime/egress/entry.sh"),
        0o755,
    ),
];

/// How the proxy image is made (crates/wall/src/egress/sidecar.rs).
const RECIPE: Recipe = Recipe {
    what: "the egress proxy",
    // Bump when the recipe's meaning changes without its files changing.
    version: "loopwright-egress-proxy 1",
    repo: PROXY_REPO,
    files: PROXY_FILES,
    dockerfile: "proxy.Dockerfile",
    from_arg: "LW_EGRESS_FROM",
};

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
    Ok(RECIPE.tag(from, &base.id))
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
    let labels = [
        (LABEL_EGRESS.to_string(), "proxy".to_string()),
        (LABEL_RECIPE.to_string(), recipe),
    ]
    .into();
    let hint = "\n(the build installs squid with apt-get: the base must be Debian-like and reach its package archive)";
    RECIPE.build(engine, from, &tag, labels, hint, on_event)?;
    Ok(tag)
}
