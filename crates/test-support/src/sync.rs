//! Shared by the lw-sync tests: a GitHub-compatible server on 127.0.0.1
//! (the real lw-github-sink binary, one per test), log entries written with
//! `Log::append`, and `lw-sync` runs.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use mailbox::log::{Action, Decision, Entry, Log};
use mailbox::message::{Kind, Message};
use serde_json::{Value, json};

pub const TOKEN: &str = "ghp_testtoken0123456789";

pub use crate::tempdir;

pub struct Env {
    pub dir: PathBuf,
    pub root: PathBuf,
    /// The lw-github-sink process; killed when the test ends.
    pub server: Child,
    pub url: String,
    pub agent: ureq::Agent,
}

impl Env {
    pub fn new(tag: &str) -> Env {
        let dir = tempdir(tag);
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("log")).unwrap();
        let (server, url) = start_sink(&dir);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        Env {
            dir,
            root,
            server,
            url,
            agent,
        }
    }

    /// Accepts `token` for `login` (read-write), through the control API.
    pub fn add_token(&self, login: &str, token: &str) {
        let v = self.ctl(
            "POST",
            "tokens",
            json!({ "token": token, "login": login, "write": true }),
        );
        assert_eq!(v["ok"], true, "{v}");
    }

    pub fn log(&self) -> Log {
        Log::new(self.root.join("log"))
    }

    pub fn ctl(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}/_sink/{path}", self.url);
        let mut r = match method {
            "GET" => self.agent.get(&url).call().unwrap(),
            "DELETE" => self.agent.delete(&url).call().unwrap(),
            _ => self.agent.post(&url).send_json(&body).unwrap(),
        };
        r.body_mut().read_json().unwrap()
    }

    pub fn faults(&self, f: Value) {
        self.ctl("POST", "faults", json!({ "faults": f }));
    }

    /// Every comment on octo/proj#issue, straight from the server.
    pub fn comments(&self, issue: u64) -> Vec<(u64, String, String)> {
        let v = self.ctl(
            "GET",
            &format!("comments?repo=octo/proj&issue={issue}"),
            Value::Null,
        );
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["id"].as_u64().unwrap(),
                    c["body"].as_str().unwrap().to_string(),
                    c["login"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// Entry name -> number of sections (parts counted once per entry) found on the issue.
    pub fn section_counts(&self, issue: u64) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for (_, body, _) in self.comments(issue) {
            if let Some(Ok(secs)) = ::sync::parse_comment(&body) {
                for s in secs {
                    if let ::sync::Head::Entry(h) = s.head
                        && h.part[0] == 1
                    {
                        *m.entry(h.entry).or_insert(0) += 1;
                    }
                }
            }
        }
        m
    }

    pub fn requests(&self) -> (Vec<Value>, Vec<Value>) {
        let v = self.ctl("GET", "requests", Value::Null);
        (
            v["requests"].as_array().unwrap().clone(),
            v["windows"].as_array().unwrap().clone(),
        )
    }

    pub fn sync_cmd(&self, args: &[&str]) -> Command {
        self.sync_cmd_at(&self.root, "octo/proj", 1, args)
    }

    pub fn sync_at(&self, repo: &str, issue: u64, args: &[&str]) -> Output {
        self.sync_cmd_at(&self.root, repo, issue, args)
            .output()
            .unwrap()
    }

    pub fn sync_root(&self, root: &Path, args: &[&str]) -> Output {
        self.sync_cmd_at(root, "octo/proj", 1, args)
            .output()
            .unwrap()
    }

    pub fn sync_cmd_at(&self, root: &Path, repo: &str, issue: u64, args: &[&str]) -> Command {
        self.sync_cmd_api(&self.url, root, repo, issue, args)
    }

    /// `lw-sync` against the API at `api` instead of this server.
    pub fn sync_cmd_api(
        &self,
        api: &str,
        root: &Path,
        repo: &str,
        issue: u64,
        args: &[&str],
    ) -> Command {
        let mut c = Command::new(crate::bin("lw-sync"));
        c.env_remove("GITHUB_TOKEN")
            .env_remove("LW_ROOT")
            .env_remove("LW_GITHUB_API_URL")
            .env_remove("GITHUB_ACTIONS")
            .env("GH_TOKEN", TOKEN)
            .env("LW_SYNC_MIN_WRITE_INTERVAL_MS", "5")
            .env("HOME", &self.dir)
            .current_dir(&self.dir)
            .arg("--root")
            .arg(root)
            .arg("--api-url")
            .arg(api)
            .arg("--repo")
            .arg(repo)
            .arg("--issue")
            .arg(issue.to_string())
            .args(args)
            .stdin(Stdio::null());
        c
    }

    pub fn sync(&self, args: &[&str]) -> Output {
        self.sync_cmd(args).output().unwrap()
    }
}

