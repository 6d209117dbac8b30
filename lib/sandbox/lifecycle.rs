//! A devcontainer.json's postStartCommand (#44), run by `create` once the
//! sandbox is made and by each `start` once its secrets are written: in
//! /work/repo, as the sandbox's user, confined like any exec.
//!
//! What runs is the script the image's label held when the sandbox was
//! made ([`wall::image::LABEL_POST_START`], written by lw init into a
//! layer's Dockerfile), kept in the record under the root, which the
//! sandbox cannot write.  Nothing is read from the clone at start time:
//! an agent that rewrites the repository's devcontainer.json or runtime
//! changes what runs only after a person's lw init and lw-build, for
//! sandboxes made after that.
//!
//! A failure is 65 naming the command and its status: `create` then undoes
//! the sandbox, as a failed incremental install does; `start` leaves it
//! running, and says so.

use super::{Record, Sandboxes};
use base::error::{Error, Result};
use engine::{ExecIo, ExecRequest, OutStream};
use wall::REPO;

impl<'a> Sandboxes<'a> {
    /// Runs the record's postStartCommand script, if any; its output goes
    /// to `say` a line at a time, its control characters made visible.
    pub(super) fn post_start(&self, rec: &Record, say: &mut dyn FnMut(&str)) -> Result<()> {
        let Some(script) = &rec.post_start else {
            return Ok(());
        };
        let req = ExecRequest {
            cmd: wall::confined(
                rec.runtime_name(),
                ["/bin/sh", "-c", script, "lw-post-start"]
                    .map(String::from)
                    .to_vec(),
            ),
            env: vec![],
            user: Some(format!("{0}:{0}", rec.uid)),
            workdir: Some(REPO.into()),
        };
        let mut output = Vec::new();
        let mut on = |_: OutStream, b: &[u8]| output.extend_from_slice(b);
        let io = ExecIo::output(&mut on);
        let code = self
            .engine
            .exec_io(&rec.container, &req, io)
            .map_err(|e| super::running::died_under(&rec.name, Some("postStartCommand"), e))?;
        let text = String::from_utf8_lossy(&output);
        let lines: Vec<String> = text
            .lines()
            .map(|l| base::visible::visible(l.trim_end_matches('\r')).into_owned())
            .collect();
        for l in &lines {
            say(l);
        }
        if code == 0 {
            return Ok(());
        }
        let what = lines
            .iter()
            .rev()
            .find(|l| l.contains(" failed (exit ") || l.starts_with("failed: "))
            .cloned()
            .unwrap_or_else(|| format!("postStartCommand failed (exit {code})"));
        Err(Error::data(format!(
            "sandbox '{}': {what}; its output is above",
            rec.name
        )))
    }
}
