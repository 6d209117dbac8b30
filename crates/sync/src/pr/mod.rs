//! A task branch's pull request (`lw-sandbox push --pr`, #43): find the one
//! open for the branch or open it, exactly once under kills and retries.
//!
//! The protocol, under `ROOT/state/pr/NAME.lock`:
//!
//! 1. List the repository's pull requests whose head is the branch, in any
//!    state (`GET /repos/{o}/{r}/pulls?head=OWNER:BRANCH&state=all`).  An
//!    open one is adopted: its title and body brought up to date when the
//!    commits changed them (`PATCH`), out of draft with `--ready`.  A closed one and no open one is refused: a
//!    person closed it, and loopwright neither reopens it nor opens a second
//!    one behind their back (exit 65, naming it and the fix).
//! 2. None: the intent (`pending` with the time) is written to the record,
//!    `ROOT/state/pr/NAME.json`, durably, before the create is sent.
//! 3. `POST /repos/{o}/{r}/pulls`.  Its answer's number is written to the
//!    record.  An unknown outcome (a dropped connection, a timeout, a 5xx)
//!    or GitHub's 422 "A pull request already exists for OWNER:BRANCH." is
//!    reconciled by listing again and adopting what is open; an unknown
//!    outcome with nothing listed stays `pending`, exit 75, and the next run
//!    starts at 1.
//!
//! GitHub keeps at most one open pull request per head and base, so the
//! list before the create and the 422 after it mean a crash at any point
//! never makes a second one; the record of intent tells a later run (and a
//! reader) that a create may have been sent.  A new pull request costs two
//! requests (list, create), three when a create's outcome must be
//! reconciled; a known one one, two when its text changed (new commits).
//!
//! The record is also what lw-sync reads to send the sandbox's later
//! entries to the pull request's conversation (`sync::Config::learn_pulls`).

pub mod pushed;
mod text;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::github::{Client, NewPull, Pull, PullWrite, answer_of, status_of};
use base::error::{Error, Exit, Result};

pub use text::{Task, body, title};

/// `ROOT/state/pr/NAME.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    pub version: u32,
    /// `OWNER/NAME`.
    pub repo: String,
    pub branch: String,
    pub base: String,
    /// The pull request, once known.
    #[serde(default)]
    pub number: Option<u64>,
    /// A create may have been sent at this time (ms since the epoch) and
    /// its outcome is not known yet.
    #[serde(default)]
    pub pending: Option<u64>,
    /// When the number was recorded (ms since the epoch): lw-sync sends
    /// the sandbox's entries logged from then on to the pull request's
    /// conversation, and leaves the earlier ones on the thread they went
    /// to (crates/sync/src/config.rs, `learn_pulls`).  Absent in older records:
    /// every entry goes to the pull request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
}

impl Record {
    /// Records `number` as the branch's pull request; `since` moves only
    /// when the number does.
    fn learn(&mut self, number: u64) {
        if self.number != Some(number) {
            self.number = Some(number);
            self.since = Some(base::time::now_ms());
        }
        self.pending = None;
    }
}

pub fn dir(state: &Path) -> PathBuf {
    state.join("pr")
}

fn path(state: &Path, name: &str) -> PathBuf {
    dir(state).join(format!("{name}.json"))
}

/// The record of sandbox `name`, if any.
pub fn load(state: &Path, name: &str) -> Result<Option<Record>> {
    let p = path(state, name);
    match std::fs::read(&p) {
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            Error::data(format!(
                "pull-request record '{}' is invalid: {e}",
                p.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("cannot read", &p, e)),
    }
}

/// Every sandbox's record: name -> record.
pub fn load_all(state: &Path) -> Result<Vec<(String, Record)>> {
    let mut out = Vec::new();
    for (name, _) in pushed::json_names(&dir(state))? {
        if let Some(r) = load(state, &name)? {
            out.push((name, r));
        }
    }
    Ok(out)
}

fn save(state: &Path, name: &str, r: &Record) -> Result<()> {
    let p = path(state, name);
    let d = dir(state);
    std::fs::create_dir_all(&d).map_err(|e| Error::io("cannot create", &d, e))?;
    let bytes = serde_json::to_vec_pretty(r).expect("a record serialises");
    base::fs::write_replace(&p, &bytes, 0o600, base::fs::Durability::Synced)
        .map_err(|e| Error::io("cannot write", &p, e))
}

/// What `open` did.
#[derive(Clone, Debug)]
pub struct Opened {
    pub number: u64,
    pub url: String,
    pub draft: bool,
    /// `created`, `found`, or `updated` (its text, or out of draft).
    pub outcome: &'static str,
}

/// The request `open` is asked to make.
pub struct Ask<'a> {
    pub name: &'a str,
    pub repo: &'a str,
    pub branch: &'a str,
    pub base: &'a str,
    pub title: &'a str,
    pub body: &'a str,
    /// Open it as a draft (the sandbox is live) unless `ready`.
    pub ready: bool,
}

