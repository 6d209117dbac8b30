//! What an operator sees and does besides routing: the held and human
//! queues, answers to questions, the log and the registry as lines or JSON
//! Lines (each object with a `type` field; lw-mediate(1), "OPTIONS").

use std::ffi::OsStr;
use std::io::Write;

use serde::Serialize;

use crate::layout::{self, Root};
use crate::log::{Action, Entry, Log};
use crate::message::{self, Kind, Message};
use crate::registry::Registry;
use base::cli::Report;
use base::error::out_err;
use base::error::{Error, Exit, Result};
use base::visible::visible_line;

/// Writes `v` as one JSON line with `"type": kind` added.
pub fn json_line(out: &mut dyn Write, kind: &str, v: impl Serialize) -> Result<()> {
    let mut v = serde_json::to_value(v)?;
    let mut obj = serde_json::Map::new();
    obj.insert("type".into(), kind.into());
    if let Some(m) = v.as_object_mut() {
        obj.append(m);
    }
    writeln!(out, "{}", serde_json::Value::Object(obj)).map_err(out_err)
}

/// Prints the held queue (`held`) or the human queue: `ID SENDER KIND "SUBJECT" (REASON)`,
/// one space between columns, control characters in the text made visible.
pub fn print_queue(out: &mut dyn Write, root: &Root, held: bool, json: bool) -> Result<()> {
    let log = Log::new(root.log_dir());
    for q in queue(root, &log, held)? {
        if json {
            json_line(out, if held { "held" } else { "question" }, &q)?;
        } else {
            writeln!(
                out,
                "{} {} {} \"{}\" ({})",
                q.id,
                q.sender,
                q.kind,
                visible_line(&q.subject),
                visible_line(&q.reason)
            )
            .map_err(out_err)?;
        }
    }
    Ok(())
}

/// Prints the log, oldest first; entries that cannot be read are reported
/// to `report` and make the result `Exit::DataErr`.
pub fn print_log(out: &mut dyn Write, root: &Root, json: bool, report: Report) -> Result<Exit> {
    let (entries, bad) = Log::new(root.log_dir()).entries()?;
    for e in &entries {
        if json {
            json_line(out, "entry", e)?;
        } else {
            writeln!(out, "{}", format_entry(e)).map_err(out_err)?;
        }
    }
    for b in &bad {
        report(&format!("log entry '{}' skipped: {}", b.name, b.reason));
    }
    Ok(if bad.is_empty() {
        Exit::Ok
    } else {
        Exit::DataErr
    })
}

/// Prints the registry: `NAME BRANCH SCOPE,...` (`-` for none); records
/// that cannot be read are reported to `report` and make it `Exit::DataErr`.
pub fn print_sandboxes(
    out: &mut dyn Write,
    root: &Root,
    json: bool,
    report: Report,
) -> Result<Exit> {
    let (good, bad) = Registry::new(root).list()?;
    for s in &good {
        if json {
            json_line(out, "sandbox", s)?;
        } else {
            let branch = s.branch.as_deref().unwrap_or("-");
            let scope = if s.scope.is_empty() {
                "-".into()
            } else {
                s.scope.join(",")
            };
            writeln!(out, "{} {branch} {scope}", s.name).map_err(out_err)?;
        }
    }
    for b in &bad {
        report(&format!(
            "registry record '{}' skipped: {}",
            b.file, b.reason
        ));
    }
    Ok(if bad.is_empty() {
        Exit::Ok
    } else {
        Exit::DataErr
    })
}

/// One line for a log entry: `ACTION ID SENDER -> TO  KIND SUBJECT  (REASON)`.
pub fn format_entry(e: &Entry) -> String {
    let to = if e.decision.to.is_empty() {
        "-".to_string()
    } else {
        e.decision.to.join(",")
    };
    let (kind, subject) = match &e.message {
        Some(m) => (m.kind.as_str(), m.subject.as_str()),
        None => ("-", ""),
    };
    format!(
        "{} {} {} {} -> {} {} \"{}\" ({})",
        visible_line(&e.logged),
        e.decision.action.as_str(),
        visible_line(&e.message_id),
        visible_line(&e.sender),
        visible_line(&to),
        kind,
        visible_line(subject),
        visible_line(&e.decision.reason)
    )
}

/// Posts a person's answer to question `qid` into `human-outbox`; the
/// mediator routes it to whoever asked.  Returns the answer.
pub fn answer(root: &Root, log: &Log, qid: &str, body: &str) -> Result<Message> {
    if !base::id::is_valid(qid) {
        return Err(Error::usage(format!(
            "'{}' is not a message id",
            qid.escape_debug()
        )));
    }
    let q = log
        .read(OsStr::new(&Entry::name_for(qid, Action::Escalate, None)))
        .or_else(|_| log.read(OsStr::new(&Entry::name_for(qid, Action::Release, None))))
        .map_err(|_| {
            Error::new(
                Exit::NoInput,
                format!("no question {qid} was escalated; see 'lw-mediate human'"),
            )
        })?;
    let subject = q
        .message
        .as_ref()
        .map(|m| m.subject.clone())
        .unwrap_or_default();
    let mut subject = format!("Re: {subject}");
    while subject.len() > message::MAX_SUBJECT {
        subject.pop();
    }
    let m = Message {
        version: message::VERSION,
        id: base::id::new_id(),
        from: layout::HUMAN.into(),
        to: vec![q.sender.clone()],
        kind: Kind::Answer,
        subject,
        body: body.to_string(),
        refs: vec![],
        in_reply_to: Some(qid.to_string()),
        created: base::time::rfc3339(base::time::now()),
    };
    m.validate()?;
    root.human_outbox().deliver_message(&m)?;
    Ok(m)
}

/// A message waiting in the held or human queue, with the reason it is there.
#[derive(Clone, Debug, Serialize)]
pub struct Queued {
    pub id: String,
    pub sender: String,
    pub kind: Kind,
    pub subject: String,
    pub created: String,
    pub reason: String,
}

/// The messages in `held/new/` (`held` true) or `human/new/`, oldest first;
/// entries that cannot be read are listed with their reason as subject.
pub fn queue(root: &Root, log: &Log, held: bool) -> Result<Vec<Queued>> {
    let (dir, action) = if held {
        (root.held(), Action::Hold)
    } else {
        (root.human(), Action::Escalate)
    };
    let entries = match dir.scan(crate::maildir::Sub::New) {
        Ok(e) => e,
        Err(e) if e.exit == Exit::NoInput && !dir.sub(crate::maildir::Sub::New).exists() => {
            return Ok(vec![]);
        }
        Err(e) => return Err(e),
    };
    let mut v = Vec::new();
    for ent in entries {
        let crate::maildir::Found::Message(m) = ent.found else {
            continue;
        };
        let logged = [action, Action::Release, Action::Forward]
            .into_iter()
            .find_map(|a| log.read(OsStr::new(&Entry::name_for(&m.id, a, None))).ok());
        // The logged subject has secret values masked (mailbox-spec.md,
        // "SECRETS AT THE DOOR"); the held copy keeps them.
        let subject = logged
            .as_ref()
            .and_then(|e| e.message.as_ref())
            .map(|l| l.subject.clone())
            .unwrap_or(m.subject);
        let reason = logged.map(|e| e.decision.reason).unwrap_or_default();
        v.push(Queued {
            id: m.id,
            sender: m.from,
            kind: m.kind,
            subject,
            created: m.created,
            reason,
        });
    }
    Ok(v)
}
