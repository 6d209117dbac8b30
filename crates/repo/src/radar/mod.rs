//! The radar: conflicts between live task branches, seen before anyone
//! merges (issue 32; lw-radar(1); mailbox-spec.md, "THE RADAR").
//!
//! A pass:
//!
//! 1. **Heads.**  Each live sandbox's task branch (the branch its record
//!    names, never one the sandbox chooses) is fetched as data into a
//!    host-owned bare repository, `ROOT/state/radar/sandboxes/NAME.git`,
//!    whose objects borrow from the mirror through alternates, so only the
//!    sandbox's new objects travel.  The transport is the one push uses
//!    (`git upload-pack` run *inside* the sandbox through `lw-sandbox
//!    exec`), so the host never runs git in a sandbox's repository;
//!    objects are fsck'd on the way in.  A fetch over the time cap, or
//!    bringing more than the size cap, skips that sandbox for the pass
//!    (`skipped NAME: why`), and its pairs keep their last verdict.
//! 2. **Pairs.**  For every pair of live sandboxes whose heads or scopes
//!    changed since the pair was last computed (and only those: the cost of
//!    a pass after one commit is the pairs of one sandbox), in
//!    `ROOT/state/radar/all.git` (alternates: the mirror and every
//!    sandbox's repository): `git merge-base`, `git merge-tree
//!    --write-tree -z` (the real conflicts, files and kinds; the merged
//!    file's markers give the hunks), and, when the other side declared a
//!    scope, `git diff-tree` from the merge base (the changed paths that
//!    lie in it).  Every git is capped in time and output (radar/run.rs).
//! 3. **News.**  A verdict whose set (conflicted files and kinds, scope
//!    overlaps) differs from the one last announced for the pair makes one
//!    `conflict` message to both sandboxes; a set that became empty makes
//!    one `conflict-cleared`.  Messages go into `ROOT/mediator-outbox/`,
//!    which lw-mediate routes as the mediator's own: policy, log and sync
//!    apply as to any message.
//!
//! State, `ROOT/state/radar.json` (written through `fs::write_replace`):
//! each sandbox's last head, each pair's inputs, verdict and announced
//! set, and the messages decided but not yet delivered.  Those are saved
//! before they are delivered, and delivered under their saved ids after a
//! crash, so a kill at any point neither loses nor repeats an announcement.
//! One pass at a time: `ROOT/state/radar.lock`.

mod attrs;
mod fetch;
mod pair;
pub mod run;
mod tell;
pub mod verdict;

pub use pair::compute_pair;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use base::error::{Error, Exit, Result};
use mailbox::layout::Root;
use mailbox::message::{Kind, Message};
pub use run::Limits;
pub use verdict::{News, Verdict};

pub const STATE_VERSION: u32 = 1;
/// Conflicted files whose hunks are read (each is one more git).
const MAX_HUNK_FILES: usize = 16;
/// Packs a sandbox's repository may pile up before it is repacked.
const MAX_PACKS: usize = 16;

/// Where a sandbox's branch is fetched from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A git URL of the `ext::` transport (push's: `git upload-pack` run
    /// inside the sandbox).
    Ext(String),
    /// A repository on this host that the host trusts (tests and
    /// benchmarks: git runs upload-pack in it).
    Path(PathBuf),
}

/// One live sandbox as the radar sees it.
#[derive(Clone, Debug)]
pub struct Live {
    pub name: String,
    pub branch: String,
    pub scope: Vec<String>,
    pub source: Source,
    /// Where the host sees the sandbox's repository, when it does: a
    /// directory it opens without following links, and the git directory
    /// beneath it.  Its ref files are a hint that the head did not move
    /// (radar/fetch.rs); None: the head is read through `source` each pass.
    pub refs: Option<(PathBuf, PathBuf)>,
}

/// What a pass did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub sandboxes: usize,
    /// Sandboxes whose head changed since the last pass.
    pub heads_changed: usize,
    /// Sandboxes whose head was read through the transport (the others'
    /// ref files showed no change).
    pub heads_read: usize,
    /// Sandboxes whose objects were fetched (their head moved).
    pub fetched: usize,
    pub pairs: usize,
    /// Pairs computed in this pass (the others kept their verdict).
    pub pairs_computed: usize,
    pub conflicts: usize,
    pub cleared: usize,
    pub events: Vec<Event>,
}

