//! Why an engine refused, when a caller acts on the reason rather than only
//! reporting it: a typed cause, set once where the engine's own error is
//! mapped (docker/mod.rs `api_err`), carried as the error's source, and
//! matched by the callers with [`Refusal::of`], so no caller reads an
//! engine's wording.  Its text is the engine's own message, so the error
//! reads as it did: `cannot start container 'c': Bind for 127.0.0.1:8080
//! failed: port is already allocated`.

use std::fmt;

use base::error::Error;

/// A refusal a caller has something to say about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A host port the container publishes is held by something else (a
    /// container's, or any process's on the engine's host); the engine's
    /// message.
    PortTaken(String),
}

impl Refusal {
    /// The refusal `e` carries, if any.
    pub fn of(e: &Error) -> Option<&Refusal> {
        e.source.as_deref()?.downcast_ref::<Refusal>()
    }

    /// The refusal the engine's `message` states, if it is one a caller
    /// acts on.  The one place that reads an engine's wording: Docker says
    /// `port is already allocated` when another container holds the port,
    /// Docker and Podman `address already in use` when any other process
    /// does.
    pub fn in_message(message: &str) -> Option<Refusal> {
        (message.contains("port is already allocated")
            || message.contains("address already in use"))
        .then(|| Refusal::PortTaken(message.to_string()))
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::PortTaken(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Refusal {}
