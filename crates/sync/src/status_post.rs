//! Writing the radar's commit statuses (crates/sync/src/status.rs says what and
//! why lw-sync): once per change, paced, settled after an unknown outcome.
//!
//! For each sandbox the radar named and whose branch was pushed
//! (`ROOT/state/pushed/NAME.json`, crates/sync/src/pr/pushed.rs), the wanted status is
//! (head commit, state, description).  `ROOT/state/statuses.json` keeps,
//! per sandbox, what was last `written` and any `pending` write, replaced
//! whole, fsynced, renamed and the directory fsynced (`fs::write_replace`),
//! under the lock every lw-sync run holds:
//!
//! 1. Wanted equals `written`: nothing is sent (steady state: 0 requests).
//! 2. A write is `pending` on the same commit (a run died between sending
//!    and recording, or GitHub's answer was lost): after two write
//!    intervals (so a status GitHub made is listed), the commit's statuses
//!    are listed once; when the newest `loopwright/radar` one is the wanted
//!    one, it is taken as written.  (Also when wanted equals `written`: the
//!    write in flight may have put another status over it.)
//! 3. Else `pending` is written (with the budget) and the status is posted:
//!    one request per change.  Its answer moves it to `written`.
//!
//! A new push changes the head, so the wanted status goes on the new
//! commit.  GitHub's 422 (the commit is not on GitHub) is recorded as
//! `refused` and reported once, not retried until the wanted status
//! changes; 403 (no "Commit statuses: write") ends the pass with exit 77.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::state::save_state;
use super::status::{CONTEXT, Verdicts, desired};
use super::{Event, MAX_UNKNOWN, Syncer};
use crate::github::{Budget, NewStatus, StatusWrite, status_of};
use base::error::{Error, Exit, Result};
use mailbox::registry::Registry;

/// One status as wanted or written.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Posting {
    pub repo: String,
    pub sha: String,
    pub state: String,
    pub description: String,
}

/// A write that may have been sent: the status and when.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InFlight {
    #[serde(flatten)]
    pub posting: Posting,
    pub at_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BranchStatus {
    pub branch: String,
    #[serde(default)]
    pub written: Option<Posting>,
    #[serde(default)]
    pub pending: Option<InFlight>,
    /// Refused by GitHub (422): not sent again while it is what is wanted.
    #[serde(default)]
    pub refused: Option<Posting>,
}

/// `ROOT/state/statuses.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Statuses {
    pub version: u32,
    /// Sandbox name -> its branch's status.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, BranchStatus>,
}

pub fn statuses_path(state_dir: &Path) -> PathBuf {
    state_dir.join("statuses.json")
}

pub fn load_statuses(p: &Path) -> Result<Statuses> {
    match std::fs::read(p) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            Error::data(format!(
                "status record '{}' is damaged ({e}); move it aside: the next run posts each branch's status once more",
                p.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Statuses {
            version: 1,
            ..Statuses::default()
        }),
        Err(e) => Err(Error::io("cannot read", p, e)),
    }
}

fn save_statuses(p: &Path, s: &Statuses) -> Result<()> {
    let mut b = serde_json::to_vec_pretty(s).expect("statuses are plain data");
    b.push(b'\n');
    super::write_atomic(p, &b)
}

fn same_commit(a: &Posting, b: &Posting) -> bool {
    a.repo == b.repo && a.sha == b.sha
}

/// One branch's wanted status.
struct Want {
    name: String,
    branch: String,
    posting: Posting,
}

impl Syncer {
    /// Brings every named branch's commit status up to the radar's verdict.
    pub fn sync_statuses(&mut self, v: &Verdicts) -> Result<()> {
        if v.is_empty() {
            return Ok(());
        }
        let wants = self.wanted_statuses(v)?;
        if wants.is_empty() {
            return Ok(());
        }
        let path = statuses_path(&self.root.state_dir());
        let mut rec = load_statuses(&path)?;
        for w in wants {
            let b = rec.sandboxes.entry(w.name.clone()).or_default();
            b.branch = w.branch.clone();
            // A write in flight on the same commit may have put another
            // status over the one written: then GitHub is asked first.
            let in_flight = b
                .pending
                .as_ref()
                .is_some_and(|p| same_commit(&p.posting, &w.posting));
            if b.refused.as_ref() == Some(&w.posting)
                || b.written.as_ref() == Some(&w.posting) && !in_flight
            {
                continue;
            }
            self.write_status(&path, &mut rec, &w)?;
        }
        Ok(())
    }

