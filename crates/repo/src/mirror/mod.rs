//! The local bare mirror every sandbox clones from.
//!
//! Sandboxes clone with `git clone --reference MIRROR` (or alternates): their
//! clones hold no objects of their own for history the mirror has, they
//! borrow them.  A mirror that loses an object therefore corrupts every clone
//! that borrowed it, so the rules here are strict:
//!
//! * **Never prune.**  The mirror is fetched without `--prune`, so a branch
//!   deleted upstream stays in the mirror, and it carries the configuration
//!   in [`NEVER_PRUNE`]: no automatic gc or maintenance, `gc.pruneExpire =
//!   never` and reflogs for every ref that never expire, so that even a `git
//!   gc` run by hand keeps the old tip of a force-pushed branch.
//!
//! * **Created whole or not at all.**  The first sync builds the mirror in
//!   `NAME.tmp-PID` beside it (`git init --bare`, the configuration, a fetch
//!   of every ref, the completion mark [`STATE`]) and renames it into place.  A
//!   directory at the mirror's path is a mirror only if it holds the state
//!   file; the leftovers of a killed first sync are temporary directories,
//!   removed by the next sync before it starts again.
//!
//! * **One fetch at a time.**  A sync holds an exclusive lock on `NAME.lock`
//!   beside the mirror (flock(2), released by the kernel if the process
//!   dies).  A sync that had to wait looks at the state when it gets the
//!   lock: if a fetch started after this sync was asked for, the mirror is
//!   already as fresh as this sync could make it, and it returns.  Several
//!   syncs started together thus make one fetch.  Readers (clones) take no
//!   lock: git updates refs and packs atomically.
//!
//! * **A failed fetch leaves the mirror as it was.**  Git writes objects
//!   before it moves refs; the fetch record is rewritten only after a fetch
//!   succeeded.
//!
//! * **Refs packed, redundant reflogs gone.**  A fetch writes each new or
//!   moved ref as a loose file, and every later git command that reads refs
//!   opens them all; a mirror of git.git would carry thousands.  So, under
//!   the lock, the first sync packs every ref into `packed-refs` and removes
//!   the reflogs of its creation (each records only that its ref was made,
//!   pointing at the ref's own tip, so it keeps nothing reachable), and a
//!   later sync packs again once [`LOOSE_REFS_MAX`] refs are loose.  Packing
//!   moves refs and never touches objects; the reflogs of later updates,
//!   which keep the old tip of a force-pushed branch, stay.  A pack that
//!   fails (another git process holds `packed-refs.lock`) is reported and
//!   left for the next sync: the fetch succeeded.
//!
//! * **Credentials stay out.**  The URL stored in the mirror's config and in
//!   its state has no user name or password; see [`crate::git::Remote`].
//!
//! By file: `state` (what is at the path, the state files, `status`),
//! `sync` (the lock, creation, the fetch into an existing mirror), `fetch`
//! (running git fetch, refs that conflict, stale lock files), `refs`
//! (counting and packing loose refs).

mod fetch;
mod refs;
mod state;
mod sync;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::git::{self, Remote};
use base::config::Project;
use base::error::{Error, Exit, Result};

pub use fetch::DELETED_PREFIX;
pub use refs::{LOOSE_REFS_MAX, loose_refs};
pub use state::{Found, State, Status, human_size};
pub use sync::{NEVER_PRUNE, Outcome, SyncOptions};

/// The mirror's place under the project top when nothing else is configured.
pub const DEFAULT_PATH: &str = ".loopwright/cache/mirror.git";
/// The environment variable that names the mirror.
pub const ENV_PATH: &str = "LW_MIRROR";
/// The configuration key that names the mirror (relative to the project top).
pub const KEY_PATH: &str = "mirror.path";
/// The configuration key that names the upstream URL (default: `origin`'s).
pub const KEY_URL: &str = "mirror.url";
/// The state file inside the mirror; its presence marks a complete mirror.
pub const STATE: &str = "lw-mirror.state";
/// The record of the last successful fetch inside the mirror.
pub const FETCHED: &str = "lw-mirror.fetched";

/// The configuration key for how old a mirror `lw-sandbox create` uses
/// without fetching first (a duration: `90s`, `5m`, `0` to always fetch).
pub const KEY_FRESH: &str = "mirror.fresh-within";
/// The default of [`KEY_FRESH`].
pub const DEFAULT_FRESH: Duration = Duration::from_secs(300);

/// The freshness a new sandbox's base gets, as `lw-sandbox create` asks for
/// it: a mirror whose last fetch finished within this window is used as it
/// is; an older one is fetched (while the container is made and started)
/// before the branch is resolved.  `project`'s [`KEY_FRESH`], else
/// [`DEFAULT_FRESH`].  A value that is not a duration is an error naming
/// the key.
pub fn create_freshness(project: Option<&Project>) -> Result<Duration> {
    let Some(p) = project else {
        return Ok(DEFAULT_FRESH);
    };
    match p.config.get(KEY_FRESH) {
        None => Ok(DEFAULT_FRESH),
        Some(v) => base::config::parse_duration(v).ok_or_else(|| {
            Error::new(
                Exit::Config,
                format!(
                    "'{KEY_FRESH} = {v}' in '{}' is not a duration; write e.g. 90s, 5m or 0",
                    p.config
                        .path
                        .as_deref()
                        .unwrap_or(Path::new(base::config::FILE))
                        .display()
                ),
            )
        }),
    }
}

