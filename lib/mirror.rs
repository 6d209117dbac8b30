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

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rustix::fs::{self as rfs, RenameFlags};

use crate::config::{Config, Project};
use crate::error::{Error, Exit, Result};
use crate::git::{self, Remote};
use crate::time;

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
        Some(v) => crate::config::parse_duration(v).ok_or_else(|| {
            Error::new(
                Exit::Config,
                format!(
                    "'{KEY_FRESH} = {v}' in '{}' is not a duration; write e.g. 90s, 5m or 0",
                    p.config
                        .path
                        .as_deref()
                        .unwrap_or(Path::new(crate::config::FILE))
                        .display()
                ),
            )
        }),
    }
}

/// Loose refs a sync leaves before it packs them (see the module docs).
pub const LOOSE_REFS_MAX: usize = 32;

/// The git configuration every mirror carries, and why.
pub const NEVER_PRUNE: &[(&str, &str)] = &[
    // Every ref, as `git clone --mirror` fetches them.
    ("remote.origin.fetch", "+refs/*:refs/*"),
    // A fetch never deletes a ref, whatever the caller's global config says.
    ("remote.origin.prune", "false"),
    ("remote.origin.pruneTags", "false"),
    ("fetch.prune", "false"),
    ("fetch.pruneTags", "false"),
    // No gc or maintenance behind our back: auto gc prunes unreachable
    // objects older than two weeks, which is what a clone may borrow.
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("receive.autoGc", "false"),
    // And if someone runs gc by hand, it still deletes nothing.
    ("gc.pruneExpire", "never"),
    ("gc.reflogExpire", "never"),
    ("gc.reflogExpireUnreachable", "never"),
    // Bare repositories keep no reflogs by default; these keep the old tip
    // of a force-pushed branch reachable.
    ("core.logAllRefUpdates", "always"),
    // Speed: the forced-update check walks history only to print a notice.
    ("fetch.showForcedUpdates", "false"),
    ("advice.fetchShowForcedUpdates", "false"),
];

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
            crate::config::FILE
        )),
        None => Error::usage("no URL to mirror; give one: lw-mirror sync URL"),
    })
}

/// What the state files record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The upstream URL, without credentials.
    pub url: String,
    pub created: Duration,
    /// When the last successful fetch started and finished.
    pub fetch_started: Duration,
    pub fetch_finished: Duration,
}

impl State {
    /// Reads the completion mark ([`STATE`]) and, leniently, the record of
    /// the last fetch ([`FETCHED`]): a lost or torn fetch record only means
    /// that the next sync fetches.
    fn parse(mark: &str, mark_path: &Path, fetched: Option<&str>) -> Result<State> {
        let c = Config::parse(mark, mark_path).map_err(|e| Error::new(Exit::DataErr, e.msg))?;
        let created = c
            .get("created")
            .and_then(time::parse_rfc3339)
            .ok_or_else(|| {
                Error::data(format!("'{}' has no valid 'created'", mark_path.display()))
            })?;
        let mut state = State {
            created,
            ..State::default()
        };
        if let Some(f) = fetched.and_then(|text| Config::parse(text, Path::new(FETCHED)).ok()) {
            let t = |k: &str| f.get(k).and_then(time::parse_rfc3339);
            if let (Some(url), Some(started), Some(finished)) =
                (f.get("url"), t("fetch-started"), t("fetch-finished"))
            {
                state.url = url.to_string();
                state.fetch_started = started;
                state.fetch_finished = finished;
            }
        }
        Ok(state)
    }

    fn render_mark(&self) -> String {
        format!(
            "# written by lw-mirror(1); its presence marks a complete mirror\nversion = 1\ncreated = {}\n",
            time::rfc3339(self.created)
        )
    }

    fn render_fetched(&self) -> String {
        format!(
            "# written by lw-mirror(1) after each successful fetch\nurl = {}\nfetch-started = {}\nfetch-finished = {}\n",
            self.url,
            time::rfc3339(self.fetch_started),
            time::rfc3339(self.fetch_finished)
        )
    }
}

/// What is at the mirror's path.
#[derive(Debug)]
pub enum Found {
    /// Nothing, or an empty directory.
    Absent,
    Ready(State),
    /// A directory that lw-mirror did not make: never touched.
    Foreign,
    /// A mirror whose state or layout is broken, and why.
    Damaged(String),
}

