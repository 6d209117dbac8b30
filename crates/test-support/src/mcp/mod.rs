//! Shared by the lw-mcp tests: the real MCP clients they drive lw-mcp with,
//! installed by .ci/run outside the repository (the Python SDK in a venv,
//! the Inspector CLI and the TypeScript SDK under node_modules), and a
//! mailbox root with registered sandboxes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Where .ci/run installs the clients: `$LW_TEST_TOOLS`, else /opt/loopwright-test.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("LW_TEST_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/loopwright-test"))
}

/// The Python interpreter of the venv holding the `mcp` SDK.
pub fn python() -> PathBuf {
    let py = tools_dir().join("py/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "the MCP Python SDK is missing: expected `import mcp` to work with {}; \
         run `bash .ci/run` (it installs it there) or `python3 -m venv {0}/.. && {0}/../bin/pip install mcp`",
        py.display()
    );
    py
}

/// The MCP Inspector's CLI (npm package @modelcontextprotocol/inspector).
pub fn inspector() -> PathBuf {
    let bin = tools_dir().join("node/node_modules/.bin/mcp-inspector");
    assert!(
        bin.exists(),
        "the MCP Inspector is missing at {}; run `bash .ci/run` (it installs it) or \
         `npm install --prefix {} @modelcontextprotocol/inspector`",
        bin.display(),
        tools_dir().join("node").display()
    );
    bin
}

/// The Python client script (crates/test-support/src/mcp/client.py).
pub fn client_script() -> PathBuf {
    crate::workspace().join("crates/test-support/src/mcp/client.py")
}

pub use crate::bin;

/// Runs the Python SDK client: `scenario`, its options, then the server command.
/// `env` is added to the client's environment, which the server inherits.
pub fn client(scenario: &str, opts: &[&str], server: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(python());
    c.arg(client_script())
        .arg(scenario)
        .args(opts)
        .arg("--")
        .args(server)
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the python client runs")
}

/// The client's one JSON line.
pub fn report(o: &Output) -> serde_json::Value {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "the client printed no JSON ({e}): stdout {out}\nstderr {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// A mailbox root with sandboxes registered by lw-mediate (no containers).
pub struct Root {
    pub dir: PathBuf,
}

impl Root {
    pub fn new(tag: &str) -> Root {
        let dir = crate::target_tmp().join(format!("mcp-{tag}-{}", base::id::new_id()));
        std::fs::create_dir_all(&dir).expect("target tmp dir is writable");
        Root { dir }
    }

    pub fn register(&self, name: &str, branch: &str, scope: &[&str]) {
        let mut c = Command::new(bin("lw-mediate"));
        c.arg("--root")
            .arg(&self.dir)
            .args(["register", name, "--branch", branch]);
        for s in scope {
            c.args(["--scope", s]);
        }
        let o = c.output().expect("lw-mediate runs");
        assert!(
            o.status.success(),
            "lw-mediate register: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    pub fn mailbox(&self, name: &str) -> PathBuf {
        self.dir.join("sandboxes").join(name)
    }

    /// The environment lw-sandbox gives sandbox `name`, pointed at this root.
    pub fn env(&self, name: &str) -> Vec<(String, String)> {
        vec![
            (
                "LW_MAILBOX".into(),
                self.mailbox(name).to_string_lossy().into(),
            ),
            ("LW_SANDBOX".into(), name.into()),
            ("LW_BRANCH".into(), format!("lw/{name}")),
            (
                "LW_REGISTRY".into(),
                self.dir.join("registry").to_string_lossy().into(),
            ),
        ]
    }

    /// `lw-mediate --once` over this root.
    pub fn mediate_once(&self) {
        let o = Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&self.dir)
            .arg("--once")
            .output()
            .expect("lw-mediate runs");
        assert!(
            o.status.success(),
            "lw-mediate --once: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Entries of a directory, sorted.
pub fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                e.expect("readable entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Shell-quotes one word.
pub fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
