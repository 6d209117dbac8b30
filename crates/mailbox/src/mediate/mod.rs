//! The mediator: reads every outbox, decides by policy, logs, delivers
//! (mailbox-spec.md, "THE MEDIATOR" and "DECISIONS AND BOUNCES").
//!
//! The sender of a message is the owner of the outbox it sits in
//! (`sandboxes/NAME/outbox`, `human-outbox` for a person, `mediator-outbox`
//! for the mediator's own generated messages, lw-radar's); the `from`
//! field inside the file is overwritten, and a differing one is noted in the
//! decision's reason.
//!
//! Each message goes through three steps, and every step is idempotent:
//!
//! 1. **Log.** The decision is written to the log as `ID.ACTION` (plus
//!    `ID.bounce` for recipients that do not exist) by delivery-once: an
//!    entry of that name is never written twice.  Before deciding, the
//!    mediator looks for an existing decision of the message; if one exists
//!    (a crash came after step 1), it is carried out again instead of taking
//!    a new one, so a restart never decides differently.  Bounce entries are
//!    made durable before the main entry, so a main entry that exists always
//!    comes with its bounce entry.
//! 2. **Deliver.** The copies named by the decision go into inboxes, the
//!    human queue or the held queue, each by delivery-once under the
//!    message's id (a bounce under an id derived from it), so a copy that an
//!    earlier run wrote, or that its reader already moved to `cur/`, is not
//!    written again.
//! 3. **Claim.** The source moves from the outbox's `new/` to its `cur/`.
//!    Once it is there the message is done; until then a restart redoes 1-2,
//!    which write nothing new.
//!
//! Each step finishes durably for a whole batch before the next starts (see
//! crates/mailbox/src/batch.rs), so a SIGKILL at any instant followed by a restart gives
//! each log entry and each inbox copy exactly once.  The claims alone are
//! made durable once per pass (each outbox's `cur/` once, after the last
//! batch): a claim a power cut takes back is step 3 again after 1-2,
//! which write nothing new.  The files of steps 1
//! and 2 are written and fsynced together, in `tmp/`, where nobody reads
//! them; the copies are renamed into view only once the log is durable.
//!
//! The held queue is bounded per sender (`held-max`): a post that would be
//! held beyond it is refused with a quiet bounce, and the first refusal of
//! an episode puts one status message into the human queue.  Hold, drop and
//! refusal entries keep no body; every logged or delivered text has the
//! known secret values masked, and a message carrying one is held
//! (mailbox-spec.md, "THE HELD QUEUE", "SECRETS AT THE DOOR").  Outboxes are
//! served one batch each in turn, so one sender's flood delays nobody else.
//!
//! Files that are not messages are moved to `quarantine/new/QID` after their
//! `QID.quarantine` entry is logged with the reason.  QID is derived from the
//! file's sender, name, inode and ctime, so a restart after a crash between
//! the two steps finds the same entry.  Such files are never opened unless
//! they are regular, singly linked and within the size limit.

// The mediator by concern: the decision, a pure module (pure/: what it
// decides from, deciding by policy, the log budget's rules); looking at an
// entry before trusting it (inspect); taking a batch from the outboxes and
// deciding on each entry, the shell around decide (collect); logging,
// delivering and claiming a batch (deliver); its durable memory on disk
// (memory); the person's queues (queues); what a sender may make it write
// (budget) and keep in the quarantine (keep); the watch loop with its
// locks (watch).  This file holds the mediator's handles and the pass.
mod budget;
mod collect;
mod deliver;
mod inspect;
mod keep;
mod logfile;
mod memory;
mod pure;
mod queues;
mod watch;

pub use budget::refusals_id;
pub use pure::decide::{bounce_id, cap_notice_id, nobody_id};
pub use pure::memory::MAX_REMEMBERED;
pub(crate) use pure::state::mailbox_name;
pub use pure::state::{DEFAULT_LOG_MAX, DEFAULT_QUARANTINE_MAX, State};
pub use watch::{lock_mediator, lock_routes, raise_open_files_limit};

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs as rfs;
use serde::Serialize;

