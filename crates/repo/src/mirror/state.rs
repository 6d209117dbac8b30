//! What is at a mirror's path (absent, ready, foreign, damaged), its state
//! files (the completion mark and the record of the last fetch, each
//! written whole and synced), and what `lw-mirror status` shows.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{FETCHED, Mirror, STATE};
use crate::git;
use base::config::Config;
use base::error::{Error, Exit, Result};
use base::time;

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
    pub(super) fn parse(mark: &str, mark_path: &Path, fetched: Option<&str>) -> Result<State> {
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

    pub(super) fn render_mark(&self) -> String {
        format!(
            "# written by lw-mirror(1); its presence marks a complete mirror\nversion = 1\ncreated = {}\n",
            time::rfc3339(self.created)
        )
    }

    pub(super) fn render_fetched(&self) -> String {
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

impl Mirror {
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

    pub(super) fn foreign(&self) -> Error {
        Error::new(
            Exit::CantCreat,
            format!(
                "'{}' exists and is not a mirror made by lw-mirror (it has no '{STATE}'); move it away or name another with --mirror",
                self.path.display()
            ),
        )
    }

    pub(super) fn damaged(&self, why: &str) -> Error {
        Error::new(
            Exit::DataErr,
            format!(
                "the mirror '{}' is damaged: {why}; move it away (mv '{0}' '{0}.damaged') and run lw-mirror sync to rebuild it",
                self.path.display()
            ),
        )
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

/// Records a successful fetch in [`FETCHED`]: written to a temporary file
/// and renamed, but not synced, since losing it only costs a fetch.  A new
/// mirror also gets its completion mark [`STATE`], synced with its directory
/// before the mirror is renamed into place.
pub(super) fn write_state(git_dir: &Path, state: &State, new_mirror: bool) -> Result<()> {
    let write = |name: &str, text: String, sync: bool| {
        let path = git_dir.join(name);
        let durability = if sync {
            base::fs::Durability::Synced
        } else {
            base::fs::Durability::Unsynced
        };
        base::fs::write_replace(&path, text.as_bytes(), 0o644, durability)
            .map_err(|e| Error::io("cannot write", &path, e))
    };
    write(FETCHED, state.render_fetched(), new_mirror)?;
    if new_mirror {
        write(STATE, state.render_mark(), true)?;
        fsync_dir(git_dir)?;
    }
    Ok(())
}

pub(super) fn fsync_dir(dir: &Path) -> Result<()> {
    base::fs::sync_dir(dir).map_err(|e| Error::io("cannot sync", dir, e))
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn sizes_for_people() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }
}
