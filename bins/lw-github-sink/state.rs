//! The server's state and its journal: every change is one JSON line
//! appended to `DIR/journal.jsonl` and fsynced before the answer is sent, and
//! the journal is replayed on start, so a restarted server has the same
//! issues, comments and ids.  Tokens are stored as SHA-256 digests.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use mailbox::digest::sha256_hex;
use mailbox::{Error, Result};
use serde::{Deserialize, Serialize};

/// One recorded request (control requests are not recorded).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    /// Milliseconds since the epoch, with microseconds.
    pub t_ms: f64,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub login: Option<String>,
    pub fault: Option<String>,
    /// A content-creating request (POST, PATCH, DELETE).
    pub write: bool,
    /// Sent inside a window the server had blocked for this token.
    pub in_window: bool,
}

/// A window in which the server told the client not to send (`retry-after`
/// or an exhausted primary limit), in milliseconds since the epoch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Window {
    pub from_ms: f64,
    pub until_ms: f64,
    pub why: String,
}

/// An injected fault.  Matching requests (by method and path substring)
/// fire it `count` times (0 = without end), after letting `skip` pass, each
/// with `probability` (default 1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fault {
    /// `status` (answer `status` without doing anything, or after doing it
    /// when `commit`), `secondary` (403/429 secondary limit, `retry_after`
    /// seconds or no header), `primary` (exhaust the primary limit for
    /// `retry_after` seconds), `drop_after_commit` (do it, then close the
    /// connection without answering), `drop` (close without doing anything),
    /// `not_json` (answer 200 with an HTML page).
    pub kind: String,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path_contains: Option<String>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub retry_after: Option<u64>,
    #[serde(default)]
    pub commit: bool,
    #[serde(default = "one")]
    pub count: u64,
    #[serde(default)]
    pub skip: u64,
    #[serde(default)]
    pub probability: Option<f64>,
    /// The `message` of a `status` answer (default "Server Error"), e.g.
    /// "Resource not accessible by integration" for a 403 on `/user` as
    /// GitHub gives App installation and Actions tokens.
    #[serde(default)]
    pub message: Option<String>,
}

fn one() -> u64 {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredComment {
    pub id: u64,
    pub repo: String,
    pub issue: u64,
    pub body: String,
    pub login: String,
    pub association: String,
    pub created: u64,
    pub updated: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenInfo {
    pub login: String,
    pub write: bool,
    pub revoked: bool,
}

/// One journal line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    Repo {
        repo: String,
    },
    Issue {
        repo: String,
        number: u64,
        title: String,
    },
    Comment {
        c: StoredComment,
    },
    Edit {
        id: u64,
        body: String,
        at: u64,
    },
    Delete {
        id: u64,
    },
    Token {
        sha: String,
        info: TokenInfo,
    },
}

#[derive(Default)]
pub struct State {
    pub repos: BTreeMap<String, BTreeMap<u64, String>>,
    pub comments: BTreeMap<u64, StoredComment>,
    pub next_id: u64,
    pub tokens: HashMap<String, TokenInfo>,
    /// Each fault with how often it fired and how often it matched.
    pub faults: Vec<(Fault, u64, u64)>,
    pub records: Vec<Record>,
    pub windows: Vec<(String, Window)>,
    /// Primary limit per login: (remaining, reset epoch seconds).
    pub primary: HashMap<String, (u64, u64)>,
    journal: Option<std::fs::File>,
    pub seq: u64,
}

impl State {
    /// Creates `dir` when missing, replays its journal and opens it for
    /// appending.
    pub fn load(dir: &Path) -> Result<State> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create", dir, e))?;
        let jpath = dir.join("journal.jsonl");
        let mut st = State {
            next_id: 1_000_001,
            ..State::default()
        };
        match std::fs::read(&jpath) {
            Ok(bytes) => {
                for line in bytes.split(|&b| b == b'\n') {
                    // A torn last line (crash mid-append) is skipped.
                    if let Ok(op) = serde_json::from_slice::<Op>(line) {
                        st.apply(op);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("cannot read", &jpath, e)),
        }
        st.journal = Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&jpath)
                .map_err(|e| Error::io("cannot open", &jpath, e))?,
        );
        Ok(st)
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Repo { repo } => {
                self.repos.entry(repo).or_default();
            }
            Op::Issue {
                repo,
                number,
                title,
            } => {
                self.repos.entry(repo).or_default().insert(number, title);
            }
            Op::Comment { c } => {
                self.next_id = self.next_id.max(c.id + 1);
                self.comments.insert(c.id, c);
            }
            Op::Edit { id, body, at } => {
                if let Some(c) = self.comments.get_mut(&id) {
                    c.body = body;
                    c.updated = at;
                }
            }
            Op::Delete { id } => {
                self.comments.remove(&id);
            }
            Op::Token { sha, info } => {
                self.tokens.insert(sha, info);
            }
        }
    }

    /// Journals then applies: a change is on disk before anyone hears of it.
    pub fn commit(&mut self, op: Op) -> std::io::Result<()> {
        if let Some(j) = &mut self.journal {
            let mut line = serde_json::to_vec(&op).expect("journal ops are plain data");
            line.push(b'\n');
            j.write_all(&line)?;
            j.sync_data()?;
        }
        self.apply(op);
        Ok(())
    }

    /// Creates `repo` and its issues 1..=`issues` where missing.
    pub fn add_repo(&mut self, repo: &str, issues: u64) -> std::io::Result<()> {
        if !self.repos.contains_key(repo) {
            self.commit(Op::Repo { repo: repo.into() })?;
        }
        for n in 1..=issues {
            if !self.repos[repo].contains_key(&n) {
                self.commit(Op::Issue {
                    repo: repo.into(),
                    number: n,
                    title: format!("issue {n}"),
                })?;
            }
        }
        Ok(())
    }

    /// Accepts `token` for `login` (stored as its digest).
    pub fn add_token(&mut self, login: &str, token: &str, write: bool) -> std::io::Result<()> {
        let info = TokenInfo {
            login: login.into(),
            write,
            revoked: false,
        };
        self.commit(Op::Token {
            sha: sha256_hex(token.as_bytes()),
            info,
        })
    }
}