/// What a sync did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Made the mirror.
    Created,
    /// Fetched into it.
    Fetched,
    /// Another sync fetched while this one waited.
    Waited,
    /// The last fetch was recent enough (`--if-older-than`).
    Fresh,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Fetched => "fetched",
            Outcome::Waited => "waited",
            Outcome::Fresh => "fresh",
        }
    }
}

/// How to sync.
pub struct SyncOptions<'a> {
    /// Return at once when the last fetch finished less than this ago.
    pub if_older_than: Option<Duration>,
    /// Show git's progress and notices on stderr.
    pub progress: bool,
    /// The upstream, asked for only when a fetch will happen; gets the URL
    /// the mirror was made from, if it exists.
    pub remote: &'a mut dyn FnMut(Option<&str>) -> Result<Remote>,
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

    /// Looks at what is at the mirror's path, without taking the lock.
    pub fn find(&self) -> Result<Found> {
        let state_path = self.path.join(STATE);
        match fs::read_to_string(&state_path) {
            Ok(text) => {
                let fetched = fs::read_to_string(self.path.join(FETCHED)).ok();
                let state = match State::parse(&text, &state_path, fetched.as_deref()) {
                    Ok(s) => s,
                    Err(e) => return Ok(Found::Damaged(e.msg)),
                };
                for part in ["HEAD", "config", "objects", "refs"] {
                    if !self.path.join(part).exists() {
                        return Ok(Found::Damaged(format!(
                            "'{}' is missing",
                            self.path.join(part).display()
                        )));
                    }
                }
                Ok(Found::Ready(state))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => match fs::read_dir(&self.path) {
                Ok(mut d) => Ok(if d.next().is_none() {
                    Found::Absent
                } else {
                    Found::Foreign
                }),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Found::Absent),
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => {
                    Ok(Found::Foreign)
                }
                Err(e) => Err(Error::io("cannot read", &self.path, e)),
            },
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) => {
                Ok(Found::Foreign)
            }
            Err(e) => Err(Error::io_as(Exit::IoErr, "cannot read", &state_path, e)),
        }
    }

    /// The state of a complete mirror, or an error that says what is wrong.
    pub fn ready(&self) -> Result<State> {
        match self.find()? {
            Found::Ready(s) => Ok(s),
            Found::Absent => Err(Error::new(
                Exit::NoInput,
                format!(
                    "no mirror at '{}'; make it with: lw-mirror sync",
                    self.path.display()
                ),
            )),
            Found::Foreign => Err(Error {
                exit: Exit::NoInput,
                ..self.foreign()
            }),
            Found::Damaged(why) => Err(self.damaged(&why)),
        }
    }

    fn foreign(&self) -> Error {
        Error::new(
            Exit::CantCreat,
            format!(
                "'{}' exists and is not a mirror made by lw-mirror (it has no '{STATE}'); move it away or name another with --mirror",
                self.path.display()
            ),
        )
    }

    fn damaged(&self, why: &str) -> Error {
        Error::new(
            Exit::DataErr,
            format!(
                "the mirror '{}' is damaged: {why}; move it away (mv '{0}' '{0}.damaged') and run lw-mirror sync to rebuild it",
                self.path.display()
            ),
        )
    }

    /// Creates the mirror or fetches into it; see the module documentation.
    pub fn sync(&self, opts: &mut SyncOptions) -> Result<Outcome> {
        let asked = time::now();
        if let Some(max) = opts.if_older_than
            && let Found::Ready(s) = self.find()?
            && asked.saturating_sub(s.fetch_finished) < max
        {
            return Ok(Outcome::Fresh);
        }
        let parent = self.parent();
        fs::create_dir_all(&parent)
            .map_err(|e| Error::io_as(Exit::CantCreat, "cannot create", &parent, e))?;
        let lock_path = self.lock_path();
        let lock_err = |e| Error::lock(&lock_path, e);
        let lock = match crate::fs::try_lock(&lock_path).map_err(lock_err)? {
            Some(held) => held,
            None => {
                if opts.progress {
                    eprintln!(
                        "lw-mirror: waiting for another sync of '{}'",
                        self.path.display()
                    );
                }
                crate::fs::lock(&lock_path).map_err(lock_err)?
            }
        };
        // The lock is held until `lock` is dropped, at the end of this function.
        let outcome = match self.find()? {
            Found::Ready(state) => {
                if state.fetch_started >= asked {
                    Outcome::Waited
                } else if opts
                    .if_older_than
                    .is_some_and(|max| time::now().saturating_sub(state.fetch_finished) < max)
                {
                    Outcome::Fresh
                } else {
                    let remote = (opts.remote)(Some(&state.url))?;
                    self.update(state, &remote, opts.progress)?;
                    Outcome::Fetched
                }
            }
            Found::Absent => {
                let remote = (opts.remote)(None)?;
                self.create(&remote, opts.progress)?;
                Outcome::Created
            }
            Found::Foreign => return Err(self.foreign()),
            Found::Damaged(why) => return Err(self.damaged(&why)),
        };
        drop(lock);
        Ok(outcome)
    }

    fn update(&self, mut state: State, remote: &Remote, progress: bool) -> Result<()> {
        let moved = remote.url != state.url;
        if moved {
            set_config(&self.path, "remote.origin.url", &remote.url)?;
        }
        let started = time::now();
        if let Err(e) = fetch(&self.path, remote, progress) {
            // A URL that does not work is not kept: the mirror stays as it was.
            if moved {
                set_config(&self.path, "remote.origin.url", &state.url)?;
            }
            return Err(e);
        }
        if moved && progress {
            eprintln!(
                "lw-mirror: upstream of '{}' is now '{}'",
                self.path.display(),
                remote.url
            );
        }
        state.url = remote.url.clone();
        state.fetch_started = started;
        state.fetch_finished = time::now();
        write_state(&self.path, &state, false)?;
        if loose_refs(&self.path, LOOSE_REFS_MAX) >= LOOSE_REFS_MAX {
            pack_refs(&self.path);
        }
        Ok(())
    }

    fn create(&self, remote: &Remote, progress: bool) -> Result<()> {
        let parent = self.parent();
        self.remove_leftovers()?;
        let tmp = parent.join(format!("{}{}", self.tmp_prefix(), std::process::id()));
        let res = (|| {
            let out = git::output(
                git::command(None)
                    .args(["init", "--quiet", "--bare", "--template="])
                    .arg(&tmp),
                "create a mirror",
            )?;
            if !out.status.success() {
                return Err(Error::new(
                    Exit::CantCreat,
                    format!(
                        "cannot create '{}': {}",
                        tmp.display(),
                        git::last_words(&out.stderr)
                    ),
                ));
            }
            set_config(&tmp, "remote.origin.url", &remote.url)?;
            for (k, v) in NEVER_PRUNE {
                set_config(&tmp, k, v)?;
            }
            let started = time::now();
            if let Some(head) = remote_head(&tmp, remote)? {
                let out = git::output(
                    git::command(None).arg("--git-dir").arg(&tmp).args([
                        "symbolic-ref",
                        "HEAD",
                        &head,
                    ]),
                    "set HEAD",
                )?;
                if !out.status.success() {
                    return Err(Error::data(format!(
                        "upstream HEAD '{head}' is not a valid ref name: {}",
                        git::last_words(&out.stderr)
                    )));
                }
            }
            fetch(&tmp, remote, progress)?;
            // The reflogs of a fresh fetch only say each ref was created.
            let logs = tmp.join("logs");
            if logs.exists() {
                fs::remove_dir_all(&logs).map_err(|e| Error::io("cannot remove", &logs, e))?;
            }
            pack_refs(&tmp);
            let now = time::now();
            let state = State {
                url: remote.url.clone(),
                created: now,
                fetch_started: started,
                fetch_finished: now,
            };
            write_state(&tmp, &state, true)?;
            // An empty directory at the path (made by hand, or a mount point)
            // is replaced; anything else was refused by `find`.
            let _ = fs::remove_dir(&self.path);
            rfs::renameat_with(rfs::CWD, &tmp, rfs::CWD, &self.path, RenameFlags::NOREPLACE)
                .map_err(|e| {
                    let msg = format!(
                        "cannot rename '{}' to '{}'",
                        tmp.display(),
                        self.path.display()
                    );
                    Error::new(Exit::CantCreat, msg).with_source(io::Error::from(e))
                })?;
            fsync_dir(&parent)
        })();
        if res.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        res
    }

    /// Removes temporary directories left by a killed first sync.  Called
    /// with the lock held, so none of them belongs to a live sync.
    fn remove_leftovers(&self) -> Result<()> {
        let parent = self.parent();
        let prefix = self.tmp_prefix();
        let dir = fs::read_dir(&parent).map_err(|e| Error::io("cannot read", &parent, e))?;
        for entry in dir.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let p = entry.path();
                fs::remove_dir_all(&p).map_err(|e| Error::io("cannot remove", &p, e))?;
            }
        }
        Ok(())
    }

    /// What `lw-mirror status` shows.
    pub fn status(&self) -> Result<Status> {
        let state = self.ready()?;
        let out = git::output(
            git::command(None)
                .arg("--git-dir")
                .arg(&self.path)
                .args(["for-each-ref", "--format=%(refname)"]),
            "list refs",
        )?;
        if !out.status.success() {
            return Err(self.damaged(&git::last_words(&out.stderr)));
        }
        let refs = out
            .stdout
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        let head = fs::read_to_string(self.path.join("HEAD"))
            .ok()
            .and_then(|h| h.strip_prefix("ref: ").map(|r| r.trim().to_string()));
        Ok(Status {
            path: self.path.clone(),
            url: git::redact_url(&state.url),
            head,
            refs,
            size: disk_usage(&self.path)?,
            created: state.created,
            last_fetch: state.fetch_finished,
        })
    }
}

