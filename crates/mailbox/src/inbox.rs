//! Reading a sandbox's inbox: what `lw-inbox` does and what `lw-mcp`'s
//! `inbox`, `show`, `ack` and `wait` tools do, in one place.
//!
//! New messages sit in `inbox/new/`, acknowledged ones in `inbox/cur/`; a
//! message's state is the directory it is in (mailbox-spec.md, "CLAIM").

use std::ffi::OsStr;

use crate::maildir::{Found, Maildir, Sub};
use crate::message::Message;
use base::{Error, Exit, Result};

/// `new` for a message in `new/`, `read` for one in `cur/`.
pub fn state(sub: Sub) -> &'static str {
    if sub == Sub::New { "new" } else { "read" }
}

/// Refuses anything that is not a message id, before it becomes a path.
pub fn check_id(id: &str) -> Result<()> {
    if base::id::is_valid(id) {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "'{}' is not a message id (lw-inbox prints ids in its first column)",
            id.escape_debug()
        )))
    }
}

/// The message `id`, new or acknowledged, with its state.
pub fn find(inbox: &Maildir, id: &str) -> Result<(Message, &'static str)> {
    check_id(id)?;
    for sub in [Sub::New, Sub::Cur] {
        match inbox.read(sub, OsStr::new(id)) {
            Found::Message(m) => return Ok((m, state(sub))),
            Found::Gone => continue,
            Found::Bad(r) => {
                return Err(Error::data(format!("message '{id}' cannot be read: {r}")));
            }
            Found::NotFile(w) => {
                return Err(Error::data(format!(
                    "message '{id}' is a {w}, not a regular file"
                )));
            }
        }
    }
    Err(Error::new(
        Exit::NoInput,
        format!("no message '{id}' in '{}'", inbox.path.display()),
    ))
}

/// Acknowledges `id` (moves it from `new/` to `cur/`).  Ok(true) when this
/// call moved it, Ok(false) when it was acknowledged already.
pub fn ack(inbox: &Maildir, id: &str) -> Result<bool> {
    check_id(id)?;
    let claimed = inbox.claim(OsStr::new(id))?;
    if !claimed && !inbox.sub(Sub::Cur).join(id).exists() {
        return Err(Error::new(
            Exit::NoInput,
            format!("no message '{id}' in '{}'", inbox.path.display()),
        ));
    }
    Ok(claimed)
}

/// True when `new/` holds at least one readable message: what a waiter waits
/// for, so that a planted bad file cannot turn it into a busy loop.
pub fn has_message(inbox: &Maildir) -> Result<bool> {
    Ok(inbox
        .names(Sub::New)?
        .iter()
        .any(|n| matches!(inbox.read(Sub::New, n), Found::Message(_))))
}
