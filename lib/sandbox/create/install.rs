//! The incremental install: dependencies for a branch whose lockfiles
//! differ from the image's.
//!
//! The image's last layer carries the manifest of its inputs (a label written
//! by lw-build): each lockfile's path and sha256.  When a file of that list
//! exists at the commit the sandbox starts from and its content differs, the
//! dependencies baked into the image are not the branch's.  Rather than
//! rebuild the image for one branch, lw-sandbox runs the layer's install step
//! in `/work/repo` of this sandbox's workspace, in a one-shot container made
//! from the same image, with the same hardening, user, limits and network as
//! the sandbox itself.  That container is labelled like the sandbox, removed
//! when the step ends, and its output goes to standard error with its
//! control characters made visible.  What the step installs must land under
//! `/work` (the only writable place): `node_modules`, `$HOME/.cargo`, a
//! virtualenv under `/work`.
//!
//! The rule: nothing from the task's branch runs with more reach than the
//! sandbox has.  The step is `sandbox.install` (the host's configuration)
//! or else the install script (the layer's input whose name ends in
//! `deps.sh`) as the image holds it, `sh /opt/loopwright/deps/PATH
//! /work/repo` — never the branch's copy, which the sandbox's agent may have
//! written.  A branch whose script differs from the image's is reported;
//! `--allow-install-change` runs the branch's copy instead.  Either runs on
//! the sandbox's own network: `none` has none (an install that must
//! download fails, saying so), `egress` reaches only its allow-list.

use super::super::{Network, Record, Sandboxes, Settings};
use super::ImageChoice;
use base::error::{Error, Result};
use engine::{ContainerSpec, ExecIo, ExecRequest, OutStream};
use wall::REPO;

/// Where the deps layer (runtime/deps.Dockerfile) keeps its inputs in the
/// image, the install script among them at its project path.
const IMAGE_DEPS: &str = "/opt/loopwright/deps";

impl<'a> Sandboxes<'a> {
    /// Runs the deps layer's install step for this sandbox (module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn incremental_install(
        &self,
        rec: &Record,
        settings: &Settings,
        spec: &ContainerSpec,
        image: &ImageChoice,
        drift: &[String],
        allow_change: bool,
        warn: &mut dyn FnMut(&str),
    ) -> Result<()> {
        let Some(cmd) = install_command(rec, settings, image, drift, allow_change, warn) else {
            return Ok(());
        };
        // The step runs on the sandbox's own network: none stays none, an
        // egress sandbox's step goes through the same allow-list.
        let net = match rec.network {
            Network::Egress => "egress network, through its allow-list",
            Network::Bridge => "bridge network",
            Network::None => "no network, as the sandbox",
        };
        warn(&format!(
            "{} differ(s) from the image's; running '{cmd}' for sandbox '{}' ({net})",
            drift.join(", "),
            rec.name
        ));
        let mut s = spec.clone();
        let name = format!("{}-install", rec.container);
        s.name = Some(name.clone());
        s.ports.clear();
        self.engine.create(&s)?;
        let res = (|| {
            self.engine.start(&name)?;
            let req = ExecRequest {
                cmd: wall::confined(
                    rec.runtime_name(),
                    vec!["/bin/sh".into(), "-c".into(), cmd.clone()],
                ),
                env: vec![],
                user: Some(format!("{0}:{0}", rec.uid)),
                workdir: Some(REPO.into()),
            };
            // The output goes to the report a line at a time, as the
            // sandbox's text: control characters shown.
            let mut lines = Lines::default();
            let mut on = |_: OutStream, b: &[u8]| lines.take(b, &mut *warn);
            let code = self.engine.exec_io(&name, &req, ExecIo::output(&mut on))?;
            lines.finish(&mut *warn);
            if code != 0 {
                let hint = if rec.network == Network::None {
                    "; the sandbox has no network, and neither has its install: create it with --network egress (the package registry in the allow-list), or rebuild the image with lw-build"
                } else {
                    ""
                };
                return Err(Error::data(format!(
                    "the incremental install '{cmd}' failed (exit {code}); its output is above{hint}"
                )));
            }
            Ok(())
        })();
        self.engine.remove(&name, true)?;
        res
    }
}

/// The install command: `sandbox.install`, else the image's install script
/// (the branch's with `allow_change`); None, warned about, when nothing runs.
fn install_command(
    rec: &Record,
    settings: &Settings,
    image: &ImageChoice,
    drift: &[String],
    allow_change: bool,
    warn: &mut dyn FnMut(&str),
) -> Option<String> {
    let script = image.inputs.iter().find(|(p, _)| p.ends_with("deps.sh"));
    let changed = script.is_some_and(|(p, _)| drift.contains(p));
    let q = |p: &str| p.replace('\'', "'\\''");
    let cmd = match (&settings.install, script) {
        (Some(c), _) => c.clone(),
        // The task's branch changed the install script: reported, and run
        // only when asked (it runs with the sandbox's reach, no more).
        (None, Some((p, _))) if changed && allow_change => {
            warn(&format!(
                "the install script '{p}' differs on branch '{}' from the image's; running the branch's as --allow-install-change asks",
                rec.branch
            ));
            format!("sh '{}' {REPO}", q(p))
        }
        (None, Some((p, _))) => {
            if changed {
                warn(&format!(
                    "the install script '{p}' differs on branch '{}' from the image's; the image's copy runs (pass --allow-install-change to run the branch's)",
                    rec.branch
                ));
                if drift.len() == 1 {
                    return None;
                }
            }
            format!("sh '{IMAGE_DEPS}/{}' {REPO}", q(p))
        }
        (None, None) => {
            warn(&format!(
                "{} differ(s) from the image's but no install step is known (set sandbox.install); run lw-build to rebuild the image",
                drift.join(", ")
            ));
            return None;
        }
    };
    Some(cmd)
}

/// Output cut into lines for the report; a line longer than this is said in
/// pieces, so output without newlines stays bounded.
const LINE_MAX: usize = 16 << 10;

/// What an exec wrote, said a line at a time (`lw-sandbox: LINE`).
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    fn take(&mut self, b: &[u8], say: &mut dyn FnMut(&str)) {
        self.pending.extend_from_slice(b);
        while let Some(i) = self.pending.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            say_line(&line[..i], say);
        }
        while self.pending.len() >= LINE_MAX {
            let piece: Vec<u8> = self.pending.drain(..LINE_MAX).collect();
            say_line(&piece, say);
        }
    }

    fn finish(self, say: &mut dyn FnMut(&str)) {
        if !self.pending.is_empty() {
            say_line(&self.pending, say);
        }
    }
}

fn say_line(b: &[u8], say: &mut dyn FnMut(&str)) {
    let text = String::from_utf8_lossy(b);
    say(&base::visible::visible(text.trim_end_matches('\r')));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_said_a_whole_line_at_a_time_with_its_controls_shown() {
        let mut said = Vec::new();
        let mut say = |m: &str| said.push(m.to_string());
        let mut l = Lines::default();
        l.take(b"fetch", &mut say);
        l.take(b"ed 3\r\nbad \x1b[2J\nlast", &mut say);
        l.finish(&mut say);
        assert_eq!(said, ["fetched 3", "bad ^[[2J", "last"]);
        let mut n = 0;
        let mut l = Lines::default();
        l.take(&vec![b'x'; LINE_MAX + 1], &mut |_: &str| n += 1);
        assert_eq!((n, l.pending.len()), (1, 1));
    }
}
