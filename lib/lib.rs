//! loopwright: the product layer behind the `lw-*` commands (sandboxes,
//! images, services, agents, the mirror, sync, doctor, MCP, the radar).
//!
//! One module per concern.  The binaries in `bins/` parse flags and call into
//! these modules; everything that can be tested without a process lives here.
//! It builds on two crates below it, re-exported under the names the code has
//! always used: `mailbox` (crates/mailbox: messages, Maildirs, the log, the
//! policy, the mediator) and `engine` (crates/engine: the container-engine
//! contract, Docker, Kubernetes).  docs/architecture.md draws the layers.

pub mod agent;
pub mod cockpit;
pub mod doctor;
pub mod egress;
pub mod finding;
pub mod github;
pub mod image;
pub mod init;
pub mod mirror;
pub mod ports;
pub mod radar;
pub mod sandbox;
pub mod secrets;
pub mod service;
pub mod sync;
pub mod wall;

pub use confine::seccomp;
pub use engine;
pub use engine::{distribution, tty};
pub use mailbox::{
    batch, bell, cli, config, digest, door_record, error, fs, git, glob, id, inbox, layout, log,
    maildir, mediate, message, operator, policy, post, quarantine, redact, registry, time, visible,
};

pub use error::{Error, Exit, Result};
