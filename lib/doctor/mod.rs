//! `lw doctor`: checks everything loopwright depends on and says, for each
//! finding, what to do about it.
//!
//! Every check is independent and never changes anything: a doctor that
//! "fixes" things behind the user's back would hide the very state it is asked
//! about.  A check that cannot run (no project, no token configured) says so
//! as `skip`, not as a failure.

use std::path::PathBuf;
use std::time::Duration;

use engine::Images;
use mailbox::layout::Root;

pub use wall::finding::{Finding, Status};

mod devcontainer;
mod engines;
pub use engines::kube_role;
mod project;

use engines::{docker, host_files, kubernetes, runtimes, services};

use project::{github, image, image_cache, mailbox, mirror, toolchain};

fn f(
    check: &'static str,
    status: Status,
    detail: impl Into<String>,
    fix: Option<String>,
) -> Finding {
    Finding {
        check,
        status,
        detail: detail.into(),
        fix,
    }
}

/// What the doctor looks at.
pub struct Inputs {
    pub cwd: PathBuf,
    pub root: Option<PathBuf>,
    /// A mirror older than this is reported as stale.
    pub fresh: Duration,
}

/// Runs every check, in the order a newcomer would fix things.
pub fn run(inp: &Inputs) -> Vec<Finding> {
    let mut out = Vec::new();
    let project = match wall::config::project(&inp.cwd) {
        Ok(Some(p)) => {
            out.push(f(
                "project",
                Status::Ok,
                format!("{}", p.top.display()),
                None,
            ));
            Some(p)
        }
        Ok(None) => {
            out.push(f(
                "project",
                Status::Skip,
                format!(
                    "'{}' is not inside a git checkout; mirror and image checks skipped",
                    inp.cwd.display()
                ),
                Some("run lw doctor inside the project".into()),
            ));
            None
        }
        Err(e) => {
            out.push(f(
                "project",
                Status::Fail,
                e.to_string(),
                Some("fix .loopwright/config at the line named".into()),
            ));
            None
        }
    };
    out.push(git());
    let kind = engine::EngineKind::of(project.as_ref().map(|p| &p.config));
    let on_docker = matches!(kind, Ok(engine::EngineKind::Docker));
    if !on_docker {
        out.extend(kubernetes(kind, project.as_ref()));
    }
    // Docker is asked either way: on Kubernetes it is the image builder
    // the runner is paired with (engine::select), which builds and holds
    // the images the image and agent checks look at.
    let role = DockerRole::of(on_docker);
    let builder = docker(&mut out, project.as_ref(), role);
    let engine = builder.as_ref().filter(|_| role == DockerRole::Runner);
    if let Some(e) = engine {
        out.push(host_files(e));
        out.extend(runtimes(e, project.as_ref()));
    }
    out.push(apparmor());
    if let Some(p) = &project {
        out.push(mirror(p, inp.fresh));
        out.extend(devcontainer::devcontainer(p));
        out.extend(toolchain(p));
        out.extend(image(p, builder.as_ref()));
        out.push(image_cache(p));
        out.extend(agent::doctor::checks(
            p,
            builder.as_ref().map(|e| e as &dyn Images),
        ));
    }
    let root = inp
        .root
        .clone()
        .or_else(|| project.as_ref().map(|p| p.cache().join("mailbox")));
    if let (Some(r), Some(e)) = (&root, engine) {
        out.extend(services(r, e, project.as_ref()));
    }
    match root {
        Some(r) => out.extend(mailbox(&Root::new(r))),
        None => out.push(f(
            "mailbox",
            Status::Skip,
            "no mailbox root (no --root, no LW_ROOT, no project)",
            Some("set LW_ROOT".into()),
        )),
    }
    out.push(github(
        project
            .as_ref()
            .map(|p| p.top.as_path())
            .unwrap_or(&inp.cwd),
    ));
    out
}

/// What the Docker engine is to the checks: the sandbox runner (engine
/// docker), or only the image builder paired with the Kubernetes runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DockerRole {
    Runner,
    Builder,
}

impl DockerRole {
    fn of(on_docker: bool) -> DockerRole {
        if on_docker {
            DockerRole::Runner
        } else {
            DockerRole::Builder
        }
    }
}

fn git() -> Finding {
    match std::process::Command::new("git").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let ok = v
                .split_whitespace()
                .nth(2)
                .and_then(|n| {
                    let mut it = n.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
                    Some((it.next()?, it.next()?))
                })
                .is_some_and(|(maj, min)| (maj, min) >= (2, 30));
            if ok {
                f("git", Status::Ok, v, None)
            } else {
                f(
                    "git",
                    Status::Warn,
                    format!("{v}; loopwright is tested with git 2.30 and later"),
                    Some("install a newer git".into()),
                )
            }
        }
        _ => f(
            "git",
            Status::Fail,
            "git is not installed or not on PATH",
            Some("apt-get install git".into()),
        ),
    }
}

/// Sandboxes run under AppArmor's docker-default where the host has
/// AppArmor (lib/sandbox); say when it has not.
fn apparmor() -> Finding {
    if crate::sandbox::host_has_apparmor() {
        f(
            "apparmor",
            Status::Ok,
            "sandboxes run under the docker-default AppArmor profile",
            None,
        )
    } else {
        f(
            "apparmor",
            Status::Warn,
            "the host has no AppArmor: sandboxes run without an AppArmor profile (no capabilities, no-new-privileges and the seccomp profile still apply)",
            Some("nothing to do unless you want AppArmor: boot a kernel with it enabled".into()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_kubernetes_docker_is_asked_as_the_image_builder() {
        // It was not asked at all, and the image check then said "the
        // Docker engine is not reachable" with Docker up.
        assert_eq!(DockerRole::of(false), DockerRole::Builder);
        assert_eq!(DockerRole::of(true), DockerRole::Runner);
    }
}
