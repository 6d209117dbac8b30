//! What lw-confine needs: Docker's seccomp profile for the sandboxes,
//! compiled to a BPF filter and installed before an exec'd command runs
//! (gVisor's runsc gives an exec'd process no filter of its own).
//!
//! A crate of its own because lw-confine is copied into every gVisor
//! sandbox: it links the base crate's errors and nothing else of
//! loopwright's, and is built with the size-optimised `sandbox` profile.

pub mod seccomp;

/// The sandboxes' seccomp profile: Docker's default without io_uring
/// (runtime/seccomp.json, made by scripts/seccomp-profile).
pub const SECCOMP_PROFILE: &str = include_str!("../../../runtime/seccomp.json");
