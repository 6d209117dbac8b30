//! The watch loop of `lw-sync --watch`: a pass now, then on every change
//! in the log directory (debounced), on a rescan and every period.

use std::path::Path;

use base::cli::Report;
use base::error::{Error, Exit, Result};

/// Runs `pass` now, then again whenever something is renamed into or
/// created in `dir` (debounced), on a rescan request, and every `period`.
/// A failure that waiting cures is told to `report`; returns when `pass`
/// fails with an error it cannot wait out.
pub fn watch_dir(
    dir: &Path,
    period: std::time::Duration,
    report: Report,
    mut pass: impl FnMut() -> Result<()>,
) -> Result<()> {
    use base::fs::{Watcher, Woke};
    let watcher = Watcher::new().map_err(|e| {
        Error::new(
            Exit::Unavailable,
            format!("cannot start a file watcher on '{}'", dir.display()),
        )
        .with_source(e)
    })?;
    watcher.add(dir).map_err(|e| {
        Error::new(Exit::NoInput, format!("cannot watch '{}'", dir.display())).with_source(e)
    })?;
    loop {
        match pass() {
            Ok(()) => {}
            // Waiting is what a watcher does; the next pass retries.
            Err(e) if matches!(e.exit, Exit::TempFail | Exit::Unavailable) => {
                report(&e.to_string())
            }
            Err(e) => return Err(e),
        }
        // A burst of arrivals wakes one pass (debounced by 200 ms).
        match watcher.wait_settled(Some(period), std::time::Duration::from_millis(200)) {
            Ok(Woke::Timeout | Woke::Changed | Woke::Overflow) => {}
            Ok(Woke::Gone(p)) => {
                return Err(Error::new(
                    Exit::NoInput,
                    format!("the watched directory '{}' was removed", p.display()),
                ));
            }
            Err(e) => {
                return Err(Error::new(
                    Exit::Software,
                    format!("the watcher on '{}' stopped", dir.display()),
                )
                .with_source(e));
            }
        }
    }
}