use crate::batch::{self, OpenMaildir};
use crate::layout::{self, Root};
use crate::log::{Action, Entry, Log};
use crate::maildir::escape_name;
use crate::policy::Policy;
use crate::registry::Registry;
use base::error::{Error, Exit, Result, errno_io};

/// Messages per batch: each batch costs three or four sync points, and one
/// fsync of each directory it touched, however many of its messages share
/// it; the outboxes' `cur/` are fsynced once per pass.
pub const DEFAULT_BATCH: usize = 1024;
/// Entries of one outbox a batch takes in a turn before it takes from the
/// next: a message waits behind at most TURN posts of each other sender per
/// turn of its own outbox, and a batch from a thousand outboxes with a few
/// posts each claims into (and fsyncs) a few hundred `cur/`, not all.
pub const TURN: usize = 16;
/// Text a batch holds at most (bodies and subjects, about): a batch of
/// messages near the size limit is cut short, so memory stays bounded.
pub const BATCH_BYTES: usize = 64 << 20;

const LOG: usize = 0;
const HUMAN: usize = 1;
const HELD: usize = 2;
const QUARANTINE: usize = 3;

/// Counts of what a mediator did, for `-v` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub routed: u64,
    pub forwarded: u64,
    pub escalated: u64,
    pub held: u64,
    pub bounced: u64,
    pub quarantined: u64,
    pub receipts: u64,
    pub resumed: u64,
    pub released: u64,
    pub dropped: u64,
    /// Messages left waiting, and outboxes that could not be read, in the
    /// last pass (see `drain`).
    pub waiting: u64,
}

impl Stats {
    /// What happened since `before` was taken.
    fn since(self, before: Stats) -> Stats {
        Stats {
            routed: self.routed - before.routed,
            forwarded: self.forwarded - before.forwarded,
            escalated: self.escalated - before.escalated,
            held: self.held - before.held,
            bounced: self.bounced - before.bounced,
            quarantined: self.quarantined - before.quarantined,
            receipts: self.receipts - before.receipts,
            resumed: self.resumed - before.resumed,
            released: self.released - before.released,
            dropped: self.dropped - before.dropped,
            waiting: self.waiting - before.waiting,
        }
    }
}

/// The open Maildirs of one pass: the fixed ones, then inboxes on demand.
struct Boxes {
    list: Vec<OpenMaildir>,
    inbox: HashMap<String, usize>,
}

/// The mediator: its handles on the root and the log, the policy in
/// force, and the [`State`] it decides from.
pub struct Mediator {
    pub root: Root,
    rootfd: OwnedFd,
    pub log: Log,
    /// `log/new/` of the root, for looking entries up by name.
    log_new: OwnedFd,
    /// Every logged name and where its entry is (log/batch.rs), brought up
    /// to date when a pass or an operator action starts (under the route
    /// lock, so nobody else logs meanwhile).
    index: crate::log::batch::Index,
    pub policy: Policy,
    /// Where the policy comes from.
    policy_file: PolicyFile,
    registry: Registry,
    /// What the mediator decides from (pure/state.rs): the registry as last
    /// read, the memory, the secret values, the log budget.
    pub state: State,
    last_save: Instant,
    /// When `tmp/` directories were last swept (see [`Mediator::sweep_tmp`]).
    last_sweep: Option<Instant>,
    warned: HashSet<String>,
    pub batch: usize,
    pub verbose: bool,
    pub stats: Stats,
    /// How batches are made durable (crates/mailbox/src/batch.rs).
    pub sync: batch::Sync,
    /// Called with a step of a batch (`collected`, `delivered`) and the
    /// outbox directories the batch takes from: tests change the disk there.
    #[doc(hidden)]
    pub batch_hook: Option<BatchHook>,
    /// Inbox owner -> keys of the names in its `cur/` that have their
    /// receipt or never get one (see `take_receipts`).
    receipts_seen: HashMap<String, HashSet<u128>>,
    /// Where warnings and notes go (the command prints them).
    report: Reporter,
}

/// What a mediator reports through: the command's [`base::cli::Report`],
/// owned, since the mediator keeps it.
pub type Reporter = Box<dyn Fn(&str)>;

