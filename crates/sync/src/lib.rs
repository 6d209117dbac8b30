//! The crate `sync`: GitHub's REST API (`github`), a task's pull request
//! (`pr`) and lw-sync, which this root is.
//!
//! Mirroring the log to GitHub issue comments, exactly once, and bringing a
//! person's answers back (lw-sync(1); mailbox-spec.md, "GITHUB COMMENT FORMAT").
//!
//! Exactly once rests on two things:
//!
//! 1. The sync state, `ROOT/state/sync.json`, written atomically (tmp file,
//!    fsync, rename, fsync of the directory).  Before a comment is sent its
//!    intent (the entries and parts it carries) is written as `pending`,
//!    together with the write time the rate limits need; after GitHub answers
//!    with the comment, the entries move to `synced` and `pending` is cleared.
//! 2. Reconciliation.  Whenever an outcome is unknown - a `pending` left by a
//!    crash, a dropped connection, a timeout, a 5xx - every page of the
//!    issue's comments is listed and the ids in the headers of lw-sync's own
//!    comments are taken as synced before anything is posted again.  A
//!    missing state file is an unknown outcome too.
//!
//! So a comment is posted at most once for each time its intent is written,
//! and an intent is only rewritten after a listing proved the comment absent.
//! Steady state costs one request per comment: no listing, no `GET` at all.
//!
//! Only comments whose author is lw-sync's login count as its own, so a
//! person cannot forge a header that hides a message.  The login is the
//! token's user (`GET /user`, once); when GitHub refuses that (403 for App
//! installation and Actions tokens), the configured `login` (or
//! `github-actions[bot]` under GitHub Actions).  Without any login, only the
//! comment ids the state recorded are lw-sync's, and a reconciliation - which
//! must recognise comments the state does not know - is refused with the fix;
//! every author is never trusted.
//! The header itself cannot be broken out of: its JSON has `<`, `>` and `&`
//! escaped, so it never contains `-->`; bodies are in fenced code blocks whose
//! fence is longer than any run of its character in the body, and the parser
//! is structural (header, fence, body, closing fence), never a text search.
//! Code blocks and code spans also keep agents' `@mentions` and `#refs` inert;
//! the only live mentions are the configured people on escalations.
//!
//! The files: `push` (reconcile, plan, post with intent), `pull` (answers
//! and notices), `verify` (both ways, restore), `watch` (the watch loop),
//! `review` (people's reviews and comments on a task's pull request,
//! delivered as requests), `format` (the comment format and rendering), `parse` (reading
//! comments back, reassembly), `state` (sync.json), `config` (sync.json
//! of the project), `federate` (hosts that coordinate through the issue:
//! announcements and taking other hosts' messages) and `clash` (their
//! proxy records and refused names); `status` and `status_post` (the
//! radar's verdict as a commit status on each pushed task branch).

pub mod github;
pub mod pr;

mod clash;
mod config;
mod federate;
mod format;
mod parse;
mod pull;
mod push;
mod review;
mod state;
mod status;
mod status_post;
mod verify;
mod watch;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;

pub use config::{CONFIG_DIR, CONFIG_FILE, Config, Federation, TargetConfig};
pub use format::{
    EntryHead, FORMAT_VERSION, HEADER_PREFIX, HEADER_SUFFIX, Head, HostHead, HostSandbox, MsgHead,
    NoticeHead, Section, body_withheld, entry_digest, render_entry,
};
pub use parse::{Rebuilt, parse_answers, parse_comment, reassemble};
pub use review::{ReviewState, review_state_path};
pub use state::{Pending, State, TargetState, load_state, lock, state_path, write_atomic};
pub use status::{CONTEXT as STATUS_CONTEXT, Verdicts};
pub use status_post::{Statuses, load_statuses, statuses_path};
pub use watch::watch_dir;

use crate::github::{Budget, Client, Comment, Target};
use base::error::{Error, Result};
use mailbox::layout::Root;
use mailbox::log::Entry;
use mailbox::message;
use mailbox::redact::Secrets;
use state::save_state;

/// Consecutive unknown outcomes before a run gives up (exit 75).
const MAX_UNKNOWN: u32 = 8;

/// One planned comment: its `(entry, part, parts)` items and its body.
type Planned = (Vec<(String, u32, u32)>, String);

