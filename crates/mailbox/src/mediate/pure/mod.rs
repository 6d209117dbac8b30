//! The mediator's decision, pure as a module: what it decides from
//! (`state`, with the durable `memory` it holds), deciding by policy
//! (`decide`), and the log budget's rules (`rules`).  Nothing here reads
//! the disk, the log or the clock, and no file here names the mediator's
//! shell around it (collect.rs, deliver.rs, budget.rs, memory.rs, keep.rs:
//! they name this): `scripts/shape` holds both, and the table tests over
//! every policy path are beside it (tests.rs).

pub(super) mod decide;
pub(super) mod memory;
pub(super) mod rules;
pub(super) mod state;
#[cfg(test)]
mod tests;
