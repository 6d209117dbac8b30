//! What the egress proxy and the agent's model proxy (crates/agent/src/proxy.rs)
//! share as containers beside a sandbox: an image built from a recipe of
//! files the toolkit carries, tagged by the hash of the recipe and of the
//! base image's id (so it is built once per base), and a start that waits
//! until the container logs that it is ready.

use std::collections::BTreeMap;
use std::time::Duration;

use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use base::visible::visible_line;
use engine::{BuildEvent, BuildOutcome, BuildRequest, ImageBuilder, NetworkEngine};

/// A proxy image's recipe.
pub struct Recipe<'a> {
    /// The proxy, in messages: `the egress proxy`.
    pub what: &'a str,
    /// The recipe's first line; bumped when its meaning changes without
    /// its files changing.
    pub version: &'a str,
    /// Where its images are tagged.
    pub repo: &'a str,
    /// The build context: path, bytes, mode (text, or a command built
    /// beside the running program, as the model proxy's).
    pub files: &'a [(&'a str, &'a [u8], u32)],
    /// The file of `files` that is the Dockerfile.
    pub dockerfile: &'a str,
    /// The build argument that names the base image.
    pub from_arg: &'a str,
}

impl Recipe<'_> {
    /// The tag of the image on base `from`, whose id is `base_id`, and the
    /// recipe text it hashes.
    pub fn tag(&self, from: &str, base_id: &str) -> (String, String) {
        let mut recipe = format!("{}\nfrom {from} {base_id}\n", self.version);
        for (path, text, mode) in self.files {
            let hex = sha256_hex(text);
            recipe.push_str(&format!("file {path} {mode:o} {hex}\n"));
        }
        let tag = format!("{}:{}", self.repo, &sha256_hex(recipe.as_bytes())[..24]);
        (tag, recipe)
    }

    /// Builds image `tag` on `from`, labelled `labels`; its output goes to
    /// `on_event`.  A failed build is 69 with the last lines of the output,
    /// and `hint` after them.
    pub fn build(
        &self,
        engine: &dyn ImageBuilder,
        from: &str,
        tag: &str,
        labels: BTreeMap<String, String>,
        hint: &str,
        on_event: &mut dyn FnMut(BuildEvent),
    ) -> Result<()> {
        let req = BuildRequest {
            context: self.context()?,
            dockerfile: self.dockerfile.into(),
            tag: tag.to_string(),
            labels,
            args: [(self.from_arg.to_string(), from.to_string())].into(),
        };
        let (outcome, tail) = build_with_tail(engine, &req, 15, on_event)?;
        match outcome {
            BuildOutcome::Built(_) => Ok(()),
            BuildOutcome::Failed(msg) => Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot build {} image '{tag}' from '{from}': {msg}\n{}{hint}",
                    self.what,
                    tail.join("\n")
                ),
            )),
        }
    }

    /// The build context: `files` as a tar archive, every mtime 0.
    fn context(&self) -> Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        let tar_err = |e: std::io::Error| {
            Error::new(
                Exit::Software,
                format!("cannot make the build context of {}", self.what),
            )
            .with_source(e)
        };
        for (path, text, mode) in self.files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(*mode);
            h.set_mtime(0);
            h.set_size(text.len() as u64);
            h.set_entry_type(tar::EntryType::Regular);
            b.append_data(&mut h, path, *text).map_err(tar_err)?;
        }
        b.into_inner().map_err(tar_err)
    }
}

/// Builds `req`, passing every event on, and keeps the last `keep` lines
/// of the build's output for the error a failed build becomes, each with
/// its control characters made visible.
pub fn build_with_tail(
    engine: &dyn ImageBuilder,
    req: &BuildRequest,
    keep: usize,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<(BuildOutcome, Vec<String>)> {
    let mut tail: Vec<String> = Vec::new();
    let outcome = engine.build(req, &mut |ev| {
        if let BuildEvent::Output(s) = &ev {
            // Kept as shown: control characters made visible, 4 KiB a line.
            tail.extend(s.lines().map(|l| {
                let mut end = l.len().min(4096);
                while !l.is_char_boundary(end) {
                    end -= 1;
                }
                visible_line(&l[..end]).into_owned()
            }));
            let n = tail.len().saturating_sub(keep);
            tail.drain(..n);
        }
        on_event(ev);
    })?;
    Ok((outcome, tail))
}

/// Starts container `name` (`what`, in messages) unless it runs, and waits
/// up to `timeout` for a line containing `ready` among those it logs from
/// this start on (an earlier run's ready line is in the same log).  None
/// when it is ready; its whole log when it is not.  A container that is
/// gone is 66: its sandbox is to be made again.
pub fn start_until_ready(
    engine: &dyn NetworkEngine,
    what: &str,
    name: &str,
    ready: &str,
    timeout: Duration,
) -> Result<Option<String>> {
    match engine.inspect(name)? {
        None => {
            return Err(Error::new(
                Exit::NoInput,
                format!("{what} '{name}' is gone; remove the sandbox and create it again"),
            ));
        }
        Some(c) if c.running => return Ok(None),
        Some(_) => {}
    }
    let before = String::from_utf8_lossy(&engine.logs(name, false)?)
        .matches(ready)
        .count();
    engine.start(name)?;
    let mut seen = 0usize;
    let is_ready = engine.wait_for_line(name, timeout, &mut |line| {
        if line.contains(ready) {
            seen += 1;
            return seen > before;
        }
        false
    })?;
    if is_ready {
        return Ok(None);
    }
    Ok(Some(
        String::from_utf8_lossy(&engine.logs(name, false)?).into_owned(),
    ))
}