/// One line of a pass's report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Event {
    /// A `conflict` or `conflict-cleared` message was put in the mediator's outbox.
    Sent {
        kind: Kind,
        id: String,
        a: String,
        b: String,
        files: Vec<String>,
    },
    /// A sandbox, or a pair, was left out of this pass.
    Skipped { name: String, why: String },
}

/// What `radar.json` keeps of a pair.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct PairState {
    /// Digest of the heads and scopes it was computed from.
    input: String,
    heads: [String; 2],
    base: String,
    verdict: Verdict,
    /// The set last announced (empty: nothing, or cleared).
    announced: Vec<String>,
    /// The id of the last message sent about the pair.
    #[serde(default)]
    last_sent: Option<String>,
    /// Why the pair could not be computed from `input` (it keeps its last
    /// verdict, and is not computed again until its input changes).
    #[serde(default)]
    refused: Option<String>,
}

/// A sandbox's head the radar would not take, and why.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Refusal {
    head: String,
    why: String,
}

#[derive(Default, Serialize, Deserialize)]
struct State {
    version: u32,
    heads: BTreeMap<String, String>,
    /// "A B", A before B by name.
    pairs: BTreeMap<String, PairState>,
    /// Decided, not yet delivered (see the module documentation).
    #[serde(default)]
    outgoing: Vec<Message>,
    /// Heads refused, by sandbox.
    #[serde(default)]
    refused: BTreeMap<String, Refusal>,
    /// Each sandbox's ref hint when its head was last read through the
    /// transport, and when (seconds since the epoch).
    #[serde(default)]
    hints: BTreeMap<String, (String, u64)>,
}

pub struct Radar {
    pub root: Root,
    dir: PathBuf,
    /// The object stores the sandboxes' clones borrow from.
    pub mirrors: Vec<PathBuf>,
    /// The current base (a commit in a mirror): a branch's own changes are
    /// counted from its merge base with it.
    pub upstream: Option<String>,
    pub limits: Limits,
    /// Also address the person (`human`) in every message.
    pub cc_human: bool,
    /// Threads computing pairs and fetching heads.
    pub threads: usize,
    state: State,
}

fn io<'a>(what: &str, p: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    let what = what.to_string();
    move |e| Error::io(&what, p, e)
}

fn pair_key(a: &str, b: &str) -> String {
    format!("{a} {b}")
}

impl Radar {
    /// Opens the radar of a root.  `mirrors` are the object stores the
    /// sandboxes' clones borrow from.  Each pass takes the root's radar
    /// lock for its length (a daemon's sleep holds nothing), waiting for a
    /// pass another process runs, and reads the state afresh under it.
    pub fn open(root: Root, mirrors: Vec<PathBuf>) -> Result<Radar> {
        root.init()?;
        let dir = root.state_dir().join("radar");
        fs::create_dir_all(dir.join("sandboxes")).map_err(io("cannot create", &dir))?;
        Ok(Radar {
            root,
            dir,
            mirrors,
            upstream: None,
            limits: Limits::default(),
            cc_human: false,
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            state: State::default(),
        })
    }

    fn load(&mut self) -> Result<()> {
        let path = self.root.state_dir().join("radar.json");
        self.state = match fs::read(&path) {
            Ok(b) => serde_json::from_slice::<State>(&b)
                .ok()
                .filter(|s| s.version == STATE_VERSION)
                // An unreadable state costs one recomputation and, at worst,
                // one repeated announcement; it never stops the radar.
                .unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(Error::io("cannot read", &path, e)),
        };
        Ok(())
    }

    fn save(&mut self) -> Result<()> {
        self.state.version = STATE_VERSION;
        let path = self.root.state_dir().join("radar.json");
        let mut bytes = serde_json::to_vec_pretty(&self.state)
            .expect("the radar's state serialises because all its fields are plain data");
        bytes.push(b'\n');
        base::fs::write_replace(&path, &bytes, 0o600, base::fs::Durability::Synced)
            .map_err(io("cannot write", &path))
    }