/// What a run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Stats {
    pub entries: usize,
    pub comments: usize,
    pub reconciles: usize,
    pub unknown: usize,
    pub bad: usize,
    pub requests: u64,
    pub writes: u64,
    /// Commit statuses written (crates/sync/src/status_post.rs).
    pub statuses: usize,
    /// ... and refused by GitHub (422): exit 65.
    pub statuses_refused: usize,
    /// Reviews, review comments and pull-request comments delivered (review.rs).
    pub reviews: usize,
    /// Of those, items by people lw-sync does not trust: ignored.
    pub untrusted: usize,
}

/// One line of output per synced entry, notice or problem.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Event {
    Synced {
        entry: String,
        target: String,
        comment: u64,
        url: String,
    },
    Bad {
        entry: String,
        reason: String,
    },
    Unknown {
        target: String,
        reason: String,
    },
    /// A comment of lw-sync's own whose sections cannot be parsed (edited by hand?).
    Unreadable {
        target: String,
        comment: u64,
        reason: String,
    },
    /// A target that failed while others were synced.
    Failed {
        target: String,
        reason: String,
    },
    Answer {
        id: String,
        in_reply_to: String,
        to: String,
        comment: u64,
    },
    Rejected {
        comment: u64,
        target: String,
        reason: String,
    },
    /// A person's answer to message `id` on an issue hosts share, left to
    /// `host`: its sandbox asked, or (an id no host logged) it tells.
    LeftTo {
        id: String,
        comment: u64,
        host: String,
    },
    MissingOnGithub {
        entry: String,
        target: String,
    },
    MissingLocally {
        entry: String,
        target: String,
    },
    Differs {
        entry: String,
        target: String,
    },
    Incomplete {
        entry: String,
        target: String,
        reason: String,
    },
    Restored {
        entry: String,
    },
    /// An entry (or one of its parts) found in more than one comment.
    Duplicate {
        entry: String,
        target: String,
        comments: Vec<u64>,
    },
    /// A message of another host's sandbox (`from` is `HOST/SANDBOX`)
    /// delivered into the outbox of its proxy here.
    Federated {
        id: String,
        from: String,
        to: Vec<String>,
        comment: u64,
    },
    /// Another host's sandbox (`reader` is `HOST/SANDBOX`) read message
    /// `id` this host routed to it: its copy in the proxy's inbox was acked,
    /// for this host's mediator to log the receipt.
    Receipt {
        id: String,
        reader: String,
        comment: u64,
    },
    /// The radar's commit status written on a branch's head.
    Status {
        branch: String,
        repo: String,
        sha: String,
        state: String,
        description: String,
    },
    /// GitHub refused a branch's status (422: the commit is not there).
    StatusRefused {
        branch: String,
        sha: String,
        reason: String,
    },
    /// `verify`: a branch's head does not show the radar's status as
    /// wanted now (`found`: GitHub's newest of the context, or `none`).
    StatusDiffers {
        branch: String,
        sha: String,
        wanted: String,
        found: String,
    },
    /// A person's review, review comment or comment on a task's pull
    /// request (`item`: `review/ID`, `line/ID`, `comment/ID`), delivered
    /// as request `id` to sandbox `to` (review.rs).
    Review {
        id: String,
        to: String,
        target: String,
        item: String,
        outside_scope: bool,
    },
    /// An item on a task's pull request by a login lw-sync does not trust.
    Ignored {
        target: String,
        item: String,
        login: String,
    },
    /// A delivered item the log does not have and the human outbox does
    /// not hold (`lw-sync verify`).
    ReviewMissing {
        target: String,
        item: String,
        id: String,
    },
    /// A sandbox name another host announced, refused here.
    Refused {
        name: String,
        host: String,
        reason: String,
    },
}

pub struct Syncer {
    pub root: Root,
    pub cfg: Config,
    pub client: Client,
    pub state: State,
    pub state_path: PathBuf,
    state_existed: bool,
    pub stats: Stats,
    pub events: Vec<Event>,
    /// Secret values masked in everything posted (crates/mailbox/src/redact/).
    pub secrets: Secrets,
}

/// The login GitHub Actions' `GITHUB_TOKEN` posts as.
pub const ACTIONS_LOGIN: &str = "github-actions[bot]";

impl Syncer {
    pub fn new(root: Root, cfg: Config, client: Client) -> Result<Syncer> {
        let state_path = state_path(&root);
        let (state, state_existed) = load_state(&state_path)?;
        let mut client = client;
        client.budget = state.budget.clone();
        // A blocked window goes to disk before any wait (crates/sync/src/github/pace.rs).
        let path = state_path.clone();
        client.persist = Some(Box::new(move |b: &Budget| {
            let (mut st, _) = load_state(&path)?;
            st.budget = b.clone();
            save_state(&path, &st)
        }));
        Ok(Syncer {
            root,
            cfg,
            client,
            state,
            state_path,
            state_existed,
            stats: Stats::default(),
            events: vec![],
            secrets: Secrets::new(),
        })
    }