/// See [`Mediator::batch_hook`].
pub type BatchHook = Box<dyn FnMut(&str, &[PathBuf])>;

/// What tells one version of a file from another: inode, mtime, size.
type Stamp = (u64, i64, i64, u64);

/// The policy file: its path, whether it was named (a missing file is an
/// error then, else the default policy), and the stamp of the version read.
struct PolicyFile {
    path: Option<PathBuf>,
    explicit: bool,
    stamp: Option<Stamp>,
}

impl PolicyFile {
    fn stamp_now(&self) -> Option<Stamp> {
        let p = self.path.as_ref()?;
        let st = rfs::stat(p).ok()?;
        Some((
            st.st_ino,
            st.st_mtime,
            st.st_mtime_nsec as i64,
            st.st_size as u64,
        ))
    }

    /// The policy the file holds now, and its stamp.
    fn load(&self) -> Result<(Policy, Option<Stamp>)> {
        let stamp = self.stamp_now();
        let policy = match (&self.path, stamp) {
            (Some(p), Some(_)) => Policy::load(p)?,
            (Some(p), None) if self.explicit => {
                return Err(Error::new(
                    Exit::NoInput,
                    format!("policy '{}' does not exist", p.display()),
                ));
            }
            _ => Policy::default(),
        };
        Ok((policy, stamp))
    }
}

impl Mediator {
    /// Opens a root.  `policy_path` is the policy file; when `explicit` is
    /// false a missing file means the default policy.  Warnings and notes
    /// (a policy reloaded, a record skipped) go to `report`.
    pub fn open(
        root: Root,
        policy_path: Option<PathBuf>,
        explicit: bool,
        report: Reporter,
    ) -> Result<Mediator> {
        root.init()?;
        // The root's own path is the person's (`--root ../r`, a link to
        // it): opened as given.  Everything beneath it is opened through
        // this descriptor with no link followed (base::fs::open_beneath).
        let rootfd = rustix::fs::open(
            &root.dir,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::io("cannot open", &root.dir, errno_io(e)))?;
        let log_new = base::fs::open_dir_beneath(&rootfd, Path::new("log/new"))
            .map_err(|e| Error::io("cannot open", &root.log_dir().join("new"), errno_io(e)))?;
        let mut policy_file = PolicyFile {
            path: policy_path,
            explicit,
            stamp: None,
        };
        let (policy, stamp) = policy_file.load()?;
        policy_file.stamp = stamp;
        let mut m = Mediator {
            log: Log::new(root.log_dir()),
            registry: Registry::new(&root),
            rootfd,
            log_new,
            index: crate::log::batch::Index::default(),
            root,
            policy,
            policy_file,
            state: State::default(),
            last_save: Instant::now(),
            last_sweep: None,
            warned: HashSet::new(),
            batch: DEFAULT_BATCH,
            verbose: false,
            stats: Stats::default(),
            sync: batch::Sync::default(),
            batch_hook: None,
            receipts_seen: HashMap::new(),
            report,
        };
        m.load_memory();
        Ok(m)
    }

    /// Re-reads the policy when its file changed.  A file with errors is
    /// reported and the previous policy stays in force.
    pub fn reload_policy_if_changed(&mut self) {
        let stamp = self.policy_file.stamp_now();
        if stamp == self.policy_file.stamp {
            return;
        }
        match self.policy_file.load() {
            Ok((policy, stamp)) => {
                self.policy = policy;
                self.policy_file.stamp = stamp;
                (self.report)(&format!(
                    "policy reloaded from {}",
                    self.policy
                        .source
                        .clone()
                        .unwrap_or_else(|| "the built-in default".into())
                ))
            }
            Err(e) => {
                (self.report)(&e.to_string());
                (self.report)("keeping the previous policy");
                self.policy_file.stamp = stamp;
            }
        }
    }

    fn warn_once(&mut self, msg: String) {
        if self.warned.len() < 10_000 && self.warned.insert(msg.clone()) {
            (self.report)(&msg);
        }
    }

