//! Does the engine see this host's files?  A sandbox bind-mounts host paths
//! (its mail dir, the mirror, its clone, the in-sandbox tools); an engine on
//! another machine resolves them on its own side, where they are missing, so
//! the sandbox would start with an empty mailbox (`lw-post` exits 73) and no
//! clone.  Such an engine gets its sandboxes in volume mode (volume.rs).
//!
//! The probe writes a random nonce in a fresh directory on the host and asks
//! the engine to read it back through a bind mount ([`HostPaths`]).  Its
//! answer is kept per engine in `ROOT/state/engines/ENGINE-ID` (one line,
//! `shared` or `separate`, then the address it was reached at), so `create`
//! pays one `info` request, not a probe container, after the first time.
//! The engine ID is the daemon's own (Docker's `ID`), so pointing
//! `DOCKER_HOST` elsewhere finds another record; `lw doctor` always probes
//! afresh and says when a record disagrees (remove it to re-probe).

use std::path::{Path, PathBuf};

use crate::HostPaths;
use base::error::{Error, Exit, Result};
use base::fs::{Durability, write_replace};
use mailbox::layout::Root;

/// Whether the engine sees the host's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// The engine reads the host's paths: sandboxes bind-mount them.
    Shared,
    /// The engine is elsewhere: bind mounts of host paths would be empty.
    Separate,
}

impl Sharing {
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::Shared => "shared",
            Sharing::Separate => "separate",
        }
    }
    fn parse(s: &str) -> Option<Sharing> {
        match s {
            "shared" => Some(Sharing::Shared),
            "separate" => Some(Sharing::Separate),
            _ => None,
        }
    }
}

/// Probes `engine` now with a nonce written in a new directory under `dir`
/// (removed again).
pub fn probe(engine: &dyn HostPaths, dir: &Path) -> Result<Sharing> {
    let nonce = format!("{:032x}", base::id::random128());
    let probe_dir = dir.join(format!(".lw-probe-{}", &nonce[..16]));
    let io = |what: &str, p: &Path, e: std::io::Error| {
        Error::new(
            Exit::IoErr,
            format!("cannot {what} '{}' for the engine probe: {e}", p.display()),
        )
    };
    std::fs::create_dir_all(&probe_dir).map_err(|e| io("make", &probe_dir, e))?;
    let name = format!("nonce-{}", &nonce[..16]);
    let file = probe_dir.join(&name);
    let seen = std::fs::write(&file, nonce.as_bytes())
        .map_err(|e| io("write", &file, e))
        .and_then(|()| engine.read_through_bind(&probe_dir, &name));
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_dir(&probe_dir);
    Ok(match seen? {
        Some(b) if b == nonce.as_bytes() => Sharing::Shared,
        _ => Sharing::Separate,
    })
}

/// Where the answer for engine `id` is kept.
pub fn record_path(root: &Root, id: &str) -> PathBuf {
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    root.state_dir().join("engines").join(safe)
}

/// The kept answer for engine `id`, if any.
pub fn recorded(root: &Root, id: &str) -> Option<Sharing> {
    let text = std::fs::read_to_string(record_path(root, id)).ok()?;
    Sharing::parse(text.lines().next()?.trim())
}

/// The engine's answer, from its record under `root` or probed (under the
/// root's state directory, the tree sandboxes mount) and recorded.
pub fn cached(engine: &dyn HostPaths, root: &Root) -> Result<Sharing> {
    let id = engine.engine_id()?;
    if let Some(s) = recorded(root, &id) {
        return Ok(s);
    }
    let state = root.state_dir();
    root.make_dir(&state).map_err(|e| {
        Error::new(
            Exit::IoErr,
            format!("cannot make '{}': {e}", state.display()),
        )
    })?;
    let s = probe(engine, &state)?;
    let path = record_path(root, &id);
    let write = root
        .make_dir(path.parent().unwrap_or(&state))
        .and_then(|()| {
            write_replace(
                &path,
                format!("{}\n{}\n", s.as_str(), engine.address()).as_bytes(),
                0o600,
                Durability::Unsynced,
            )
        });
    // A record that cannot be written costs a probe next time, nothing more.
    let _ = write;
    Ok(s)
}
