//! `lw init --check`: the project's own tests, once, in a sandbox made for
//! that and removed after.
//!
//! The test command is the one each stack's tool runs (`npm test`,
//! `python3 -m pytest -q`, `cargo test --offline -q`, `go test ./...`), in
//! the order the stacks are found, each only when the previous passed.  It
//! runs through lw-sandbox(1) as a person would (`create` with the network
//! off, `exec`, `rm --force`), found next to the running binary as `lw`
//! finds its commands, so the check sees exactly the sandbox a task gets.
//!
//! What the project prints is its own: a hostile or broken test suite can
//! print without end, print terminal escapes, or never end.  So the output
//! goes to a file in the sandbox's workspace (bounded by its disk) and only
//! its last lines come back, their control characters shown as `\xNN`; the
//! command runs under `timeout`; the sandbox is removed whatever happened.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Stack;
use base::error::{Error, Exit, Result};

/// How many of the output's last lines the report shows.
pub const TAIL_LINES: usize = 20;

/// The exit status of `lw init --check` when the tests ran and failed: a
/// test runner's 1, apart from the 64–78 of lw init's own failures.
pub const TESTS_FAILED: u8 = 1;

/// The status `timeout(1)` gives a command it ended.
const TIMED_OUT: i32 = 124;

/// The test command for `stacks` at `top`: each stack's, joined by `&&`;
/// none when no stack has one (a package.json without a `test` script, or
/// with npm's placeholder that always fails).
pub fn test_command(top: &Path, stacks: &[Stack]) -> Option<String> {
    let parts: Vec<&str> = stacks
        .iter()
        .filter_map(|s| match s.name {
            "node" => node_test(top),
            "python" => Some(python_test(top)),
            "rust" => Some("cargo test --offline -q"),
            "go" => Some("go test ./..."),
            _ => None,
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(" && "))
}

/// pytest; first the project's own C extension built in place where its
/// setup.py declares one (`ext_modules`), as the tests import it from the
/// clone, which is not installed.
fn python_test(top: &Path) -> &'static str {
    let setup = std::fs::read_to_string(top.join("setup.py")).unwrap_or_default();
    if setup.contains("ext_modules") {
        "python3 setup.py -q build_ext --inplace && python3 -m pytest -q"
    } else {
        "python3 -m pytest -q"
    }
}

fn node_test(top: &Path) -> Option<&'static str> {
    let text = std::fs::read_to_string(top.join("package.json")).ok()?;
    let j: serde_json::Value = serde_json::from_str(&text).ok()?;
    let script = j.get("scripts")?.get("test")?.as_str()?;
    if script.contains("no test specified") {
        return None;
    }
    Some(if top.join("pnpm-lock.yaml").is_file() {
        "pnpm test"
    } else if top.join("yarn.lock").is_file() {
        "yarn test"
    } else {
        "npm test"
    })
}

/// What one check found.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub command: String,
    /// The command's exit status (128+n for a signal, 124 timed out).
    pub status: i32,
    pub took: Duration,
    /// The output's last lines, made printable.
    pub tail: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.status == 0
    }

    /// The report: `pass` or `fail`, then `command`, `exit`, `time`, one
    /// `KEY VALUE` line each, then the output's tail, each line after `| `.
    pub fn report(&self) -> String {
        let mut s = format!(
            "{}\ncommand {}\nexit {}{}\ntime {:.1} s\n",
            if self.passed() { "pass" } else { "fail" },
            self.command,
            self.status,
            if self.status == TIMED_OUT {
                " (timed out)"
            } else {
                ""
            },
            self.took.as_secs_f64()
        );
        for l in &self.tail {
            s.push_str("| ");
            s.push_str(l);
            s.push('\n');
        }
        s
    }
}

/// `bytes` as lines a terminal shows as they are: each control character
/// but the tab, and each byte that is not UTF-8, as `\xNN`; the last `n`
/// lines.
pub fn printable_tail(bytes: &[u8], n: usize) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| {
            l.chars()
                .map(|c| match c {
                    '\t' => "\t".to_string(),
                    c if c.is_control() => format!("\\x{:02x}", c as u32),
                    '\u{fffd}' => "\\x??".to_string(),
                    c => c.to_string(),
                })
                .collect()
        })
        .collect()
}

/// Where and how the check runs.
pub struct Check<'a> {
    /// The directory holding lw-sandbox.
    pub bins: PathBuf,
    /// The checkout's top.
    pub top: &'a Path,
    /// The mailbox root the throwaway sandbox is made in.
    pub root: &'a Path,
    pub command: String,
    pub timeout: Duration,
}

