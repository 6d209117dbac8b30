//! Images: lw-build's cache, layers, mise, projects and engine, lw-init's
//! devcontainer reading, and the busybox-only container lw-post runs in.  One
//! binary, a module per suite (its tests run on parallel threads).

mod build_cache;
mod build_cli;
mod build_engine;
mod build_layers;
mod build_mise;
mod build_project;
mod container;
mod devcontainer;
mod devcontainer_registry;
