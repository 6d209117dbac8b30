//! Shared by the federation tests: two hosts (their roots, sync.json,
//! policy and token) around one lw-github-sink, mailbox-only sandboxes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use crate::sync::{Env, text};
use mailbox::layout::Root;
use mailbox::maildir::Sub;
use mailbox::message::{Kind, Message};
use mailbox::registry::{Registry, Sandbox};
use serde_json::json;
use std::time::{Duration, Instant};

pub const TOKEN_A: &str = "ghp_hostatoken0123456789";
pub const TOKEN_B: &str = "ghp_hostbtoken0123456789";
pub const LOGIN_A: &str = "host-a-bot";
pub const LOGIN_B: &str = "host-b-bot";
pub const POLICY: &str = "loopwright-policy 1\nrate off\nduplicates off\n";

/// One host: its root, its configuration and its token.
pub struct Host {
    pub name: &'static str,
    pub root: Root,
    pub config: PathBuf,
    pub policy: PathBuf,
    pub token: &'static str,
}

pub fn host(env: &Env, name: &'static str, token: &'static str, own: &[(&str, &[&str])]) -> Host {
    let dir = env.dir.join(name);
    let root = Root::new(dir.join("root"));
    std::fs::create_dir_all(&root.dir).unwrap();
    root.init().unwrap();
    let reg = Registry::new(&root);
    for (n, scope) in own {
        reg.register(&Sandbox::new(
            n,
            None,
            scope.iter().map(|s| s.to_string()).collect(),
        ))
        .unwrap();
    }
    let config = dir.join("sync.json");
    std::fs::write(
        &config,
        json!({ "host": name, "hosts": { "hosta": LOGIN_A, "hostb": LOGIN_B } }).to_string(),
    )
    .unwrap();
    let policy = dir.join("policy");
    std::fs::write(&policy, POLICY).unwrap();
    Host {
        name,
        root,
        config,
        policy,
        token,
    }
}

impl Host {
    pub fn sync_cmd(&self, env: &Env, args: &[&str]) -> Command {
        let mut c = env.sync_cmd_at(&self.root.dir, "octo/proj", 1, args);
        c.env("GH_TOKEN", self.token)
            .arg("--config")
            .arg(&self.config);
        c
    }
    pub fn sync(&self, env: &Env, args: &[&str]) -> Output {
        let o = self.sync_cmd(env, args).output().unwrap();
        assert!(
            o.status.success(),
            "{}: lw-sync {args:?}: {}{}",
            self.name,
            text(&o.stdout),
            text(&o.stderr)
        );
        o
    }
    pub fn mediate(&self) {
        let o = Command::new(crate::bin("lw-mediate"))
            .arg("--root")
            .arg(&self.root.dir)
            .arg("--policy")
            .arg(&self.policy)
            .arg("--once")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{}: lw-mediate --once: {}",
            self.name,
            text(&o.stderr)
        );
    }
    pub fn mediator_watch(&self) -> Child {
        Command::new(crate::bin("lw-mediate"))
            .arg("--root")
            .arg(&self.root.dir)
            .arg("--policy")
            .arg(&self.policy)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
    pub fn record(&self, name: &str) -> Option<Sandbox> {
        Registry::new(&self.root).get(name).unwrap()
    }
    /// The names in `dir/{new,cur}` of a Maildir under the root.
    pub fn names(&self, rel: &str) -> Vec<String> {
        let mut v = Vec::new();
        for s in [Sub::New, Sub::Cur] {
            let d = mailbox::maildir::Maildir::new(self.root.dir.join(rel)).sub(s);
            if let Ok(rd) = std::fs::read_dir(d) {
                v.extend(
                    rd.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned()),
                );
            }
        }
        v.sort();
        v
    }
}

pub fn two_hosts(tag: &str) -> (Env, Host, Host) {
    let env = Env::new(tag);
    env.add_token(LOGIN_A, TOKEN_A);
    env.add_token(LOGIN_B, TOKEN_B);
    let a = host(&env, "hosta", TOKEN_A, &[("api", &["src/api/**"])]);
    let b = host(&env, "hostb", TOKEN_B, &[("web", &["schema/**"])]);
    (env, a, b)
}

pub fn contract_change(subject: &str) -> Message {
    Message {
        version: 1,
        id: base::id::new_id(),
        from: "api".into(),
        to: vec!["mediator".into()],
        kind: Kind::ContractChange,
        subject: subject.into(),
        body: format!("{subject}: user.name is now user.full_name\n"),
        refs: vec!["schema/users.json".into()],
        in_reply_to: None,
        created: base::time::rfc3339(base::time::now()),
    }
}

/// Both hosts announce, then each pulls the other's announcement.
pub fn introduce(env: &Env, a: &Host, b: &Host) {
    a.sync(env, &["pull"]);
    b.sync(env, &["pull"]);
    a.sync(env, &["pull"]);
}

/// Arrival times of the messages in `dir/new` (watched with inotify).
pub fn watch_arrivals(dir: PathBuf, n: usize, deadline: Duration) -> BTreeMap<String, Instant> {
    let md = mailbox::maildir::Maildir::new(dir);
    let mut seen: BTreeMap<String, Instant> = BTreeMap::new();
    md.wait_until(Some(deadline), || {
        for e in std::fs::read_dir(md.sub(Sub::New)).unwrap().flatten() {
            seen.entry(e.file_name().to_string_lossy().into_owned())
                .or_insert_with(Instant::now);
        }
        Ok(seen.len() >= n)
    })
    .unwrap();
    seen
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The log entry of `m` forwarded to `to`, as its host's lw-sync mirrors it.
pub fn forward_entry(m: &Message, to: &[&str]) -> mailbox::log::Entry {
    mailbox::log::Entry {
        version: 1,
        name: format!("{}.forward", m.id),
        logged: base::time::rfc3339(base::time::now()),
        message_id: m.id.clone(),
        sender: m.from.clone(),
        message: Some(m.clone()),
        decision: mailbox::log::Decision {
            quiet: false,
            action: mailbox::log::Action::Forward,
            to: to.iter().map(|s| s.to_string()).collect(),
            reason: "test".into(),
        },
    }
}

/// Posts `body` on the issue as `login`, straight into the sink.
pub fn post_as(env: &Env, login: &str, body: &str) {
    let v = env.ctl(
        "POST",
        "comments",
        json!({ "repo": "octo/proj", "issue": 1, "login": login, "body": body }),
    );
    assert!(v["id"].as_u64().is_some(), "{v}");
}