/// The facts `lw-mirror status` prints.
#[derive(Clone, Debug)]
pub struct Status {
    pub path: PathBuf,
    pub url: String,
    pub head: Option<String>,
    pub refs: usize,
    /// Disk usage in bytes (allocated blocks, as du(1) counts).
    pub size: u64,
    pub created: Duration,
    pub last_fetch: Duration,
}

fn set_config(git_dir: &Path, key: &str, value: &str) -> Result<()> {
    let out = git::output(
        git::command(None)
            .arg("--git-dir")
            .arg(git_dir)
            .args(["config", key, value]),
        "configure",
    )?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::new(
            Exit::IoErr,
            format!(
                "cannot set '{key}' in '{}': {}",
                git_dir.display(),
                git::last_words(&out.stderr)
            ),
        ))
    }
}

/// The ref the upstream's HEAD points to, as `git clone --mirror` sets it.
fn remote_head(git_dir: &Path, remote: &Remote) -> Result<Option<String>> {
    let mut cmd = git::command(None);
    cmd.arg("--git-dir")
        .arg(git_dir)
        .args(["ls-remote", "--symref", "origin", "HEAD"]);
    remote.authorize(&mut cmd);
    let out = git::output(&mut cmd, "reach the upstream")?;
    if !out.status.success() {
        return Err(unreachable(remote, &out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().find_map(|l| {
        let (r, name) = l.strip_prefix("ref: ")?.split_once('\t')?;
        (name == "HEAD").then(|| r.to_string())
    }))
}

fn unreachable(remote: &Remote, stderr: &[u8]) -> Error {
    Error::new(
        Exit::Unavailable,
        format!(
            "cannot fetch from '{}': {}",
            remote.url,
            remote.scrub(&git::last_words(stderr))
        ),
    )
}

/// `git fetch origin` into `git_dir`, with progress on stderr when asked.
/// A stale ref lock left by a killed fetch is removed and the fetch retried
/// once; the caller holds the mirror's lock, so no live git owns it.
///
/// A ref that upstream deleted and the mirror keeps can stand in the way of a
/// new upstream ref (`refs/heads/a` kept, `refs/heads/a/b` new: git cannot
/// hold both).  The kept ref is then moved to `refs/lw-mirror/deleted/...`,
/// where it keeps its objects reachable, and the fetch retried.
fn fetch(git_dir: &Path, remote: &Remote, progress: bool) -> Result<()> {
    let mut locks_cleared = false;
    for _ in 0..4 {
        let Some(stderr) = run_fetch(git_dir, remote, progress)? else {
            return Ok(());
        };
        let text = String::from_utf8_lossy(&stderr);
        if text.contains(".lock': File exists") && !locks_cleared {
            locks_cleared = true;
            if remove_stale_locks(git_dir)? > 0 {
                continue;
            }
        }
        let conflicts = ref_conflicts(&text);
        if conflicts.is_empty() {
            return Err(fetch_error(git_dir, remote, &stderr));
        }
        for old in conflicts {
            move_deleted_ref(git_dir, &old, progress)?;
        }
    }
    Err(Error::new(
        Exit::Software,
        format!(
            "cannot fetch into '{}': ref conflicts remain",
            git_dir.display()
        ),
    ))
}

/// How many loose ref files `refs/` holds, counting up to `max`.
pub fn loose_refs(git_dir: &Path, max: usize) -> usize {
    fn walk(dir: &Path, n: &mut usize, max: usize) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            if *n >= max {
                return;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path(), n, max),
                Ok(t) if t.is_file() => *n += 1,
                _ => {}
            }
        }
    }
    let mut n = 0;
    walk(&git_dir.join("refs"), &mut n, max);
    n
}

