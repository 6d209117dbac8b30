//! Heads: each live sandbox's branch, read cheaply first (`git ls-remote`
//! over the same transport) and fetched only when it moved since the last
//! pass; a head refused once (over a cap, unreadable) is remembered with
//! why, and not fetched again until it changes (issue 46).

use std::collections::HashMap;
use std::path::Path;

use super::{Event, Live, Radar, Refusal, Report, Source, parallel, run};

/// What reading one sandbox's head gave.
enum Head {
    /// The head, and whether objects were fetched for it.
    Ok(String, bool),
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
    ) -> crate::Result<HashMap<String, String>> {
        // Heads are read from an empty repository of the radar's own.
        self.bare(&self.dir.join("probe.git"), &[])?;
        let results: Vec<Head> = parallel(live, self.threads, |l| self.head(l));
        let mut heads = HashMap::new();
        for (l, r) in live.iter().zip(results) {
            match r {
                Head::Ok(h, fetched) => {
                    report.fetched += usize::from(fetched);
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

    fn head(&self, l: &Live) -> Head {
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
                        crate::visible::visible(&crate::git::last_words(&r.stderr))
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
            return Head::Ok(now, false);
        }
        if let Some(r) = self.state.refused.get(&l.name).filter(|r| r.head == now) {
            return Head::Refused(
                Some(now),
                format!("{} (at this head before: not fetched again)", r.why),
            );
        }
        match self.fetch(l, &src) {
            Ok(h) => Head::Ok(h, true),
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
        let before = crate::fs::tree_size(&repo.join("objects"));
        let old = std::fs::read_to_string(repo.join("refs/radar/head"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| s.len() >= 40);
        let (mut c, _) = self.remote(l, &repo);
        c.args([
            "-c",
            "fetch.unpackLimit=1",
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-maintenance",
            "--no-recurse-submodules",
        ])
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
                crate::visible::visible(&crate::git::last_words(&r.stderr))
            ));
        }
        // What this fetch brought, packed.
        let size = crate::fs::tree_size(&repo.join("objects")).saturating_sub(before);
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
                crate::visible::visible(&crate::git::last_words(&r.stderr))
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
