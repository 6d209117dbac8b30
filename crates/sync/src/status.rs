//! The radar's verdict as a commit status (#43), the pure part: what the
//! log says stands between task branches, and the one-line status each
//! branch's head should carry.  crates/sync/src/status_post.rs writes it.
//!
//! Why lw-sync and not the radar writes it: lw-sync already owns the
//! token, the pacing that keeps GitHub's limits across runs and crashes
//! (crates/sync/src/github/pace.rs) and the write-intent-then-settle discipline of
//! comments; and it reads the radar's verdicts where the door records
//! them, the log, so a status says what was logged, never more.  The radar
//! stays a host-side process without network credentials.
//!
//! A verdict comes from the mediator's own `conflict` and
//! `conflict-cleared` messages (sender `mediator`, which no sandbox can be,
//! to the two sandboxes of the pair).  The newest message about a pair
//! decides: a `conflict` stands until a `conflict-cleared` follows (a
//! message the schema refuses counts for nothing, as it is not mirrored).  A
//! pair whose other sandbox is no longer registered does not stand (the
//! radar stopped watching it).  A branch the radar never named gets no
//! status at all.

use std::collections::{BTreeMap, BTreeSet};

use crate::github::MAX_STATUS_DESCRIPTION;
use mailbox::layout;
use mailbox::log::Entry;
use mailbox::message::Kind;

/// The status context loopwright writes.
pub const CONTEXT: &str = "loopwright/radar";

/// The newest message about a pair: its id and, for a standing conflict,
/// the paths it named.
type Said = (String, Option<Vec<String>>);

/// What the log says about each pair of sandboxes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// `(a, b)` (a before b) -> what was said last.
    pairs: BTreeMap<(String, String), Said>,
}

impl Verdicts {
    /// The radar's verdicts among `entries` (the log, in any order).
    pub fn from_log(entries: &[Entry]) -> Verdicts {
        let mut v = Verdicts::default();
        for e in entries {
            v.note(e);
        }
        v
    }

    fn note(&mut self, e: &Entry) {
        let Some(m) = &e.message else { return };
        // A message the schema refuses is not mirrored as a comment either
        // (the radar's own are capped to the schema: 64 refs, one line each).
        if e.sender != layout::MEDIATOR
            || !matches!(m.kind, Kind::Conflict | Kind::ConflictCleared)
            || m.validate().is_err()
        {
            return;
        }
        let mut two: Vec<&String> = m.to.iter().filter(|t| *t != layout::HUMAN).collect();
        two.sort();
        two.dedup();
        let [a, b] = two[..] else { return };
        let files = (m.kind == Kind::Conflict).then(|| m.refs.clone());
        let slot = self.pairs.entry((a.clone(), b.clone())).or_default();
        // Ids begin with their time, so the newest message has the greatest.
        if slot.0.is_empty() || m.id > slot.0 {
            *slot = (m.id.clone(), files);
        }
    }

