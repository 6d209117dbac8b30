//! Two hosts' doors federated through their GitHub peers: forwarding,
//! names, state.  One binary, a module per suite (its tests run on parallel
//! threads).

mod federation;
mod federation_names;
mod federation_state;
