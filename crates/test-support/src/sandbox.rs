//! Shared by the lw-sandbox tests: a scratch project (an upstream bare
//! repository, a checkout of it with a runtime definition, a mailbox root),
//! its image built by lw-build on the local Debian test image, and the
//! docker CLI as an independent witness of what the engine holds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

pub use crate::bin;

pub use crate::nonce;

pub fn git(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        o.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs")
}

pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The Debian test image (scripts/test-images), made once.
pub fn debian() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let script = crate::workspace().join("scripts/test-images");
        let out = Command::new(&script)
            .arg("debian")
            .output()
            .expect("scripts/test-images runs");
        assert!(
            out.status.success(),
            "scripts/test-images debian: {}",
            err(&out)
        );
        text(&out)
            .lines()
            .find(|l| l.starts_with("debian"))
            .and_then(|l| l.split_whitespace().nth(1))
            .expect("NAME TAG")
            .to_string()
    })
}

pub const RUNTIME: &str = "image loopwright/lw-sbtest
from @FROM@
layer base
    dockerfile .loopwright/runtime/base.Dockerfile
    input .loopwright/runtime/entry.sh .loopwright/runtime/ca-certificates
layer deps
    dockerfile .loopwright/runtime/deps.Dockerfile
    input .loopwright/runtime/deps.sh deps.lock
";

/// A scratch project with a mailbox root.  Dropping it removes every
/// container and volume its root labelled, and its directories.
pub struct Fixture {
    pub dir: PathBuf,
    pub upstream: PathBuf,
    pub proj: PathBuf,
    pub root: PathBuf,
}

impl Fixture {
    pub fn new(tag: &str) -> Fixture {
        Fixture::with_config(tag, "")
    }

    pub fn with_config(tag: &str, config: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!("lw-sbt-{tag}-{}", nonce()));
        let upstream = dir.join("up.git");
        let proj = dir.join("proj");
        let root = dir.join("root");
        std::fs::create_dir_all(&dir).expect("temp dir");
        git(&dir, &["init", "-q", "--bare", "-b", "main", "up.git"]);
        git(&dir, &["init", "-q", "-b", "main", "proj"]);
        git(&proj, &["config", "user.name", "Host Person"]);
        git(&proj, &["config", "user.email", "host@example.com"]);
        git(
            &proj,
            &[
                "remote",
                "add",
                "origin",
                upstream.to_str().expect("utf-8 temp path"),
            ],
        );
        let init = Command::new(bin("lw-build"))
            .args(["init", "--from", debian()])
            .current_dir(&proj)
            .output()
            .expect("lw-build runs");
        assert!(init.status.success(), "lw-build init: {}", err(&init));
        std::fs::write(
            proj.join(".loopwright/runtime/runtime.conf"),
            RUNTIME.replace("@FROM@", debian()),
        )
        .expect("write");
        std::fs::write(proj.join(".loopwright/config"), config).expect("write");
        std::fs::write(proj.join("deps.lock"), "lock v1\n").expect("write");
        std::fs::create_dir_all(proj.join("src/api")).expect("mkdir");
        std::fs::write(proj.join("src/api/schema.json"), "{\"users\": 1}\n").expect("write");
        std::fs::write(proj.join("README"), "sample\n").expect("write");
        std::fs::write(proj.join(".gitignore"), ".loopwright/cache/\n").expect("write");
        git(&proj, &["add", "-A"]);
        git(&proj, &["commit", "-qm", "init"]);
        git(&proj, &["push", "-q", "origin", "main"]);
        // Closed, as lw-sandbox makes a root and lw doctor wants it.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&root)
            .expect("mkdir root");
        let f = Fixture {
            dir,
            upstream,
            proj,
            root,
        };
        f.build();
        f
    }

    /// lw-build in the project (cached after the first run on this machine).
    pub fn build(&self) {
        let o = Command::new(bin("lw-build"))
            .current_dir(&self.proj)
            .output()
            .expect("lw-build runs");
        assert!(o.status.success(), "lw-build: {}", err(&o));
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin("lw-sandbox"));
        c.args(args)
            .current_dir(&self.proj)
            .env("LW_ROOT", &self.root)
            .env_remove("LW_MIRROR")
            .stdin(Stdio::null());
        c
    }

    pub fn sb(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("lw-sandbox runs")
    }

    /// `lw-sandbox ARGS` that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.sb(args);
        assert!(
            o.status.success(),
            "lw-sandbox {args:?} exited {:?}: {}",
            o.status.code(),
            err(&o)
        );
        text(&o)
    }

    /// Runs a shell script in sandbox `name`: (status, stdout, stderr).
    pub fn sh(&self, name: &str, script: &str) -> (i32, String, String) {
        let o = self.sb(&["exec", name, "--", "sh", "-c", script]);
        (o.status.code().unwrap_or(-1), text(&o), err(&o))
    }

    pub fn root_id(&self) -> String {
        loopwright::sandbox::root_id(&self.root)
    }

    pub fn container(&self, name: &str) -> String {
        format!("lw-sb-{}-{name}", self.root_id())
    }

    /// Containers and volumes the engine holds for this root (docker CLI).
    pub fn leftovers(&self) -> Vec<String> {
        let label = format!("label=org.loopwright.root={}", self.root_id());
        let mut v: Vec<String> = text(&docker(&["ps", "-aq", "--filter", &label]))
            .lines()
            .map(|l| format!("container {l}"))
            .collect();
        v.extend(
            text(&docker(&["volume", "ls", "-q", "--filter", &label]))
                .lines()
                .map(|l| format!("volume {l}")),
        );
        v.extend(
            text(&docker(&[
                "network",
                "ls",
                "--format",
                "{{.Name}}",
                "--filter",
                &label,
            ]))
            .lines()
            .map(|l| format!("network {l}")),
        );
        v
    }

    /// Everything lw-sandbox keeps for this root besides the engine's objects.
    pub fn host_leftovers(&self) -> Vec<String> {
        let mut v = Vec::new();
        let ports = std::fs::read_to_string(self.root.join("state/ports")).unwrap_or_default();
        v.extend(
            ports
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .map(|l| format!("lease {l}")),
        );
        for d in ["registry", "sandboxes", "state/sandbox", "state/push"] {
            if let Ok(rd) = std::fs::read_dir(self.root.join(d)) {
                v.extend(
                    rd.flatten()
                        .map(|e| format!("{d}/{}", e.file_name().to_string_lossy())),
                );
            }
        }
        v
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let label = format!("label=org.loopwright.root={}", self.root_id());
        let ids: Vec<String> = text(&docker(&["ps", "-aq", "--filter", &label]))
            .lines()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-fv"])
                .args(&ids)
                .output();
        }
        let vols: Vec<String> = text(&docker(&["volume", "ls", "-q", "--filter", &label]))
            .lines()
            .map(str::to_string)
            .collect();
        if !vols.is_empty() {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f"])
                .args(&vols)
                .output();
        }
        // Egress networks (their proxies went with the containers above).
        let nets: Vec<String> = text(&docker(&["network", "ls", "-q", "--filter", &label]))
            .lines()
            .map(str::to_string)
            .collect();
        if !nets.is_empty() {
            let _ = Command::new("docker")
                .args(["network", "rm"])
                .args(&nets)
                .output();
        }
        unmount_under(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Unmounts every filesystem mounted under `dir` (the sandboxes' disk
/// images, lib/sandbox/disk.rs), deepest first, so the directory can go.
pub fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let prefix = format!("{}/", dir.display());
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount").arg("-l").arg(p).output();
    }
}