    /// The status each pushed branch the radar named should carry.
    fn wanted_statuses(&mut self, v: &Verdicts) -> Result<Vec<Want>> {
        let state = self.root.state_dir();
        let (pushed, unreadable) = crate::pr::pushed::load_all(&state)?;
        for u in unreadable {
            self.events.push(Event::Failed {
                target: u.path.display().to_string(),
                reason: format!(
                    "{}; its branch gets no radar status until the next push rewrites it",
                    u.why
                ),
            });
        }
        let (reg, _) = Registry::new(&self.root).list()?;
        let live: BTreeSet<String> = reg.iter().map(|r| r.name.clone()).collect();
        let branch: BTreeMap<String, String> = reg
            .iter()
            .filter_map(|r| Some((r.name.clone(), r.branch.clone()?)))
            .collect();
        let pulls: BTreeMap<String, String> = crate::pr::load_all(&state)?
            .into_iter()
            .map(|(n, r)| (n, r.repo))
            .collect();
        let mut out = Vec::new();
        for p in pushed {
            let name = p.name;
            if !live.contains(&name) || !v.names(&name) {
                continue;
            }
            let Some(repo) = pulls.get(&name).cloned().or_else(|| self.cfg.repo.clone()) else {
                continue;
            };
            let standing = v.standing(&name, &live);
            let (st, description) = desired(&standing, |o| {
                branch.get(o).cloned().unwrap_or_else(|| o.to_string())
            });
            out.push(Want {
                name,
                branch: p.branch,
                posting: Posting {
                    repo,
                    sha: p.commit,
                    state: st.into(),
                    description,
                },
            });
        }
        Ok(out)
    }

