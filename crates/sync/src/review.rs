//! A person's review comes back through the door (#43): for each task
//! branch's pull request (`ROOT/state/pr/NAME.json`, written by
//! `lw-sandbox push --pr`), `lw-sync pull` reads
//!
//! - the reviews (`GET .../pulls/{n}/reviews`): verdict and text;
//! - the review comments (`GET .../pulls/{n}/comments`): file, line, text;
//! - the conversation (`GET .../issues/{n}/comments`): people's comments,
//!   not lw-sync's own sections and not `/lw answer` lines (those are
//!   answers, `pull.rs`);
//!
//! and puts each, once, into `ROOT/human-outbox` as a `request` from
//! `human` to the sandbox, so the mediator's policy routes, holds or drops
//! it and logs what it did.  A review comment carries `PATH:LINE` (or
//! `PATH` for a comment on a whole file or an outdated line) in `refs`,
//! then its link.
//!
//! Exactly once: the message id is derived from the repository, the pull
//! request and the item's GitHub id, so a run killed after the delivery and
//! before its record delivers the same id again, which the outbox
//! (`deliver_once`) and the mediator's log (one decision per id) both
//! refuse.  `ROOT/state/reviews.json` (atomic, fsynced) records what was
//! delivered or ignored, so a later pass neither rebuilds the message nor
//! counts an ignored item twice, and holds the conversation's `since` and
//! the listings' ETags; both move only once every item listed was handled,
//! so a pass killed halfway lists the same items again.
//!
//! Choices, each documented in lw-sync(1):
//! - Only trusted people count, as for answers: the configured
//!   `answerers`, else the repository's owners, members and
//!   collaborators.  Anyone else is ignored and counted (stats
//!   `untrusted`, an `ignored` event), once per item.
//! - A review comment on a file outside the sandbox's scope is delivered,
//!   with a note saying so: GitHub only takes review comments on the pull
//!   request's diff, so the task's own branch changed that file, and the
//!   person's words are about this task.  The policy can still hold it.
//! - A text longer than a message body may be is cut, with a note and the
//!   link to the whole (an answer's text is bounded the same way).
//! - A review on a closed or merged pull request is delivered as on an
//!   open one; a sandbox that is gone gets the mediator's bounce.
//! - An item edited after it was delivered is not delivered again: the
//!   agent has the text as it was read.  A person who wants more writes a
//!   new comment.
//! - Pending reviews (drafts), dismissed ones and `COMMENTED` reviews
//!   without text (the envelope GitHub makes around review comments) carry
//!   nothing to deliver.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Event, Syncer, parse_answers, parse_comment};
use crate::github::{Comment, Listing, Review, ReviewComment, Target};
use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use mailbox::message::{self, Kind, Message};
use mailbox::registry::Registry;

