//! Heads: each live sandbox's branch, read cheaply first and fetched only
//! when it moved since the last pass; a head refused once (over a cap,
//! unreadable) is remembered with why, and not fetched again until it
//! changes (issue 46).
//!
//! Cheap, in two steps.  Where the host sees the sandbox's repository (its
//! workspace filesystem, `Live::refs`), the branch's loose ref and its line
//! of `packed-refs` are read as data, beneath a descriptor, no link
//! followed, a few KiB at most: while they are what they were when the
//! head was last read through the transport (and for at most
//! [`HINT_TTL`]), the head is taken as unchanged and nothing is run.  A
//! sandbox that forges them only hides its own branch from the radar for
//! that long, which it could do by not committing.  Otherwise `git
//! ls-remote` over the transport reads the head (one exec, no objects),
//! and only a head that moved is fetched.

use std::collections::HashMap;
use std::path::Path;

use super::{Event, Live, Radar, Refusal, Report, Source, parallel, run};

/// How long an unchanged ref file is taken for an unchanged head.
pub(super) const HINT_TTL: std::time::Duration = std::time::Duration::from_secs(30);
/// Bytes of `packed-refs` read for the hint (a larger one gives none).
const MAX_PACKED_REFS: usize = 1 << 20;

/// What reading one sandbox's head gave.
enum Head {
    /// The head, whether objects were fetched for it, and the ref hint
    /// read just before the transport read it (None: the hint answered).
    Ok(String, bool, Option<String>),
    /// Left out of this pass: the head refused (when known), and why.
    Refused(Option<String>, String),
}

