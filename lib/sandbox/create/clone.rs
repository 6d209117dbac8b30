//! The clone: where the task's branch starts (its upstream tip, `--from`,
//! or the mirror's HEAD), and the clone made inside the sandbox as its user
//! from the read-only mirror, with its git identity and trust in the mirror.

use std::fs;
use std::path::Path;

use super::super::{CreateOptions, Record, Sandboxes, Settings};
use super::{Clock, ImageChoice};
use base::config::Project;
use base::error::{Error, Exit, Result};
use wall::{MIRROR, WORK};

/// The clone, run inside the sandbox as its user.  Arguments: branch,
/// start commit, 1 when the branch exists upstream, the gitconfig, the
/// mirror's default branch, and where from: the mirror (shared objects) or
/// a bundle (volume mode; removed once cloned).
const CLONE: &str = r#"set -eu
B=$1 BASE=$2 EXISTS=$3 DEFAULT=$5 SRC=$6
mkdir -p /work/home
# Identity, and trust in the mirror (it belongs to the host's user; git reads
# safe.directory only from global configuration).
[ -e /work/home/.gitconfig ] || printf '%s' "$4" > /work/home/.gitconfig
if [ ! -e /work/repo/.git ]; then
    if [ "$SRC" = /lw/mirror ]; then
        git clone --quiet --shared --no-checkout "$SRC" /work/repo
    else
        git clone --quiet --no-checkout "$SRC" /work/repo
    fi
    cd /work/repo
    if [ "$EXISTS" = 1 ]; then
        git checkout --quiet -B "$B" --track "origin/$B"
    else
        git checkout --quiet --no-track -B "$B" "$BASE"
    fi
    # The clone made a local branch for the mirror's HEAD: only B is the task's.
    if [ -n "$DEFAULT" ] && [ "$DEFAULT" != "$B" ]; then git branch --quiet -D "$DEFAULT" 2>/dev/null || true; fi
fi
[ "$SRC" = /lw/mirror ] || rm -f "$SRC"
# Go's build cache starts from the image's (the standard library, built by
# toolchain.sh): its entries linked, as Go only reads an entry once written, and
# trim.txt the sandbox's own, so that Go trims none for a day (after that
# it may, and what it trimmed is compiled again).  Without it, a cold cache.
G=/opt/loopwright/gocache C=/work/.cache/go-build
if [ -d "$G" ] && [ ! -e "$C" ]; then
    mkdir -p /work/.cache
    { cp -Rs "$G" "$C.new" && rm -f "$C.new/trim.txt" && date +%s >"$C.new/trim.txt" && mv "$C.new" "$C"; } ||
        rm -rf "$C.new"
fi
git -C /work/repo rev-parse HEAD
"#;

impl<'a> Sandboxes<'a> {
    /// Resolves where the branch starts (recording a new branch's base in
    /// `rec`), finds the image inputs the branch changed, and clones; returns
    /// the head commit and the changed inputs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn clone_branch(
        &self,
        rec: &mut Record,
        opts: &CreateOptions,
        project: Option<&Project>,
        settings: &Settings,
        mirror: &Path,
        image: &ImageChoice,
        clock: &mut Clock,
        warn: &mut dyn FnMut(&str),
    ) -> Result<(String, Vec<String>)> {
        let name = rec.name.clone();
        let (exists, base) = start_commit(mirror, opts, warn)?;
        rec.base = exists.is_none().then(|| base.clone());
        let drift = super::image::drifted_inputs(mirror, &base, &image.inputs)?;
        clock.mark("resolve");
        let default = mirror_head_branch(mirror);
        let (user_name, email) = identity(settings, project, &name);
        let exists_flag = if exists.is_some() { "1" } else { "0" };
        let gitconfig = gitconfig(&user_name, &email);
        let args = [
            "lw-clone",
            &rec.branch,
            &base,
            exists_flag,
            &gitconfig,
            &default,
            if rec.volume_mode {
                super::super::volume::BUNDLE
            } else {
                MIRROR
            },
        ];
        // On Kubernetes a copy is `tar` in the pod anyway (the engine's
        // copy_in): the bundle rides on the clone's own exec, one round
        // trip fewer.  Elsewhere it is copied in first.
        let fed = rec.volume_mode && self.kind == engine::EngineKind::Kubernetes;
        if rec.volume_mode && !fed {
            self.volume_bundle(rec, mirror)?;
            clock.mark("bundle");
        }
        let (code, out, err) = if fed {
            let tar = self.volume_bundle_tar(rec, mirror)?;
            clock.mark("bundle");
            let mut cmd = vec![
                "/bin/sh",
                "-c",
                "tar -x -o -f - -C /work && exec /bin/sh -c \"$@\"",
                "lw-bundle",
                CLONE,
            ];
            cmd.extend(args);
            self.run_fed(rec, &cmd, tar)?
        } else {
            let mut cmd = vec!["/bin/sh", "-c", CLONE];
            cmd.extend(args);
            self.run(rec, &cmd, None)?
        };
        if code != 0 {
            return Err(clone_failed(&name, code, &err, settings.uid));
        }
        let head = String::from_utf8_lossy(&out).trim().to_string();
        clock.mark("clone");
        Ok((head, drift))
    }
}

