//! What `lw-sandbox push` last put upstream for each sandbox:
//! `ROOT/state/pushed/NAME.json` (the branch and its commit), replaced
//! whole through `fs::write_replace` (fsynced) after the push succeeded.
//! lw-sync reads it to put the radar's commit status on the head GitHub
//! has (crates/sync/src/status.rs): a commit that was never pushed would be
//! refused (422), and a new push moves the status to the new head.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use base::error::{Error, Result};

/// `ROOT/state/pushed/NAME.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pushed {
    /// The sandbox (the file's name, not stored in it).
    #[serde(skip)]
    pub name: String,
    pub version: u32,
    pub branch: String,
    /// The commit the upstream's branch was set to.
    pub commit: String,
    /// When (RFC 3339 UTC).
    #[serde(default)]
    pub at: String,
}

pub fn dir(state: &Path) -> PathBuf {
    state.join("pushed")
}

/// Records that `branch` of sandbox `name` is `commit` upstream now.
pub fn record(state: &Path, name: &str, branch: &str, commit: &str) -> Result<()> {
    let d = dir(state);
    std::fs::create_dir_all(&d).map_err(|e| Error::io("cannot create", &d, e))?;
    let p = d.join(format!("{name}.json"));
    let rec = Pushed {
        name: name.into(),
        version: 1,
        branch: branch.into(),
        commit: commit.into(),
        at: base::time::rfc3339(base::time::now()),
    };
    let bytes = serde_json::to_vec_pretty(&rec).expect("a record serialises");
    base::fs::write_replace(&p, &bytes, 0o600, base::fs::Durability::Synced)
        .map_err(|e| Error::io("cannot write", &p, e))
}

/// A record that cannot be read: its path and why.
pub struct Unreadable {
    pub path: PathBuf,
    pub why: String,
}

/// Every sandbox's record, by name; a record that cannot be read is
/// reported in the second list and left out.
pub fn load_all(state: &Path) -> Result<(Vec<Pushed>, Vec<Unreadable>)> {
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for (name, p) in json_names(&dir(state))? {
        match std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Pushed>(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => good.push(Pushed { name, ..r }),
            Err(why) => bad.push(Unreadable { path: p, why }),
        }
    }
    Ok((good, bad))
}

/// The `NAME.json` records in state directory `d` (none when it is
/// missing), by name: a temporary file of `write_replace` (a dot name) is
/// not one.
pub(crate) fn json_names(d: &Path) -> Result<Vec<(String, PathBuf)>> {
    let rd = match std::fs::read_dir(d) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io("cannot read", d, e)),
    };
    let mut out: Vec<(String, PathBuf)> = rd
        .flatten()
        .filter_map(|ent| {
            let f = ent.file_name().to_string_lossy().into_owned();
            let name = f.strip_suffix(".json").filter(|n| !n.starts_with('.'))?;
            Some((name.to_string(), ent.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}
