//! Running git on a sandbox's branch as data: hardened settings no file can
//! override, a time cap and an output cap, the whole process group killed
//! when either is passed.
//!
//! What a sandbox controls is the content of its branch: its history, trees
//! and blobs.  Everything git does with them here happens in host-owned
//! repositories under `ROOT/state/radar/` (made with `--template=`, their
//! config written by the host), with system and global config ignored and
//! `-c` settings that beat any repository file, so nothing the sandbox
//! wrote is ever run or read as configuration.  A history made to be slow
//! (a deep merge base, a huge tree, a rename storm) is bounded by the time
//! cap; a blob made to be large, by the output cap.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Settings passed with `-c` to every git the radar runs, after
/// `crate::git::untrusted_config` (no hook, no transport, objects checked).
pub const HARDENED: &[&str] = &[
    "core.untrackedCache=false",
    "merge.renameLimit=7000",
    "diff.renameLimit=7000",
    // Blobs over 1 MiB are streamed, never held whole (index-pack, fsck).
    "core.bigFileThreshold=1m",
    // Attributes never make git run a filter or renormalise: the radar
    // honours the built-in merge attributes only (radar/attrs.rs).
    "merge.renormalize=false",
    "core.attributesFile=/dev/null",
];

/// Caps on one git process.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Wall-clock time one git may take.
    pub time: Duration,
    /// Bytes of standard output read; more is an error.
    pub output: usize,
    /// Bytes of new objects one sandbox's fetch may bring, packed; and
    /// the uncompressed size any one of its new blobs may have.
    pub fetch: u64,
    /// Bytes of data memory (`RLIMIT_DATA`) one git may use.
    pub memory: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(20),
            output: 8 << 20,
            fetch: 256 << 20,
            memory: 1 << 30,
        }
    }
}

/// What a capped git did.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Why a capped git has no answer.
#[derive(Debug)]
pub enum Failed {
    /// It could not be started.
    Spawn(std::io::Error),
    /// It ran longer than the time cap (killed).
    Time(Duration),
    /// It printed more than the output cap (killed).
    Output(usize),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Spawn(e) => write!(f, "cannot run git: {e}"),
            Failed::Time(t) => write!(f, "git took longer than {}s (killed)", t.as_secs_f32()),
            Failed::Output(n) => write!(f, "git printed more than {n} bytes (killed)"),
        }
    }
}

/// A git command for a host-owned repository: scrubbed environment
/// (crates/repo/src/git/), no system or global config, the hardened `-c` settings.
pub fn git(git_dir: &Path) -> Command {
    let mut cmd = crate::git::command(None);
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .env_remove("GIT_CONFIG_COUNT")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_ATTR_NOSYSTEM", "1");
    crate::git::untrusted_config(&mut cmd);
    for c in HARDENED {
        cmd.args(["-c", c]);
    }
    cmd.arg("--git-dir").arg(git_dir);
    cmd
}

/// Runs one capped git in `repo`; its stdout, or why not.
pub(super) fn git_out<S: AsRef<OsStr>>(
    repo: &Path,
    limits: &Limits,
    pre: &[&OsStr],
    args: &[S],
    ok: &[i32],
) -> std::result::Result<(i32, Vec<u8>), String> {
    let mut c = git(repo);
    c.args(pre).args(args);
    let what = args[0].as_ref().to_string_lossy().into_owned();
    let r = run(c, limits).map_err(|e| format!("{what}: {e}"))?;
    let code = r.status.code().unwrap_or(-1);
    if !ok.contains(&code) {
        return Err(format!(
            "{what}: {}",
            base::visible::visible(&crate::git::last_words(&r.stderr))
        ));
    }
    Ok((code, r.stdout))
}

/// Reads `r` to its end, at most `cap` bytes; Err(()) when there is more.
fn read_capped(mut r: impl Read, cap: usize) -> Result<Vec<u8>, ()> {
    let mut buf = Vec::new();
    let n = (&mut r)
        .take(cap as u64 + 1)
        .read_to_end(&mut buf)
        .unwrap_or(0);
    if n > cap { Err(()) } else { Ok(buf) }
}

/// Runs `cmd` in its own process group with the caps of `limits`; the
/// group is killed on either time or output cap (git's children with it:
/// the transport of a fetch, a pack-objects), and each of its processes
/// gets at most `limits.memory` bytes of data (an allocation past it fails,
/// and git dies saying so).
pub fn run(mut cmd: Command, limits: &Limits) -> Result<Ran, Failed> {
    let mem = limits.memory;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            let l = rustix::process::Rlimit {
                current: Some(mem),
                maximum: Some(mem),
            };
            let _ = rustix::process::setrlimit(rustix::process::Resource::Data, l);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(Failed::Spawn)?;
    let pgid = rustix::process::Pid::from_child(&child);
    let (tx, rx) = mpsc::channel::<(u8, Result<Vec<u8>, ()>)>();
    let out = child.stdout.take().expect("stdout is piped above");
    let err = child.stderr.take().expect("stderr is piped above");
    let cap = limits.output;
    let t1 = tx.clone();
    let h1 = std::thread::spawn(move || {
        let _ = t1.send((1, read_capped(out, cap)));
    });
    let h2 = std::thread::spawn(move || {
        let _ = tx.send((2, read_capped(err, 64 << 10)));
    });
    let deadline = Instant::now() + limits.time;
    let (mut stdout, mut stderr) = (None, None);
    let mut failed = None;
    while stdout.is_none() || stderr.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((1, Ok(b))) => stdout = Some(b),
            Ok((_, Ok(b))) => stderr = Some(b),
            Ok((1, Err(()))) => {
                failed = Some(Failed::Output(cap));
                break;
            }
            Ok((_, Err(()))) => stderr = Some(b"(more than 64 KiB on stderr)".to_vec()),
            Err(_) => {
                failed = Some(Failed::Time(limits.time));
                break;
            }
        }
    }
    if let Some(f) = failed {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        let _ = child.wait();
        let _ = (h1.join(), h2.join());
        return Err(f);
    }
    let status = child.wait().map_err(Failed::Spawn)?;
    let _ = (h1.join(), h2.join());
    Ok(Ran {
        status,
        stdout: stdout.unwrap_or_default(),
        stderr: stderr.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_and_output_caps_kill_the_group() {
        let lim = Limits {
            time: Duration::from_millis(300),
            output: 1000,
            fetch: 0,
            memory: 64 << 20,
        };
        let mut c = Command::new("sh");
        // The child's child holds the pipe: only killing the group ends it.
        c.args(["-c", "sleep 30 & sleep 30"]);
        let t = Instant::now();
        assert!(matches!(run(c, &lim), Err(Failed::Time(_))));
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let mut c = Command::new("sh");
        c.args(["-c", "yes"]);
        assert!(matches!(run(c, &lim), Err(Failed::Output(1000))));
        let mut c = Command::new("sh");
        c.args(["-c", "printf ok; printf why >&2; exit 3"]);
        let r = run(c, &lim).unwrap();
        assert_eq!(
            (r.status.code(), &r.stdout[..], &r.stderr[..]),
            (Some(3), &b"ok"[..], &b"why"[..])
        );
        // 128 MiB asked of a 64 MiB data cap: refused inside the child.
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "x=$(head -c 134217728 /dev/zero | tr '\\0' a); echo ${#x}",
        ]);
        let r = run(
            c,
            &Limits {
                time: Duration::from_secs(20),
                output: 1000,
                ..lim
            },
        )
        .unwrap();
        assert!(
            !String::from_utf8_lossy(&r.stdout).starts_with("134217728"),
            "the cap let 128 MiB through"
        );
    }
}