    /// Whether the radar ever named sandbox `name`.
    pub fn names(&self, name: &str) -> bool {
        self.pairs.keys().any(|(a, b)| a == name || b == name)
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The conflicts standing for `name` with sandboxes `live` holds:
    /// the other sandbox and the paths.
    pub fn standing(&self, name: &str, live: &BTreeSet<String>) -> Vec<(String, Vec<String>)> {
        self.pairs
            .iter()
            .filter_map(|((a, b), (_, files))| {
                let other = if a == name {
                    b
                } else if b == name {
                    a
                } else {
                    return None;
                };
                let files = files.as_ref()?;
                live.contains(other).then(|| (other.clone(), files.clone()))
            })
            .collect()
    }
}

/// The status a branch's head should carry: `failure` naming the other
/// branches and the files while conflicts stand, else `success`.
/// `branch_of` names a sandbox's branch.  The description is one line of
/// at most [`MAX_STATUS_DESCRIPTION`] characters, whatever the names hold.
pub(super) fn desired(
    standing: &[(String, Vec<String>)],
    branch_of: impl Fn(&str) -> String,
) -> (&'static str, String) {
    if standing.is_empty() {
        return (
            "success",
            "no conflict with other task branches (loopwright radar)".into(),
        );
    }
    let others: Vec<String> = standing.iter().map(|(o, _)| branch_of(o)).collect();
    let mut files: Vec<&String> = standing.iter().flat_map(|(_, f)| f).collect();
    files.sort();
    files.dedup();
    let mut d = format!(
        "conflicts with {}",
        join_fit(&others, MAX_STATUS_DESCRIPTION / 2)
    );
    if !files.is_empty() {
        let room = MAX_STATUS_DESCRIPTION.saturating_sub(d.chars().count() + 2);
        let f: Vec<String> = files.iter().map(|s| s.to_string()).collect();
        d.push_str(": ");
        d.push_str(&join_fit(&f, room));
    }
    ("failure", one_line(&d, MAX_STATUS_DESCRIPTION))
}

/// `items` joined by ", ", as many as fit in `room` characters, then
/// "+N more"; each item on one line and cut to fit.
fn join_fit(items: &[String], room: usize) -> String {
    let mut out = String::new();
    for (i, it) in items.iter().enumerate() {
        let more = items.len() - i;
        let tail = if more > 1 {
            format!(" +{} more", more - 1).len()
        } else {
            0
        };
        let sep = if out.is_empty() { 0 } else { 2 };
        let left = room.saturating_sub(out.chars().count() + sep + tail);
        let shown = one_line(it, left.min(60));
        if shown.is_empty() || (shown.ends_with('…') && more > 1 && !out.is_empty()) {
            if out.is_empty() {
                return format!("{more} branches or files");
            }
            out.push_str(&format!(" +{more} more"));
            return out;
        }
        if sep > 0 {
            out.push_str(", ");
        }
        out.push_str(&shown);
    }
    out
}

/// `s` on one line (control characters and bidi overrides made visible,
/// crates/base/src/visible.rs), cut to `max` characters with "…".
pub(super) fn one_line(s: &str, max: usize) -> String {
    let v = base::visible::visible_line(s);
    if v.chars().count() <= max {
        return v.into_owned();
    }
    if max == 0 {
        return String::new();
    }
    let mut out: String = v.chars().take(max - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailbox::log::{Action, Decision};
    use mailbox::message::Message;

    fn radar(n: u64, kind: Kind, to: &[&str], refs: &[&str], sender: &str) -> Entry {
        let id = &base::id::id_at(std::time::Duration::from_secs(1_700_000_000 + n), 7);
        let m = Message {
            version: 1,
            id: id.into(),
            from: sender.into(),
            to: to.iter().map(|s| s.to_string()).collect(),
            kind,
            subject: "s".into(),
            body: "b".into(),
            refs: refs.iter().map(|s| s.to_string()).collect(),
            in_reply_to: None,
            created: "2026-01-01T00:00:00Z".into(),
        };
        Entry {
            version: 1,
            name: format!("{id}.forward"),
            logged: "2026-01-01T00:00:00Z".into(),
            message_id: id.into(),
            sender: sender.into(),
            message: Some(m),
            decision: Decision {
                quiet: false,
                action: Action::Forward,
                to: vec![],
                reason: String::new(),
            },
        }
    }

    fn live(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_newest_message_about_a_pair_decides_whatever_the_log_order() {
        let c1 = radar(
            1,
            Kind::Conflict,
            &["web", "api", "human"],
            &["x.rs"],
            "mediator",
        );
        let cl = radar(
            2,
            Kind::ConflictCleared,
            &["api", "web"],
            &["x.rs"],
            "mediator",
        );
        let c3 = radar(3, Kind::Conflict, &["api", "web"], &["y.rs"], "mediator");
        let all = live(&["api", "web"]);
        let v = Verdicts::from_log(&[cl.clone(), c1.clone()]);
        assert!(
            v.standing("api", &all).is_empty(),
            "cleared after the conflict"
        );
        let v = Verdicts::from_log(&[c3.clone(), cl, c1]);
        assert_eq!(
            v.standing("web", &all),
            [("api".to_string(), vec!["y.rs".to_string()])]
        );
        // The other sandbox gone: nothing stands.
        assert!(v.standing("web", &live(&["web"])).is_empty());
        assert!(v.names("web") && !v.names("db"));
    }

    #[test]
    fn only_the_mediators_conflict_messages_count() {
        let forged = radar(1, Kind::Conflict, &["api", "web"], &["x"], "web");
        let status = radar(2, Kind::Status, &["api", "web"], &["x"], "mediator");
        let three = radar(3, Kind::Conflict, &["a", "b", "c"], &["x"], "mediator");
        assert!(Verdicts::from_log(&[forged, status, three]).is_empty());
    }

    #[test]
    fn descriptions_name_the_other_branch_and_files_on_one_line_within_the_limit() {
        let b = |s: &str| format!("task/{s}");
        let (st, d) = desired(
            &[("api".into(), vec!["src/a.rs".into(), "src/b.rs".into()])],
            b,
        );
        assert_eq!(
            (st, d.as_str()),
            ("failure", "conflicts with task/api: src/a.rs, src/b.rs")
        );
        assert_eq!(desired(&[], b).0, "success");
        // Hostile: newlines, escapes, bidi overrides, 10,000 files, long names.
        let files: Vec<String> = (0..10_000)
            .map(|i| format!("dir/f{i}\n\u{1b}[31m"))
            .collect();
        let evil = |_: &str| "x\ny\u{202e}z".repeat(40);
        let (st, d) = desired(&[("api".into(), files.clone()), ("db".into(), files)], evil);
        assert_eq!(st, "failure");
        assert!(
            d.chars().count() <= MAX_STATUS_DESCRIPTION,
            "{} chars: {d}",
            d.chars().count()
        );
        assert!(
            !d.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{d:?}"
        );
        assert!(d.contains("more"), "{d}");
        // A name far over the limit alone still fits.
        let (_, d) = desired(&[("a".into(), vec!["p".repeat(5000)])], |_| {
            "b".repeat(5000)
        });
        assert!(d.chars().count() <= MAX_STATUS_DESCRIPTION, "{d}");
    }
}