/// Starts lw-github-sink on a free loopback port with its state in
/// `dir/sink`, octo/proj issues 1..3 and the token TOKEN for lw-bot, and
/// waits for the base URL it prints once it listens.
fn start_sink(dir: &Path) -> (Child, String) {
    let tokens = dir.join("sink-tokens");
    std::fs::write(&tokens, format!("lw-bot {TOKEN}\n")).unwrap();
    let mut child = Command::new(crate::bin("lw-github-sink"))
        .arg("--dir")
        .arg(dir.join("sink"))
        .args(["--listen", "127.0.0.1:0", "--repo", "octo/proj:3"])
        .arg("--tokens")
        .arg(&tokens)
        .args(["--hourly-limit", "100000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start lw-github-sink");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_string();
    if !url.starts_with("http://") {
        let _ = child.kill();
        panic!(
            "lw-github-sink did not print its URL (got {line:?}): {:?}",
            child.wait()
        );
    }
    (child, url)
}

impl Drop for Env {
    /// A failed test leaves its directory for inspection; a passing one does not.
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn message(from: &str, to: &str, kind: Kind, subject: &str, body: &str) -> Message {
    Message {
        version: 1,
        id: base::id::new_id(),
        from: from.into(),
        to: vec![to.into()],
        kind,
        subject: subject.into(),
        body: body.into(),
        refs: vec![],
        in_reply_to: None,
        created: base::time::rfc3339(base::time::now()),
    }
}

/// The entry the mediator logs for `m` and `action`.
pub fn entry(m: &Message, action: Action) -> Entry {
    Entry {
        version: 1,
        name: Entry::name_for(&m.id, action, None),
        logged: base::time::rfc3339(base::time::now()),
        message_id: m.id.clone(),
        sender: m.from.clone(),
        message: Some(m.clone()),
        decision: Decision {
            quiet: false,
            action,
            to: m.to.clone(),
            reason: format!("policy: {} is {}", m.kind, action.as_str()),
        },
    }
}

pub fn append_n(log: &Log, n: usize, body: &str) -> Vec<Entry> {
    (0..n)
        .map(|i| {
            let m = message(
                "api",
                "web",
                Kind::Status,
                &format!("status {i}"),
                &format!("{body} {i} @someone #12"),
            );
            let e = entry(&m, Action::Forward);
            assert!(log.append(&e).unwrap());
            e
        })
        .collect()
}

pub fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

pub fn files_under(d: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![d.to_path_buf()];
    while let Some(p) = stack.pop() {
        if let Ok(rd) = std::fs::read_dir(&p) {
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p)
                } else {
                    out.push(p)
                }
            }
        }
    }
    out
}

/// One REST request with `token`: status, headers and JSON body.
pub fn call(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Vec<(String, String)>, Value) {
    let auth = format!("Bearer {token}");
    let mut r = match (method, body) {
        ("GET", _) => agent
            .get(url)
            .header("Authorization", &auth)
            .call()
            .unwrap(),
        ("PATCH", Some(b)) => agent
            .patch(url)
            .header("Authorization", &auth)
            .send_json(&b)
            .unwrap(),
        (_, Some(b)) => agent
            .post(url)
            .header("Authorization", &auth)
            .send_json(&b)
            .unwrap(),
        _ => unreachable!(),
    };
    let headers = r
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let v = r.body_mut().read_json().unwrap_or(Value::Null);
    (r.status().as_u16(), headers, v)
}

pub fn header<'a>(h: &'a [(String, String)], k: &str) -> Option<&'a str> {
    h.iter()
        .find(|(a, _)| a.eq_ignore_ascii_case(k))
        .map(|(_, v)| v.as_str())
}