/// Where the mirror lives: `--mirror` flag, then `$LW_MIRROR`, then the
/// project's `mirror.path`, then `.loopwright/cache/mirror.git`.
pub fn locate(
    flag: Option<&Path>,
    env: Option<&Path>,
    project: Option<&Project>,
    cwd: &Path,
) -> Result<PathBuf> {
    if let Some(p) = flag.or(env).filter(|p| !p.as_os_str().is_empty()) {
        return Ok(if p.is_absolute() {
            p.to_path_buf()
        } else {
            cwd.join(p)
        });
    }
    let Some(project) = project else {
        return Err(Error::usage(format!(
            "'{}' is not inside a git repository; run in the project, or name the mirror with --mirror or ${ENV_PATH}",
            cwd.display()
        )));
    };
    Ok(project.path(project.config.get(KEY_PATH).unwrap_or(DEFAULT_PATH)))
}

/// The upstream when none is given: the project's `mirror.url`, then its
/// `origin`, then the URL the mirror was made from.
pub fn default_remote(
    project: Option<&Project>,
    stored: Option<&str>,
    cwd: &Path,
) -> Result<Remote> {
    if let Some(p) = project {
        if let Some(url) = p.config.get(KEY_URL) {
            return Remote::parse(url, &p.top);
        }
        if let Some(url) = git::origin_url(&p.top, &p.git_dir)? {
            return Remote::parse(&url, &p.top);
        }
    }
    if let Some(url) = stored {
        return Remote::parse(url, cwd);
    }
    Err(match project {
        Some(p) => Error::config(format!(
            "the project '{}' has no remote 'origin' and no '{KEY_URL}' in '{}'; give the URL: lw-mirror sync URL",
            p.top.display(),
            base::config::FILE
        )),
        None => Error::usage("no URL to mirror; give one: lw-mirror sync URL"),
    })
}

/// Makes sure the project's cache is git-ignored even where the project's
/// own `.gitignore` does not say so.
pub fn ignore_cache(project: &Project) -> Result<()> {
    let cache = project.cache();
    fs::create_dir_all(&cache).map_err(|e| Error::io("cannot create", &cache, e))?;
    let ignore = cache.join(".gitignore");
    if !ignore.exists() {
        fs::write(
            &ignore,
            "# written by lw-mirror: everything here is a cache\n*\n",
        )
        .map_err(|e| Error::io("cannot write", &ignore, e))?;
    }
    Ok(())
}

/// A mirror at a path (which may not exist yet).
#[derive(Clone, Debug)]
pub struct Mirror {
    pub path: PathBuf,
}

impl Mirror {
    pub fn new(path: impl Into<PathBuf>) -> Mirror {
        Mirror { path: path.into() }
    }

    fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "mirror".into())
    }

    fn parent(&self) -> PathBuf {
        self.path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"))
    }

    /// The lock file, beside the mirror so that it exists before the mirror does.
    pub fn lock_path(&self) -> PathBuf {
        self.parent().join(format!("{}.lock", self.name()))
    }

    fn tmp_prefix(&self) -> String {
        format!("{}.tmp-", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::config::Config;

    #[test]
    fn create_freshness_defaults_reads_the_key_and_names_a_bad_value() {
        let project = |text: &str| Project {
            top: PathBuf::from("/p"),
            git_dir: PathBuf::from("/p/.git"),
            config: Config::parse(text, Path::new("/p/.loopwright/config")).unwrap(),
        };
        assert_eq!(create_freshness(None).unwrap(), DEFAULT_FRESH);
        assert_eq!(create_freshness(Some(&project(""))).unwrap(), DEFAULT_FRESH);
        let p = project("mirror.fresh-within = 90s\n");
        assert_eq!(create_freshness(Some(&p)).unwrap(), Duration::from_secs(90));
        let p = project("mirror.fresh-within = 0\n");
        assert_eq!(create_freshness(Some(&p)).unwrap(), Duration::ZERO);
        let p = project("mirror.fresh-within = soon\n");
        let e = create_freshness(Some(&p)).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(e.to_string().contains("mirror.fresh-within = soon"), "{e}");
    }

    #[test]
    fn mirror_path_precedence() {
        let cwd = Path::new("/w");
        let p = Project {
            top: "/proj".into(),
            git_dir: "/proj/.git".into(),
            config: Config::parse("mirror.path = m.git\n", Path::new("c")).unwrap(),
        };
        let q = Project {
            top: "/proj".into(),
            git_dir: "/proj/.git".into(),
            config: Config::default(),
        };
        assert_eq!(
            locate(Some(Path::new("f")), Some(Path::new("/e")), Some(&p), cwd).unwrap(),
            Path::new("/w/f")
        );
        assert_eq!(
            locate(None, Some(Path::new("/e")), Some(&p), cwd).unwrap(),
            Path::new("/e")
        );
        assert_eq!(
            locate(None, None, Some(&p), cwd).unwrap(),
            Path::new("/proj/m.git")
        );
        assert_eq!(
            locate(None, None, Some(&q), cwd).unwrap(),
            Path::new("/proj/.loopwright/cache/mirror.git")
        );
        assert_eq!(locate(None, None, None, cwd).unwrap_err().exit, Exit::Usage);
    }
}
