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

mod config;
mod format;
mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use config::{CONFIG_DIR, CONFIG_FILE, Config, TargetConfig};
pub use format::{
    EntryHead, FORMAT_VERSION, HEADER_PREFIX, HEADER_SUFFIX, Head, MsgHead, NoticeHead, Rebuilt,
    Section, body_withheld, entry_digest, parse_answers, parse_comment, reassemble, render_entry,
    sha256_hex,
};
pub use state::{Pending, State, TargetState, load_state, lock, state_path, write_atomic};

use crate::error::{Error, Exit, Result};
use crate::github::{Budget, Client, Comment, MAX_COMMENT_CHARS, Posted, Target};
use crate::layout::Root;
use crate::log::{Entry, Log};
use crate::message::{self, Kind, Message};
use crate::redact::Secrets;
use format::{SEPARATOR, header_line, inline};
use state::{complete_partials, mark_part, save_state};

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
    /// Secret values masked in everything posted (lib/redact.rs).
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
        // A blocked window goes to disk before any wait (lib/github.rs).
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

    /// Lists every comment of `t` and records what is already there.
    fn reconcile(&mut self, t: &Target) -> Result<()> {
        self.reconcile_listing(t).map(|_| ())
    }

    /// [`Syncer::reconcile`], returning the listing.
    fn reconcile_listing(&mut self, t: &Target) -> Result<Vec<Comment>> {
        if self.own_login().is_none() {
            return Err(self.no_login());
        }
        // After an unknown outcome, give GitHub a moment (two write intervals)
        // so that a comment it created just before the connection dropped is
        // in the list.
        if let Some(p) = self
            .state
            .targets
            .get(&t.to_string())
            .and_then(|ts| ts.pending.as_ref())
        {
            let settle = p.at_ms + 2 * self.client.limits.min_write_interval.as_millis() as u64;
            let now = crate::time::now_ms();
            if settle > now {
                std::thread::sleep(std::time::Duration::from_millis(settle - now));
            }
        }
        let comments = self.client.list_comments(t, None)?;
        self.stats.reconciles += 1;
        let sections = self.own_sections(t, &comments);
        let key = t.to_string();
        let ts = self.state.targets.entry(key).or_default();
        for (cid, s) in &sections {
            match &s.head {
                Head::Entry(h) => {
                    if h.part[1] <= 1 {
                        ts.synced
                            .entry(h.entry.clone())
                            .or_insert_with(|| vec![*cid]);
                    } else {
                        ts.partial
                            .entry(h.entry.clone())
                            .or_default()
                            .entry(h.part[0])
                            .or_insert(*cid);
                    }
                }
                Head::Notice(n) => {
                    ts.synced.entry(n.key.clone()).or_insert_with(|| vec![*cid]);
                }
            }
        }
        complete_partials(ts, &sections);
        ts.pending = None;
        ts.reconciled = true;
        self.save()?;
        Ok(comments)
    }

    /// One pass over the log: everything not yet on GitHub is posted.
    pub fn sync(&mut self) -> Result<()> {
        let log = Log::new(self.root.log_dir());
        let (entries, bad) = log.entries()?;
        for b in bad {
            self.stats.bad += 1;
            self.events.push(Event::Bad {
                entry: b.name,
                reason: b.reason,
            });
        }
        let mut by_target: BTreeMap<Target, Vec<Entry>> = BTreeMap::new();
        for e in entries {
            // Refusals over the held-queue cap are not mirrored one by one:
            // one status message to a person stands for them.
            if e.decision.quiet {
                continue;
            }
            let e = self.outgoing(&e);
            if let Some(m) = &e.message
                && let Err(why) = m.validate()
            {
                self.stats.bad += 1;
                self.events.push(Event::Bad {
                    entry: e.name.clone(),
                    reason: format!("message: {why}"),
                });
                continue;
            }
            by_target
                .entry(self.cfg.target_for(&e)?)
                .or_default()
                .push(e);
        }
        if by_target.is_empty() {
            return Ok(());
        }
        // Nothing new anywhere and nothing in flight: no request at all.
        let idle = by_target.iter().all(|(t, es)| {
            self.state.targets.get(&t.to_string()).is_some_and(|ts| {
                ts.reconciled
                    && ts.pending.is_none()
                    && es.iter().all(|e| ts.synced.contains_key(&e.name))
            })
        });
        if idle {
            return Ok(());
        }
        self.ensure_login()?;
        let mut first_err = None;
        for (t, es) in by_target {
            match self.sync_target(&t, &es) {
                Ok(()) => {}
                Err(e) if matches!(e.exit, Exit::Config | Exit::DataErr) => {
                    // This target is wrong; the others may be fine.  The
                    // first failure is the run's error, the rest are events.
                    if first_err.is_some() {
                        self.events.push(Event::Failed {
                            target: t.to_string(),
                            reason: e.to_string(),
                        });
                    } else {
                        first_err = Some(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn sync_target(&mut self, t: &Target, entries: &[Entry]) -> Result<()> {
        let key = t.to_string();
        let mut unknown_in_row = 0;
        let mut unrenderable: BTreeSet<String> = BTreeSet::new();
        let mut solo: BTreeSet<String> = BTreeSet::new();
        loop {
            let ts = self.state.targets.entry(key.clone()).or_default();
            if !ts.reconciled || ts.pending.is_some() || !self.state_existed && ts.synced.is_empty()
            {
                self.reconcile(t)?;
                self.state_existed = true;
            }
            let ts = self
                .state
                .targets
                .get(&key)
                .expect("reconcile made the target state");
            let mut todo: Vec<&Entry> = entries
                .iter()
                .filter(|e| !ts.synced.contains_key(&e.name) && !unrenderable.contains(&e.name))
                .collect();
            // What a person must answer goes first, ahead of any backlog;
            // held headers last, in comments of their own (see `plan`).
            todo.sort_by_key(|e| {
                (
                    e.decision.action != crate::log::Action::Escalate,
                    e.decision.action == crate::log::Action::Hold,
                )
            });
            if todo.is_empty() {
                return Ok(());
            }
            let plan = self.plan(&todo, &mut unrenderable, &solo)?;
            if plan.is_empty() {
                return Ok(());
            }
            let mut interrupted = false;
            for (items, body) in plan {
                let path = self.state_path.clone();
                let state = &mut self.state;
                let key2 = key.clone();
                let items2: Vec<(String, u32)> =
                    items.iter().map(|(n, p, _)| (n.clone(), *p)).collect();
                let mut before = |b: &Budget| -> Result<()> {
                    state.budget = b.clone();
                    let ts = state
                        .targets
                        .get_mut(&key2)
                        .expect("target state exists while posting");
                    ts.pending = Some(Pending {
                        items: items2.clone(),
                        at_ms: crate::time::now_ms(),
                    });
                    save_state(&path, state)
                };
                let res = self.client.post_comment(t, &body, &mut before);
                match res {
                    Ok(Posted::Created(c)) => {
                        unknown_in_row = 0;
                        self.stats.comments += 1;
                        let ts = self
                            .state
                            .targets
                            .get_mut(&key)
                            .expect("target state exists");
                        for (name, part, n) in &items {
                            mark_part(ts, name, *part, *n, c.id);
                            if ts.synced.contains_key(name) {
                                self.stats.entries += 1;
                                self.events.push(Event::Synced {
                                    entry: name.clone(),
                                    target: key.clone(),
                                    comment: c.id,
                                    url: c.html_url.clone(),
                                });
                            }
                        }
                        ts.pending = None;
                        self.save()?;
                    }
                    Ok(Posted::Unknown(reason)) => {
                        self.stats.unknown += 1;
                        unknown_in_row += 1;
                        self.events.push(Event::Unknown {
                            target: key.clone(),
                            reason: reason.clone(),
                        });
                        self.save()?;
                        if unknown_in_row >= MAX_UNKNOWN {
                            return Err(Error::new(
                                Exit::TempFail,
                                format!(
                                    "{unknown_in_row} comments in a row on {t} had an unknown outcome (last: {reason}); try again later"
                                ),
                            ));
                        }
                        interrupted = true;
                        break;
                    }
                    Err(e) => {
                        // A definite failure: nothing was created.
                        if let Some(ts) = self.state.targets.get_mut(&key) {
                            ts.pending = None;
                        }
                        self.save()?;
                        if e.exit != Exit::DataErr {
                            return Err(e);
                        }
                        // GitHub refused this comment's content (422): post a
                        // batch's entries one by one to find the culprit; a
                        // lone entry is reported and retried by the next run.
                        if items.len() > 1 {
                            solo.extend(items.iter().map(|(n, _, _)| n.clone()));
                            interrupted = true;
                            break;
                        }
                        for (name, _, _) in &items {
                            self.stats.bad += 1;
                            self.events.push(Event::Bad {
                                entry: name.clone(),
                                reason: e.to_string(),
                            });
                            unrenderable.insert(name.clone());
                        }
                    }
                }
            }
            if !interrupted {
                // Entries that arrived meanwhile are picked up by the next pass.
                return Ok(());
            }
        }
    }

    /// Groups pending entries into comments: a backlog is batched (up to
    /// `batch` entries and the character limit per comment); an entry too
    /// large for one comment is split into parts, one comment each.
    fn plan(
        &mut self,
        todo: &[&Entry],
        unrenderable: &mut BTreeSet<String>,
        solo: &BTreeSet<String>,
    ) -> Result<Vec<Planned>> {
        let mut plan: Vec<Planned> = Vec::new();
        let mut cur: Planned = (vec![], String::new());
        let mut cur_held = false;
        let batch = self.cfg.batch();
        let ts = self
            .state
            .targets
            .get(&self.key_of(todo[0])?)
            .cloned()
            .unwrap_or_default();
        for e in todo {
            let parts = match render_entry(e, &self.cfg.mention, MAX_COMMENT_CHARS) {
                Ok(p) => p,
                Err(err) => {
                    self.stats.bad += 1;
                    self.events.push(Event::Bad {
                        entry: e.name.clone(),
                        reason: err.msg,
                    });
                    unrenderable.insert(e.name.clone());
                    continue;
                }
            };
            if parts.len() > 1 {
                let have = ts.partial.get(&e.name).cloned().unwrap_or_default();
                let n = parts.len() as u32;
                for (i, p) in parts.into_iter().enumerate() {
                    let part = i as u32 + 1;
                    if !have.contains_key(&part) {
                        plan.push((vec![(e.name.clone(), part, n)], p));
                    }
                }
                continue;
            }
            let s = parts
                .into_iter()
                .next()
                .expect("render_entry gives at least one part");
            let joined = cur.1.chars().count() + SEPARATOR.len() + s.chars().count();
            // Held headers share comments only with each other, so that a
            // burst of them makes as few comments as the batch size allows.
            let held = e.decision.action == crate::log::Action::Hold;
            let alone = solo.contains(&e.name)
                || cur.0.first().is_some_and(|(n, _, _)| solo.contains(n))
                || cur_held != held;
            cur_held = held;
            if !cur.0.is_empty() && (alone || cur.0.len() >= batch || joined > MAX_COMMENT_CHARS) {
                plan.push(std::mem::take(&mut cur));
            }
            if !cur.0.is_empty() {
                cur.1.push_str(SEPARATOR);
            }
            cur.1.push_str(&s);
            cur.0.push((e.name.clone(), 1, 1));
        }
        if !cur.0.is_empty() {
            plan.push(cur);
        }
        Ok(plan)
    }

    fn key_of(&self, e: &Entry) -> Result<String> {
        Ok(self.cfg.target_for(e)?.to_string())
    }

    /// The way back: `/lw answer ID` lines in people's comments become
    /// answers in `ROOT/human-outbox`.
    pub fn pull(&mut self) -> Result<()> {
        self.ensure_login()?;
        let log = Log::new(self.root.log_dir());
        let (entries, _) = log.entries()?;
        let mut known: HashMap<String, (String, String)> = HashMap::new();
        for e in &entries {
            if let Some(m) = &e.message {
                known
                    .entry(e.message_id.clone())
                    .or_insert((e.sender.clone(), m.subject.clone()));
            }
        }
        for t in self.cfg.targets()? {
            self.pull_target(&t, &known)?;
        }
        Ok(())
    }

    fn pull_target(&mut self, t: &Target, known: &HashMap<String, (String, String)>) -> Result<()> {
        let key = t.to_string();
        let ts = self.state.targets.entry(key.clone()).or_default().clone();
        let mut listed = None;
        if ts.pending.is_some() || !ts.reconciled {
            // Notices already on the issue must be known before any is posted.
            listed = Some(self.reconcile_listing(t)?);
        }
        let ts = self.state.targets[&key].clone();
        let comments = match listed {
            Some(all) if ts.pull_since.is_none() => all,
            _ => {
                // A minute of overlap: a comment GitHub indexes late, with an
                // older updated_at, is still seen.  Handled ones are skipped.
                let since = ts
                    .pull_since
                    .as_deref()
                    .and_then(crate::time::parse_rfc3339)
                    .map(|d| {
                        let t = crate::time::rfc3339(
                            d.saturating_sub(std::time::Duration::from_secs(60)),
                        );
                        format!("{}Z", &t[..19])
                    });
                self.client.list_comments(t, since.as_deref())?
            }
        };
        let mut known = known.clone();
        for (_, s) in self.own_sections(t, &comments) {
            if let Head::Entry(h) = s.head
                && let Some(m) = h.msg
            {
                known
                    .entry(h.id.clone())
                    .or_insert((h.sender.clone(), m.subject.clone()));
            }
        }
        let mut newest = ts.pull_since.clone();
        let login = self.own_login();
        let ids = self.recorded_ids();
        for c in &comments {
            if newest.as_deref().is_none_or(|n| c.updated_at.as_str() > n) {
                newest = Some(c.updated_at.clone());
            }
            if ts.answered.contains(&c.id)
                || (self.trusted(c, login.as_deref(), &ids) && parse_comment(c.text()).is_some())
            {
                continue;
            }
            let cmds = parse_answers(c.text());
            if cmds.is_empty() {
                continue;
            }
            let allowed = if self.cfg.answerers.is_empty() {
                matches!(
                    c.author_association.as_str(),
                    "OWNER" | "MEMBER" | "COLLABORATOR"
                )
            } else {
                self.cfg.answerers.iter().any(|a| a == c.login())
            };
            for (k, (id, text)) in cmds.iter().enumerate() {
                let problem = if !allowed {
                    Some(format!(
                        "@{} may not answer for this repository (configure \"answerers\")",
                        c.login()
                    ))
                } else if let Some((asker, subject)) = known.get(id) {
                    if text.trim().is_empty() {
                        Some(format!(
                            "the answer to {id} is empty: write it on the lines after `/lw answer {id}`"
                        ))
                    } else {
                        match self.deliver_answer(t, c, k, id, asker, subject, text) {
                            Ok(()) => None,
                            Err(e) if e.exit == Exit::DataErr => Some(e.msg),
                            Err(e) => return Err(e),
                        }
                    }
                } else {
                    Some(format!(
                        "no message with id {id} is known to lw-sync; check the id in `/lw answer`"
                    ))
                };
                if let Some(p) = problem {
                    self.events.push(Event::Rejected {
                        comment: c.id,
                        target: key.clone(),
                        reason: p.clone(),
                    });
                    self.notice(t, c, k, &p)?;
                }
            }
            self.state
                .targets
                .get_mut(&key)
                .expect("target state exists")
                .answered
                .insert(c.id);
            self.save()?;
        }
        self.state
            .targets
            .get_mut(&key)
            .expect("target state exists")
            .pull_since = newest;
        self.save()
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver_answer(
        &mut self,
        t: &Target,
        c: &Comment,
        k: usize,
        id: &str,
        asker: &str,
        subject: &str,
        text: &str,
    ) -> Result<()> {
        let created = crate::time::parse_rfc3339(&c.created_at).unwrap_or_else(crate::time::now);
        let seed = sha256_hex(format!("{}#{}/{}/{k}", t.repo, t.issue, c.id).as_bytes());
        let rand = u128::from_str_radix(&seed[..32], 16).expect("a SHA-256 hex digest is hex");
        let mut subj = format!("Re: {subject}");
        while subj.len() > message::MAX_SUBJECT {
            subj.pop();
        }
        let m = Message {
            version: message::VERSION,
            id: crate::id::id_at(created, rand),
            from: crate::layout::HUMAN.into(),
            to: vec![asker.to_string()],
            kind: Kind::Answer,
            subject: subj,
            body: text.to_string(),
            refs: if c.html_url.is_empty() || c.html_url.len() > message::MAX_REF {
                vec![]
            } else {
                vec![c.html_url.clone()]
            },
            in_reply_to: Some(id.to_string()),
            created: crate::time::rfc3339(created),
        };
        m.validate().map_err(|e| {
            Error::data(format!(
                "the answer in comment {} is not a valid message: {e}",
                c.id
            ))
        })?;
        self.root
            .human_outbox()
            .deliver_once(&m.id, &m.to_bytes())?;
        self.events.push(Event::Answer {
            id: m.id.clone(),
            in_reply_to: id.into(),
            to: asker.into(),
            comment: c.id,
        });
        Ok(())
    }

    /// Tells the person on the issue why their answer was not delivered;
    /// once per (comment, answer), with the same intent/reconcile protocol.
    fn notice(&mut self, t: &Target, c: &Comment, k: usize, problem: &str) -> Result<()> {
        let key = t.to_string();
        let nkey = format!("notice/{}/{k}", c.id);
        if self
            .state
            .targets
            .get(&key)
            .is_some_and(|ts| ts.synced.contains_key(&nkey))
        {
            return Ok(());
        }
        let head = Head::Notice(NoticeHead {
            v: FORMAT_VERSION,
            key: nkey.clone(),
            about: c.id,
        });
        let body = format!(
            "{}\n**lw-sync** did not deliver the answer in comment {} ({}): {}\n",
            header_line(&head),
            c.id,
            inline(&format!("@{}", c.login())).replace('@', "@\u{200b}"),
            inline(problem)
        );
        for _ in 0..MAX_UNKNOWN {
            let path = self.state_path.clone();
            let state = &mut self.state;
            let items = vec![(nkey.clone(), 1)];
            let key2 = key.clone();
            let mut before = |b: &Budget| -> Result<()> {
                state.budget = b.clone();
                state.targets.entry(key2.clone()).or_default().pending = Some(Pending {
                    items: items.clone(),
                    at_ms: crate::time::now_ms(),
                });
                save_state(&path, state)
            };
            match self.client.post_comment(t, &body, &mut before)? {
                Posted::Created(nc) => {
                    let ts = self
                        .state
                        .targets
                        .get_mut(&key)
                        .expect("target state exists");
                    ts.synced.insert(nkey, vec![nc.id]);
                    ts.pending = None;
                    return self.save();
                }
                Posted::Unknown(reason) => {
                    self.events.push(Event::Unknown {
                        target: key.clone(),
                        reason,
                    });
                    self.reconcile(t)?;
                    if self
                        .state
                        .targets
                        .get(&key)
                        .is_some_and(|ts| ts.synced.contains_key(&nkey))
                    {
                        return Ok(());
                    }
                }
            }
        }
        Err(Error::new(
            Exit::TempFail,
            format!(
                "the notice about comment {} on {t} could not be posted; try again later",
                c.id
            ),
        ))
    }

    /// Compares the log with GitHub both ways; with `restore`, appends the
    /// entries found only on GitHub to the log.  True when both agree.
    pub fn verify(&mut self, restore: bool) -> Result<bool> {
        self.ensure_login()?;
        let log = Log::new(self.root.log_dir());
        let (entries, bad) = log.entries()?;
        for b in bad {
            self.events.push(Event::Bad {
                entry: b.name,
                reason: b.reason,
            });
        }
        let mut local: BTreeMap<Target, BTreeMap<String, Entry>> = BTreeMap::new();
        // Comments of format version 1 carried held bodies and unmasked
        // text: such an entry agrees with the log as it is, not as mirrored now.
        let raw: HashMap<String, Entry> = entries
            .iter()
            .map(|e| (e.name.clone(), e.clone()))
            .collect();
        for e in entries.iter().filter(|e| !e.decision.quiet) {
            let e = self.outgoing(e);
            local
                .entry(self.cfg.target_for(&e)?)
                .or_default()
                .insert(e.name.clone(), e);
        }
        let mut targets: BTreeSet<Target> = self.cfg.targets()?.into_iter().collect();
        targets.extend(local.keys().cloned());
        let mut same = true;
        for t in targets {
            let comments = self.client.list_comments(&t, None)?;
            let sections = self.own_sections(&t, &comments);
            let (remote, broken) = reassemble(&sections);
            let mine = local.remove(&t).unwrap_or_default();
            let key = t.to_string();
            for (name, comments) in duplicates(&sections) {
                same = false;
                self.events.push(Event::Duplicate {
                    entry: name,
                    target: key.clone(),
                    comments,
                });
            }
            for (name, e) in &mine {
                match remote.get(name) {
                    None if broken.contains_key(name) => {
                        same = false;
                        self.events.push(Event::Incomplete {
                            entry: name.clone(),
                            target: key.clone(),
                            reason: broken[name].clone(),
                        });
                    }
                    None => {
                        same = false;
                        self.events.push(Event::MissingOnGithub {
                            entry: name.clone(),
                            target: key.clone(),
                        });
                    }
                    Some((r, _)) if r != e && raw.get(name) != Some(r) => {
                        same = false;
                        self.events.push(Event::Differs {
                            entry: name.clone(),
                            target: key.clone(),
                        });
                    }
                    Some(_) => {}
                }
            }
            for (name, (e, _)) in &remote {
                if !mine.contains_key(name) {
                    same = false;
                    self.events.push(Event::MissingLocally {
                        entry: name.clone(),
                        target: key.clone(),
                    });
                    if restore {
                        match restorable(e) {
                            Ok(()) => {
                                log.append(e)?;
                                self.events.push(Event::Restored {
                                    entry: name.clone(),
                                });
                            }
                            Err(why) => self.events.push(Event::Incomplete {
                                entry: name.clone(),
                                target: key.clone(),
                                reason: why,
                            }),
                        }
                    }
                }
            }
            for (name, why) in &broken {
                if !mine.contains_key(name) {
                    same = false;
                    self.events.push(Event::Incomplete {
                        entry: name.clone(),
                        target: key.clone(),
                        reason: why.clone(),
                    });
                }
            }
        }
        Ok(same)
    }

    pub fn finish_stats(&mut self) -> Stats {
        self.stats.requests = self.client.requests;
        self.stats.writes = self.client.writes;
        self.stats.clone()
    }
}

/// Runs `pass` now, then again whenever something is renamed into or
/// created in `dir` (debounced), on a rescan request, and every `period`.
/// Returns when `pass` fails with an error it cannot wait out.
pub fn watch_dir(
    dir: &Path,
    period: std::time::Duration,
    mut pass: impl FnMut() -> Result<()>,
) -> Result<()> {
    use crate::fs::{Watcher, Woke};
    let watcher = Watcher::new().map_err(|e| {
        Error::new(
            Exit::Unavailable,
            format!("cannot start a file watcher on '{}'", dir.display()),
        )
        .with_source(e)
    })?;
    watcher.add(dir).map_err(|e| {
        Error::new(Exit::NoInput, format!("cannot watch '{}'", dir.display())).with_source(e)
    })?;
    loop {
        match pass() {
            Ok(()) => {}
            // Waiting is what a watcher does; the next pass retries.
            Err(e) if matches!(e.exit, Exit::TempFail | Exit::Unavailable) => {
                eprintln!("lw-sync: {e}")
            }
            Err(e) => return Err(e),
        }
        // A burst of arrivals wakes one pass (debounced by 200 ms).
        match watcher.wait_settled(Some(period), std::time::Duration::from_millis(200)) {
            Ok(Woke::Timeout | Woke::Changed | Woke::Overflow) => {}
            Ok(Woke::Gone(p)) => {
                return Err(Error::new(
                    Exit::NoInput,
                    format!("the watched directory '{}' was removed", p.display()),
                ));
            }
            Err(e) => {
                return Err(Error::new(
                    Exit::Software,
                    format!("the watcher on '{}' stopped", dir.display()),
                )
                .with_source(e));
            }
        }
    }
}

/// Entries whose sections (the same part) appear in more than one comment.
fn duplicates(sections: &[(u64, Section)]) -> Vec<(String, Vec<u64>)> {
    let mut seen: BTreeMap<(String, u32), Vec<u64>> = BTreeMap::new();
    for (cid, s) in sections {
        if let Head::Entry(h) = &s.head {
            seen.entry((h.entry.clone(), h.part[0]))
                .or_default()
                .push(*cid);
        }
    }
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for ((name, _), ids) in seen {
        if ids.len() > 1 {
            out.entry(name).or_default().extend(ids);
        }
    }
    out.into_iter().collect()
}

/// Whether an entry rebuilt from GitHub may be written into the log: its
/// name must be `MSGID.ACTION[.PARTY]` (it becomes a file name) and its
/// message must validate.
fn restorable(e: &Entry) -> std::result::Result<(), String> {
    if !crate::id::is_valid(&e.message_id) {
        return Err(format!(
            "message id '{}' does not follow the id grammar",
            e.message_id.escape_debug()
        ));
    }
    let base = Entry::name_for(&e.message_id, e.decision.action, None);
    let ok = e.name == base
        || e.name
            .strip_prefix(&format!("{base}."))
            .is_some_and(crate::layout::valid_name);
    if !ok {
        return Err(format!(
            "entry name '{}' is not MSGID.ACTION[.PARTY]; not restored",
            e.name.escape_debug()
        ));
    }
    if let Some(m) = &e.message {
        m.validate()
            .map_err(|why| format!("message: {why}; not restored"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Action;

    use super::format::tests::entry;

    #[test]
    fn only_well_named_entries_are_restored() {
        let mut e = entry("x", Action::Forward);
        assert!(restorable(&e).is_ok());
        e.name = format!("{}.forward.web", e.message_id);
        assert!(restorable(&e).is_ok());
        for bad in [
            "../../etc/x".to_string(),
            format!("{}.forward/../x", e.message_id),
            format!("{}.hold", e.message_id),
        ] {
            e.name = bad.clone();
            assert!(restorable(&e).is_err(), "{bad}");
        }
    }
}
