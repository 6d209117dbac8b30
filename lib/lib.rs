//! loopwright: the product layer behind the `lw-*` commands (sandboxes,
//! images, services, agents, the mirror, sync, doctor, MCP, the radar).
//!
//! One module per concern.  The binaries in `bins/` parse flags and call into
//! these modules; everything that can be tested without a process lives here.
//! It builds on the crates below it, named by their own paths so a reader
//! sees which crate a module lives in: `mailbox::log::Entry` is
//! crates/mailbox/src/log.rs.  `base` (crates/base: errors, cli, fs, time,
//! ids, digests, globs), `mailbox` (messages, Maildirs, the log, the
//! policy, the mediator, the project config), `engine` (crates/engine: the container-engine
//! contract, Docker, Kubernetes) and `confine` (crates/confine: the seccomp
//! filter).  docs/architecture.md draws the layers.

pub mod agent;
pub mod config;
pub mod doctor;
pub mod egress;
pub mod finding;
pub mod git;
pub mod image;
pub mod init;
pub mod mirror;
pub mod ports;
pub mod radar;
pub mod sandbox;
pub mod secrets;
pub mod service;
pub mod wall;