/// `git pack-refs --all`: every ref into `packed-refs`; objects are not
/// touched.  A failure (another git holds `packed-refs.lock`) is reported
/// and otherwise ignored: the refs stay loose and correct.
fn pack_refs(git_dir: &Path) {
    let res = git::output(
        git::command(None)
            .arg("--git-dir")
            .arg(git_dir)
            .args(["pack-refs", "--all", "--prune"]),
        "pack refs",
    );
    match res {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "lw-mirror: refs of '{}' left loose for the next sync to pack: {}",
            git_dir.display(),
            git::last_words(&out.stderr)
        ),
        Err(e) => eprintln!(
            "lw-mirror: refs of '{}' left loose for the next sync to pack: {e}",
            git_dir.display()
        ),
    }
}

/// Kept refs named in git's `cannot lock ref 'NEW': 'OLD' exists; cannot
/// create 'NEW'` messages.
fn ref_conflicts(stderr: &str) -> Vec<String> {
    let mut old: Vec<String> = stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once("cannot lock ref '")?.1;
            let (_, rest) = rest.split_once("': '")?;
            let (old, _) = rest.split_once("' exists; cannot create '")?;
            old.starts_with("refs/").then(|| old.to_string())
        })
        .collect();
    old.sort();
    old.dedup();
    old
}

