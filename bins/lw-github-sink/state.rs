//! The server's state and its journal: every change is one JSON line
//! appended to `DIR/journal.jsonl` and fsynced before the answer is sent, and
//! the journal is replayed on start, so a restarted server has the same
//! issues, comments and ids.  Tokens are stored as SHA-256 digests.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use base::digest::sha256_hex;
use base::{Error, Result};
use serde::{Deserialize, Serialize};

/// One recorded request (control requests are not recorded).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
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
pub(crate) struct Window {
    pub from_ms: f64,
    pub until_ms: f64,
    pub why: String,
}

/// An injected fault.  Matching requests (by method and path substring)
/// fire it `count` times (0 = without end), after letting `skip` pass, each
/// with `probability` (default 1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Fault {
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
pub(crate) struct StoredComment {
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
pub(crate) struct TokenInfo {
    pub login: String,
    pub write: bool,
    pub revoked: bool,
    /// May read and write pull requests and commit statuses (a fine-grained
    /// token without `pull_requests` is refused 403 there).
    #[serde(default = "yes")]
    pub pulls: bool,
}

fn yes() -> bool {
    true
}

/// A pull request.  Its number is one of the repository's issue numbers (as
/// on GitHub, where a pull request is an issue too, whose conversation is
/// the issue-comments API on that number).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StoredPull {
    pub repo: String,
    pub number: u64,
    pub title: String,
    pub body: String,
    /// The head's owner and branch (`owner:branch` is its label).
    pub head_owner: String,
    pub head: String,
    pub head_sha: String,
    pub base: String,
    /// `open` or `closed`.
    pub state: String,
    pub draft: bool,
    pub merged: bool,
    pub login: String,
    pub created: u64,
    pub updated: u64,
}

/// A commit status.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StoredStatus {
    pub id: u64,
    pub repo: String,
    pub sha: String,
    pub state: String,
    pub context: String,
    pub description: Option<String>,
    pub target_url: Option<String>,
    pub login: String,
    pub created: u64,
}

/// A review (`path` None) or a review comment on a line of a file, written
/// by a person through the control API.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StoredReview {
    pub id: u64,
    pub repo: String,
    pub pull: u64,
    pub login: String,
    /// A review's `APPROVED`, `CHANGES_REQUESTED` or `COMMENTED`.
    pub state: String,
    pub body: String,
    pub path: Option<String>,
    pub line: Option<u64>,
    pub created: u64,
    /// GitHub's `author_association` (`OWNER`, `MEMBER`, `NONE`, ...).
    #[serde(default = "owner")]
    pub association: String,
}

fn owner() -> String {
    "OWNER".into()
}

/// One journal line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
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
    /// The git repository whose branches the repository has.
    Git {
        repo: String,
        dir: std::path::PathBuf,
    },
    /// A pull request made or changed (the whole of it).
    Pull {
        p: StoredPull,
    },
    Status {
        s: StoredStatus,
    },
    Review {
        r: StoredReview,
    },
}

#[derive(Default)]
pub(crate) struct State {
    pub repos: BTreeMap<String, BTreeMap<u64, String>>,
    pub comments: BTreeMap<u64, StoredComment>,
    pub next_id: u64,
    pub tokens: HashMap<String, TokenInfo>,
    /// Repository -> the git directory holding its branches; a repository
    /// without one has every branch asked for.
    pub git: BTreeMap<String, std::path::PathBuf>,
    /// (repository, number) -> pull request.
    pub pulls: BTreeMap<(String, u64), StoredPull>,
    pub statuses: Vec<StoredStatus>,
    pub reviews: Vec<StoredReview>,
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
    pub(crate) fn load(dir: &Path) -> Result<State> {
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
            Op::Git { repo, dir } => {
                self.git.insert(repo, dir);
            }
            Op::Pull { p } => {
                let issues = self.repos.entry(p.repo.clone()).or_default();
                issues.insert(p.number, p.title.clone());
                self.pulls.insert((p.repo.clone(), p.number), p);
            }
            Op::Status { s } => {
                self.next_id = self.next_id.max(s.id + 1);
                self.statuses.push(s);
            }
            Op::Review { r } => {
                self.next_id = self.next_id.max(r.id + 1);
                self.reviews.push(r);
            }
        }
    }

    /// Journals then applies: a change is on disk before anyone hears of it.
    pub(crate) fn commit(&mut self, op: Op) -> std::io::Result<()> {
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
    pub(crate) fn add_repo(&mut self, repo: &str, issues: u64) -> std::io::Result<()> {
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

    /// The tip of `branch` of `repo`: from its git directory when it has
    /// one (None when the branch does not exist), else a made-up commit.
    pub(crate) fn branch_tip(&self, repo: &str, branch: &str) -> Option<String> {
        let Some(dir) = self.git.get(repo) else {
            return Some(sha256_hex(format!("{repo}:{branch}").as_bytes())[..40].to_string());
        };
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(dir)
            .args(["rev-parse", "--verify", "--quiet"])
            .arg(format!("refs/heads/{branch}^{{commit}}"))
            .output()
            .ok()?;
        let sha = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !sha.is_empty()).then_some(sha)
    }

    /// Whether `sha` names a commit of `repo` (always, without a git directory).
    pub(crate) fn has_commit(&self, repo: &str, sha: &str) -> bool {
        let Some(dir) = self.git.get(repo) else {
            return true;
        };
        std::process::Command::new("git")
            .arg("--git-dir")
            .arg(dir)
            .args(["cat-file", "-e"])
            .arg(format!("{sha}^{{commit}}"))
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Accepts `token` for `login` (stored as its digest).
    pub(crate) fn add_token(
        &mut self,
        login: &str,
        token: &str,
        write: bool,
    ) -> std::io::Result<()> {
        let info = TokenInfo {
            login: login.into(),
            write,
            revoked: false,
            pulls: true,
        };
        self.commit(Op::Token {
            sha: sha256_hex(token.as_bytes()),
            info,
        })
    }
}