    fn refresh_registry(&mut self) -> Result<()> {
        let (good, bad) = self.registry.list()?;
        for b in bad {
            self.warn_once(format!(
                "registry record '{}' skipped: {}",
                b.file, b.reason
            ));
        }
        let state = &mut self.state;
        state.known = good.into_iter().map(|s| (s.name.clone(), s)).collect();
        // A sandbox made since the last pass may hold a secret the door
        // has not looked up yet (crates/mailbox/src/redact/names.rs); one it cannot
        // resolve, or whose value is not the one it was made with
        // (crate::door_record), stops the door (78) rather than let the
        // value through.
        let env = |n: &str| std::env::var_os(n);
        let warnings = state
            .secrets
            .add_recorded(&self.root, state.known.values(), &env)?;
        for w in warnings {
            self.warn_once(w);
        }
        Ok(())
    }

    /// Looks up the logged decision of a message: the main entry and the
    /// bounce entry, either of which may be absent.
    pub fn decision_of(&self, id: &str) -> (Option<Entry>, Option<Entry>) {
        let main = self
            .logged(id, Action::Forward)
            .or_else(|| self.logged(id, Action::Escalate))
            .or_else(|| self.logged(id, Action::Hold));
        (main, self.logged(id, Action::Bounce))
    }

    /// The log entry of message `id` for `action`, if it was logged (and
    /// can be read).
    pub(super) fn logged(&self, id: &str, action: Action) -> Option<Entry> {
        let name = Entry::name_for(id, action, None);
        self.index.read(&self.log_new, &name)?.ok()
    }

    fn count(&mut self, e: &Entry) {
        self.state.charge(e, base::time::now_ms());
        match e.decision.action {
            Action::Forward => self.stats.forwarded += 1,
            Action::Escalate => self.stats.escalated += 1,
            Action::Hold => self.stats.held += 1,
            Action::Bounce => self.stats.bounced += 1,
            Action::Quarantine => self.stats.quarantined += 1,
            Action::Read => self.stats.receipts += 1,
            Action::Release => self.stats.released += 1,
            Action::Drop => self.stats.dropped += 1,
        }
    }

    fn print(&self, out: &mut dyn Write, e: &Entry) -> Result<()> {
        if self.verbose {
            writeln!(out, "{}", crate::operator::format_entry(e)).map_err(base::error::out_err)?;
        }
        Ok(())
    }

    /// One pass over every outbox, the held queue and the inboxes' receipts.
    pub fn pass(&mut self, out: &mut dyn Write) -> Result<Stats> {
        let _routes = lock_routes(&self.root)?;
        self.reload_policy_if_changed();
        self.refresh_registry()?;
        let before = self.stats;
        let mut boxes = self.open_boxes()?;
        self.finish_operator_actions(&mut boxes, out)?;
        self.archive_removed(&mut boxes, out)?;
        self.count_held(&boxes);
        // Batches span outboxes: each takes up to TURN entries of each
        // outbox in turn until it is full, so a flood from one sender keeps
        // another's question waiting behind at most TURN of its posts, and
        // a thousand outboxes with one message each cost a handful of sync
        // points, not a thousand.  A lone message is routed at once:
        // nothing waits for a batch to fill.
        let mut obs: Vec<(String, OpenMaildir)> = Vec::new();
        let mut queues: Vec<(Vec<OsString>, usize)> = Vec::new();
        // Sender -> its posts that wait because its log budget is used up.
        let mut full: HashMap<String, u64> = HashMap::new();
        for (sender, rel) in self.outboxes() {
            match self.open_outbox(&rel) {
                Ok(Some((_, names))) if self.budget_full(&self.state.qualified(&sender)) => {
                    // Not even read: they wait for the next hour.
                    self.stats.waiting += names.len() as u64;
                    full.insert(self.state.qualified(&sender), names.len() as u64);
                }
                Ok(Some((ob, names))) => {
                    obs.push((sender, ob));
                    queues.push((names, 0));
                }
                Ok(None) => {}
                Err(e) => {
                    // One sender's broken outbox never stops the others.
                    self.warn_once(format!("outbox of {sender} skipped: {e}"));
                    self.stats.waiting += 1;
                }
            }
        }
        let mut turn = 0usize;
        let mut later: Vec<(usize, OsString)> = Vec::new();
        // Outboxes (by index in `obs`) with a claim whose `cur/` is not yet
        // fsynced: each once, after the pass's last batch.
        let mut claimed: HashSet<usize> = HashSet::new();
        loop {
            let mut items = std::mem::take(&mut later);
            self.fill_batch(&obs, &mut queues, &mut turn, &mut items, &mut full);
            if items.is_empty() {
                break;
            }
            match self.route_batch(&mut boxes, &obs, &items, &mut claimed, out) {
                Ok(put_off) => later = put_off,
                Err(e) => {
                    // A batch that fails is left where it is; a later pass
                    // carries out what it logged.
                    let mut who: Vec<&str> =
                        items.iter().map(|(k, _)| obs[*k].0.as_str()).collect();
                    who.sort_unstable();
                    who.dedup();
                    self.stats.waiting += who.len() as u64;
                    let who = who.join(", ");
                    self.warn_once(format!("a batch from {who} waits: {e}"));
                }
            }
        }
        self.sync_claims(&obs, &claimed);
        self.take_receipts(&mut boxes, out)?;
        self.tell_full(&mut boxes, &full, out)?;
        self.tell_quarantine_full(&mut boxes, out)?;
        self.log_refusals(&mut boxes, false, out)?;
        self.sweep_tmp();
        if self.state.memory.dirty && self.last_save.elapsed() > Duration::from_secs(2) {
            self.save_memory()?;
        }
        Ok(self.stats.since(before))
    }

