//! Sandboxes on the Docker engine: the flow, bad input, posture, runtimes,
//! egress, services, a devcontainer's start.  One binary, a module per suite
//! (its tests run on parallel threads); the storms (sandbox_pr,
//! sandbox_parallel) and the escape suites are binaries of their own.

mod devcontainer_start;
mod egress;
mod sandbox_bad_input;
mod sandbox_egress;
mod sandbox_flow;
mod sandbox_posture;
mod sandbox_runtime;
mod service;
