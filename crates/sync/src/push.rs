//! Posting: reconciliation with what is already on the issue, the plan of
//! comments for what is not, and posting each with its intent written first.

use std::collections::{BTreeMap, BTreeSet};

use super::format::{SEPARATOR, render_entry};
use super::state::{complete_partials, mark_part, save_state};
use super::{Event, MAX_UNKNOWN, Planned, Syncer};
use super::{Head, Pending};
use crate::github::{Budget, Comment, MAX_COMMENT_CHARS, Posted, Target};
use base::error::{Error, Exit, Result};
use mailbox::log::{Entry, Log};

/// What one target's posting has learned so far in this pass.
#[derive(Default)]
struct Round {
    /// Unknown outcomes since the last comment that was created.
    unknown_in_row: u32,
    /// Entries that cannot be posted (not renderable, or refused alone).
    unrenderable: BTreeSet<String>,
    /// Entries of a refused batch, posted one per comment from now on.
    solo: BTreeSet<String>,
}

impl Syncer {
    /// Lists every comment of `t` and records what is already there.
    pub(super) fn reconcile(&mut self, t: &Target) -> Result<()> {
        self.reconcile_listing(t).map(|_| ())
    }

    /// [`Syncer::reconcile`], returning the listing.
    pub(super) fn reconcile_listing(&mut self, t: &Target) -> Result<Vec<Comment>> {
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
            let now = self.client.clock.now_ms();
            if settle > now {
                self.client
                    .clock
                    .sleep(std::time::Duration::from_millis(settle - now));
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
                Head::Host(h) => {
                    // The newest announcement is the one kept current.
                    let v = ts
                        .synced
                        .entry(super::federate::host_key(&h.host))
                        .or_default();
                    if v.first().is_none_or(|&c| c < *cid) {
                        *v = vec![*cid];
                    }
                }
            }
        }
        complete_partials(ts, &sections);
        ts.pending = None;
        ts.reconciled = true;
        self.save()?;
        Ok(comments)
    }

    /// One pass over the log: everything not yet on GitHub is posted, then
    /// the radar's verdicts go on the task branches' heads as statuses.
    pub fn sync(&mut self) -> Result<()> {
        let log = Log::new(self.root.log_dir());
        let (entries, bad) = log.entries()?;
        // After the read: every entry read is older than the pull requests learned.
        self.cfg.learn_pulls(&self.root.state_dir())?;
        let verdicts = super::Verdicts::from_log(&entries);
        let posted = self.sync_comments(entries, bad);
        let statuses = self.sync_statuses(&verdicts);
        posted.and(statuses)
    }

    fn sync_comments(
        &mut self,
        entries: Vec<Entry>,
        bad: Vec<mailbox::log::BadEntry>,
    ) -> Result<()> {
        self.announce()?;
        // A proxy's messages are its own host's to mirror (crates/sync/src/federate.rs).
        let proxies = self.proxy_names()?;
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
            if e.decision.quiet || super::federate::foreign(&e, &proxies) {
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
            by_target.entry(self.target_of(&e)?).or_default().push(e);
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
        let mut round = Round::default();
        loop {
            let Some(plan) = self.next_plan(t, &key, entries, &mut round)? else {
                return Ok(());
            };
            if !self.post_plan(t, &key, plan, &mut round)? {
                // Entries that arrived meanwhile are picked up by the next pass.
                return Ok(());
            }
        }
    }

    /// Reconciles when the state cannot be trusted, then plans the comments
    /// for what `t` still lacks; None when nothing is left to post.
    fn next_plan(
        &mut self,
        t: &Target,
        key: &str,
        entries: &[Entry],
        round: &mut Round,
    ) -> Result<Option<Vec<Planned>>> {
        let ts = self.state.targets.entry(key.to_string()).or_default();
        if !ts.reconciled || ts.pending.is_some() || !self.state_existed && ts.synced.is_empty() {
            self.reconcile(t)?;
            self.state_existed = true;
        }
        let ts = self
            .state
            .targets
            .get(key)
            .expect("reconcile made the target state");
        let mut todo: Vec<&Entry> = entries
            .iter()
            .filter(|e| !ts.synced.contains_key(&e.name) && !round.unrenderable.contains(&e.name))
            .collect();
        // What a person must answer goes first, ahead of any backlog;
        // held headers last, in comments of their own (see `plan`).
        todo.sort_by_key(|e| {
            (
                e.decision.action != mailbox::log::Action::Escalate,
                e.decision.action == mailbox::log::Action::Hold,
            )
        });
        if todo.is_empty() {
            return Ok(None);
        }
        let plan = self.plan(&todo, &mut round.unrenderable, &round.solo)?;
        Ok((!plan.is_empty()).then_some(plan))
    }

    /// Posts the planned comments in order.  True when the plan was
    /// interrupted (an unknown outcome, a refused batch) and must be made
    /// again after a reconciliation.
    fn post_plan(
        &mut self,
        t: &Target,
        key: &str,
        plan: Vec<Planned>,
        round: &mut Round,
    ) -> Result<bool> {
        for (items, body) in plan {
            let intent = items.iter().map(|(n, p, _)| (n.clone(), *p)).collect();
            match self.post_with_intent(t, key, intent, &body) {
                Ok(Posted::Created(c)) => {
                    round.unknown_in_row = 0;
                    self.record_created(key, &items, &c)?;
                }
                Ok(Posted::Unknown(reason)) => {
                    self.stats.unknown += 1;
                    round.unknown_in_row += 1;
                    self.events.push(Event::Unknown {
                        target: key.to_string(),
                        reason: reason.clone(),
                    });
                    self.save()?;
                    if round.unknown_in_row >= MAX_UNKNOWN {
                        return Err(Error::new(
                            Exit::TempFail,
                            format!(
                                "{} comments in a row on {t} had an unknown outcome (last: {reason}); try again later",
                                round.unknown_in_row
                            ),
                        ));
                    }
                    return Ok(true);
                }
                Err(e) => {
                    if self.refused(key, &items, e, round)? {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    /// Posts `body` on `t`; the intent (`items` as `pending`) and the
    /// budget are written to the state just before the request is sent.
    pub(super) fn post_with_intent(
        &mut self,
        t: &Target,
        key: &str,
        items: Vec<(String, u32)>,
        body: &str,
    ) -> Result<Posted> {
        let path = self.state_path.clone();
        let state = &mut self.state;
        let mut before = |b: &Budget| -> Result<()> {
            state.budget = b.clone();
            state.targets.entry(key.to_string()).or_default().pending = Some(Pending {
                items: items.clone(),
                at_ms: base::time::now_ms(),
            });
            save_state(&path, state)
        };
        self.client.post_comment(t, body, &mut before)
    }

    /// Records the parts comment `c` carries as synced and clears the intent.
    fn record_created(
        &mut self,
        key: &str,
        items: &[(String, u32, u32)],
        c: &Comment,
    ) -> Result<()> {
        self.stats.comments += 1;
        let ts = self
            .state
            .targets
            .get_mut(key)
            .expect("target state exists");
        for (name, part, n) in items {
            mark_part(ts, name, *part, *n, c.id);
            if ts.synced.contains_key(name) {
                self.stats.entries += 1;
                self.events.push(Event::Synced {
                    entry: name.clone(),
                    target: key.to_string(),
                    comment: c.id,
                    url: c.html_url.clone(),
                });
            }
        }
        ts.pending = None;
        self.save()
    }

    /// A definite failure: nothing was created.  A refused batch (422) is
    /// posted again entry by entry (true: plan again); a refused lone entry
    /// is reported and retried by the next run; anything else is the error.
    fn refused(
        &mut self,
        key: &str,
        items: &[(String, u32, u32)],
        e: Error,
        round: &mut Round,
    ) -> Result<bool> {
        if let Some(ts) = self.state.targets.get_mut(key) {
            ts.pending = None;
        }
        self.save()?;
        if e.exit != Exit::DataErr {
            return Err(e);
        }
        if items.len() > 1 {
            round.solo.extend(items.iter().map(|(n, _, _)| n.clone()));
            return Ok(true);
        }
        for (name, _, _) in items {
            self.stats.bad += 1;
            self.events.push(Event::Bad {
                entry: name.clone(),
                reason: e.to_string(),
            });
            round.unrenderable.insert(name.clone());
        }
        Ok(false)
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
            let held = e.decision.action == mailbox::log::Action::Hold;
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
        Ok(self.target_of(e)?.to_string())
    }

    /// Where entry `e` goes: where a run already mirrored it (or began
    /// to), so a mapping that changed since - a pull request learned after
    /// the entry went to the run's issue - takes only later entries and
    /// nothing is posted twice; else where the config sends it.
    pub(super) fn target_of(&self, e: &Entry) -> Result<Target> {
        for (key, ts) in &self.state.targets {
            let held = ts.synced.contains_key(&e.name)
                || ts.partial.contains_key(&e.name)
                || ts
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.items.iter().any(|(n, _)| *n == e.name));
            if held
                && let Some((repo, n)) = key.rsplit_once('#')
                && let Ok(issue) = n.parse()
            {
                return Ok(Target {
                    repo: repo.to_string(),
                    issue,
                });
            }
        }
        self.cfg.target_for(e)
    }
}