    /// Fills `items` up to a batch, taking up to [`TURN`] entries of each
    /// outbox in turn from `turn` on; a sender that went over its log
    /// budget in this pass has the rest of its queue counted as waiting.
    fn fill_batch(
        &mut self,
        obs: &[(String, OpenMaildir)],
        queues: &mut [(Vec<OsString>, usize)],
        turn: &mut usize,
        items: &mut Vec<(usize, OsString)>,
        full: &mut HashMap<String, u64>,
    ) {
        let step = self.batch.max(1);
        let mut idle = 0;
        while items.len() < step && idle < queues.len() {
            let k = *turn;
            *turn = (*turn + 1) % queues.len();
            let (names, at) = &mut queues[k];
            if *at < names.len() && self.budget_full(&self.state.qualified(&obs[k].0)) {
                // Went over its budget in this pass: the rest waits.
                let left = (names.len() - *at) as u64;
                *at = names.len();
                self.stats.waiting += left;
                *full.entry(self.state.qualified(&obs[k].0)).or_default() += left;
                idle += 1;
            } else if *at < names.len() {
                let n = TURN.min(names.len() - *at).min(step - items.len());
                items.extend(names[*at..*at + n].iter().map(|name| (k, name.clone())));
                *at += n;
                idle = 0;
            } else {
                idle += 1;
            }
        }
    }

    /// Makes the pass's claims durable: one fsync of each outbox's `cur/`
    /// that took a claim, after the last batch (mailbox-spec.md,
    /// DURABILITY).  A claim lost to a cut before it is carried out again
    /// from the log, delivering nothing twice; a failure is warned about.
    fn sync_claims(&mut self, obs: &[(String, OpenMaildir)], claimed: &HashSet<usize>) {
        let mut ks: Vec<usize> = claimed.iter().copied().collect();
        ks.sort_unstable();
        let dirs: Vec<(&OwnedFd, PathBuf)> = ks
            .iter()
            .map(|k| (&obs[*k].1.cur, obs[*k].1.path.join("cur")))
            .collect();
        let refs: Vec<(&OwnedFd, &Path)> = dirs.iter().map(|(f, p)| (*f, p.as_path())).collect();
        if let Err(e) = batch::fsync_all(&refs) {
            self.warn_once(format!("claims wait to be made durable: {e}"));
        }
    }

