//! The sync state, `ROOT/state/sync.json`, written atomically, and the lock
//! every run holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::format::{Head, HostSandbox, Section};
use crate::github::Budget;
use base::error::{Error, Exit, Result};
use mailbox::layout::Root;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pending {
    /// `(entry, part)` pairs the comment in flight carries.
    pub items: Vec<(String, u32)>,
    pub at_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TargetState {
    /// Listed at least once since the state file was made.
    #[serde(default)]
    pub reconciled: bool,
    /// Entry (or notice key) -> the comment ids holding its parts.
    #[serde(default)]
    pub synced: BTreeMap<String, Vec<u64>>,
    /// Parts of multi-part entries posted so far.
    #[serde(default)]
    pub partial: BTreeMap<String, BTreeMap<u32, u64>>,
    #[serde(default)]
    pub pending: Option<Pending>,
    /// `since` for the next pull.
    #[serde(default)]
    pub pull_since: Option<String>,
    /// The `since` sent by the last pull and the ETag of its answer (a
    /// listing of one page): the next pull with the same `since` asks
    /// with If-None-Match, and a 304 - nothing changed, and free under
    /// GitHub's rate limit - means nothing to look at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_etag: Option<(String, String)>,
    /// People's comments whose `/lw answer` lines were handled.
    #[serde(default)]
    pub answered: BTreeSet<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// The token's user, whose comments are lw-sync's own.
    #[serde(default)]
    pub login: Option<String>,
    #[serde(default)]
    pub login_checked: bool,
    #[serde(default)]
    pub targets: BTreeMap<String, TargetState>,
    #[serde(default)]
    pub budget: Budget,
    /// Federation: what other hosts announced and what was taken from them.
    #[serde(default)]
    pub fed: FedState,
}

/// Another host's announcement, as last read.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Announced {
    /// Its comment.
    pub comment: u64,
    /// When the comment was made (RFC 3339): the time part of the ids
    /// derived from it, so that a rerun derives the same ones.
    #[serde(default)]
    pub at: String,
    pub sandboxes: Vec<HostSandbox>,
}

/// Federation state (lw-sync(1), FEDERATION).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FedState {
    /// The high-water mark of the comments of other hosts taken: every one
    /// with an id up to it had its entries dealt with (delivered or found
    /// not addressed here), except those in `waiting`.  GitHub's comment
    /// ids increase, so a mark and the few incomplete ids keep this record
    /// the same size however long the run.  A cache: delivery itself is
    /// once by the message id (see `federate`).
    #[serde(default)]
    pub taken_through: u64,
    /// Comments at or below the mark holding parts of an entry whose other
    /// parts are not on the issue yet: looked at again by every pull.
    #[serde(default)]
    pub waiting: BTreeSet<u64>,
    /// The record before the mark (every taken id): read from an older
    /// state file and folded into the mark when loaded, never written.
    #[serde(default, skip_serializing)]
    pub taken: BTreeSet<u64>,
    /// Host -> its announcement as last read.
    #[serde(default)]
    pub roster: BTreeMap<String, Announced>,
    /// SHA-256 of this host's announcement as last posted or edited.
    #[serde(default)]
    pub announced: Option<String>,
    /// Refused names (`NAME/HOST`) already told to this root.
    #[serde(default)]
    pub told: BTreeSet<String>,
}

impl FedState {
    /// Whether comment `id` was dealt with already.
    pub fn is_taken(&self, id: u64) -> bool {
        id <= self.taken_through && !self.waiting.contains(&id)
    }

    /// Records comment `id` as dealt with (`done`) or as waiting for parts.
    pub fn mark(&mut self, id: u64, done: bool) {
        if done {
            self.waiting.remove(&id);
        } else {
            self.waiting.insert(id);
        }
        self.taken_through = self.taken_through.max(id);
    }

    /// Folds an older state's set of taken ids into the mark.  The ids
    /// below it that the set lacks were comments still waiting for parts,
    /// or never listed: an entry in parts is taken again when its last
    /// part's comment (a new id) is read, which looks up the earlier ones.
    fn compact(&mut self) {
        if let Some(&max) = self.taken.last() {
            self.taken_through = self.taken_through.max(max);
        }
        self.taken.clear();
    }
}

pub fn state_path(root: &Root) -> PathBuf {
    root.state_dir().join("sync.json")
}

/// The state format: 2 asks `GET /user` again when version 1 found it
/// refused (version 1 then trusted every comment author).
pub(super) const STATE_VERSION: u32 = 2;

