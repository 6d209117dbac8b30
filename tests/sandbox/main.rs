//! Sandboxes on the Docker engine: the flow, bad input, posture, runtimes,
//! egress, services, a devcontainer's start.  One binary, a module per suite
//! (its tests run on parallel threads); the storms (sandbox_pr,
//! sandbox_parallel), the escape suites and tests/egress (its race makes
//! networks by the dozen: beside the others it ran Docker out of address
//! pools) are binaries of their own.

mod devcontainer_start;
mod sandbox_bad_input;
mod sandbox_egress;
mod sandbox_flow;
mod sandbox_posture;
mod sandbox_runtime;
mod service;