    /// Removes files older than 36 hours from the `tmp/` of every Maildir
    /// under the root (writers killed mid-delivery leave them), at most once
    /// an hour: the first pass of a run, then hourly.
    fn sweep_tmp(&mut self) {
        if self
            .last_sweep
            .is_some_and(|t| t.elapsed() < Duration::from_secs(3600))
        {
            return;
        }
        self.last_sweep = Some(Instant::now());
        // Paths beneath the root's descriptor: a sandbox can replace its
        // `outbox`, `inbox` or their `tmp` with a link to a host directory,
        // and this removes files as root (base::fs::open_beneath).
        let mut dirs: Vec<PathBuf> = [
            "log",
            "human",
            "held",
            "quarantine",
            "human-outbox",
            "mediator-outbox",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        for (s, rel) in self.outboxes() {
            if s != layout::HUMAN && s != layout::MEDIATOR {
                dirs.push(rel);
                dirs.push(Path::new("sandboxes").join(&s).join("inbox"));
            }
        }
        for d in dirs {
            if let Err(e) = crate::maildir::sweep_tmp(&self.rootfd, &d, crate::maildir::TMP_MAX_AGE)
            {
                self.warn_once(format!(
                    "cannot sweep '{}': {e}",
                    self.root.dir.join(&d).join("tmp").display()
                ));
            }
        }
    }

    /// Passes until a pass finds nothing more to do (`--once`).  The
    /// counts are totals, except `waiting`, which is the last pass's: what
    /// is still stuck.
    pub fn drain(&mut self, out: &mut dyn Write) -> Result<Stats> {
        let start = self.stats;
        let last = loop {
            let s = self.pass(out)?;
            if s.routed == 0 && s.quarantined == 0 && s.receipts == 0 {
                break s;
            }
        };
        // What was refused is logged before exiting, not a minute later.
        if !self.state.memory.refused.is_empty() {
            let _routes = lock_routes(&self.root)?;
            let mut boxes = self.open_boxes()?;
            self.log_refusals(&mut boxes, true, out)?;
        }
        self.save_memory()?;
        // `waiting` is what is still stuck after the last pass, not a difference.
        Ok(Stats {
            waiting: last.waiting,
            ..self.stats.since(start)
        })
    }

    /// Every outbox: `(sender, path relative to the root)`, the human's
    /// first, then the mediator's own (the radar's messages).
    fn outboxes(&mut self) -> Vec<(String, PathBuf)> {
        let mut v = vec![
            (layout::HUMAN.to_string(), PathBuf::from("human-outbox")),
            (
                layout::MEDIATOR.to_string(),
                PathBuf::from("mediator-outbox"),
            ),
        ];
        let sdir = self.root.sandboxes_dir();
        let rd = match std::fs::read_dir(&sdir) {
            Ok(rd) => rd,
            Err(e) => {
                self.warn_once(format!("cannot read '{}': {e}", sdir.display()));
                return v;
            }
        };
        let mut names = Vec::new();
        for ent in rd.flatten() {
            let n = ent.file_name();
            // file_type() does not follow links: a link here is never an outbox.
            if !ent.file_type().is_ok_and(|t| t.is_dir()) {
                self.warn_once(format!(
                    "'{}' in '{}' is not a directory (or is a symbolic link); ignored",
                    escape_name(&n),
                    sdir.display()
                ));
                continue;
            }
            match n.to_str() {
                Some(s) if layout::valid_name(s) && s != layout::HUMAN && s != layout::MEDIATOR => {
                    names.push(s.to_string())
                }
                _ => self.warn_once(format!(
                    "'{}' in '{}' is not a sandbox name; ignored",
                    escape_name(&n),
                    sdir.display()
                )),
            }
        }
        names.sort();
        v.extend(names.into_iter().map(|n| {
            let rel = Path::new("sandboxes").join(&n).join("outbox");
            (n, rel)
        }));
        v
    }
}

/// The names in a directory, without `.` and `..`.
fn read_names(fd: &OwnedFd) -> rustix::io::Result<Vec<OsString>> {
    let mut v = Vec::new();
    for ent in rfs::Dir::read_from(fd)? {
        let ent = ent?;
        let n = ent.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        v.push(OsStr::from_bytes(n).to_os_string());
    }
    Ok(v)
}
