//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The tests' one temporary directory (the `tempfile` crate's): a fresh
/// directory under the target dir, removed when dropped unless the test
/// failed (then it is kept for inspection).
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = tempfile::Builder::new()
            .prefix(&format!("{tag}-"))
            .tempdir_in(crate::target_tmp())
            .expect("target tmp dir is writable");
        TempDir(d)
    }
    /// The same under the system's temporary directory: outside any git
    /// repository (the target dir is inside the checkout), for tests of
    /// what a command does where no repository is.
    pub fn outside_repo(tag: &str) -> TempDir {
        let d = tempfile::Builder::new()
            .prefix(&format!("lw-{tag}-"))
            .tempdir()
            .expect("the temporary directory is writable");
        TempDir(d)
    }
    pub fn path(&self) -> &Path {
        self.0.path()
    }
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.0.path().join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        self.0.disable_cleanup(std::thread::panicking());
    }
}

/// Asserts that `o` succeeded, else fails with its status, stdout and
/// stderr.
pub fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

/// What `o` wrote, stdout then stderr, as text.
pub fn output(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

pub fn lw_post() -> Command {
    Command::new(crate::bin("lw-post"))
}

pub fn lw_inbox() -> Command {
    Command::new(crate::bin("lw-inbox"))
}

/// Runs a command with stdin closed (not a terminal) and returns its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("test binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Entries of a directory, sorted.
pub fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Mounts a tmpfs of `size` at `dir`; undone by the returned guard.
pub struct Mount(pub PathBuf);

impl Mount {
    pub fn tmpfs(dir: &Path, opts: &str) -> Mount {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(
            st.success(),
            "mount -t tmpfs -o {opts} {} failed (tests that need a small file system run as root)",
            dir.display()
        );
        Mount(dir.to_path_buf())
    }
    pub fn remount(&self, opts: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,{opts}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(st.success(), "remount {opts} failed");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
