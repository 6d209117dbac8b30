//! The foundations of loopwright, under every other crate: errors and exit
//! statuses, the command line's shared parts, durable files beneath a
//! directory fd, time, ids, digests, what is visible, globs.
//!
//! Nothing here knows a message, a Maildir, a sandbox or an engine: the door
//! (crates/mailbox), lw-confine, the engines and the test peers build on it
//! without building on each other (crates/README.md).

pub mod cli;
pub mod config;
pub mod digest;
pub mod error;
pub mod fs;
pub mod glob;
pub mod id;
pub mod time;
pub mod visible;

pub use error::{Error, Exit, Result};
