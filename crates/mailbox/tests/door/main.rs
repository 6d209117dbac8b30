//! The door's tests: lw-post, lw-inbox and lw-mediate, and the mailbox
//! crate under them, as one test binary (each former suite a module).  They
//! need no container engine: `cargo test -p mailbox` runs them alone.

mod mediate_bad_input;
mod mediate_keep;
mod mediate_logged;
mod mediate_man;
mod mediate_operator;
mod mediate_resume;
mod mediate_scale;
mod mediate_spoof;
mod mediate_storm;
mod mediate_twin;
mod post_crash;
mod post_inbox;