/// The sandbox's git identity: `sandbox.git-name`/`-email`, else the host's
/// for the project, else one naming the sandbox.
fn identity(settings: &Settings, project: Option<&Project>, name: &str) -> (String, String) {
    let user_name = settings
        .git_name
        .clone()
        .or_else(|| host_identity(project, "user.name"))
        .unwrap_or_else(|| format!("lw-sandbox {name}"));
    let email = settings
        .git_email
        .clone()
        .or_else(|| host_identity(project, "user.email"))
        .unwrap_or_else(|| format!("{name}@sandbox.loopwright.invalid"));
    (user_name, email)
}

/// A failed clone, with a hint when the image is the likely cause.
fn clone_failed(name: &str, code: i64, err: &[u8], uid: u32) -> Error {
    let why = String::from_utf8_lossy(err);
    let hint = if why.contains("Permission denied") || why.contains("Read-only") {
        format!("; the image must give {WORK} to uid {uid} (lw-build's base layer does)")
    } else if why.contains("not found") && why.contains("git") {
        "; the image has no git (lw-build's base layer installs it)".to_string()
    } else {
        String::new()
    };
    Error::new(
        Exit::Unavailable,
        format!(
            "cannot clone into sandbox '{name}' (exit {code}): {}{hint}",
            base::visible::visible(why.trim())
        ),
    )
}

/// The commit `rev` names in the mirror, or None.
fn mirror_commit(mirror: &Path, rev: &str) -> Result<Option<String>> {
    let out = repo::git::output(
        repo::git::command(None).arg("--git-dir").arg(mirror).args([
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &format!("{rev}^{{commit}}"),
        ]),
        "read the mirror",
    )?;
    let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !sha.is_empty()).then_some(sha))
}

/// The host's git identity for the project, if it has one.
fn host_identity(project: Option<&Project>, key: &str) -> Option<String> {
    let p = project?;
    repo::git::config_get(&p.top, key)
        .ok()
        .flatten()
        .filter(|v| !v.is_empty())
}

/// The sandbox's `~/.gitconfig`: its identity and trust in the mirror.
fn gitconfig(name: &str, email: &str) -> String {
    let q = |v: &str| {
        let v: String = v.chars().filter(|c| !c.is_control()).collect();
        format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
    };
    format!(
        "[user]\n\tname = {}\n\temail = {}\n[safe]\n\tdirectory = {MIRROR}\n",
        q(name),
        q(email)
    )
}

/// The branch the mirror's HEAD names (the clone makes a local one for it).
fn mirror_head_branch(mirror: &Path) -> String {
    fs::read_to_string(mirror.join("HEAD"))
        .ok()
        .and_then(|h| {
            h.trim()
                .strip_prefix("ref: refs/heads/")
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Whether `--from` names a ref the mirror lacks while the branch itself is
/// not there either (so `--from` would be used, and would fail).
pub(super) fn from_is_missing(mirror: &Path, opts: &CreateOptions) -> Result<bool> {
    let Some(f) = &opts.from else {
        return Ok(false);
    };
    Ok(
        mirror_commit(mirror, &format!("refs/heads/{}", opts.branch))?.is_none()
            && mirror_commit(mirror, &format!("refs/heads/{f}"))?.is_none()
            && mirror_commit(mirror, f)?.is_none(),
    )
}

/// Where the task's branch starts: its upstream tip when it exists (the
/// first value), else `--from`, else the upstream's HEAD.
fn start_commit(
    mirror: &Path,
    opts: &CreateOptions,
    warn: &mut dyn FnMut(&str),
) -> Result<(Option<String>, String)> {
    let exists = mirror_commit(mirror, &format!("refs/heads/{}", opts.branch))?;
    let base = match (&exists, &opts.from) {
        (Some(tip), _) => {
            if opts.from.is_some() {
                warn(&format!(
                    "branch '{}' exists upstream; --from is ignored",
                    opts.branch
                ));
            }
            tip.clone()
        }
        (None, Some(f)) => match mirror_commit(mirror, &format!("refs/heads/{f}"))? {
            Some(c) => c,
            None => mirror_commit(mirror, f)?.ok_or_else(|| {
                Error::usage(format!(
                    "--from '{f}' names no branch, tag or commit in the mirror '{}'",
                    mirror.display()
                ))
            })?,
        },
        (None, None) => mirror_commit(mirror, "HEAD")?.ok_or_else(|| {
            Error::data(format!(
                "the mirror '{}' has no HEAD commit; name one with --from",
                mirror.display()
            ))
        })?,
    };
    Ok((exists, base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitconfig_quotes_what_git_would_misread() {
        let c = gitconfig("A \"B\" \\ C\n[core]", "a@b");
        assert_eq!(
            c,
            "[user]\n\tname = \"A \\\"B\\\" \\\\ C[core]\"\n\temail = \"a@b\"\n[safe]\n\tdirectory = /lw/mirror\n"
        );
        // git itself reads it back as written.
        let dir = std::env::temp_dir().join(format!("lw-gitconfig-{}", base::id::new_id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("config");
        fs::write(&f, &c).unwrap();
        let out = std::process::Command::new("git")
            .args(["config", "--file"])
            .arg(&f)
            .args(["user.name"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            "A \"B\" \\ C[core]"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_mirror_head_names_the_branch_to_drop() {
        let dir = std::env::temp_dir().join(format!("lw-head-{}", base::id::new_id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("HEAD"), "ref: refs/heads/trunk\n").unwrap();
        assert_eq!(mirror_head_branch(&dir), "trunk");
        fs::write(dir.join("HEAD"), "0123abcd\n").unwrap();
        assert_eq!(mirror_head_branch(&dir), "");
        fs::remove_dir_all(&dir).unwrap();
    }
}