impl Check<'_> {
    fn sandbox(&self) -> Command {
        let mut c = Command::new(self.bins.join("lw-sandbox"));
        c.arg("--root")
            .arg(self.root)
            .arg("--project")
            .arg(self.top)
            .current_dir(self.top)
            .stdin(Stdio::null());
        c
    }

    /// Makes the sandbox, runs the command, removes the sandbox.  An error
    /// is lw-sandbox's failing (its message is on standard error); the
    /// tests failing is an [`Outcome`].
    pub fn run(&self) -> Result<Outcome> {
        let nonce = format!("{:08x}", base::id::random128() as u32);
        let name = format!("lw-check-{nonce}");
        let created = self
            .sandbox()
            .args(["create", &name, "--network", "none", "--branch"])
            .arg(format!("lw-check/{nonce}"))
            .stdout(Stdio::null())
            .status()
            .map_err(|e| self.cannot_run(e))?;
        if !created.success() {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot make the check's sandbox (lw-sandbox create exited {}; its message is above); build the image first: lw-mirror sync && lw-build",
                    created.code().unwrap_or(-1)
                ),
            ));
        }
        let ran = self.exec(&name);
        let removed = self
            .sandbox()
            .args(["rm", "--force", &name])
            .stdout(Stdio::null())
            .status();
        let outcome = ran?;
        match removed {
            Ok(s) if s.success() => Ok(outcome),
            _ => Err(Error::new(
                Exit::Unavailable,
                format!("cannot remove the check's sandbox '{name}'; lw-sandbox rm --force {name}"),
            )),
        }
    }

    fn exec(&self, name: &str) -> Result<Outcome> {
        // The output to a file of the workspace, its tail back on stdout;
        // the command's status is the script's.
        let script = format!(
            "log=$(mktemp /work/.lw-check.XXXXXX); timeout -k 10 {secs} sh -c \"$1\" >\"$log\" 2>&1 </dev/null; s=$?; tail -n {TAIL_LINES} \"$log\"; rm -f \"$log\"; exit $s",
            secs = self.timeout.as_secs().max(1)
        );
        let t = Instant::now();
        let o = self
            .sandbox()
            .args(["exec", name, "--", "sh", "-c", &script, "lw-check"])
            .arg(&self.command)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| self.cannot_run(e))?;
        let took = t.elapsed();
        use std::os::unix::process::ExitStatusExt;
        let status = o
            .status
            .code()
            .or_else(|| o.status.signal().map(|n| 128 + n))
            .unwrap_or(-1);
        Ok(Outcome {
            command: self.command.clone(),
            status,
            took,
            tail: printable_tail(&o.stdout, TAIL_LINES),
        })
    }

    fn cannot_run(&self, e: std::io::Error) -> Error {
        Error::io("cannot run", &self.bins.join("lw-sandbox"), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stack_s_test_command_and_npm_s_placeholder_is_none() {
        let d = std::env::temp_dir().join(format!(
            "lw-check-{}-{:x}",
            std::process::id(),
            base::id::random128() as u32
        ));
        std::fs::create_dir_all(&d).unwrap();
        let st = |n: &'static str| Stack {
            name: n,
            evidence: String::new(),
        };
        let w = |n: &str, t: &str| std::fs::write(d.join(n), t).unwrap();
        w(
            "package.json",
            r#"{"scripts": {"test": "echo \"Error: no test specified\" && exit 1"}}"#,
        );
        assert_eq!(test_command(&d, &[st("node")]), None);
        assert_eq!(
            test_command(&d, &[st("rust"), st("node"), st("go")]).as_deref(),
            Some("cargo test --offline -q && go test ./...")
        );
        w("package.json", r#"{"scripts": {"test": "tape test/*.js"}}"#);
        assert_eq!(test_command(&d, &[st("node")]).as_deref(), Some("npm test"));
        w("yarn.lock", "");
        assert_eq!(
            test_command(&d, &[st("node")]).as_deref(),
            Some("yarn test")
        );
        w("package.json", "not json");
        assert_eq!(test_command(&d, &[st("node")]), None);
        assert_eq!(
            test_command(&d, &[st("python")]).as_deref(),
            Some("python3 -m pytest -q")
        );
        // A C extension (bitarray's setup.py): built in place first.
        w(
            "setup.py",
            "setup(name='b', ext_modules=[Extension('b._b', ['b/_b.c'])])\n",
        );
        assert_eq!(
            test_command(&d, &[st("python")]).as_deref(),
            Some("python3 setup.py -q build_ext --inplace && python3 -m pytest -q")
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_tail_is_the_last_lines_with_control_characters_shown() {
        let mut out = Vec::new();
        for i in 0..30 {
            out.extend(format!("line {i}\n").as_bytes());
        }
        out.extend(b"\x1b]0;title\x07end\tok \xff\r\n");
        let t = printable_tail(&out, 3);
        assert_eq!(t, ["line 28", "line 29", "\\x1b]0;title\\x07end\tok \\x??"]);
        let o = Outcome {
            command: "npm test".into(),
            status: 124,
            took: Duration::from_millis(1500),
            tail: t,
        };
        assert!(!o.passed());
        assert_eq!(
            o.report(),
            "fail\ncommand npm test\nexit 124 (timed out)\ntime 1.5 s\n| line 28\n| line 29\n| \\x1b]0;title\\x07end\tok \\x??\n"
        );
    }
}