/// A test's own Docker network and the servers on it (labelled `label`):
/// removed when dropped, after the fixture's drop has removed the proxies
/// attached to it.
pub struct World {
    pub label: String,
    pub net: String,
}

impl World {
    /// Creates the network `net`, labelled `org.loopwright.test=TEST` and as
    /// the egress proxy's way out; it and every container with the label go
    /// when the World is dropped.
    pub fn outside(test: &str, net: &str) -> World {
        let world = World {
            label: format!("org.loopwright.test={test}"),
            net: net.to_string(),
        };
        let o = docker(&[
            "network",
            "create",
            "--label",
            &world.label,
            "--label",
            "org.loopwright.egress=outside",
            &world.net,
        ]);
        assert!(o.status.success(), "{}", err(&o));
        world
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let ids = text(&docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label={}", self.label),
        ]));
        for id in ids.split_whitespace() {
            let _ = docker(&["rm", "-f", id]);
        }
        let _ = docker(&["network", "rm", &self.net]);
    }
}

/// The runtimes the wall suites run under, in one run: runc always, and
/// gVisor's runsc (registered by `.ci/run`; without it the suite fails
/// saying how to register it, unless LW_TEST_RUNTIMES=runc narrows the run).
pub fn wall_runtimes() -> Vec<&'static str> {
    let only_runc = std::env::var("LW_TEST_RUNTIMES").is_ok_and(|v| v.trim() == "runc");
    if only_runc {
        return vec!["runc"];
    }
    let registered =
        text(&docker(&["info", "--format", "{{json .Runtimes}}"])).contains("\"runsc\"");
    assert!(
        registered,
        "runsc (gVisor) is not registered with the engine, so the runsc column cannot run: {} \
         (or set LW_TEST_RUNTIMES=runc to run the runc column alone)",
        engine::runtime::RUNSC_INSTALL
    );
    vec!["runc", "runsc"]
}

/// The configuration line that puts a fixture's sandboxes under `runtime`.
pub fn runtime_config(runtime: &str) -> String {
    format!("sandbox.runtime = {runtime}\n")
}