/// The prefix under which kept refs that block new upstream refs are moved.
pub const DELETED_PREFIX: &str = "refs/lw-mirror/deleted/";

fn move_deleted_ref(git_dir: &Path, old: &str, progress: bool) -> Result<()> {
    let out = git::output(
        git::command(None).arg("--git-dir").arg(git_dir).args([
            "rev-parse",
            "--verify",
            "--quiet",
            old,
        ]),
        "read a ref",
    )?;
    let oid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || oid.is_empty() {
        return Err(Error::new(
            Exit::Software,
            format!("cannot read '{old}' in '{}'", git_dir.display()),
        ));
    }
    let new = format!(
        "{DELETED_PREFIX}{}",
        old.strip_prefix("refs/").unwrap_or(old)
    );
    let mut child = git::command(None)
        .arg("--git-dir")
        .arg(git_dir)
        .args([
            "update-ref",
            "--stdin",
            "-m",
            "lw-mirror: deleted upstream, moved aside",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot run git update-ref").with_source(e))?;
    let script = format!("start\nupdate {new} {oid}\ndelete {old} {oid}\ncommit\n");
    let write = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes());
    let out = child
        .wait_with_output()
        .map_err(|e| Error::new(Exit::IoErr, "cannot wait for git").with_source(e))?;
    if write.is_err() || !out.status.success() {
        return Err(Error::new(
            Exit::Software,
            format!(
                "cannot move '{old}' to '{new}' in '{}': {}",
                git_dir.display(),
                git::last_words(&out.stderr)
            ),
        ));
    }
    if progress {
        eprintln!("lw-mirror: '{old}' was deleted upstream and blocks a new ref; kept as '{new}'");
    }
    Ok(())
}

/// Runs the fetch; `Some(stderr)` when it failed.
fn run_fetch(git_dir: &Path, remote: &Remote, progress: bool) -> Result<Option<Vec<u8>>> {
    let mut cmd: Command = git::command(None);
    cmd.arg("--git-dir").arg(git_dir).args([
        "fetch",
        "--no-write-fetch-head",
        "--no-auto-maintenance",
    ]);
    cmd.arg(if progress { "--progress" } else { "--quiet" })
        .arg("origin");
    remote.authorize(&mut cmd);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot run git fetch").with_source(e))?;
    let mut pipe = child
        .stderr
        .take()
        .expect("stderr is piped because it was set to Stdio::piped()");
    // Keep what git says for the error message; pass it on when showing progress.
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut term = io::stderr();
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if progress {
                    let _ = term.write_all(&buf[..n]);
                }
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 64 * 1024 {
                    kept.drain(..kept.len() - 32 * 1024);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::new(Exit::IoErr, "cannot wait for git fetch").with_source(e))?;
    Ok(if status.success() { None } else { Some(kept) })
}

fn fetch_error(git_dir: &Path, remote: &Remote, stderr: &[u8]) -> Error {
    let text = String::from_utf8_lossy(stderr);
    let why = remote.scrub(&git::last_words(stderr));
    let local = |exit| {
        Error::new(
            exit,
            format!(
                "cannot fetch from '{}' into '{}': {why}",
                remote.url,
                git_dir.display()
            ),
        )
    };
    if text.contains("No space left") || text.contains("Disk quota") {
        local(Exit::IoErr)
    } else if text.contains(".lock': File exists") {
        local(Exit::TempFail)
    } else {
        unreachable(remote, stderr)
    }
}

/// Removes git lock files (`*.lock`) from the mirror's refs, logs and top.
fn remove_stale_locks(git_dir: &Path) -> Result<usize> {
    fn walk(dir: &Path, n: &mut usize) -> Result<()> {
        let Ok(entries) = fs::read_dir(dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let p = e.path();
            let ft = e
                .file_type()
                .map_err(|err| Error::io("cannot read", &p, err))?;
            if ft.is_dir() {
                walk(&p, n)?;
            } else if p.extension().is_some_and(|x| x == "lock") {
                fs::remove_file(&p).map_err(|err| Error::io("cannot remove", &p, err))?;
                *n += 1;
            }
        }
        Ok(())
    }
    let mut n = 0;
    for top in [
        "HEAD.lock",
        "packed-refs.lock",
        "config.lock",
        "shallow.lock",
    ] {
        let p = git_dir.join(top);
        if fs::remove_file(&p).is_ok() {
            n += 1;
        }
    }
    walk(&git_dir.join("refs"), &mut n)?;
    walk(&git_dir.join("logs"), &mut n)?;
    Ok(n)
}

/// Records a successful fetch in [`FETCHED`]: written to a temporary file
/// and renamed, but not synced, since losing it only costs a fetch.  A new
/// mirror also gets its completion mark [`STATE`], synced with its directory
/// before the mirror is renamed into place.
fn write_state(git_dir: &Path, state: &State, new_mirror: bool) -> Result<()> {
    let write = |name: &str, text: String, sync: bool| {
        let path = git_dir.join(name);
        let durability = if sync {
            crate::fs::Durability::Synced
        } else {
            crate::fs::Durability::Unsynced
        };
        crate::fs::write_replace(&path, text.as_bytes(), 0o644, durability)
            .map_err(|e| Error::io("cannot write", &path, e))
    };
    write(FETCHED, state.render_fetched(), new_mirror)?;
    if new_mirror {
        write(STATE, state.render_mark(), true)?;
        fsync_dir(git_dir)?;
    }
    Ok(())
}

fn fsync_dir(dir: &Path) -> Result<()> {
    crate::fs::sync_dir(dir).map_err(|e| Error::io("cannot sync", dir, e))
}

fn disk_usage(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).map_err(|e| Error::io("cannot read", &d, e))?;
        for e in entries.flatten() {
            let Ok(md) = e.metadata() else { continue };
            total += md.blocks() * 512;
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(total)
}

/// `1.5 MiB`, for people.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn state_round_trips() {
        let s = State {
            url: "https://h/x.git".into(),
            created: Duration::from_secs(1_700_000_000),
            fetch_started: Duration::from_millis(1_700_000_100_250),
            fetch_finished: Duration::from_secs(1_700_000_101),
        };
        assert_eq!(
            State::parse(&s.render_mark(), Path::new("s"), Some(&s.render_fetched())).unwrap(),
            s
        );
        let lost = State {
            created: s.created,
            ..State::default()
        };
        assert_eq!(
            State::parse(&s.render_mark(), Path::new("s"), None).unwrap(),
            lost
        );
        assert_eq!(
            State::parse(&s.render_mark(), Path::new("s"), Some("url = x\n")).unwrap(),
            lost
        );
    }

    #[test]
    fn state_without_times_is_damaged() {
        let e = State::parse("url = x\n", Path::new("s"), None).unwrap_err();
        assert!(e.to_string().contains("no valid 'created'"), "{e}");
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

    #[test]
    fn ref_conflicts_are_read_from_git_messages() {
        let text = "error: cannot lock ref 'refs/heads/a/b': 'refs/heads/a' exists; cannot create 'refs/heads/a/b'\n\
                    error: cannot lock ref 'refs/heads/x': 'refs/heads/x/y' exists; cannot create 'refs/heads/x'\n\
                    error: cannot lock ref 'refs/heads/q': Unable to create lock\n";
        assert_eq!(
            ref_conflicts(text),
            vec!["refs/heads/a".to_string(), "refs/heads/x/y".to_string()]
        );
    }

    #[test]
    fn sizes_for_people() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }
}