impl Opened {
    /// The `push --pr --json` record.
    pub fn json(&self, name: &str) -> serde_json::Value {
        serde_json::json!({"type": "pull-request", "name": name, "number": self.number, "url": self.url, "draft": self.draft, "outcome": self.outcome})
    }
}

/// Finds or opens the pull request of `ask`'s branch (the module's
/// protocol); `state` is the root's state directory.
pub fn open(state: &Path, client: &mut Client, ask: &Ask) -> Result<Opened> {
    let d = dir(state);
    std::fs::create_dir_all(&d).map_err(|e| Error::io("cannot create", &d, e))?;
    let lock = d.join(format!("{}.lock", ask.name));
    let _held = base::fs::lock(&lock).map_err(|e| Error::lock(&lock, e))?;
    let mut rec = match load(state, ask.name)? {
        Some(r) if r.repo == ask.repo && r.branch == ask.branch => r,
        _ => Record {
            version: 1,
            repo: ask.repo.into(),
            branch: ask.branch.into(),
            base: ask.base.into(),
            ..Record::default()
        },
    };
    let owner = ask.repo.split('/').next().unwrap_or_default();
    let head = format!("{owner}:{}", ask.branch);
    let listed = match client.list_pulls(ask.repo, &head, "all") {
        Err(e) if status_of(&e) == Some(403) => return Err(no_rights(e, ask)),
        r => r?,
    };
    if let Some(p) = listed.iter().find(|p| p.state == "open") {
        return adopt(state, client, ask, &mut rec, p.clone());
    }
    if let Some(p) = listed.first() {
        let how = if p.merged { "merged" } else { "closed" };
        return Err(Error::data(format!(
            "pull request {}#{} for branch '{}' is {how}, and loopwright opens no second one for the same branch: reopen it on GitHub{}, or push the work on a new branch (lw-sandbox create with another --branch)",
            ask.repo,
            p.number,
            ask.branch,
            if p.merged {
                " (a merged one cannot be)"
            } else {
                ""
            }
        )));
    }
    rec.pending = Some(base::time::now_ms());
    rec.base = ask.base.into();
    save(state, ask.name, &rec)?;
    let new = NewPull {
        title: ask.title,
        body: ask.body,
        head: &head,
        base: ask.base,
        draft: !ask.ready,
    };
    let made = client.create_pull(ask.repo, &new, &mut |_| Ok(()));
    let p = match made {
        Ok(PullWrite::Done(p)) => *p,
        Ok(PullWrite::Unknown(why)) => reconcile(client, ask, &head, &why)?,
        Err(e) if status_of(&e) == Some(422) && already_exists(&e) => reconcile(
            client,
            ask,
            &head,
            "GitHub answered that one already exists",
        )?,
        Err(e) if status_of(&e) == Some(422) => return Err(refused_create(e, ask)),
        Err(e) if status_of(&e) == Some(403) => return Err(no_rights(e, ask)),
        Err(e) => return Err(e),
    };
    rec.learn(p.number);
    save(state, ask.name, &rec)?;
    Ok(Opened {
        number: p.number,
        url: p.html_url,
        draft: p.draft,
        outcome: "created",
    })
}

fn already_exists(e: &Error) -> bool {
    // GitHub's only signal is the message of its validation error; the
    // status (422) is matched first, the wording only tells this 422 from
    // the others.
    e.msg.contains("already exists")
        || answer_of(e).is_some_and(|a| a.message.contains("already exists"))
}