    /// Rereads the state: another process (cron beside a watcher) may have
    /// synced since.  Call it after taking the lock, before a pass.
    pub fn reload(&mut self) -> Result<()> {
        let (state, existed) = load_state(&self.state_path)?;
        self.client.budget = state.budget.clone();
        self.state = state;
        self.state_existed = existed;
        Ok(())
    }

    fn save(&mut self) -> Result<()> {
        self.state.budget = self.client.budget.clone();
        save_state(&self.state_path, &self.state)
    }

    fn ensure_login(&mut self) -> Result<()> {
        if !self.state.login_checked {
            self.state.login = self.client.user()?;
            self.state.login_checked = true;
            self.save()?;
        }
        Ok(())
    }

    /// The login whose comments are lw-sync's: the token's user, else the
    /// configured `login`, else the Actions bot when running under Actions.
    pub fn own_login(&self) -> Option<String> {
        self.state
            .login
            .clone()
            .or_else(|| self.cfg.login.clone())
            .or_else(|| {
                let f = self.cfg.federation().ok().flatten()?;
                Some(f.my_login().to_string())
            })
            .or_else(|| {
                (std::env::var("GITHUB_ACTIONS").as_deref() == Ok("true"))
                    .then(|| ACTIONS_LOGIN.to_string())
            })
    }

    /// The comment ids the state records as lw-sync's.
    fn recorded_ids(&self) -> BTreeSet<u64> {
        let mut ids = BTreeSet::new();
        for ts in self.state.targets.values() {
            ids.extend(ts.synced.values().flatten().copied());
            ids.extend(ts.partial.values().flat_map(|p| p.values().copied()));
        }
        ids
    }

    fn trusted(&self, c: &Comment, login: Option<&str>, ids: &BTreeSet<u64>) -> bool {
        match login {
            Some(l) => c.login() == l || self.cfg.trust.iter().any(|t| t == c.login()),
            None => ids.contains(&c.id),
        }
    }

    /// The error for a reconciliation without a login.
    fn no_login(&self) -> Error {
        Error::config(
            "GitHub refused to name the token's user (GET /user), so lw-sync cannot tell its own comments from anyone else's; \
             set \"login\" in .loopwright/sync.json to the account the token posts as \
             (\"github-actions[bot]\" for GitHub Actions' GITHUB_TOKEN, \"APP-SLUG[bot]\" for a GitHub App)",
        )
    }

    /// The entry as lw-sync mirrors it: a held or dropped message without
    /// its body, and every known secret value masked.
    fn outgoing(&self, e: &Entry) -> Entry {
        let mut e = e.clone();
        let withheld = body_withheld(&e);
        self.secrets.mask_in(&mut e.decision.reason);
        if let Some(m) = &mut e.message {
            if withheld {
                m.body.clear();
            }
            for (t, max) in [
                (&mut m.subject, message::MAX_SUBJECT),
                (&mut m.body, message::MAX_BODY),
            ] {
                self.secrets.mask_in(t);
                while t.len() > max {
                    t.pop();
                }
            }
            for r in &mut m.refs {
                self.secrets.mask_in(r);
                while r.len() > message::MAX_REF {
                    r.pop();
                }
            }
        }
        e
    }

    /// lw-sync's own sections among `comments`, with their comment ids.
    fn own_sections(&mut self, t: &Target, comments: &[Comment]) -> Vec<(u64, Section)> {
        let login = self.own_login();
        let ids = if login.is_none() {
            self.recorded_ids()
        } else {
            BTreeSet::new()
        };
        let mut out = Vec::new();
        for c in comments {
            if !self.trusted(c, login.as_deref(), &ids) {
                continue;
            }
            match parse_comment(c.text()) {
                None => {}
                Some(Ok(ss)) => out.extend(ss.into_iter().map(|s| (c.id, s))),
                Some(Err(e)) => self.events.push(Event::Unreadable {
                    target: t.to_string(),
                    comment: c.id,
                    reason: e,
                }),
            }
        }
        out
    }

    pub fn finish_stats(&mut self) -> Stats {
        self.stats.requests = self.client.requests;
        self.stats.writes = self.client.writes;
        self.stats.clone()
    }
}
