//! Shared by the lw-build tests: scratch projects, the local test images and
//! the docker CLI as an independent witness of what the engine holds.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn lw_build() -> PathBuf {
    crate::bin("lw-build")
}

pub use crate::nonce;

/// Tag of a test base image made by scripts/test-images (cached by hash).
pub fn test_image(name: &str) -> String {
    static BUSYBOX: OnceLock<String> = OnceLock::new();
    static DEBIAN: OnceLock<String> = OnceLock::new();
    let cell = if name == "busybox" { &BUSYBOX } else { &DEBIAN };
    cell.get_or_init(|| {
        let script = crate::workspace().join("scripts/test-images");
        let out = Command::new(&script)
            .arg(name)
            .output()
            .expect("scripts/test-images runs");
        assert!(
            out.status.success(),
            "scripts/test-images {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("test-images prints text");
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .expect("test-images names the image");
        line.split_whitespace()
            .nth(1)
            .expect("NAME TAG")
            .to_string()
    })
    .clone()
}

/// A scratch project directory, removed on drop with every image whose
/// repository starts with `repo` (and any container named after it).
pub struct Project {
    pub dir: PathBuf,
    pub repo: String,
    /// Leave the images behind (a cache for the next run).
    pub keep_images: bool,
}

impl Project {
    pub fn new(tag: &str) -> Project {
        let n = nonce();
        let dir = std::env::temp_dir().join(format!("lw-test-{tag}-{n}"));
        std::fs::create_dir_all(dir.join(".loopwright/runtime")).expect("temp dir is writable");
        Project {
            dir,
            repo: format!("loopwright/lw-test-{tag}-{n}"),
            keep_images: false,
        }
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.dir.join(rel);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).expect("mkdir in project");
        }
        std::fs::write(&p, text).expect("write in project");
    }

    pub fn lw_build(&self, args: &[&str]) -> Output {
        self.lw_build_env(args, &[])
    }

    pub fn lw_build_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(lw_build());
        c.args(args).current_dir(&self.dir);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("lw-build runs")
    }

    /// `lw-build` that must succeed; returns (layer, tag, state) per layer.
    pub fn build_ok(&self) -> Vec<(String, String, String)> {
        let out = self.lw_build(&[]);
        assert!(
            out.status.success(),
            "lw-build failed ({:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8 output")
            .lines()
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                assert_eq!(w.len(), 3, "LAYER TAG STATE: {l:?}");
                (w[0].to_string(), w[1].to_string(), w[2].to_string())
            })
            .collect()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.keep_images {
            return;
        }
        let out = Command::new("docker")
            .args(["images", "--format", "{{.Repository}}:{{.Tag}}"])
            .output()
            .expect("docker images runs");
        let tags: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(&self.repo))
            .map(str::to_string)
            .collect();
        if !tags.is_empty() {
            let _ = Command::new("docker")
                .arg("rmi")
                .arg("-f")
                .args(&tags)
                .output();
        }
    }
}

/// The image id a tag points at, from the docker CLI; None when missing.
pub fn image_id(tag: &str) -> Option<String> {
    let out = Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}", tag])
        .output()
        .expect("docker runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