pub fn load_state(path: &Path) -> Result<(State, bool)> {
    match std::fs::read(path) {
        Ok(b) => {
            let mut s: State = serde_json::from_slice(&b)
                .map_err(|e| Error::data(format!("sync state '{}' is damaged ({e}); move it aside and run again to rebuild it from GitHub", path.display())))?;
            if s.version > STATE_VERSION {
                return Err(Error::data(format!(
                    "sync state '{}' is version {}, newer than this lw-sync reads ({STATE_VERSION}); use a newer lw-sync",
                    path.display(),
                    s.version
                )));
            }
            if s.version < 2 && s.login.is_none() {
                s.login_checked = false;
            }
            s.version = STATE_VERSION;
            s.fed.compact();
            Ok((s, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((
            State {
                version: STATE_VERSION,
                ..State::default()
            },
            false,
        )),
        Err(e) => Err(Error::io("cannot read sync state", path, e)),
    }
}

/// Writes `bytes` to `path` atomically and durably (crates/base/src/fs), readable by
/// its owner only: the state names the issue and comment ids.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    base::fs::write_replace(path, bytes, 0o600, base::fs::Durability::Synced)
        .map_err(|e| Error::io("cannot write", path, e))
}

pub(crate) fn save_state(path: &Path, st: &State) -> Result<()> {
    let mut b = serde_json::to_vec(st).expect("sync state is plain data");
    b.push(b'\n');
    write_atomic(path, &b)
}

/// The lock that keeps cron and a watcher from syncing at once.  Blocks
/// until it is free; released when the file is closed (or the process dies).
pub fn lock(root: &Root, wait: bool) -> Result<std::fs::File> {
    let dir = root.state_dir();
    root.make_dir(&dir)
        .map_err(|e| Error::io("cannot create", &dir, e))?;
    let p = dir.join("sync.lock");
    if wait {
        return base::fs::lock(&p).map_err(|e| Error::lock(&p, e));
    }
    base::fs::try_lock(&p)
        .map_err(|e| Error::lock(&p, e))?
        .ok_or_else(|| {
            Error::new(
                Exit::TempFail,
                format!("another lw-sync holds '{}'; nothing done", p.display()),
            )
        })
}

pub(crate) fn mark_part(ts: &mut TargetState, name: &str, part: u32, n: u32, cid: u64) {
    match n {
        n if n > 1 => {
            let ps = ts.partial.entry(name.to_string()).or_default();
            ps.insert(part, cid);
            if ps.len() as u32 == n {
                let ids = ps.values().copied().collect();
                ts.partial.remove(name);
                ts.synced.insert(name.to_string(), ids);
            }
        }
        _ => {
            ts.synced.insert(name.to_string(), vec![cid]);
        }
    }
}

pub(crate) fn complete_partials(ts: &mut TargetState, sections: &[(u64, Section)]) {
    let mut totals: HashMap<String, u32> = HashMap::new();
    for (_, s) in sections {
        if let Head::Entry(h) = &s.head {
            totals.insert(h.entry.clone(), h.part[1]);
        }
    }
    let done: Vec<String> = ts
        .partial
        .iter()
        .filter(|(n, ps)| totals.get(*n).is_some_and(|&t| ps.len() as u32 == t))
        .map(|(n, _)| n.clone())
        .collect();
    for n in done {
        let ps = ts.partial.remove(&n).expect("listed above");
        ts.synced.insert(n, ps.values().copied().collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_set_of_taken_ids_folds_into_the_mark() {
        let dir = std::env::temp_dir().join(format!("lw-state-{}", base::id::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("sync.json");
        std::fs::write(&p, r#"{"version":2,"fed":{"taken":[3,5,9]}}"#).unwrap();
        let (mut st, existed) = load_state(&p).unwrap();
        assert!(existed);
        assert_eq!((st.fed.taken_through, st.fed.taken.len()), (9, 0));
        assert!(st.fed.is_taken(4) && st.fed.is_taken(9) && !st.fed.is_taken(10));
        st.fed.mark(12, false);
        st.fed.mark(11, true);
        assert!(!st.fed.is_taken(12) && st.fed.is_taken(11));
        save_state(&p, &st).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(!text.contains("\"taken\""), "{text}");
        let (again, _) = load_state(&p).unwrap();
        assert_eq!(again.fed.taken_through, 12);
        assert_eq!(again.fed.waiting.iter().copied().collect::<Vec<_>>(), [12]);
        again
            .fed
            .waiting
            .iter()
            .for_each(|&w| assert!(!again.fed.is_taken(w)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
