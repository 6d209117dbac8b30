//! The radar's messages: `conflict` and `conflict-cleared`, the mediator's
//! own (mailbox-spec.md, "THE RADAR"), addressed to both sandboxes.

use super::{Live, PairState, Radar, Verdict, fit};
use mailbox::layout;
use mailbox::message::{self, Kind, Message};

/// The refs of a message: the paths it is about, within the schema's limits.
fn refs_of(v: &Verdict) -> Vec<String> {
    let mut refs: Vec<String> = v.files.iter().map(|f| f.path.clone()).collect();
    refs.extend(v.a_in_b_scope.iter().cloned());
    refs.extend(v.b_in_a_scope.iter().cloned());
    refs.sort();
    refs.dedup();
    refs.retain(|r| {
        !r.is_empty() && r.len() <= message::MAX_REF && !r.chars().any(char::is_control)
    });
    refs.truncate(message::MAX_REFS);
    refs
}

/// The line naming the pair's previous message: a conflict that comes back
/// after its clearing, at the same commits, is a new message, never an
/// exact duplicate the mediator would hold (issue 40).
fn follows(prev: &PairState) -> String {
    match &prev.last_sent {
        Some(id) => format!("(The radar's previous message about this pair: {id}.)\n"),
        None => String::new(),
    }
}

impl Radar {
    fn recipients(&self, a: &Live, b: &Live) -> Vec<String> {
        let mut to = vec![a.name.clone(), b.name.clone()];
        if self.cc_human {
            to.push(layout::HUMAN.into());
        }
        to
    }

    pub(super) fn conflict_message(
        &self,
        a: &Live,
        b: &Live,
        heads: &[String; 2],
        base: &str,
        v: &Verdict,
        prev: &PairState,
    ) -> Message {
        let mut what = Vec::new();
        if !v.files.is_empty() {
            what.push(format!(
                "{} file{} conflict",
                v.files.len(),
                if v.files.len() == 1 { "" } else { "s" }
            ));
        }
        let scoped = v.a_in_b_scope.len() + v.b_in_a_scope.len();
        if scoped > 0 {
            what.push(format!(
                "{scoped} path{} in the other's scope",
                if scoped == 1 { "" } else { "s" }
            ));
        }
        let mut subject = format!(
            "conflict: {} ({}) and {} ({}): {}",
            a.name,
            a.branch,
            b.name,
            b.branch,
            what.join(", ")
        );
        fit(&mut subject, message::MAX_SUBJECT);
        let mut body = format!(
            "The radar merged branch {} of {} (commit {}) with branch {} of {} (commit {}),\nfrom their merge base {}.\n",
            a.branch, a.name, heads[0], b.branch, b.name, heads[1], base
        );
        if !v.files.is_empty() {
            body.push_str("\nReal conflicts (what git merge would stop on):\n");
            for f in &v.files {
                let hunks = if f.hunks.is_empty() {
                    String::new()
                } else {
                    let l: Vec<String> = f.hunks.iter().map(u32::to_string).collect();
                    format!(
                        ", {} hunk{} at merged line{} {}",
                        f.hunks.len(),
                        if f.hunks.len() == 1 { "" } else { "s" },
                        if f.hunks.len() == 1 { "" } else { "s" },
                        l.join(", ")
                    )
                };
                body.push_str(&format!("  {} ({}{hunks})\n", f.path, f.kind));
            }
        }
        for (who, other, paths) in [(a, b, &v.a_in_b_scope), (b, a, &v.b_in_a_scope)] {
            if !paths.is_empty() {
                body.push_str(&format!(
                    "\n{} changed paths in the scope {} declared ({}):\n",
                    who.name,
                    other.name,
                    other.scope.join(", ")
                ));
                for p in paths {
                    body.push_str(&format!("  {p}\n"));
                }
            }
        }
        body.push_str(&format!(
            "\nSee it yourself: git merge-tree --write-tree {} {}\nThis is said once; a change of the set is said again, and its end as conflict-cleared.\n",
            heads[0], heads[1]
        ));
        body.push_str(&follows(prev));
        fit(&mut body, message::MAX_BODY);
        let refs = refs_of(v);
        self.message(a, b, Kind::Conflict, subject, body, refs)
    }

    pub(super) fn cleared_message(
        &self,
        a: &Live,
        b: &Live,
        heads: &[String; 2],
        prev: &PairState,
    ) -> Message {
        let mut subject = format!(
            "conflict-cleared: {} ({}) and {} ({})",
            a.name, a.branch, b.name, b.branch
        );
        fit(&mut subject, message::MAX_SUBJECT);
        let refs = refs_of(&prev.verdict);
        let mut body = format!(
            "Branch {} of {} (now commit {}) and branch {} of {} (now commit {}) merge cleanly,\nand neither changes paths in the other's scope.  What was announced before\n(commits {} and {}) is over: {}.\n",
            a.branch,
            a.name,
            heads[0],
            b.branch,
            b.name,
            heads[1],
            prev.heads[0],
            prev.heads[1],
            if refs.is_empty() {
                "-".to_string()
            } else {
                refs.join(", ")
            }
        );
        body.push_str(&follows(prev));
        fit(&mut body, message::MAX_BODY);
        self.message(a, b, Kind::ConflictCleared, subject, body, refs)
    }

    fn message(
        &self,
        a: &Live,
        b: &Live,
        kind: Kind,
        subject: String,
        body: String,
        refs: Vec<String>,
    ) -> Message {
        let now = base::time::now();
        Message {
            version: message::VERSION,
            id: base::id::id_at(now, base::id::random128()),
            from: layout::MEDIATOR.into(),
            to: self.recipients(a, b),
            kind,
            subject,
            body,
            refs,
            in_reply_to: None,
            created: base::time::rfc3339(now),
        }
    }
}
