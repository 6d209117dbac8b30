//! One project's checkout made a git repository with an upstream, the
//! built commands on PATH, and its run through lw init, lw-build,
//! lw-sandbox create and its test command (tests/real_projects/main.rs).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use super::{Project, fetch, ok};
use crate::sandbox_support::{self, docker, err, git, nonce, text, unmount_under};

struct Cleanup {
    dir: PathBuf,
    root: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let label = format!(
            "label=org.loopwright.root={}",
            loopwright::sandbox::root_id(&self.root)
        );
        for what in [&["ps", "-aq"][..], &["volume", "ls", "-q"][..]] {
            let mut args = what.to_vec();
            args.extend(["--filter", &label]);
            let ids: Vec<String> = text(&docker(&args)).lines().map(str::to_string).collect();
            if !ids.is_empty() {
                let rm: &[&str] = if what[0] == "ps" {
                    &["rm", "-fv"]
                } else {
                    &["volume", "rm", "-f"]
                };
                let _ = Command::new("docker").args(rm).args(&ids).output();
            }
        }
        unmount_under(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One project's checkout, pushed to its own upstream, with the built
/// binaries on PATH; removed (and its sandboxes) when dropped.
pub(crate) struct Checkout {
    pub name: String,
    pub repo: PathBuf,
    path: String,
    root: PathBuf,
    _cleanup: Cleanup,
}

impl Checkout {
    pub(crate) fn new(pr: &Project) -> Checkout {
        let src = fetch(pr);
        let dir = std::env::temp_dir().join(format!("lw-real-{}-{}", pr.stack, nonce()));
        let repo = dir.join("repo");
        std::fs::create_dir_all(&dir).unwrap();
        let root = repo.join(".loopwright/cache/mailbox");
        let cleanup = Cleanup {
            dir: dir.clone(),
            root: root.clone(),
        };
        ok(
            &dir,
            &format!("cp -a '{}' repo && rm repo/.lw-fetched", src.display()),
        );
        git(&dir, &["init", "-q", "--bare", "-b", "main", "up.git"]);
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["config", "user.name", "A Person"]);
        git(&repo, &["config", "user.email", "person@example.com"]);
        git(
            &repo,
            &[
                "remote",
                "add",
                "origin",
                dir.join("up.git").to_str().unwrap(),
            ],
        );
        git(&repo, &["add", "-A", "-f"]);
        git(&repo, &["commit", "-qm", "as published"]);
        git(&repo, &["push", "-q", "origin", "main"]);
        let bins = sandbox_support::bin("lw-init")
            .parent()
            .unwrap()
            .to_path_buf();
        let path = format!(
            "{}:{}",
            bins.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Checkout {
            name: format!("{} {}", pr.name, pr.version),
            repo,
            path,
            root,
            _cleanup: cleanup,
        }
    }

    /// `script` in the checkout, its time printed: its output.
    pub(crate) fn sh(&self, what: &str, script: &str) -> Output {
        let t = Instant::now();
        let o = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(&self.repo)
            .env("PATH", &self.path)
            .env("LW_ROOT", &self.root)
            .env_remove("LW_MIRROR")
            .env_remove("LW_MAILBOX")
            .stdin(Stdio::null())
            .output()
            .expect("bash runs");
        let secs = t.elapsed().as_secs_f64();
        println!("{}: {what} {secs:.1} s", self.name);
        o
    }

    /// `script`, which must succeed: its stdout and stderr.
    pub(crate) fn step(&self, what: &str, script: &str) -> (String, String) {
        let o = self.sh(what, script);
        assert!(
            o.status.success(),
            "{}: {what} failed:\n{}\n{}",
            self.name,
            text(&o),
            err(&o)
        );
        (text(&o), err(&o))
    }

    /// lw init, lw-mirror sync, lw-build in the corpus's image repository
    /// for `stack`: lw-build's output.
    pub(crate) fn build(&self, stack: &str) -> String {
        self.step("lw init", "lw init >/dev/null");
        // One image repository for the corpus: a toolchain layer's tag is
        // its inputs' hash, so the same toolchain is the same image.
        ok(
            &self.repo,
            &format!(
                "sed -i '1i image loopwright/lw-real-{stack}' .loopwright/runtime/runtime.conf"
            ),
        );
        self.step("lw-mirror sync", "lw-mirror sync >/dev/null");
        self.step("lw-build", "lw-build").0
    }
}

/// What one project's run found: its toolchain layer's tag and state
/// (`cached` or `built`), and what its declared toolchain versions resolve
/// to.
pub(crate) struct Ran {
    pub tag: String,
    pub state: String,
    pub declared: String,
}

/// One project through the whole path.
pub(crate) fn run(pr: &Project) -> Ran {
    let c = Checkout::new(pr);
    let built = c.build(pr.stack);
    let toolchain = built
        .lines()
        .find(|l| l.starts_with("toolchain "))
        .unwrap_or_default()
        .to_string();
    println!("{}: {toolchain}", c.name);
    c.step(
        "lw-sandbox create",
        "lw-sandbox create t --branch task/t >/dev/null",
    );
    let (out, e) = c.step(
        &format!("test ({}, network none)", pr.test),
        &format!(
            "lw-sandbox exec t -- sh -c 'cd /work/repo && {} 2>&1'",
            pr.test
        ),
    );
    println!(
        "{}: {} — last lines:\n{}{e}",
        c.name,
        pr.why,
        out.lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let declared = std::fs::read_to_string(c.repo.join(".loopwright/runtime/toolchain.versions"))
        .unwrap_or_default();
    let word = |i: usize| {
        toolchain
            .split_whitespace()
            .nth(i)
            .unwrap_or_default()
            .to_string()
    };
    Ran {
        tag: word(1),
        state: word(2),
        declared,
    }
}

/// The sandboxes (containers) of a checkout's mailbox root.
pub(crate) fn containers(c: &Checkout) -> Vec<String> {
    let label = format!(
        "label=org.loopwright.root={}",
        loopwright::sandbox::root_id(&c.root)
    );
    text(&docker(&["ps", "-aq", "--filter", &label]))
        .lines()
        .map(str::to_string)
        .collect()
}
