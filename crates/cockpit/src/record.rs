//! lw-sandbox's records, read as the page's data: a record that is missing
//! or unreadable is no record (the list then shows the registry's entry),
//! never an error, since lw-sandbox may be writing or removing it.  Below
//! data.rs, diff.rs and live.rs, which all look a sandbox up by name.

use loopwright::sandbox::Record;
use mailbox::layout::Root;

/// lw-sandbox's record of `name` (ROOT/state/sandbox/NAME.json), if any.
pub(super) fn record(root: &Root, name: &str) -> Option<Record> {
    if !base::id::valid_name(name) {
        return None;
    }
    let p = root
        .state_dir()
        .join("sandbox")
        .join(format!("{name}.json"));
    let bytes = std::fs::read(p).ok()?;
    serde_json::from_slice(&bytes).ok()
}