    /// Settles a pending write of `w`, or posts it: once, unless outcomes
    /// stay unknown (then up to [`MAX_UNKNOWN`] times, each settled first).
    fn write_status(&mut self, path: &Path, rec: &mut Statuses, w: &Want) -> Result<()> {
        for _ in 0..MAX_UNKNOWN {
            let pending = rec.sandboxes[&w.name].pending.clone();
            if let Some(p) = pending.filter(|p| same_commit(&p.posting, &w.posting))
                && self.settled(&p, &w.posting)?
            {
                return self.written(path, rec, w);
            }
            match self.post_status(path, rec, w) {
                Ok(StatusWrite::Done(_)) => return self.written(path, rec, w),
                Ok(StatusWrite::Unknown(why)) => {
                    self.stats.unknown += 1;
                    self.events.push(Event::Unknown {
                        target: format!("{}@{}", w.posting.repo, w.posting.sha),
                        reason: why,
                    });
                }
                Err(e) if status_of(&e) == Some(422) => {
                    let b = rec.sandboxes.get_mut(&w.name).expect("made above");
                    b.pending = None;
                    b.refused = Some(w.posting.clone());
                    save_statuses(path, rec)?;
                    self.stats.statuses_refused += 1;
                    self.events.push(Event::StatusRefused {
                        branch: w.branch.clone(),
                        sha: w.posting.sha.clone(),
                        reason: format!(
                            "{e}; is the commit on {}? push the branch again",
                            w.posting.repo
                        ),
                    });
                    return Ok(());
                }
                Err(e) if status_of(&e) == Some(403) => {
                    let b = rec.sandboxes.get_mut(&w.name).expect("made above");
                    b.pending = None;
                    save_statuses(path, rec)?;
                    return Err(Error::new(
                        Exit::NoPerm,
                        format!(
                            "{e}; the radar's statuses need \"Commit statuses: write\" (fine-grained) or the repo scope (classic) on {}",
                            w.posting.repo
                        ),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            Exit::TempFail,
            format!(
                "the status of branch '{}' on {} had {MAX_UNKNOWN} unknown outcomes in a row; try again later",
                w.branch, w.posting.repo
            ),
        ))
    }

    /// Whether GitHub shows `want` after the write in flight `p` on the
    /// same commit: the newest status of the context, listed once, two
    /// write intervals after `p` was sent.
    fn settled(&mut self, p: &InFlight, want: &Posting) -> Result<bool> {
        let settle = p.at_ms + 2 * self.client.limits.min_write_interval.as_millis() as u64;
        let now = self.client.clock.now_ms();
        if settle > now {
            self.client
                .clock
                .sleep(std::time::Duration::from_millis(settle - now));
        }
        let listed = self.client.list_statuses(&want.repo, &want.sha)?;
        self.stats.reconciles += 1;
        Ok(listed
            .iter()
            .find(|s| s.context == CONTEXT)
            .is_some_and(|s| {
                s.state == want.state && s.description.as_deref() == Some(want.description.as_str())
            }))
    }

    /// Posts `w` with its intent (and the budget) written first.
    fn post_status(&mut self, path: &Path, rec: &mut Statuses, w: &Want) -> Result<StatusWrite> {
        let sync_path = self.state_path.clone();
        let state = &mut self.state;
        let mut before = |b: &Budget| -> Result<()> {
            state.budget = b.clone();
            save_state(&sync_path, state)?;
            rec.sandboxes.get_mut(&w.name).expect("made above").pending = Some(InFlight {
                posting: w.posting.clone(),
                at_ms: base::time::now_ms(),
            });
            save_statuses(path, rec)
        };
        let new = NewStatus {
            state: &w.posting.state,
            context: CONTEXT,
            description: &w.posting.description,
        };
        self.client
            .create_status(&w.posting.repo, &w.posting.sha, &new, &mut before)
    }

    fn written(&mut self, path: &Path, rec: &mut Statuses, w: &Want) -> Result<()> {
        let b = rec.sandboxes.get_mut(&w.name).expect("made above");
        b.written = Some(w.posting.clone());
        b.pending = None;
        b.refused = None;
        save_statuses(path, rec)?;
        self.stats.statuses += 1;
        self.events.push(Event::Status {
            branch: w.branch.clone(),
            repo: w.posting.repo.clone(),
            sha: w.posting.sha.clone(),
            state: w.posting.state.clone(),
            description: w.posting.description.clone(),
        });
        Ok(())
    }

    /// `verify`'s part for statuses: each branch's status as wanted now
    /// against what the record wrote and what GitHub shows as the newest of
    /// its context on that commit (one listing per branch).  True when all
    /// agree.
    pub fn verify_statuses(&mut self) -> Result<bool> {
        let log = mailbox::log::Log::new(self.root.log_dir());
        let (entries, _) = log.entries()?;
        let wants = self.wanted_statuses(&Verdicts::from_log(&entries))?;
        let rec = load_statuses(&statuses_path(&self.root.state_dir()))?;
        let mut same = true;
        for w in wants {
            let b = rec.sandboxes.get(&w.name);
            if b.and_then(|b| b.refused.as_ref()) == Some(&w.posting) {
                continue; // reported when GitHub refused it
            }
            let listed = self.client.list_statuses(&w.posting.repo, &w.posting.sha)?;
            let found = listed
                .iter()
                .find(|s| s.context == CONTEXT)
                .map(|s| format!("{} \"{}\"", s.state, s.description.as_deref().unwrap_or("")));
            let wanted = format!("{} \"{}\"", w.posting.state, w.posting.description);
            if found.as_deref() != Some(wanted.as_str()) {
                same = false;
                self.events.push(Event::StatusDiffers {
                    branch: w.branch.clone(),
                    sha: w.posting.sha.clone(),
                    wanted,
                    found: found.unwrap_or_else(|| "none".into()),
                });
            }
        }
        Ok(same)
    }
}
