//! loopwright: the library behind the `lw-*` commands.
//!
//! One module per concern.  The binaries in `bins/` parse flags and call into
//! these modules; everything that can be tested without a process lives here.

pub mod agent;
pub mod bell;
pub mod cli;
pub mod cockpit;
pub mod config;
pub mod digest;
pub mod distribution;
pub mod doctor;
pub mod egress;
pub mod engine;
pub mod error;
pub mod finding;
pub mod fs;
pub mod git;
pub mod github;
pub mod glob;
pub mod group;
pub mod id;
pub mod image;
pub mod inbox;
pub mod init;
pub mod layout;
pub mod log;
pub mod maildir;
pub mod mcp;
pub mod mediate;
pub mod message;
pub mod mirror;
pub mod operator;
pub mod policy;
pub mod ports;
pub mod post;
pub mod quarantine;
pub mod radar;
pub mod redact;
pub mod registry;
pub mod sandbox;
pub mod seccomp;
pub mod secrets;
pub mod service;
pub mod sync;
pub mod time;
pub mod tty;
pub mod visible;
pub mod wall;

pub use error::{Error, Exit, Result};
