//! Posting one message into a sandbox's outbox: what `lw-post` does and what
//! `lw-mcp`'s `post` tool does, in one place so the two cannot drift.
//!
//! The whole request is checked first (kind, every schema limit, the mailbox
//! directory); only then is the message delivered by the delivery procedure
//! of crates/mailbox/src/maildir/.  When [`post`] returns Ok the message is in
//! `outbox/new/` and on disk; on any error nothing is in `new/` or `tmp/`.

use std::path::{Path, PathBuf};

use crate::layout::{self, SandboxBox};
use crate::message::{self, Kind, Message};
use base::{Error, Exit, Result};

/// What a poster asks for; `to` empty means the mediator.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub kind: String,
    pub subject: String,
    pub body: String,
    pub to: Vec<String>,
    pub refs: Vec<String>,
    pub in_reply_to: Option<String>,
}

/// A message that was posted, and where it sits.
#[derive(Clone, Debug)]
pub struct Posted {
    pub message: Message,
    pub path: PathBuf,
}

/// The kind named `name`, if an agent may post it (bounce is the mediator's).
pub fn postable_kind(name: &str) -> Result<Kind> {
    if Kind::parse(name).is_some_and(|k| !k.postable()) {
        return Err(Error::data(format!(
            "kind '{name}' is the mediator's: agents may not post it; use one of: {}",
            postable_kinds().join(", ")
        )));
    }
    Kind::parse(name).ok_or_else(|| {
        Error::data(format!(
            "unknown kind '{}'; use one of: {}",
            name.escape_debug(),
            postable_kinds().join(", ")
        ))
    })
}

/// The names of the kinds an agent may post, in the spec's order.
pub fn postable_kinds() -> Vec<&'static str> {
    message::KINDS
        .iter()
        .filter(|k| k.postable())
        .map(|k| k.as_str())
        .collect()
}

/// The sender name written into a message: `from`, else `$LW_SANDBOX`, else
/// the mailbox directory's name when it is a valid name, else `sandbox`.
/// Informational only: the mediator uses the outbox's owner.
pub fn sender(mailbox: &Path, from: Option<String>) -> String {
    match from.or_else(|| std::env::var("LW_SANDBOX").ok()) {
        Some(f) => f,
        None => {
            let base = mailbox.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if layout::valid_name(base) {
                base.to_string()
            } else {
                "sandbox".to_string()
            }
        }
    }
}

/// The mailbox a command was given (`--mailbox`, else `LW_MAILBOX`), or the
/// usage error that says how to give one: inside a sandbox `LW_MAILBOX` is
/// set; on the host it must name `ROOT/sandboxes/NAME`.
pub fn mailbox_given(flag: Option<PathBuf>) -> Result<PathBuf> {
    flag.filter(|m| !m.as_os_str().is_empty()).ok_or_else(|| {
        Error::usage(
            "no mailbox: LW_MAILBOX is not set (a sandbox sets it); on the host pass --mailbox ROOT/sandboxes/NAME or set LW_MAILBOX to it",
        )
    })
}

/// Validates `req` completely, then delivers it into `mailbox`'s outbox.
/// A `request` or `handoff` names its recipients: with none it would only
/// reach the mediator and bounce later, so it is refused now (64).
pub fn post(mailbox: &Path, from: &str, req: Request) -> Result<Posted> {
    let kind = postable_kind(&req.kind)?;
    if req.to.is_empty() && matches!(kind, Kind::Request | Kind::Handoff) {
        return Err(Error::usage(format!(
            "a {} needs a recipient: name it with --to NAME (lw-mcp: the `to` argument)",
            kind.as_str()
        )));
    }
    let to = if req.to.is_empty() {
        vec![layout::MEDIATOR.to_string()]
    } else {
        req.to
    };
    let m = Message::compose(
        from,
        to,
        kind,
        req.subject,
        req.body,
        req.refs,
        req.in_reply_to,
    )?;
    if !mailbox.is_dir() {
        return Err(Error::new(
            Exit::CantCreat,
            format!(
                "mailbox '{}' is not a directory; set LW_MAILBOX or --mailbox to the sandbox's mailbox",
                mailbox.display()
            ),
        ));
    }
    let path = SandboxBox::new(mailbox).outbox().deliver_message(&m)?;
    Ok(Posted { message: m, path })
}
