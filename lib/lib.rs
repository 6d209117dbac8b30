//! loopwright: the product layer behind the `lw-*` commands: sandboxes,
//! shared services, `lw init` and the doctor.
//!
//! One module per concern.  The binaries in `bins/` parse flags and call into
//! these modules; everything that can be tested without a process lives here.
//! It builds on the crates below it, named by their own paths so a reader
//! sees which crate a module lives in: `mailbox::log::Entry` is
//! crates/mailbox/src/log.rs.  `agent` (crates/agent: the agent kits and
//! the model proxy's sidecar), `wall` (crates/wall: images, egress,
//! hardening, secrets, ports, the product's config keys), `repo`
//! (crates/repo: the git CLI, the mirror, the radar), `sync` (crates/sync:
//! lw-sync, GitHub), `engine` (crates/engine: the container-engine
//! contract, Docker, Kubernetes), `mailbox` (the door), `confine`
//! (crates/confine: the seccomp filter) and `base` (crates/base: errors,
//! cli, fs, time, ids, digests, globs, the config's format).
//! docs/architecture.md draws the layers.

pub mod doctor;
pub mod init;
pub mod sandbox;
pub mod service;
