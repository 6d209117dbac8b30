//! What a person does from the page: answer a question, release or drop a
//! held message.  These are lw-mediate's operator commands (crates/mailbox/src/operator.rs
//! and the mediator's queue steps), called the same way `lw-mediate answer`,
//! `release` and `drop` call them; the page adds the person's name, so the
//! log says who acted: an answer is signed in its body (the log keeps the
//! routed message whole), a drop's reason names them.

use std::path::PathBuf;

use base::error::{Error, Exit, Result};
use mailbox::layout::Root;
use mailbox::log::{Entry, Log};
use mailbox::mediate::Mediator;
use mailbox::message::{MAX_BODY, Message};
use mailbox::redact::Secrets;

/// Longest name a person gives (`--operator`).
pub(super) const MAX_OPERATOR: usize = 64;

/// Checks the name a person acts under: printable, short, one line.
pub fn check_operator(name: &str) -> Result<()> {
    if name.is_empty()
        || name.chars().count() > MAX_OPERATOR
        || name.chars().any(|c| {
            c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
    {
        return Err(Error::usage(format!(
            "--operator '{}': expected a name of 1 to {MAX_OPERATOR} printable characters",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// The body of an answer as posted: the text, then the person's signature.
pub(super) fn signed(text: &str, operator: &str) -> String {
    format!("{}\n\n-- {operator} (lw-cockpit)", text.trim_end())
}

/// Answers question `qid` as `operator` (see the module documentation).
/// One answer per question: the question must still wait in the human
/// queue, and the first answer claims it (a file made with O_EXCL in
/// `ROOT/state/cockpit/answered/`), so a double click or answers sent at
/// once from two tabs give one answer and 409 for the others.
pub(super) fn answer(root: &Root, qid: &str, text: &str, operator: &str) -> Result<Message> {
    if text.trim().is_empty() {
        return Err(Error::usage("the answer is empty"));
    }
    let body = signed(text, operator);
    if body.len() > MAX_BODY {
        return Err(Error::data(format!(
            "the answer is {} bytes; a message body holds at most {MAX_BODY}",
            body.len()
        )));
    }
    check_id(qid)?;
    let log = Log::new(root.log_dir());
    let waiting = mailbox::operator::queue(root, &log, false)?
        .iter()
        .any(|q| q.id == qid);
    if !waiting {
        return Err(answered(qid));
    }
    let claimed = claim(root, qid)?;
    mailbox::operator::answer(root, &log, qid, &body).inspect_err(|_| {
        // Not answered after all: another answer may be tried.
        let _ = std::fs::remove_file(&claimed);
    })
}

fn answered(qid: &str) -> Error {
    Error::new(
        Exit::TempFail,
        format!("question {qid} is answered already (or no longer waits for a person)"),
    )
}

/// Claims `qid` for one answer (the claim's path); 409 for every claim
/// after the first.
fn claim(root: &Root, qid: &str) -> Result<PathBuf> {
    let dir = root.state_dir().join("cockpit").join("answered");
    root.make_dir(&dir)
        .map_err(|e| Error::io("cannot create", &dir, e))?;
    let path = dir.join(qid);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => Ok(path),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(answered(qid)),
        Err(e) => Err(Error::io("cannot create", &path, e)),
    }
}

/// The policy lw-mediate would use: `path`, else its default path.
pub(super) struct Door {
    pub policy: Option<PathBuf>,
    pub report: super::Notes,
}

impl Door {
    /// The mediator, opened as `lw-mediate release` opens it: the policy
    /// in force and the secret values the door masks.
    fn mediator(&self, root: &Root) -> Result<Mediator> {
        let (p, explicit) = match &self.policy {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(mailbox::policy::DEFAULT_PATH), false),
        };
        let report = self.report.clone();
        let mut m = Mediator::open(
            root.clone(),
            Some(p),
            explicit,
            Box::new(move |l| report(l)),
        )?;
        m.state.secrets = self.secrets(root)?;
        Ok(m)
    }

    /// The secret values the door masks, as `lw-mediate` loads them.
    pub(super) fn secrets(&self, root: &Root) -> Result<Secrets> {
        let env = |n: &str| std::env::var_os(n);
        let here = std::env::current_dir().unwrap_or_default();
        let (mut s, mut warnings): (Secrets, _) = Secrets::for_root(root, &here, &env)?;
        warnings.extend(s.add_env(&["GH_TOKEN".into(), "GITHUB_TOKEN".into()], &env));
        for w in warnings {
            (self.report)(&format!("warning: {w}"));
        }
        Ok(s)
    }

    /// Releases held message `id`.
    pub(super) fn release(&self, root: &Root, id: &str) -> Result<Entry> {
        check_id(id)?;
        self.mediator(root)?.release(id, &mut std::io::sink())
    }

    /// Drops held message `id`; the log's reason names the person.
    pub(super) fn drop_held(
        &self,
        root: &Root,
        id: &str,
        reason: &str,
        operator: &str,
    ) -> Result<Entry> {
        check_id(id)?;
        let reason = if reason.trim().is_empty() {
            "no reason given"
        } else {
            reason.trim()
        };
        let why = format!("{reason} (by {operator}, lw-cockpit)");
        self.mediator(root)?
            .drop_held(id, &why, &mut std::io::sink())
    }
}

fn check_id(id: &str) -> Result<()> {
    if base::id::is_valid(id) {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "'{}' is not a message id",
            id.escape_debug()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_names_are_one_printable_line() {
        assert!(check_operator("Ada Lovelace").is_ok());
        for bad in ["", "a\nb", "x\u{1b}[2J", "evil\u{202e}txt", &"n".repeat(65)] {
            assert!(check_operator(bad).is_err(), "{bad:?}");
        }
        assert_eq!(signed("yes  \n", "ada"), "yes\n\n-- ada (lw-cockpit)");
    }
}
