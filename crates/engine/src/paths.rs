//! Whether an engine sees the host's files: the contract's probe.
//!
//! A sandbox bind-mounts host paths (its mail dir, the mirror, its clone,
//! the in-sandbox tools).  An engine on another machine (a remote
//! `DOCKER_HOST`) resolves those paths on its own side, where they are
//! missing or other files; [`crate::hostpaths`] asks through
//! [`HostPaths`] which case holds.

use std::path::Path;

use crate::Engine;
use base::error::Result;

/// What an engine can tell about the host's paths.
pub trait HostPaths: Engine {
    /// The engine's address as the user gave it (`DOCKER_HOST`).
    fn address(&self) -> String;
    /// The engine's own identity (Docker's daemon ID): stable while the
    /// engine keeps its state, different for another engine.
    fn engine_id(&self) -> Result<String>;
    /// The content of `dir/name` as a container of this engine sees it when
    /// `dir` is bind-mounted into it (read-only; the container is made and
    /// removed, never started), or `None` when the engine finds no such
    /// file there.
    fn read_through_bind(&self, dir: &Path, name: &str) -> Result<Option<Vec<u8>>>;
}
