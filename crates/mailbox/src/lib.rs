//! The door of loopwright: messages, Maildirs, the root's layout, the log,
//! the policy and the mediator, with the config and the git CLI they read.
//! The foundations they stand on (errors and exit statuses, ids, time,
//! durable files, digests, globs) are the `base` crate's.
//!
//! lw-post, lw-inbox and lw-mediate depend on this crate alone, so it never
//! links an async runtime, a container engine's client, an HTTP client or
//! the MCP server: its dependencies are base, clap, rustix, serde, sha2 and
//! the Unicode tables.  The engine crate and the product crate build on it;
//! nothing here can name them (docs/architecture.md draws the layers).

pub mod batch;
pub mod bell;
pub mod config;
pub mod door_record;
pub mod inbox;
pub mod layout;
pub mod log;
pub mod maildir;
pub mod mediate;
pub mod message;
pub mod operator;
pub mod policy;
pub mod post;
pub mod quarantine;
pub mod redact;
pub mod registry;
pub mod ring;
pub mod text;