    /// One pass over the live sandboxes (see the module documentation).
    pub fn pass(&mut self, live: &[Live]) -> Result<Report> {
        let lock_path = self.root.state_dir().join("radar.lock");
        let _lock = base::fs::lock(&lock_path).map_err(|e| Error::lock(&lock_path, e))?;
        self.load()?;
        let mut report = Report {
            sandboxes: live.len(),
            ..Report::default()
        };
        // What an earlier pass decided and did not deliver goes first.
        self.deliver_outgoing(&mut report)?;

        let heads = self.heads(live, &mut report)?;
        report.heads_changed = heads
            .iter()
            .filter(|(n, h)| self.state.heads.get(*n) != Some(*h))
            .count();

        let all = self.all_repo(live)?;
        // The current base counts only when all.git has it.
        let upstream = self.upstream.clone().filter(|u| {
            run::git_out(
                &all,
                &self.limits,
                &[],
                &["cat-file", "-e", &format!("{u}^{{commit}}")],
                &[0],
            )
            .is_ok()
        });
        // Pairs of live sandboxes; a skipped sandbox's pairs stay as they were.
        let mut names: Vec<&Live> = live.iter().collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        let mut todo: Vec<(&Live, &Live, String)> = Vec::new();
        let mut keep: Vec<String> = Vec::new();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                report.pairs += 1;
                let key = pair_key(&a.name, &b.name);
                keep.push(key.clone());
                let (Some(ha), Some(hb)) = (heads.get(&a.name), heads.get(&b.name)) else {
                    continue;
                };
                let input = input_digest(ha, hb, &a.scope, &b.scope, upstream.as_deref());
                match self.state.pairs.get(&key) {
                    Some(p) if p.input == input => {
                        if let Some(why) = &p.refused {
                            report.events.push(Event::Skipped {
                                name: key.replace(' ', "+"),
                                why: format!("{why} (at these heads before: not computed again)"),
                            });
                        }
                    }
                    _ => todo.push((a, b, input)),
                }
            }
        }
        self.state.pairs.retain(|k, _| keep.contains(k));
        self.state
            .heads
            .retain(|n, _| live.iter().any(|l| &l.name == n));
        self.state
            .hints
            .retain(|n, _| live.iter().any(|l| &l.name == n));
        for (n, h) in &heads {
            self.state.heads.insert(n.clone(), h.clone());
        }

        let computed = self.compute(&all, &todo, &heads, upstream.as_deref());
        report.pairs_computed = todo.len();
        for ((a, b, input), res) in todo.iter().zip(computed) {
            let key = pair_key(&a.name, &b.name);
            let (base, v) = match res {
                Ok(x) => x,
                Err(why) => {
                    report.events.push(Event::Skipped {
                        name: key.replace(' ', "+"),
                        why: why.clone(),
                    });
                    // Remembered until the input changes; the last verdict stays.
                    let p = self.state.pairs.entry(key).or_default();
                    p.input = input.clone();
                    p.refused = Some(why);
                    continue;
                }
            };
            let hs = [heads[&a.name].clone(), heads[&b.name].clone()];
            self.judge(a, b, key, input.clone(), hs, base, v);
        }
        // Durable before delivered: a crash now delivers these next pass.
        self.save()?;
        self.deliver_outgoing(&mut report)?;
        Ok(report)
    }

    /// Records a pair's new verdict, and decides what to announce against
    /// what was announced last (saved as outgoing, delivered after the save).
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &mut self,
        a: &Live,
        b: &Live,
        key: String,
        input: String,
        hs: [String; 2],
        base: String,
        v: Verdict,
    ) {
        let prev = self.state.pairs.remove(&key).unwrap_or_default();
        let mut announced = prev.announced.clone();
        let mut last_sent = prev.last_sent.clone();
        let m = match verdict::news(&prev.announced, &v) {
            News::Quiet => None,
            News::Conflict => {
                announced = v.key();
                Some(self.conflict_message(a, b, &hs, &base, &v, &prev))
            }
            News::Cleared => {
                announced = vec![];
                Some(self.cleared_message(a, b, &hs, &prev))
            }
        };
        if let Some(m) = m {
            last_sent = Some(m.id.clone());
            self.state.outgoing.push(m);
        }
        self.state.pairs.insert(
            key,
            PairState {
                input,
                heads: hs,
                base,
                verdict: v,
                announced,
                last_sent,
                refused: None,
            },
        );
    }

    /// Delivers the saved outgoing messages into the mediator's outbox,
    /// each once: one already there (new or taken) is not written again.
    fn deliver_outgoing(&mut self, report: &mut Report) -> Result<()> {
        if self.state.outgoing.is_empty() {
            return Ok(());
        }
        let ob = self.root.mediator_outbox();
        for m in &self.state.outgoing {
            let there = [mailbox::maildir::Sub::New, mailbox::maildir::Sub::Cur]
                .iter()
                .any(|s| ob.sub(*s).join(&m.id).exists());
            if !there {
                ob.deliver_message(m)?;
            }
            let (a, b) = (m.to[0].clone(), m.to[1].clone());
            match m.kind {
                Kind::Conflict => report.conflicts += 1,
                _ => report.cleared += 1,
            }
            report.events.push(Event::Sent {
                kind: m.kind,
                id: m.id.clone(),
                a,
                b,
                files: m.refs.clone(),
            });
        }
        self.state.outgoing.clear();
        self.save()
    }

    /// A host-owned bare repository (no hooks: `--template=`), its objects
    /// borrowed from `alternates`.
    fn bare(&self, path: &Path, alternates: &[PathBuf]) -> Result<()> {
        if !path.join("objects").is_dir() {
            let r = run::run(
                {
                    let mut c = crate::git::command(None);
                    c.args(["init", "--quiet", "--bare", "--template="])
                        .arg(path);
                    c
                },
                &Limits::default(),
            )
            .map_err(|e| {
                Error::new(
                    Exit::CantCreat,
                    format!("cannot make '{}': {e}", path.display()),
                )
            })?;
            if !r.status.success() {
                return Err(Error::new(
                    Exit::CantCreat,
                    format!(
                        "cannot make '{}': {}",
                        path.display(),
                        crate::git::last_words(&r.stderr)
                    ),
                ));
            }
        }
        let alt = path.join("objects/info/alternates");
        let text: String = alternates
            .iter()
            .map(|p| format!("{}\n", p.display()))
            .collect();
        if fs::read_to_string(&alt).ok().as_deref() != Some(text.as_str()) {
            fs::create_dir_all(path.join("objects/info")).map_err(io("cannot create", &alt))?;
            base::fs::write_replace(&alt, text.as_bytes(), 0o644, base::fs::Durability::Unsynced)
                .map_err(io("cannot write", &alt))?;
        }
        Ok(())
    }

    fn mirror_objects(&self) -> Vec<PathBuf> {
        self.mirrors.iter().map(|m| m.join("objects")).collect()
    }

    fn sandbox_repo(&self, name: &str) -> PathBuf {
        self.dir.join("sandboxes").join(format!("{name}.git"))
    }

    /// The repository pairs are computed in: it sees the mirror and every
    /// live sandbox's fetched objects.
    fn all_repo(&self, live: &[Live]) -> Result<PathBuf> {
        let all = self.dir.join("all.git");
        let mut alts = self.mirror_objects();
        // A refused sandbox has no repository: not an alternate.
        alts.extend(
            live.iter()
                .map(|l| self.sandbox_repo(&l.name).join("objects"))
                .filter(|p| p.is_dir()),
        );
        self.bare(&all, &alts)?;
        Ok(all)
    }

    /// Computes the pairs of `todo` in parallel: (merge base, verdict) or why not.
    #[allow(clippy::type_complexity)]
    fn compute(
        &self,
        all: &Path,
        todo: &[(&Live, &Live, String)],
        heads: &HashMap<String, String>,
        upstream: Option<&str>,
    ) -> Vec<std::result::Result<(String, Verdict), String>> {
        parallel(todo, self.threads, |(a, b, _)| {
            compute_pair(
                all,
                &self.limits,
                (a, b),
                (&heads[&a.name], &heads[&b.name]),
                upstream,
            )
        })
    }
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn fit(s: &mut String, max: usize) {
    while s.len() > max {
        s.pop();
    }
}

fn input_digest(ha: &str, hb: &str, sa: &[String], sb: &[String], up: Option<&str>) -> String {
    let v = match up {
        // Without a base, the digest of earlier versions.
        None => serde_json::json!([ha, hb, sa, sb]),
        Some(u) => serde_json::json!([ha, hb, sa, sb, u]),
    };
    base::digest::hex(&Sha256::digest(v.to_string().as_bytes())[..16])
}

/// Runs `f` over `items` on `threads` threads; results in order.
fn parallel<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= items.len() {
                        break;
                    }
                    let r = f(&items[i]);
                    out.lock().expect("no thread panics holding the results")[i] = Some(r);
                }
            });
        }
    });
    out.into_inner()
        .expect("no thread panics holding the results")
        .into_iter()
        .map(|r| r.expect("every item was computed"))
        .collect()
}
