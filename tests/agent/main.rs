//! Agents in sandboxes: the agent layer, the model proxy, lw-mcp mounted in
//! a sandbox.  One binary, a module per suite (its tests run on parallel
//! threads); agent_cli, a storm of real agent runs, is a binary of its own.

mod agent_layer;
mod mcp_sandbox;
mod model_proxy;