/// After a create whose outcome is unknown: the open pull request of the
/// head, listed; else 75 with the intent kept.
fn reconcile(client: &mut Client, ask: &Ask, head: &str, why: &str) -> Result<Pull> {
    let listed = client.list_pulls(ask.repo, head, "open")?;
    listed.into_iter().next().ok_or_else(|| {
        Error::new(
            Exit::TempFail,
            format!(
                "the pull request for branch '{}' on {} may not have been made ({why}); run the push again: it lists before it creates, so it never makes two",
                ask.branch, ask.repo
            ),
        )
    })
}

fn refused_create(e: Error, ask: &Ask) -> Error {
    // GitHub's detail, after the request's own words (which name the
    // branches, and a branch may be called `database`): its phrases hold
    // spaces, which no branch name does.
    let detail = e.to_string();
    let fix = if detail.contains("No commits between") {
        format!(
            "branch '{}' has no commits beyond '{}' (already merged?): nothing to review; commit work on it and push again",
            ask.branch, ask.base
        )
    } else if detail.contains(": base invalid") || detail.contains("; base invalid") {
        format!(
            "branch '{}' does not exist on {}: push it there first, or name another base with sandbox.pr-base in .loopwright/config",
            ask.base, ask.repo
        )
    } else {
        "see GitHub's answer".to_string()
    };
    Error::new(
        Exit::DataErr,
        format!(
            "cannot open a pull request for branch '{}': {fix}",
            ask.branch
        ),
    )
    .with_source(answer_of(&e).cloned().unwrap_or(crate::github::Answer {
        status: 422,
        message: detail,
    }))
}

fn no_rights(e: Error, ask: &Ask) -> Error {
    Error::new(
        Exit::NoPerm,
        format!(
            "the token may not open pull requests on {}: give it \"Pull requests: write\" (fine-grained) or the repo scope (classic), then push again with --pr; the branch '{}' is pushed",
            ask.repo, ask.branch
        ),
    )
    .with_source(answer_of(&e).cloned().unwrap_or(crate::github::Answer {
        status: 403,
        message: e.msg.clone(),
    }))
}

/// An open pull request of the branch: recorded, out of draft with
/// `ready`.
fn adopt(
    state: &Path,
    client: &mut Client,
    ask: &Ask,
    rec: &mut Record,
    p: Pull,
) -> Result<Opened> {
    let mut outcome = "found";
    let mut draft = p.draft;
    if rec.number != Some(p.number) || rec.pending.is_some() {
        rec.learn(p.number);
        save(state, ask.name, rec)?;
    }
    if p.title != ask.title || p.body.as_deref().unwrap_or("") != ask.body {
        // Idempotent: a PATCH whose outcome is unknown is sent again by the
        // next push, so it fails nothing here.
        let fields = serde_json::json!({ "title": ask.title, "body": ask.body });
        if let PullWrite::Done(_) =
            client.update_pull(ask.repo, p.number, &fields, &mut |_| Ok(()))?
        {
            outcome = "updated";
        }
    }
    if ask.ready && p.draft {
        match client.mark_ready(ask.repo, &p, &mut |_| Ok(())) {
            Ok(true) => {
                draft = false;
                outcome = "updated";
            }
            Ok(false) => {
                return Err(Error::new(
                    Exit::TempFail,
                    format!(
                        "{}#{}: marking it ready for review had no known outcome; run the push again",
                        ask.repo, p.number
                    ),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Opened {
        number: p.number,
        url: p.html_url,
        draft,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(detail: &str) -> String {
        let ask = Ask {
            name: "m",
            repo: "octo/proj",
            branch: "lw/database",
            base: "main",
            title: "t",
            body: "b",
            ready: false,
        };
        let e = Error::data(format!(
            "GitHub did not accept pull request for octo:lw/database into main: {detail}"
        ));
        refused_create(e, &ask).msg
    }

    #[test]
    fn a_refused_create_is_told_by_githubs_words_not_by_a_branch_named_database() {
        let merged = refused("No commits between main and lw/database");
        assert!(merged.contains("has no commits beyond 'main'"), "{merged}");
        let base = refused("base invalid");
        assert!(
            base.contains("branch 'main' does not exist on octo/proj"),
            "{base}"
        );
        let other = refused("head invalid");
        assert!(other.contains("see GitHub's answer"), "{other}");
    }
}