impl Radar {
    /// Reads every live sandbox's head, fetching those that moved; returns
    /// name -> head.  Skipped sandboxes are reported and left out.
    pub(super) fn heads(
        &mut self,
        live: &[Live],
        report: &mut Report,
    ) -> base::Result<HashMap<String, String>> {
        // Heads are read from an empty repository of the radar's own.
        self.bare(&self.dir.join("probe.git"), &[])?;
        let results: Vec<Head> = parallel(live, self.threads, |l| self.head(l));
        let mut heads = HashMap::new();
        for (l, r) in live.iter().zip(results) {
            match r {
                Head::Ok(h, fetched, hint) => {
                    report.fetched += usize::from(fetched);
                    report.heads_read += usize::from(hint.is_some());
                    if let Some(hint) = hint {
                        let at = base::time::now().as_secs();
                        self.state.hints.insert(l.name.clone(), (hint, at));
                    }
                    self.state.refused.remove(&l.name);
                    heads.insert(l.name.clone(), h);
                }
                Head::Refused(head, why) => {
                    if let Some(head) = head {
                        self.state.refused.insert(
                            l.name.clone(),
                            Refusal {
                                head,
                                why: why.clone(),
                            },
                        );
                    }
                    report.events.push(Event::Skipped {
                        name: l.name.clone(),
                        why,
                    });
                }
            }
        }
        // Repositories of sandboxes gone are removed.
        let dir = self.dir.join("sandboxes");
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                let gone = n
                    .strip_suffix(".git")
                    .is_some_and(|n| !live.iter().any(|l| l.name == n));
                if gone {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(heads)
    }

    /// The git command and URL that reach `l`'s repository.
    fn remote(&self, l: &Live, repo: &Path) -> (std::process::Command, String) {
        let mut c = run::git(repo);
        let src = match &l.source {
            Source::Ext(url) => {
                c.args(["-c", "protocol.ext.allow=always"]);
                url.clone()
            }
            Source::Path(p) => {
                c.args(["-c", "protocol.file.allow=always"]);
                p.display().to_string()
            }
        };
        (c, src)
    }

    /// The ref hint of `l` (see the module documentation): its loose ref
    /// and its `packed-refs` line, or None when the host cannot read them.
    fn hint(&self, l: &Live) -> Option<String> {
        use rustix::fs::OFlags;
        use std::io::Read as _;
        let (base, git_dir) = l.refs.as_ref()?;
        let dir = base::fs::open_dir_no_links(base).ok()?;
        let read = |rel: std::path::PathBuf, max: usize| -> Option<Option<Vec<u8>>> {
            let fd = match base::fs::open_beneath(&dir, &rel, OFlags::RDONLY | OFlags::NONBLOCK) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) => return Some(None),
                Err(_) => return None,
            };
            let st = rustix::fs::fstat(&fd).ok()?;
            if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile
            {
                return None;
            }
            let mut buf = Vec::new();
            std::fs::File::from(fd)
                .take(max as u64 + 1)
                .read_to_end(&mut buf)
                .ok()?;
            (buf.len() <= max).then_some(Some(buf))
        };
        let loose = read(git_dir.join("refs/heads").join(&l.branch), 4096)?;
        let packed = read(git_dir.join("packed-refs"), MAX_PACKED_REFS)?;
        let want = format!(" refs/heads/{}", l.branch);
        let line = packed.as_deref().and_then(|p| {
            p.split(|b| *b == b'\n')
                .find(|x| x.ends_with(want.as_bytes()))
                .map(<[u8]>::to_vec)
        });
        if loose.is_none() && line.is_none() {
            return None; // the branch is kept elsewhere (reftable?): no hint
        }
        let show = |b: Option<Vec<u8>>| {
            b.map_or("-".into(), |b| {
                String::from_utf8_lossy(&b).trim().to_string()
            })
        };
        Some(format!("{}|{}", show(loose), show(line)))
    }

    fn head(&self, l: &Live) -> Head {
        let hint = self.hint(l);
        if let (Some(h), Some((old, at)), Some(head)) = (
            &hint,
            self.state.hints.get(&l.name),
            self.state.heads.get(&l.name),
        ) {
            let age = base::time::now().as_secs().saturating_sub(*at);
            if h == old && age < HINT_TTL.as_secs() && self.has_head(l, head) {
                return Head::Ok(head.clone(), false, None);
            }
        }
        let hint = hint.unwrap_or_default();
        // The cheap read: the branch's commit, no objects.
        let (mut c, src) = self.remote(l, &self.dir.join("probe.git"));
        c.args(["ls-remote", "--heads", "--quiet"])
            .arg(&src)
            .arg(format!("refs/heads/{}", l.branch));
        let now = match run::run(c, &self.limits) {
            Err(e) => return Head::Refused(None, format!("ls-remote: {e}")),
            Ok(r) if !r.status.success() => {
                return Head::Refused(
                    None,
                    format!(
                        "cannot read branch '{}': {}",
                        l.branch,
                        base::visible::visible(&crate::git::last_words(&r.stderr))
                    ),
                );
            }
            Ok(r) => String::from_utf8_lossy(&r.stdout)
                .lines()
                .find_map(|x| {
                    let (h, r) = x.split_once('\t')?;
                    (r == format!("refs/heads/{}", l.branch)).then(|| h.to_string())
                })
                .unwrap_or_default(),
        };
        if now.is_empty() {
            return Head::Refused(None, format!("branch '{}' does not exist", l.branch));
        }
        if self.state.heads.get(&l.name) == Some(&now) && self.has_head(l, &now) {
            return Head::Ok(now, false, Some(hint));
        }
        if let Some(r) = self.state.refused.get(&l.name).filter(|r| r.head == now) {
            return Head::Refused(
                Some(now),
                format!("{} (at this head before: not fetched again)", r.why),
            );
        }
        match self.fetch(l, &src) {
            Ok(h) => Head::Ok(h, true, Some(hint)),
            Err(why) => Head::Refused(Some(now), why),
        }
    }

    /// Whether `l`'s repository holds `head` as its fetched head.
    fn has_head(&self, l: &Live, head: &str) -> bool {
        let p = self.sandbox_repo(&l.name).join("refs/radar/head");
        std::fs::read_to_string(p).is_ok_and(|s| s.trim() == head)
    }

    /// Fetches `l`'s branch; its head, or why it is refused (what was
    /// fetched then is not kept).
    fn fetch(&self, l: &Live, src: &str) -> Result<String, String> {
        let repo = self.sandbox_repo(&l.name);
        self.bare(&repo, &self.mirror_objects())
            .map_err(|e| e.to_string())?;
        let before = base::fs::tree_size(&repo.join("objects"));
        let old = std::fs::read_to_string(repo.join("refs/radar/head"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| s.len() >= 40);
        let (mut c, _) = self.remote(l, &repo);
        c.args(["-c", "fetch.unpackLimit=1"]);
        crate::git::fetch_untrusted(&mut c)
            .arg(src)
            .arg(format!("+refs/heads/{}:refs/radar/head", l.branch));
        let refuse = |why: String| {
            let _ = std::fs::remove_dir_all(&repo);
            Err(why)
        };
        let r = match run::run(c, &self.limits) {
            Ok(r) => r,
            Err(e) => return refuse(format!("fetch: {e}")),
        };
        if !r.status.success() {
            return refuse(format!(
                "cannot fetch branch '{}': {}",
                l.branch,
                base::visible::visible(&crate::git::last_words(&r.stderr))
            ));
        }
        // What this fetch brought, packed.
        let size = base::fs::tree_size(&repo.join("objects")).saturating_sub(before);
        if size > self.limits.fetch {
            return refuse(format!(
                "branch '{}' brought {size} bytes of objects; the cap is {}",
                l.branch, self.limits.fetch
            ));
        }
        // And no new blob larger than the cap once inflated (a compression
        // bomb), read from the objects' headers before any blob is.
        if let Err(why) = self.blob_sizes(&repo, old.as_deref()) {
            return refuse(format!("branch '{}': {why}", l.branch));
        }
        let mut c = run::git(&repo);
        c.args([
            "rev-parse",
            "--verify",
            "--quiet",
            "refs/radar/head^{commit}",
        ]);
        let r = run::run(c, &self.limits).map_err(|e| format!("rev-parse: {e}"))?;
        let h = String::from_utf8_lossy(&r.stdout).trim().to_string();
        if !r.status.success() || h.len() < 40 {
            return refuse(format!("branch '{}' names no commit", l.branch));
        }
        self.tidy(&repo);
        Ok(h)
    }

    /// Err when a blob new in `repo` (not the mirror's, not reachable from
    /// `old`) is larger than the size cap uncompressed.
    fn blob_sizes(&self, repo: &Path, old: Option<&str>) -> Result<(), String> {
        let mut c = run::git(repo);
        c.args([
            "rev-list",
            "--objects",
            "--filter-print-omitted",
            &format!(
                "--filter=blob:limit={}",
                self.limits.fetch.saturating_add(1)
            ),
            "refs/radar/head",
            "--not",
            "--alternate-refs",
        ]);
        if let Some(o) = old {
            c.arg(o);
        }
        let r = run::run(c, &self.limits).map_err(|e| format!("rev-list: {e}"))?;
        if !r.status.success() {
            return Err(format!(
                "rev-list: {}",
                base::visible::visible(&crate::git::last_words(&r.stderr))
            ));
        }
        match r
            .stdout
            .split(|b| *b == b'\n')
            .find(|l| l.starts_with(b"~"))
        {
            Some(l) => Err(format!(
                "blob {} is over the size cap of {} bytes uncompressed",
                String::from_utf8_lossy(&l[1..]),
                self.limits.fetch
            )),
            None => Ok(()),
        }
    }

    /// Packs a sandbox's repository into one when fetches piled up packs:
    /// only what its head reaches stays (`repack -a -d -l`).
    fn tidy(&self, repo: &Path) {
        let packs = std::fs::read_dir(repo.join("objects/pack"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                    .count()
            })
            .unwrap_or(0);
        if packs > super::MAX_PACKS {
            let mut c = run::git(repo);
            c.args(["repack", "-a", "-d", "-l", "-q"]);
            let _ = run::run(c, &self.limits);
        }
    }
}