/// `ROOT/state/reviews.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReviewState {
    pub version: u32,
    /// `OWNER/NAME#N` -> what was seen on that pull request.
    #[serde(default)]
    pub pulls: BTreeMap<String, PullSeen>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PullSeen {
    /// Items (`review/ID`, `line/ID`, `comment/ID`) delivered -> the id
    /// of the request that carried each.
    #[serde(default)]
    pub delivered: BTreeMap<String, String>,
    /// Items of people lw-sync does not trust: never delivered, counted once.
    #[serde(default)]
    pub ignored: BTreeSet<String>,
    /// `since` for the next listing of the conversation.
    #[serde(default)]
    pub since: Option<String>,
    /// The ETags of the last listings whose every item was handled: the
    /// next pull asks with If-None-Match, and GitHub's 304 costs nothing.
    #[serde(default)]
    pub tags: Tags,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Tags {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reviews: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<String>,
    /// The conversation's, with the `since` it was listed with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<(String, String)>,
}

/// What one pass found on a pull request: the items not handled yet, the
/// newest update time of its conversation, and the listings' ETags.
struct Found {
    items: Vec<Item>,
    newest: Option<String>,
    tags: Tags,
}

pub fn review_state_path(state_dir: &Path) -> PathBuf {
    state_dir.join("reviews.json")
}

fn load(p: &Path) -> Result<ReviewState> {
    match std::fs::read(p) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            Error::data(format!(
                "review state '{}' is damaged ({e}); move it aside and run again: nothing is delivered twice",
                p.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ReviewState {
            version: 1,
            ..ReviewState::default()
        }),
        Err(e) => Err(Error::io("cannot read", p, e)),
    }
}

fn save(p: &Path, st: &ReviewState) -> Result<()> {
    let b = serde_json::to_vec(st).expect("review state is plain data");
    super::write_atomic(p, &b)
}

/// One thing a person wrote on a pull request, made ready to deliver.
pub(super) struct Item {
    /// `review/ID`, `line/ID` or `comment/ID`.
    pub key: String,
    pub login: String,
    pub association: String,
    pub created: String,
    pub url: String,
    pub subject: String,
    pub text: String,
    /// The file of a review comment, and its line when it has one.
    pub place: Option<(String, Option<u64>)>,
}

/// The message id of item `key` of pull request `pull` (`OWNER/NAME#N`):
/// the same on every run, so a repeat is refused by id.
pub(super) fn item_id(pull: &str, key: &str, created: &str) -> String {
    let at = base::time::parse_rfc3339(created).unwrap_or_default();
    let seed = sha256_hex(format!("review/{pull}/{key}").as_bytes());
    let rand = u128::from_str_radix(&seed[..32], 16).expect("a SHA-256 hex digest is hex");
    base::id::id_at(at, rand)
}

/// Whether a person may speak to the agents: the same trust as answers.
fn trusted_person(answerers: &[String], login: &str, association: &str) -> bool {
    if answerers.is_empty() {
        matches!(association, "OWNER" | "MEMBER" | "COLLABORATOR")
    } else {
        answerers.iter().any(|a| a == login)
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A file and line as a ref: `PATH:LINE`, or `PATH`; None when the path
/// cannot be a ref (a control character, too long): the body still names it.
fn place_ref(path: &str, line: Option<u64>) -> Option<String> {
    let r = match line {
        Some(l) => format!("{path}:{l}"),
        None => path.to_string(),
    };
    (!path.is_empty() && r.len() <= message::MAX_REF && !r.chars().any(char::is_control))
        .then_some(r)
}

/// The request delivering `it` to `sandbox`, whose scope is `scope`.
pub(super) fn request(pull: &str, sandbox: &str, scope: &[String], it: &Item) -> (Message, bool) {
    let mut body = String::new();
    let mut refs = Vec::new();
    let mut outside = false;
    if let Some((path, line)) = &it.place {
        let shown = path.escape_debug().to_string();
        match line {
            Some(l) => body.push_str(&format!("{shown}:{l}\n")),
            None => body.push_str(&format!("{shown}\n")),
        }
        outside = !scope.is_empty() && !scope.iter().any(|s| mailbox::policy::overlaps(s, path));
        if outside {
            body.push_str(&format!(
                "(note: {shown} is outside this sandbox's scope ({}); delivered because it is in this task's pull request)\n",
                scope.join(", ")
            ));
        }
        body.push('\n');
        refs.extend(place_ref(path, *line));
    }
    if !it.url.is_empty() && it.url.len() <= message::MAX_REF && !it.url.contains(char::is_control)
    {
        refs.push(it.url.clone());
    }
    let room = message::MAX_BODY - body.len() - 200;
    if it.text.len() > room {
        let kept = cut(&it.text, room);
        body.push_str(kept);
        body.push_str(&format!(
            "\n\n[lw-sync: cut to {} of {} bytes; the whole text: {}]",
            kept.len(),
            it.text.len(),
            cut(&it.url, 100)
        ));
    } else {
        body.push_str(&it.text);
    }
    let created = base::time::parse_rfc3339(&it.created).unwrap_or_else(base::time::now);
    let m = Message {
        version: message::VERSION,
        id: item_id(pull, &it.key, &it.created),
        from: mailbox::layout::HUMAN.into(),
        to: vec![sandbox.to_string()],
        kind: Kind::Request,
        subject: cut(&it.subject, message::MAX_SUBJECT).to_string(),
        body,
        refs,
        in_reply_to: None,
        created: base::time::rfc3339(created),
    };
    (m, outside)
}

fn verdict(state: &str) -> &str {
    match state {
        "APPROVED" => "approved",
        "CHANGES_REQUESTED" => "changes requested",
        _ => "commented",
    }
}

/// A conversation's items, its newest update time and its ETag.
type Conversation = (Vec<Item>, Option<String>, Option<(String, String)>);

/// A review as an item; None for one that carries nothing: a draft
/// (`PENDING`), a dismissed one, or GitHub's `COMMENTED` envelope without
/// text around review comments.
fn review_item(t: &Target, r: &Review) -> Option<Item> {
    let text = r.body.clone().unwrap_or_default();
    let nothing = matches!(r.state.as_str(), "PENDING" | "DISMISSED")
        || (r.state == "COMMENTED" && text.trim().is_empty());
    if nothing {
        return None;
    }
    Some(Item {
        key: format!("review/{}", r.id),
        login: r.login().to_string(),
        association: r.author_association.clone(),
        created: r.submitted_at.clone().unwrap_or_default(),
        url: r.html_url.clone(),
        subject: format!("Review of {t} by @{}: {}", r.login(), verdict(&r.state)),
        text: if text.trim().is_empty() {
            format!("({}, without text)", verdict(&r.state))
        } else {
            text
        },
        place: None,
    })
}

/// A review comment as an item: its line, else the line it was made on
/// (an outdated comment), else the whole file.
fn line_item(t: &Target, c: &ReviewComment) -> Item {
    let line = c.line.or(c.original_line);
    let at = match line {
        Some(l) => format!("{}:{l}", c.path.escape_debug()),
        None => c.path.escape_debug().to_string(),
    };
    Item {
        key: format!("line/{}", c.id),
        login: c.login().to_string(),
        association: c.author_association.clone(),
        created: c.created_at.clone(),
        url: c.html_url.clone(),
        subject: format!("Review comment by @{} on {at} ({t})", c.login()),
        text: c.body.clone(),
        place: Some((c.path.clone(), line)),
    }
}

impl Syncer {
    fn review_state_file(&self) -> PathBuf {
        review_state_path(&self.root.state_dir())
    }

    /// The way back for reviews: every task branch's pull request, read and
    /// delivered (see the top of this file).
    pub fn pull_reviews(&mut self) -> Result<()> {
        let path = self.review_state_file();
        let mut st = load(&path)?;
        let mut first_err = None;
        for (name, rec) in crate::pr::load_all(&self.root.state_dir())? {
            let Some(n) = rec.number else { continue };
            let t = Target {
                repo: rec.repo.clone(),
                issue: n,
            };
            // A pull request that is gone (404) or an item that makes no
            // message is this one's problem: the others are still read.
            // The first is the run's error, the rest are events.
            let mut fail = |s: &mut Syncer, e: Error| -> Result<()> {
                if !matches!(e.exit, Exit::Config | Exit::DataErr) {
                    return Err(e);
                }
                match first_err {
                    None => first_err = Some(e),
                    Some(_) => s.events.push(Event::Failed {
                        target: t.to_string(),
                        reason: e.to_string(),
                    }),
                }
                Ok(())
            };
            let seen = st.pulls.get(&t.to_string()).cloned().unwrap_or_default();
            let Found {
                items,
                newest,
                tags,
            } = match self.pull_items(&t, &seen, true) {
                Ok(got) => got,
                Err(e) => {
                    fail(self, e)?;
                    continue;
                }
            };
            let scope = Registry::new(&self.root)
                .get(&name)
                .ok()
                .flatten()
                .map(|s| s.scope)
                .unwrap_or_default();
            let mut all = true;
            for it in items {
                if let Err(e) = self.deliver_item(&t, &name, &scope, &it, &mut st, &path) {
                    all = false;
                    fail(self, e)?;
                }
            }
            // The conversation's cursor and the ETags move once every item
            // listed was delivered (or ignored): one that failed is listed again.
            let ps = st.pulls.entry(t.to_string()).or_default();
            if all && (newest.is_some() || ps.tags != tags) {
                ps.since = newest.or(ps.since.take());
                ps.tags = tags;
                save(&path, &st)?;
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// What people wrote on pull request `t` that `seen` has not handled;
    /// with `conditional`, asked with the ETags `seen` holds.
    fn pull_items(&mut self, t: &Target, seen: &PullSeen, conditional: bool) -> Result<Found> {
        let old = if conditional {
            seen.tags.clone()
        } else {
            Tags::default()
        };
        let mut tags = old.clone();
        let mut items = Vec::new();
        if let Some((reviews, tag)) =
            self.client
                .list_reviews(&t.repo, t.issue, old.reviews.as_deref())?
        {
            tags.reviews = tag;
            items.extend(reviews.iter().filter_map(|r| review_item(t, r)));
        }
        let lines = self
            .client
            .list_review_comments(&t.repo, t.issue, old.lines.as_deref())?;
        if let Some((comments, tag)) = lines {
            tags.lines = tag;
            items.extend(comments.iter().map(|c| line_item(t, c)));
        }
        let (comments, newest, tag) =
            self.conversation(t, seen.since.as_deref(), old.conversation)?;
        tags.conversation = tag;
        items.extend(comments);
        let done = |k: &str| seen.delivered.contains_key(k) || seen.ignored.contains(k);
        items.retain(|it| !done(&it.key));
        Ok(Found {
            items,
            newest,
            tags,
        })
    }

    /// People's comments in the conversation of `t` updated since `since`
    /// (a minute of overlap), the newest update time listed, and the ETag
    /// for the next listing (`tag` is the last one, with its `since`).
    fn conversation(
        &mut self,
        t: &Target,
        since: Option<&str>,
        tag: Option<(String, String)>,
    ) -> Result<Conversation> {
        let since = since.and_then(base::time::parse_rfc3339).map(|d| {
            let s = base::time::rfc3339(d.saturating_sub(std::time::Duration::from_secs(60)));
            format!("{}Z", &s[..19])
        });
        let since_key = since.clone().unwrap_or_default();
        let asked = tag.filter(|(s, _)| *s == since_key);
        let listing = self.client.list_comments_if(
            t,
            since.as_deref(),
            asked.as_ref().map(|(_, e)| e.as_str()),
        )?;
        let (comments, tag) = match listing {
            Listing::NotModified => return Ok((vec![], None, asked)),
            Listing::Comments(all, etag) => (all, etag.map(|e| (since_key, e))),
        };
        let login = self.own_login();
        let ids = self.recorded_ids();
        let newest = comments.iter().map(|c| c.updated_at.clone()).max();
        let mut out = Vec::new();
        for c in comments {
            if self.not_a_person_speaking(&c, login.as_deref(), &ids) {
                continue;
            }
            out.push(Item {
                key: format!("comment/{}", c.id),
                login: c.login().to_string(),
                association: c.author_association.clone(),
                created: c.created_at.clone(),
                url: c.html_url.clone(),
                subject: format!("Comment by @{} on {t}", c.login()),
                text: c.text().to_string(),
                place: None,
            });
        }
        Ok((out, newest, tag))
    }

    /// lw-sync's own sections and notices (of this host or another of a
    /// federation), and `/lw answer` comments, which `pull.rs` handles.
    fn not_a_person_speaking(&self, c: &Comment, login: Option<&str>, ids: &BTreeSet<u64>) -> bool {
        let a_host = self
            .cfg
            .federation()
            .ok()
            .flatten()
            .is_some_and(|f| f.host_of(c.login()).is_some());
        ((a_host || self.trusted(c, login, ids)) && parse_comment(c.text()).is_some())
            || !parse_answers(c.text()).is_empty()
            || c.text().trim().is_empty()
    }

    fn deliver_item(
        &mut self,
        t: &Target,
        sandbox: &str,
        scope: &[String],
        it: &Item,
        st: &mut ReviewState,
        path: &Path,
    ) -> Result<()> {
        let key = t.to_string();
        if !trusted_person(&self.cfg.answerers, &it.login, &it.association) {
            self.stats.untrusted += 1;
            self.events.push(Event::Ignored {
                target: key.clone(),
                item: it.key.clone(),
                login: it.login.clone(),
            });
            st.pulls
                .entry(key)
                .or_default()
                .ignored
                .insert(it.key.clone());
            return save(path, st);
        }
        let (m, outside) = request(&key, sandbox, scope, it);
        m.validate().map_err(|e| {
            Error::data(format!(
                "{} of {key} does not make a valid message: {e}",
                it.key
            ))
        })?;
        self.root
            .human_outbox()
            .deliver_once(&m.id, &m.to_bytes())?;
        self.stats.reviews += 1;
        self.events.push(Event::Review {
            id: m.id.clone(),
            to: sandbox.to_string(),
            target: key.clone(),
            item: it.key.clone(),
            outside_scope: outside,
        });
        st.pulls
            .entry(key)
            .or_default()
            .delivered
            .insert(it.key.clone(), m.id);
        save(path, st)
    }

    /// `lw-sync verify`'s part for pull requests, the way back: every item
    /// a trusted person wrote on a task's pull request has its request in
    /// the log (or still in the human outbox, for the mediator).  The way
    /// out - each log entry of the task once in the pull request's
    /// conversation, no duplicates - is `verify`'s comparison of each
    /// target, the pull request being its sandbox's target.  True when
    /// nothing is missing.
    pub fn verify_reviews(&mut self, logged: &BTreeSet<String>) -> Result<bool> {
        let mut same = true;
        let outbox = self.root.human_outbox();
        let queued = |id: &str| {
            [mailbox::maildir::Sub::New, mailbox::maildir::Sub::Cur]
                .iter()
                .any(|s| outbox.sub(*s).join(id).symlink_metadata().is_ok())
        };
        for (_, rec) in crate::pr::load_all(&self.root.state_dir())? {
            let Some(n) = rec.number else { continue };
            let t = Target {
                repo: rec.repo.clone(),
                issue: n,
            };
            let found = self.pull_items(&t, &PullSeen::default(), false)?;
            for it in found.items {
                if !trusted_person(&self.cfg.answerers, &it.login, &it.association) {
                    continue;
                }
                let id = item_id(&t.to_string(), &it.key, &it.created);
                if !logged.contains(&id) && !queued(&id) {
                    same = false;
                    self.events.push(Event::ReviewMissing {
                        target: t.to_string(),
                        item: it.key,
                        id,
                    });
                }
            }
        }
        Ok(same)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(text: &str, place: Option<(&str, Option<u64>)>) -> Item {
        Item {
            key: "line/7".into(),
            login: "alice".into(),
            association: "OWNER".into(),
            created: "2026-12-07T01:02:03Z".into(),
            url: "https://github.com/o/r/pull/4#discussion_r7".into(),
            subject: "s".into(),
            text: text.into(),
            place: place.map(|(p, l)| (p.to_string(), l)),
        }
    }

    #[test]
    fn a_review_comment_becomes_a_request_with_its_place_in_refs() {
        let (m, outside) = request(
            "o/r#4",
            "api",
            &["src/api/**".into()],
            &item("rename this", Some(("src/api/a.rs", Some(12)))),
        );
        assert!(!outside);
        assert_eq!((m.from.as_str(), m.kind), ("human", Kind::Request));
        assert_eq!(m.refs[0], "src/api/a.rs:12");
        assert!(m.body.ends_with("rename this"), "{}", m.body);
        m.validate().unwrap();
        // The same item makes the same id on every run; another item another.
        let again = request("o/r#4", "api", &[], &item("x", None)).0;
        assert_eq!(again.id, m.id);
        let mut other = item("x", None);
        other.key = "line/8".into();
        assert_ne!(request("o/r#4", "api", &[], &other).0.id, m.id);
    }

    #[test]
    fn an_outdated_or_whole_file_comment_keeps_what_place_it_has() {
        let t = Target {
            repo: "o/r".into(),
            issue: 4,
        };
        let c = |line, original_line| ReviewComment {
            id: 9,
            user: None,
            body: "b".into(),
            path: "src/a.rs".into(),
            line,
            original_line,
            html_url: String::new(),
            created_at: "2026-12-07T01:02:03Z".into(),
            updated_at: String::new(),
            author_association: "OWNER".into(),
        };
        let refs = |it: &Item| request("o/r#4", "api", &[], it).0.refs;
        assert_eq!(refs(&line_item(&t, &c(None, Some(7)))), ["src/a.rs:7"]);
        assert_eq!(refs(&line_item(&t, &c(None, None))), ["src/a.rs"]);
        // A draft, a dismissal and GitHub's empty envelope carry nothing.
        let r = |state: &str, body: Option<&str>| Review {
            id: 1,
            user: None,
            body: body.map(str::to_string),
            state: state.into(),
            html_url: String::new(),
            submitted_at: None,
            author_association: "OWNER".into(),
        };
        for (state, body) in [
            ("PENDING", Some("x")),
            ("DISMISSED", Some("x")),
            ("COMMENTED", None),
        ] {
            assert!(review_item(&t, &r(state, body)).is_none(), "{state}");
        }
        let ok = review_item(&t, &r("APPROVED", None)).unwrap();
        assert_eq!(ok.text, "(approved, without text)");
    }

    #[test]
    fn outside_the_scope_is_delivered_with_a_note() {
        let (m, outside) = request(
            "o/r#4",
            "api",
            &["src/api/**".into()],
            &item("why here?", Some(("web/index.js", Some(3)))),
        );
        assert!(outside);
        assert!(m.body.contains("outside this sandbox's scope (src/api/**)"));
        assert_eq!(m.refs[0], "web/index.js:3");
    }

    #[test]
    fn a_huge_text_is_cut_on_a_character_and_a_hostile_path_is_no_ref() {
        let huge = "é".repeat(message::MAX_BODY);
        let (m, _) = request(
            "o/r#4",
            "api",
            &[],
            &item(&huge, Some(("a\nb.rs", Some(1)))),
        );
        m.validate().unwrap();
        assert!(m.body.contains("[lw-sync: cut to "), "tail");
        assert!(m.body.starts_with("a\\nb.rs:1\n"), "{}", &m.body[..20]);
        assert_eq!(m.refs, ["https://github.com/o/r/pull/4#discussion_r7"]);
    }
}
