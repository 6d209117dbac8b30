//! The mediator: reads every outbox, decides by policy, logs, delivers
//! (mailbox-spec.md, "THE MEDIATOR" and "DECISIONS AND BOUNCES").
//!
//! The sender of a message is the owner of the outbox it sits in
//! (`sandboxes/NAME/outbox`, or `human-outbox` for a person); the `from`
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
//! lib/group.rs), so a SIGKILL at any instant followed by a restart gives
//! each log entry and each inbox copy exactly once.
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

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io::{Read as _, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::digest::hex;
use crate::error::{Error, Exit, Result, errno_io};
use crate::group::{self, Box3, Group, open_dir_at};
use crate::layout::{self, Root};
use crate::log::{Action, Decision, Entry, LOG_VERSION, Log};
use crate::maildir::escape_name;
use crate::message::{self, Kind, Message};
use crate::policy::{self, Policy, Route};
use crate::redact::Secrets;
use crate::registry::{Registry, Sandbox};

/// Messages per batch: each batch costs a handful of directory fsyncs.
pub const DEFAULT_BATCH: usize = 256;
/// Distinct messages remembered for duplicate detection.
pub const MAX_REMEMBERED: usize = 10_000;

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

/// Rate and duplicate memory.  Bounded: a sender keeps at most the policy's
/// rate count of times, and at most MAX_REMEMBERED digests are kept.
#[derive(Default, Serialize, Deserialize)]
struct Memory {
    version: u32,
    /// Sender -> times (ms since the epoch) of its recent admitted messages.
    rate: HashMap<String, VecDeque<u64>>,
    /// Digest (hex) and time (ms) of recent messages, oldest first.
    dups: VecDeque<(String, u64)>,
    /// Inbox owner -> mtime (ns) of its `cur/` when receipts were last taken.
    receipts: HashMap<String, i128>,
    /// Senders over their held-queue cap who were told about it (one
    /// status message per episode; forgotten once they are below the cap).
    #[serde(default)]
    capped: std::collections::BTreeSet<String>,
    #[serde(skip)]
    dup_index: HashMap<String, u64>,
}

/// One message (or non-message) taken from an outbox.
enum Work {
    Route {
        name: OsString,
        /// The message as posted (the held queue keeps it whole).
        message: Box<Message>,
        entries: Vec<Entry>,
        claim_question: Option<String>,
    },
    Quarantine {
        name: OsString,
        qid: String,
    },
}

/// The open Maildirs of one pass: the fixed ones, then inboxes on demand.
struct Boxes {
    list: Vec<Box3>,
    inbox: HashMap<String, usize>,
}

pub struct Mediator {
    pub root: Root,
    rootfd: OwnedFd,
    pub log: Log,
    pub policy: Policy,
    policy_path: Option<PathBuf>,
    policy_explicit: bool,
    policy_stamp: Option<(u64, i64, i64, u64)>,
    registry: Registry,
    known: HashMap<String, Sandbox>,
    memory: Memory,
    memory_dirty: bool,
    last_save: Instant,
    /// When `tmp/` directories were last swept (see [`Mediator::sweep_tmp`]).
    last_sweep: Option<Instant>,
    warned: HashSet<String>,
    pub batch: usize,
    pub verbose: bool,
    pub stats: Stats,
    /// How batches are made durable (lib/group.rs).
    pub sync: group::Sync,
    /// Secret values that never leave through the door (lib/redact.rs).
    pub secrets: Secrets,
    /// Sender -> messages of theirs in `held/new/`, counted at each pass.
    held_count: HashMap<String, u32>,
}

/// A derived id: the time part of `base` (or `t`), 128 bits of a digest.
fn derived_id(t: Duration, parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    let mut r = [0u8; 16];
    r.copy_from_slice(&d[..16]);
    crate::id::id_at(t, u128::from_be_bytes(r))
}

/// The id of the status message sent when post `id` found its sender at
/// the held-queue cap.
pub fn cap_notice_id(id: &str) -> String {
    derived_id(
        crate::id::time_of(id).unwrap_or_default(),
        &[b"held-cap", id.as_bytes()],
    )
}

/// Cuts `s` to at most `max` bytes, on a character boundary.
fn fit(s: &mut String, max: usize) {
    while s.len() > max {
        s.pop();
    }
}

/// The id of the bounce sent back for message `id`.
pub fn bounce_id(id: &str) -> String {
    derived_id(
        crate::id::time_of(id).unwrap_or_default(),
        &[b"bounce", id.as_bytes()],
    )
}

/// The digest that makes two messages "exact duplicates": everything a
/// reader sees except the id and the creation time.
fn content_digest(m: &Message) -> String {
    let v = serde_json::json!([
        m.from,
        m.to,
        m.kind,
        m.subject,
        m.body,
        m.refs,
        m.in_reply_to
    ]);
    hex(&Sha256::digest(v.to_string().as_bytes())[..16])
}

/// What an outbox entry turned out to be.
enum Inspected {
    Message(Message),
    Bad(String, rfs::Stat),
    Gone,
}

/// Examines `name` in the directory `dir` without following it, blocking on
/// it, or reading more than the size limit.
fn inspect(dir: &OwnedFd, name: &OsStr) -> Inspected {
    let st = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(_) => return Inspected::Gone,
    };
    let bad = |why: String| Inspected::Bad(why, st);
    let ft = rfs::FileType::from_raw_mode(st.st_mode);
    if ft != rfs::FileType::RegularFile {
        let what = match ft {
            rfs::FileType::Directory => "a directory",
            rfs::FileType::Symlink => "a symbolic link (not followed)",
            rfs::FileType::Fifo => "a FIFO (not opened)",
            rfs::FileType::Socket => "a socket",
            _ => "a device",
        };
        return bad(format!("{what}, not a message file"));
    }
    let Ok(text) = std::str::from_utf8(name.as_bytes()) else {
        return bad("file name is not UTF-8".into());
    };
    if !crate::id::is_valid(text) {
        return bad("file name does not follow the id grammar".into());
    }
    if st.st_nlink > 1 {
        return bad(format!(
            "{} hard links; a posted message has one (not read)",
            st.st_nlink
        ));
    }
    if st.st_mode & 0o7111 != 0 {
        return bad(format!(
            "mode {:o} has setuid, setgid, sticky or execute bits; a posted message has none (not read)",
            st.st_mode & 0o7777
        ));
    }
    if st.st_size as u64 > message::MAX_FILE {
        return bad(format!(
            "file is {} bytes; the limit is {} (not read)",
            st.st_size,
            message::MAX_FILE
        ));
    }
    let fd = match rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Inspected::Gone,
        Err(e) => return bad(format!("cannot open: {}", errno_io(e))),
    };
    // The entry may have been swapped between the stat and the open.
    match rfs::fstat(&fd) {
        Ok(st2) if st2.st_ino == st.st_ino && st2.st_dev == st.st_dev && st2.st_nlink == 1 => {}
        Ok(_) => return bad("changed while being read".into()),
        Err(e) => return bad(format!("cannot stat: {}", errno_io(e))),
    }
    let mut buf = Vec::with_capacity(st.st_size as usize);
    if let Err(e) = std::fs::File::from(fd)
        .take(message::MAX_FILE + 1)
        .read_to_end(&mut buf)
    {
        return bad(format!("cannot read: {e}"));
    }
    match Message::parse(&buf) {
        Ok(m) if m.id != text => bad(format!("id '{}' inside does not match the file name", m.id)),
        Ok(m) if !m.kind.postable() => bad(format!(
            "kind '{}' is the mediator's own and cannot be posted",
            m.kind
        )),
        Ok(m) => Inspected::Message(m),
        Err(e) => bad(e.0),
    }
}

/// The quarantine id of a bad entry: stable across restarts for the same file.
fn quarantine_id(sender: &str, name: &OsStr, st: &rfs::Stat) -> String {
    let t = Duration::new(
        st.st_ctime.max(0) as u64,
        st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
    );
    derived_id(
        t,
        &[
            b"quarantine",
            sender.as_bytes(),
            name.as_bytes(),
            &st.st_dev.to_le_bytes(),
            &st.st_ino.to_le_bytes(),
            &st.st_ctime.to_le_bytes(),
            &st.st_ctime_nsec.to_le_bytes(),
        ],
    )
}

/// Takes the lock that keeps two mediators off one root.  Held until the
/// returned file is dropped (or the process dies).
pub fn lock_mediator(root: &Root) -> Result<std::fs::File> {
    let p = lock_path(root, "mediator.lock")?;
    crate::fs::try_lock(&p)
        .map_err(|e| Error::lock(&p, e))?
        .ok_or_else(|| {
            Error::new(
                Exit::TempFail,
                format!(
                    "another lw-mediate is running on '{}' (lock '{}' is held)",
                    root.dir.display(),
                    p.display()
                ),
            )
        })
}

/// Takes the lock that serialises writers of inboxes and queues (a pass of
/// the mediator, an operator's release or drop); waits for it.
pub fn lock_routes(root: &Root) -> Result<std::fs::File> {
    let p = lock_path(root, "route.lock")?;
    crate::fs::lock(&p).map_err(|e| Error::lock(&p, e))
}

fn lock_path(root: &Root, name: &str) -> Result<PathBuf> {
    root.check_exists()?;
    let dir = root.state_dir();
    match std::fs::create_dir(&dir) {
        Ok(()) | Err(_) if dir.is_dir() => {}
        Ok(()) => {}
        Err(e) => return Err(Error::io("cannot create", &dir, e)),
    }
    Ok(dir.join(name))
}

impl Mediator {
    /// Opens a root.  `policy_path` is the policy file; when `explicit` is
    /// false a missing file means the default policy.
    pub fn open(root: Root, policy_path: Option<PathBuf>, explicit: bool) -> Result<Mediator> {
        root.init()?;
        let rootfd = open_dir_at(None, &root.dir)
            .map_err(|e| Error::io("cannot open", &root.dir, errno_io(e)))?;
        let mut m = Mediator {
            log: Log::new(root.log_dir()),
            registry: Registry::new(&root),
            rootfd,
            root,
            policy: Policy::default(),
            policy_path,
            policy_explicit: explicit,
            policy_stamp: None,
            known: HashMap::new(),
            memory: Memory::default(),
            memory_dirty: false,
            last_save: Instant::now(),
            last_sweep: None,
            warned: HashSet::new(),
            batch: DEFAULT_BATCH,
            verbose: false,
            stats: Stats::default(),
            sync: group::Sync::default(),
            secrets: Secrets::new(),
            held_count: HashMap::new(),
        };
        m.load_policy()?;
        m.load_memory();
        Ok(m)
    }

    fn policy_file_stamp(&self) -> Option<(u64, i64, i64, u64)> {
        let p = self.policy_path.as_ref()?;
        let st = rfs::stat(p).ok()?;
        Some((
            st.st_ino,
            st.st_mtime,
            st.st_mtime_nsec as i64,
            st.st_size as u64,
        ))
    }

    fn load_policy(&mut self) -> Result<()> {
        let stamp = self.policy_file_stamp();
        self.policy = match (&self.policy_path, stamp) {
            (Some(p), Some(_)) => Policy::load(p)?,
            (Some(p), None) if self.policy_explicit => {
                return Err(Error::new(
                    Exit::NoInput,
                    format!("policy '{}' does not exist", p.display()),
                ));
            }
            _ => Policy::default(),
        };
        self.policy_stamp = stamp;
        Ok(())
    }

    /// Re-reads the policy when its file changed.  A file with errors is
    /// reported and the previous policy stays in force.
    pub fn reload_policy_if_changed(&mut self) {
        let stamp = self.policy_file_stamp();
        if stamp == self.policy_stamp {
            return;
        }
        let old = std::mem::take(&mut self.policy);
        match self.load_policy() {
            Ok(()) => eprintln!(
                "lw-mediate: policy reloaded from {}",
                self.policy
                    .source
                    .clone()
                    .unwrap_or_else(|| "the built-in default".into())
            ),
            Err(e) => {
                eprintln!("lw-mediate: {e}\nlw-mediate: keeping the previous policy");
                self.policy = old;
                self.policy_stamp = stamp;
            }
        }
    }

    fn warn_once(&mut self, msg: String) {
        if self.warned.len() < 10_000 && self.warned.insert(msg.clone()) {
            eprintln!("lw-mediate: {msg}");
        }
    }

    fn memory_path(&self) -> PathBuf {
        self.root.state_dir().join("mediator.json")
    }

    fn load_memory(&mut self) {
        let p = self.memory_path();
        let Ok(bytes) = std::fs::read(&p) else { return };
        match serde_json::from_slice::<Memory>(&bytes) {
            Ok(mut m) => {
                m.dup_index = m.dups.iter().cloned().collect();
                self.memory = m;
            }
            Err(e) => self.warn_once(format!("ignoring unreadable state '{}': {e}", p.display())),
        }
    }

    /// Writes the rate, duplicate and receipt memory (atomically: temporary
    /// file, fsync, rename).  Losing it costs only a forgotten window.
    pub fn save_memory(&mut self) -> Result<()> {
        if !self.memory_dirty {
            return Ok(());
        }
        self.memory.version = 1;
        let p = self.memory_path();
        let bytes = serde_json::to_vec(&self.memory)
            .expect("the state serialises because it is plain data");
        crate::fs::write_replace(&p, &bytes, 0o644, crate::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write state", &p, e))?;
        self.memory_dirty = false;
        self.last_save = Instant::now();
        Ok(())
    }

    fn open_boxes(&self) -> Result<Boxes> {
        let open = |rel: &str| Box3::open(&self.rootfd, &self.root.dir, Path::new(rel));
        Ok(Boxes {
            list: vec![
                open("log")?,
                open("human")?,
                open("held")?,
                open("quarantine")?,
            ],
            inbox: HashMap::new(),
        })
    }

    /// The Maildir a party receives in: the human queue or a sandbox inbox.
    fn party_box(&self, boxes: &mut Boxes, party: &str) -> Result<usize> {
        if party == layout::HUMAN {
            return Ok(HUMAN);
        }
        if let Some(i) = boxes.inbox.get(party) {
            return Ok(*i);
        }
        if !layout::valid_name(party) {
            return Err(Error::new(
                Exit::Software,
                format!("'{}' is not a party name", party.escape_debug()),
            ));
        }
        let sfd = group::ensure_dir_at(&self.rootfd, "sandboxes")
            .map_err(|e| Error::io("cannot open", &self.root.sandboxes_dir(), errno_io(e)))?;
        let _ = group::ensure_dir_at(&sfd, party).map_err(|e| {
            Error::io(
                "cannot open",
                &self.root.sandboxes_dir().join(party),
                errno_io(e),
            )
        })?;
        let b = Box3::open(
            &self.rootfd,
            &self.root.dir,
            &Path::new("sandboxes").join(party).join("inbox"),
        )?;
        boxes.list.push(b);
        boxes.inbox.insert(party.to_string(), boxes.list.len() - 1);
        Ok(boxes.list.len() - 1)
    }

    fn refresh_registry(&mut self) -> Result<()> {
        let (good, bad) = self.registry.list()?;
        for b in bad {
            self.warn_once(format!(
                "registry record '{}' skipped: {}",
                b.file, b.reason
            ));
        }
        self.known = good.into_iter().map(|s| (s.name.clone(), s)).collect();
        Ok(())
    }

    /// Looks up the logged decision of a message: the main entry and the
    /// bounce entry, either of which may be absent.
    pub fn decision_of(&self, id: &str) -> (Option<Entry>, Option<Entry>) {
        let read = |a: Action| {
            let n = Entry::name_for(id, a, None);
            if self.log.has(&n) {
                self.log.read(OsStr::new(&n)).ok()
            } else {
                None
            }
        };
        let main = read(Action::Forward)
            .or_else(|| read(Action::Escalate))
            .or_else(|| read(Action::Hold));
        (main, read(Action::Bounce))
    }

    /// Who sent message `id`, by the log.
    fn sender_of(&self, id: &str) -> Option<String> {
        let (a, b) = self.decision_of(id);
        a.or(b).map(|e| e.sender)
    }

    /// Where a message goes by its kind's route, ignoring hold rules.
    /// Returns the main decision (None when every recipient bounced) and the
    /// recipients that bounce, with the reason.
    fn route(
        &self,
        m: &Message,
        sender: &str,
        release: bool,
    ) -> (Option<Decision>, Vec<String>, String) {
        let rule = self.policy.route(m.kind);
        let at = self.policy.at(rule.line);
        let named: Vec<String> =
            m.to.iter()
                .filter(|t| *t != layout::MEDIATOR)
                .cloned()
                .collect();
        let main_action = if release {
            Action::Release
        } else {
            Action::Forward
        };
        let (mut targets, why, bounce_why): (Vec<String>, String, String) = match rule.value {
            Route::Hold if !release => {
                return (
                    Some(Decision {
                        quiet: false,
                        action: Action::Hold,
                        to: vec![],
                        reason: format!("kind {} is routed to hold ({at})", m.kind),
                    }),
                    vec![],
                    String::new(),
                );
            }
            Route::Human | Route::Hold => {
                let action = if release {
                    Action::Release
                } else {
                    Action::Escalate
                };
                return (
                    Some(Decision {
                        quiet: false,
                        action,
                        to: vec![layout::HUMAN.to_string()],
                        reason: format!("kind {} goes to a person ({at})", m.kind),
                    }),
                    vec![],
                    String::new(),
                );
            }
            Route::Named => {
                if named.is_empty() && m.kind != Kind::Status {
                    return (
                        None,
                        vec![layout::MEDIATOR.to_string()],
                        format!(
                            "{} names no recipient but the mediator; name a sandbox with --to ({at})",
                            m.kind
                        ),
                    );
                }
                let why = if named.is_empty() {
                    format!(
                        "{} addressed to the mediator only: logged, delivered to nobody ({at})",
                        m.kind
                    )
                } else {
                    format!("{} to its named recipients ({at})", m.kind)
                };
                (named.clone(), why, "not a registered sandbox".into())
            }
            Route::Scope => {
                let mut t: Vec<String> = self
                    .known
                    .values()
                    .filter(|s| s.name != sender)
                    .filter(|s| {
                        s.scope.is_empty()
                            || m.refs.is_empty()
                            || s.scope
                                .iter()
                                .any(|sc| m.refs.iter().any(|r| policy::overlaps(sc, r)))
                    })
                    .map(|s| s.name.clone())
                    .collect();
                t.extend(named.iter().cloned());
                let why = if m.refs.is_empty() {
                    format!("{} without refs goes to every other sandbox ({at})", m.kind)
                } else {
                    format!(
                        "{} goes to sandboxes whose scope overlaps its refs or that declared none ({at})",
                        m.kind
                    )
                };
                (t, why, "not a registered sandbox".into())
            }
            Route::Asker => {
                let Some(q) = &m.in_reply_to else {
                    return (
                        None,
                        named
                            .clone()
                            .into_iter()
                            .chain([layout::MEDIATOR.into()])
                            .take(1)
                            .collect(),
                        format!(
                            "{} has no in_reply_to, so it has nobody to go to ({at})",
                            m.kind
                        ),
                    );
                };
                match self.sender_of(q) {
                    Some(asker) => {
                        let mut t = vec![asker.clone()];
                        t.extend(named.iter().cloned());
                        (
                            t,
                            format!("{} goes to {asker}, who sent {q} ({at})", m.kind),
                            "not a registered sandbox".into(),
                        )
                    }
                    None => {
                        return (
                            None,
                            vec![layout::MEDIATOR.to_string()],
                            format!("in_reply_to {q} names no message in the log ({at})"),
                        );
                    }
                }
            }
        };
        targets.sort();
        targets.dedup();
        let (known, unknown): (Vec<String>, Vec<String>) = targets
            .into_iter()
            .partition(|t| t == layout::HUMAN || self.known.contains_key(t));
        let main = if known.is_empty() && !(rule.value == Route::Named && named.is_empty()) {
            None
        } else {
            Some(Decision {
                quiet: false,
                action: main_action,
                to: known,
                reason: why,
            })
        };
        (main, unknown, bounce_why)
    }

    /// The hold rules, in order: sender, kind, duplicate, rate.  Updates the
    /// rate and duplicate memory.
    fn hold_reason(&mut self, m: &Message, sender: &str) -> Option<String> {
        if let Some(r) = self.policy.hold_senders.iter().find(|r| r.value == sender) {
            return Some(format!(
                "sender {sender} is held ({})",
                self.policy.at(r.line)
            ));
        }
        if let Some(r) = self.policy.hold_kinds.iter().find(|r| r.value == m.kind) {
            return Some(format!(
                "kind {} is held ({})",
                m.kind,
                self.policy.at(r.line)
            ));
        }
        let now = crate::time::now_ms();
        if let Some(d) = self.policy.duplicates.clone() {
            let window = d.value.as_millis() as u64;
            let mem = &mut self.memory;
            while let Some((h, t)) = mem.dups.front().cloned() {
                if now.saturating_sub(t) > window || mem.dups.len() > MAX_REMEMBERED {
                    mem.dups.pop_front();
                    if mem.dup_index.get(&h) == Some(&t) {
                        mem.dup_index.remove(&h);
                    }
                } else {
                    break;
                }
            }
            let digest = content_digest(m);
            if let Some(t) = mem.dup_index.get(&digest)
                && now.saturating_sub(*t) <= window
            {
                let ago = now.saturating_sub(*t) / 1000;
                return Some(format!(
                    "exact duplicate of a message {sender} posted {ago}s ago (within {}s, {})",
                    d.value.as_secs(),
                    self.policy.at(d.line)
                ));
            }
            mem.dups.push_back((digest.clone(), now));
            mem.dup_index.insert(digest, now);
            self.memory_dirty = true;
        }
        if let Some(r) = self.policy.rate.clone() {
            let window = r.value.window.as_millis() as u64;
            let q = self.memory.rate.entry(sender.to_string()).or_default();
            while q.front().is_some_and(|t| now.saturating_sub(*t) >= window) {
                q.pop_front();
            }
            if q.len() >= r.value.count as usize {
                return Some(format!(
                    "sender {sender} went over {} messages in {}s ({})",
                    r.value.count,
                    r.value.window.as_secs(),
                    self.policy.at(r.line)
                ));
            }
            q.push_back(now);
            self.memory_dirty = true;
        }
        None
    }

    fn entry(&self, m: &Message, sender: &str, mut d: Decision) -> Entry {
        let keep_body = !(d.quiet || matches!(d.action, Action::Hold | Action::Drop));
        self.secrets.mask_in(&mut d.reason);
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&m.id, d.action, None),
            logged: crate::time::rfc3339(crate::time::now()),
            message_id: m.id.clone(),
            sender: sender.to_string(),
            message: Some(self.logged_message(m, keep_body)),
            decision: d,
        }
    }

    /// A message as the log keeps it: secret values masked, and the body
    /// left out of hold, drop and refusal entries (the held queue keeps the
    /// body of a held message; a refused one goes back to its sender).
    fn logged_message(&self, m: &Message, keep_body: bool) -> Message {
        let mut m = m.clone();
        if !keep_body {
            m.body.clear();
        }
        if !self.secrets.is_empty() {
            self.secrets.mask_in(&mut m.subject);
            fit(&mut m.subject, message::MAX_SUBJECT);
            self.secrets.mask_in(&mut m.body);
            fit(&mut m.body, message::MAX_BODY);
            for r in &mut m.refs {
                self.secrets.mask_in(r);
                fit(r, message::MAX_REF);
            }
        }
        m
    }

    /// Whether a logged entry records `m` (as [`Mediator::logged_message`] keeps it).
    fn records(&self, e: &Entry, m: &Message) -> bool {
        match &e.message {
            Some(l) => {
                l == m || *l == self.logged_message(m, true) || *l == self.logged_message(m, false)
            }
            None => false,
        }
    }

    /// The name of a secret the message carries, if any.
    fn secret_in(&self, m: &Message) -> Option<String> {
        if self.secrets.is_empty() {
            return None;
        }
        [&m.subject, &m.body]
            .into_iter()
            .chain(m.refs.iter())
            .find_map(|t| self.secrets.find(t))
            .map(str::to_string)
    }

    /// Holds a message, or refuses it when its sender is at the cap of the
    /// held queue: a quiet bounce, and the first time in an episode, one
    /// status message to a person.
    fn hold_or_refuse(&mut self, m: &Message, sender: &str, reason: String) -> Vec<Entry> {
        let n = self.held_count.get(sender).copied().unwrap_or(0);
        match self.policy.held_max.clone() {
            Some(cap) if sender != layout::HUMAN && n >= cap.value => {
                let at = self.policy.at(cap.line);
                let d = Decision {
                    quiet: true,
                    action: Action::Bounce,
                    to: m.to.clone(),
                    reason: format!(
                        "sender {sender} has {n} messages in the held queue, the most allowed ({at}); this one would have been held ({reason}), so it bounced instead; an operator releases or drops held messages with lw-mediate release or drop"
                    ),
                };
                let mut out = vec![self.entry(m, sender, d)];
                if self.memory.capped.insert(sender.to_string()) {
                    self.memory_dirty = true;
                    out.push(self.cap_notice(m, sender, n, &at));
                }
                out
            }
            _ => {
                *self.held_count.entry(sender.to_string()).or_default() += 1;
                let d = Decision {
                    quiet: false,
                    action: Action::Hold,
                    to: vec![],
                    reason,
                };
                vec![self.entry(m, sender, d)]
            }
        }
    }

    /// The status message that tells a person a sender reached the cap,
    /// logged as an escalation from the mediator; its id derives from the
    /// post that found the cap, so a restart writes the same one.
    fn cap_notice(&self, trigger: &Message, sender: &str, n: u32, at: &str) -> Entry {
        let id = cap_notice_id(&trigger.id);
        let m = Message {
            version: message::VERSION,
            id: id.clone(),
            from: layout::MEDIATOR.into(),
            to: vec![layout::HUMAN.into()],
            kind: Kind::Status,
            subject: format!(
                "{sender} reached the cap of {n} held messages; its further posts bounce"
            ),
            body: format!(
                "Sandbox {sender} has {n} messages in the held queue, the most the policy allows ({at}).\n\
                 Until an operator releases or drops some of them, every further post of {sender} that\n\
                 would be held bounces back to it instead, and is logged without its body.\n\
                 \n\
                 See them:   lw-mediate held\n\
                 Act:        lw-mediate release ID ...   or   lw-mediate drop ID ... --reason TEXT\n\
                 \n\
                 This is said once; it is said again only after {sender} went below the cap.\n"
            ),
            refs: vec![],
            in_reply_to: None,
            created: crate::time::rfc3339(crate::time::now()),
        };
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&id, Action::Escalate, None),
            logged: crate::time::rfc3339(crate::time::now()),
            message_id: id,
            sender: layout::MEDIATOR.into(),
            message: Some(m),
            decision: Decision {
                quiet: false,
                action: Action::Escalate,
                to: vec![layout::HUMAN.into()],
                reason: format!(
                    "sender {sender} reached the held-queue cap ({at}); said once per episode"
                ),
            },
        }
    }

    /// Drops the held messages of removed sandboxes (no registry record and
    /// no `sandboxes/NAME` any more, as `lw-sandbox rm` leaves it): logged as
    /// `drop`, archived in `held/cur/` (mailbox-spec.md, "THE HELD QUEUE").
    fn archive_removed(&mut self, boxes: &mut Boxes, out: &mut dyn Write) -> Result<()> {
        let held = &boxes.list[HELD];
        let Ok(names) = read_names(&held.new) else {
            return Ok(());
        };
        let mut gone = Vec::new();
        for n in names {
            if let Inspected::Message(m) = inspect(&held.new, &n)
                && m.from != layout::HUMAN
                && !self.known.contains_key(&m.from)
                && rfs::statat(
                    &self.rootfd,
                    Path::new("sandboxes").join(&m.from),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .is_err_and(|e| e == Errno::NOENT)
            {
                gone.push((m.id, m.from));
            }
        }
        for (id, sender) in gone {
            let why = format!(
                "sender {sender} was removed (no registry record, no mailbox); kept in held/cur"
            );
            self.release_or_drop(boxes, &id, Some(&why), out)?;
        }
        Ok(())
    }

    /// Counts the held queue by sender, and forgets the senders told about
    /// the cap who are below it again.
    fn count_held(&mut self, boxes: &Boxes) {
        let held = &boxes.list[HELD];
        let mut count: HashMap<String, u32> = HashMap::new();
        // Without a cap nothing needs the counts (and the queue may be long).
        let names = match self.policy.held_max {
            Some(_) => read_names(&held.new),
            None => Ok(vec![]),
        };
        if let Ok(names) = names {
            for n in names {
                if let Inspected::Message(m) = inspect(&held.new, &n) {
                    *count.entry(m.from).or_default() += 1;
                }
            }
        }
        let cap = self.policy.held_max.as_ref().map(|c| c.value);
        let before = self.memory.capped.len();
        self.memory
            .capped
            .retain(|s| cap.is_some_and(|c| count.get(s).copied().unwrap_or(0) >= c));
        if self.memory.capped.len() != before {
            self.memory_dirty = true;
        }
        self.held_count = count;
    }

    /// A new decision for a message nobody decided on yet.  `bounced`, when
    /// given, is the bounce of an earlier run that must stand.
    fn decide(
        &mut self,
        m: &Message,
        sender: &str,
        claimed: &str,
        bounced: Option<Entry>,
    ) -> Vec<Entry> {
        let spoof = if claimed != sender {
            format!(
                "; 'from' in the file said '{}', ignored: the sender is the owner of the outbox",
                claimed.escape_debug()
            )
        } else {
            String::new()
        };
        if let Some(b) = &bounced
            && b.decision.quiet
        {
            // A refusal an earlier run logged: it stands, with its notice.
            let notice = Entry::name_for(&cap_notice_id(&m.id), Action::Escalate, None);
            let mut out = vec![b.clone()];
            if self.log.has(&notice) {
                out.extend(self.log.read(OsStr::new(&notice)).ok());
            }
            return out;
        }
        if bounced.is_none() {
            let why = match self.secret_in(m) {
                Some(name) => Some(format!("contains secret {name}")),
                None => self.hold_reason(m, sender),
            };
            if let Some(reason) = why {
                return self.hold_or_refuse(m, sender, reason + &spoof);
            }
        }
        let (main, unknown, why) = self.route(m, sender, false);
        if bounced.is_none()
            && let Some(d) = &main
            && d.action == Action::Hold
        {
            return self.hold_or_refuse(m, sender, d.reason.clone() + &spoof);
        }
        let mut out = Vec::new();
        match bounced {
            Some(b) => {
                // An earlier run bounced these; deliver only to the rest.
                if let Some(mut d) = main {
                    d.to.retain(|t| !b.decision.to.contains(t));
                    if !d.to.is_empty() {
                        out.push(self.entry(m, sender, d));
                    }
                }
                out.push(b);
            }
            None => {
                if !unknown.is_empty() {
                    let d = Decision {
                        quiet: false,
                        action: Action::Bounce,
                        to: unknown.clone(),
                        reason: format!(
                            "cannot deliver to {}: {why}; a bounce went back to {sender}{spoof}",
                            unknown.join(", ")
                        ),
                    };
                    out.push(self.entry(m, sender, d));
                }
                if let Some(mut d) = main {
                    d.reason += &spoof;
                    out.push(self.entry(m, sender, d));
                }
            }
        }
        out
    }

    /// The bounce message for a bounce entry.
    fn bounce_message(e: &Entry) -> Message {
        let m = e
            .message
            .as_ref()
            .expect("bounce entries carry their message");
        let mut subject = format!("undeliverable: {}", m.subject);
        while subject.len() > message::MAX_SUBJECT {
            subject.pop();
        }
        Message {
            version: message::VERSION,
            id: bounce_id(&m.id),
            from: layout::MEDIATOR.into(),
            to: vec![e.sender.clone()],
            kind: Kind::Bounce,
            subject,
            body: format!(
                "Your {} message {} (\"{}\") was not delivered to {}.\nReason: {}\n",
                m.kind,
                m.id,
                m.subject,
                e.decision.to.join(", "),
                e.decision.reason
            ),
            refs: vec![],
            in_reply_to: Some(m.id.clone()),
            created: e.logged.clone(),
        }
    }

    /// Stages the copies a logged entry calls for.
    fn stage_deliveries(
        &mut self,
        boxes: &mut Boxes,
        g: &mut Group,
        e: &Entry,
        full: &Message,
    ) -> Result<()> {
        let Some(m) = &e.message else { return Ok(()) };
        match e.decision.action {
            Action::Forward | Action::Release | Action::Escalate => {
                let bytes = m.to_bytes();
                for party in &e.decision.to {
                    let key = self.party_box(boxes, party)?;
                    g.stage(&boxes.list, key, &m.id, &bytes)?;
                }
            }
            Action::Hold => {
                g.stage(&boxes.list, HELD, &m.id, &full.to_bytes())?;
            }
            Action::Bounce => {
                let b = Self::bounce_message(e);
                let key = self.party_box(boxes, &e.sender)?;
                g.stage(&boxes.list, key, &b.id, &b.to_bytes())?;
            }
            _ => {}
        }
        Ok(())
    }

    fn count(&mut self, e: &Entry) {
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
            writeln!(out, "{}", crate::operator::format_entry(e)).map_err(crate::error::out_err)?;
        }
        Ok(())
    }

    /// Logs the entries (bounces first, each group durable before the next)
    /// and returns them; entries logged by an earlier run are skipped.
    fn log_entries(
        &mut self,
        boxes: &Boxes,
        entries: &[&Entry],
        out: &mut dyn Write,
    ) -> Result<()> {
        for first in [true, false] {
            let mut g = Group::with_sync(self.sync);
            let mut written = Vec::new();
            for e in entries.iter().filter(|e| {
                (e.decision.action == Action::Bounce || e.sender == layout::MEDIATOR) == first
            }) {
                if g.stage(&boxes.list, LOG, &e.name, &e.to_bytes())? {
                    written.push(*e);
                }
            }
            if !g.is_empty() {
                g.commit(&boxes.list)?;
            }
            for e in written {
                self.count(e);
                self.print(out, e)?;
            }
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
        // One batch of each outbox in turn, so that a flood from one sender
        // never keeps another's question waiting behind it.
        let mut open = Vec::new();
        for (sender, rel) in self.outboxes() {
            match self.open_outbox(&rel) {
                Ok(Some((ob, names))) => open.push((sender, ob, names, 0usize)),
                Ok(None) => {}
                Err(e) => {
                    // One sender's broken outbox never stops the others.
                    self.warn_once(format!("outbox of {sender} skipped: {e}"));
                    self.stats.waiting += 1;
                }
            }
        }
        let step = self.batch.max(1);
        while !open.is_empty() {
            open.retain_mut(|(sender, ob, names, at)| {
                let end = (*at + step).min(names.len());
                let chunk = &names[*at..end];
                *at = end;
                if let Err(e) = self.route_chunk(&mut boxes, ob, sender, chunk, out) {
                    self.warn_once(format!("outbox of {sender} skipped: {e}"));
                    self.stats.waiting += 1;
                    return false;
                }
                *at < names.len()
            });
        }
        self.take_receipts(&mut boxes, out)?;
        self.sweep_tmp();
        if self.memory_dirty && self.last_save.elapsed() > Duration::from_secs(2) {
            self.save_memory()?;
        }
        Ok(self.stats.since(before))
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
        let mut dirs: Vec<PathBuf> = ["log", "human", "held", "quarantine", "human-outbox"]
            .iter()
            .map(|d| self.root.dir.join(d))
            .collect();
        for (s, rel) in self.outboxes() {
            if s != layout::HUMAN {
                dirs.push(self.root.dir.join(rel));
                dirs.push(self.root.sandbox(&s).inbox().path);
            }
        }
        for d in dirs {
            if let Err(e) = crate::maildir::sweep_tmp(&d, crate::maildir::TMP_MAX_AGE) {
                self.warn_once(format!("cannot sweep '{}': {e}", d.join("tmp").display()));
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
        self.save_memory()?;
        // `waiting` is what is still stuck after the last pass, not a difference.
        Ok(Stats {
            waiting: last.waiting,
            ..self.stats.since(start)
        })
    }

    /// Every outbox: `(sender, path relative to the root)`, the human's first.
    fn outboxes(&mut self) -> Vec<(String, PathBuf)> {
        let mut v = vec![(layout::HUMAN.to_string(), PathBuf::from("human-outbox"))];
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

    /// An outbox and the names waiting in its `new/`, oldest first; None
    /// when nothing waits.
    fn open_outbox(&mut self, rel: &Path) -> Result<Option<(Box3, Vec<OsString>)>> {
        let path = self.root.dir.join(rel);
        let newfd = match open_dir_at(Some(&self.rootfd), &rel.join("new")) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(Error::io("cannot open", &path.join("new"), errno_io(e))),
        };
        let mut names = read_names(&newfd)
            .map_err(|e| Error::io("cannot read", &path.join("new"), errno_io(e)))?;
        if names.is_empty() {
            return Ok(None);
        }
        names.sort();
        let ob = Box3::open(&self.rootfd, &self.root.dir, rel)?;
        Ok(Some((ob, names)))
    }

    fn route_chunk(
        &mut self,
        boxes: &mut Boxes,
        ob: &Box3,
        sender: &str,
        names: &[OsString],
        out: &mut dyn Write,
    ) -> Result<()> {
        let resumed_before = self.stats.resumed;
        let mut work = Vec::new();
        let mut to_log: Vec<Entry> = Vec::new();
        for name in names {
            let quarantine = |why: String, st: &rfs::Stat, sender: &str| {
                let qid = quarantine_id(sender, name, st);
                let e = Entry {
                    version: LOG_VERSION,
                    name: Entry::name_for(&qid, Action::Quarantine, None),
                    logged: crate::time::rfc3339(crate::time::now()),
                    message_id: qid.clone(),
                    sender: sender.to_string(),
                    message: None,
                    decision: Decision {
                        quiet: false,
                        action: Action::Quarantine,
                        to: vec![],
                        reason: format!(
                            "'{}' in the outbox of {sender}: {why}; kept as quarantine/new/{qid}",
                            escape_name(name)
                        ),
                    },
                };
                (
                    Work::Quarantine {
                        name: name.clone(),
                        qid,
                    },
                    e,
                )
            };
            match inspect(&ob.new, name) {
                Inspected::Gone => {}
                Inspected::Bad(why, st) => {
                    let (w, e) = quarantine(why, &st, sender);
                    work.push(w);
                    to_log.push(e);
                }
                Inspected::Message(mut m) => {
                    let claimed = std::mem::replace(&mut m.from, sender.to_string());
                    let (main, bounce) = self.decision_of(&m.id);
                    let prior = main.clone().or(bounce.clone());
                    let clash = prior.as_ref().and_then(|p| {
                        if p.sender != sender {
                            Some(format!(
                                "id {} is already used by a message from {}",
                                m.id, p.sender
                            ))
                        } else if !self.records(p, &m) {
                            Some(format!(
                                "id {} is already used by an earlier, different message",
                                m.id
                            ))
                        } else if ob.has_cur(name) {
                            Some(format!("posted again after {} was routed", m.id))
                        } else {
                            None
                        }
                    });
                    if let Some(why) = clash {
                        let st = rfs::statat(&ob.new, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW);
                        if let Ok(st) = st {
                            let (w, e) = quarantine(why, &st, sender);
                            work.push(w);
                            to_log.push(e);
                        }
                        continue;
                    }
                    let entries = match (main, bounce) {
                        (Some(a), b) => {
                            self.stats.resumed += 1;
                            std::iter::once(a).chain(b).collect()
                        }
                        (None, b) => {
                            if b.is_some() {
                                self.stats.resumed += 1;
                            }
                            self.decide(&m, sender, &claimed, b)
                        }
                    };
                    let claim_question = match (sender, m.kind, &m.in_reply_to) {
                        (layout::HUMAN, Kind::Answer, Some(q)) => Some(q.clone()),
                        _ => None,
                    };
                    to_log.extend(entries.iter().cloned());
                    work.push(Work::Route {
                        name: name.clone(),
                        message: Box::new(m),
                        entries,
                        claim_question,
                    });
                }
            }
        }
        if self.stats.resumed > resumed_before {
            eprintln!(
                "lw-mediate: carrying out {} decisions that an earlier run had logged",
                self.stats.resumed - resumed_before
            );
        }
        // 1. Log.
        let refs: Vec<&Entry> = to_log.iter().collect();
        self.log_entries(boxes, &refs, out)?;
        // A cap notice was logged: remember at once that it was said, so a
        // restart does not say it twice.
        if to_log.iter().any(|e| e.sender == layout::MEDIATOR) {
            self.save_memory()?;
        }
        // 2. Deliver.  A recipient whose inbox cannot be written (removed,
        // or replaced by a link) holds up only the messages addressed to
        // it: they stay unclaimed, to be carried out again by a later pass.
        let mut g = Group::with_sync(self.sync);
        let mut failed = HashSet::new();
        for (i, w) in work.iter().enumerate() {
            let Work::Route {
                name,
                entries,
                message,
                ..
            } = w
            else {
                continue;
            };
            for e in entries {
                if let Err(err) = self.stage_deliveries(boxes, &mut g, e, message) {
                    self.warn_once(format!(
                        "message {} of {sender} waits: {err}",
                        escape_name(name)
                    ));
                    if failed.insert(i) {
                        self.stats.waiting += 1;
                    }
                }
            }
        }
        g.commit(&boxes.list)?;
        // 3. Claim (or move to quarantine).
        let (mut claimed, mut quarantined, mut questions) = (false, false, false);
        for (i, w) in work.iter().enumerate() {
            if failed.contains(&i) {
                continue;
            }
            match w {
                Work::Route {
                    name,
                    claim_question,
                    entries,
                    ..
                } => {
                    // Counted only when claimed, so that `drain` cannot spin on
                    // a source it fails to move.
                    match group::move_noreplace(&ob.new, name, &ob.cur, name) {
                        Ok(true) => {
                            claimed = true;
                            self.stats.routed += 1;
                        }
                        Ok(false) => {}
                        Err(e) => self.warn_once(format!(
                            "cannot claim '{}' into '{}': {}",
                            escape_name(name),
                            ob.path.join("cur").display(),
                            errno_io(e)
                        )),
                    }
                    let forwarded = entries.iter().any(|e| e.decision.action == Action::Forward);
                    if let (Some(q), true) = (claim_question, forwarded) {
                        let h = &boxes.list[HUMAN];
                        if let Ok(true) =
                            group::move_noreplace(&h.new, OsStr::new(q), &h.cur, OsStr::new(q))
                        {
                            questions = true;
                        }
                    }
                }
                Work::Quarantine { name, qid } => {
                    let q = &boxes.list[QUARANTINE];
                    match crate::quarantine::take(&ob.new, name, &q.new, OsStr::new(qid)) {
                        Ok(_) => quarantined = true,
                        Err(e) => self.warn_once(format!(
                            "cannot move '{}' of {sender} into quarantine: {}; left in place",
                            escape_name(name),
                            errno_io(e)
                        )),
                    }
                }
            }
        }
        if claimed {
            ob.fsync_cur()?;
        }
        if quarantined {
            boxes.list[QUARANTINE].fsync_new()?;
        }
        if questions {
            boxes.list[HUMAN].fsync_cur()?;
        }
        Ok(())
    }

    /// Held messages whose release or drop was logged but not finished
    /// (an operator command died halfway): finish them.
    fn finish_operator_actions(&mut self, boxes: &mut Boxes, out: &mut dyn Write) -> Result<()> {
        let names = read_names(&boxes.list[HELD].new)
            .map_err(|e| Error::io("cannot read", &boxes.list[HELD].path, errno_io(e)))?;
        for n in names {
            let Some(id) = n.to_str() else { continue };
            let rel = Entry::name_for(id, Action::Release, None);
            let drop = Entry::name_for(id, Action::Drop, None);
            if self.log.has(&rel) || self.log.has(&drop) {
                self.release_or_drop(boxes, id, None, out)?;
            }
        }
        Ok(())
    }

    /// Releases (`drop_reason` None) or drops a held message.
    fn release_or_drop(
        &mut self,
        boxes: &mut Boxes,
        id: &str,
        drop_reason: Option<&str>,
        out: &mut dyn Write,
    ) -> Result<Entry> {
        let held = &boxes.list[HELD];
        if !crate::id::is_valid(id) {
            return Err(Error::usage(format!(
                "'{}' is not a message id",
                id.escape_debug()
            )));
        }
        let m = match inspect(&held.new, OsStr::new(id)) {
            Inspected::Message(m) => m,
            Inspected::Gone => {
                for (a, done) in [(Action::Release, "released"), (Action::Drop, "dropped")] {
                    let n = Entry::name_for(id, a, None);
                    if self.log.has(&n) {
                        return Err(Error::new(
                            Exit::DataErr,
                            format!("message {id} was {done} already (log entry {n})"),
                        ));
                    }
                }
                return Err(Error::new(
                    Exit::NoInput,
                    format!("no held message {id}; see 'lw-mediate held'"),
                ));
            }
            Inspected::Bad(why, _) => return Err(Error::data(format!("held message {id} {why}"))),
        };
        let sender = m.from.clone();
        let existing = |a: Action| {
            let n = Entry::name_for(id, a, None);
            if self.log.has(&n) {
                self.log.read(OsStr::new(&n)).ok()
            } else {
                None
            }
        };
        let mut entries = Vec::new();
        if let Some(e) = existing(Action::Drop) {
            entries.push(e);
        } else if let Some(e) = existing(Action::Release) {
            entries.push(e);
            entries.extend(existing(Action::Bounce));
        } else if let Some(reason) = drop_reason {
            let d = Decision {
                quiet: false,
                action: Action::Drop,
                to: vec![],
                reason: reason.to_string(),
            };
            let mut e = self.entry(&m, &sender, d);
            e.name = Entry::name_for(id, Action::Drop, None);
            entries.push(e);
        } else {
            let (main, unknown, why) = self.route(&m, &sender, true);
            if !unknown.is_empty() && existing(Action::Bounce).is_none() {
                let d = Decision {
                    quiet: false,
                    action: Action::Bounce,
                    to: unknown.clone(),
                    reason: format!(
                        "released, but cannot deliver to {}: {why}; a bounce went back to {sender}",
                        unknown.join(", ")
                    ),
                };
                entries.push(self.entry(&m, &sender, d));
            }
            let mut d = main.unwrap_or(Decision {
                quiet: false,
                action: Action::Release,
                to: vec![],
                reason: String::new(),
            });
            d.action = Action::Release;
            d.reason = format!(
                "released by an operator; {}",
                if d.reason.is_empty() {
                    "no recipient is left".into()
                } else {
                    d.reason
                }
            );
            entries.push(self.entry(&m, &sender, d));
        }
        let refs: Vec<&Entry> = entries.iter().collect();
        self.log_entries(boxes, &refs, out)?;
        let mut g = Group::with_sync(self.sync);
        for e in &entries {
            self.stage_deliveries(boxes, &mut g, e, &m)?;
        }
        g.commit(&boxes.list)?;
        let held = &boxes.list[HELD];
        group::move_noreplace(&held.new, OsStr::new(id), &held.cur, OsStr::new(id))
            .map_err(|e| Error::io("cannot move", &held.path.join("new").join(id), errno_io(e)))?;
        held.fsync_cur()?;
        Ok(entries
            .pop()
            .expect("a release or drop logs at least one entry"))
    }

    /// Releases a held message to the recipients its route names now.
    pub fn release(&mut self, id: &str, out: &mut dyn Write) -> Result<Entry> {
        let _routes = lock_routes(&self.root)?;
        self.refresh_registry()?;
        let mut boxes = self.open_boxes()?;
        self.release_or_drop(&mut boxes, id, None, out)
    }

    /// Drops a held message: logged, moved to `held/cur/`, never deleted.
    pub fn drop_held(&mut self, id: &str, reason: &str, out: &mut dyn Write) -> Result<Entry> {
        let _routes = lock_routes(&self.root)?;
        let mut boxes = self.open_boxes()?;
        let why = format!("dropped by an operator: {reason}");
        self.release_or_drop(&mut boxes, id, Some(&why), out)
    }

    /// Records receipts: a message in a recipient's `inbox/cur/` was acked.
    /// An inbox whose `cur/` did not change since the last look is skipped,
    /// and names are streamed, so memory does not grow with the inbox.
    fn take_receipts(&mut self, boxes: &mut Boxes, out: &mut dyn Write) -> Result<()> {
        let mut names: Vec<String> = self.known.keys().cloned().collect();
        names.sort();
        let now_ns = crate::time::now().as_nanos() as i128;
        for r in names {
            let rel = Path::new("sandboxes").join(&r).join("inbox").join("cur");
            let Ok(fd) = open_dir_at(Some(&self.rootfd), &rel) else {
                continue;
            };
            let Ok(st) = rfs::fstat(&fd) else { continue };
            let mtime = st.st_mtime as i128 * 1_000_000_000 + st.st_mtime_nsec as i128;
            // A change within the file system's timestamp granularity of the
            // last look could hide behind an equal mtime: look again then.
            if self.memory.receipts.get(&r) == Some(&mtime) && now_ns - mtime > 2_000_000_000 {
                continue;
            }
            let mut g = Group::with_sync(self.sync);
            let mut pending: Vec<Entry> = Vec::new();
            let dir = rfs::Dir::read_from(&fd)
                .map_err(|e| Error::io("cannot read", &self.root.dir.join(&rel), errno_io(e)))?;
            for ent in dir {
                let Ok(ent) = ent else { break };
                let Ok(id) = ent.file_name().to_str() else {
                    continue;
                };
                if !crate::id::is_valid(id) {
                    continue;
                }
                let rname = Entry::name_for(id, Action::Read, Some(&r));
                if self.log.has(&rname) {
                    continue;
                }
                let routed = [Action::Forward, Action::Release]
                    .into_iter()
                    .find_map(|a| {
                        let n = Entry::name_for(id, a, None);
                        self.log
                            .read(OsStr::new(&n))
                            .ok()
                            .filter(|e| e.decision.to.contains(&r))
                    });
                let Some(src) = routed else { continue };
                let e = Entry {
                    version: LOG_VERSION,
                    name: rname,
                    logged: crate::time::rfc3339(crate::time::now()),
                    message_id: id.to_string(),
                    sender: src.sender.clone(),
                    message: None,
                    decision: Decision {
                        quiet: false,
                        action: Action::Read,
                        to: vec![r.clone()],
                        reason: format!("{r} acked it (moved it to inbox/cur)"),
                    },
                };
                if g.stage(&boxes.list, LOG, &e.name, &e.to_bytes())? {
                    pending.push(e);
                }
                if pending.len() >= self.batch {
                    g.commit(&boxes.list)?;
                    for e in pending.drain(..) {
                        self.count(&e);
                        self.print(out, &e)?;
                    }
                }
            }
            g.commit(&boxes.list)?;
            for e in pending.drain(..) {
                self.count(&e);
                self.print(out, &e)?;
            }
            self.memory.receipts.insert(r, mtime);
            self.memory_dirty = true;
        }
        Ok(())
    }

    /// Watches the root and routes as things arrive, with a full pass every
    /// `rescan` as a safety net.  Returns only on error.
    pub fn watch(&mut self, rescan: Duration, out: &mut dyn Write) -> Result<()> {
        use crate::fs::{Watcher, Woke};
        let watcher = Watcher::new().map_err(|e| Error::io("cannot watch", &self.root.dir, e))?;
        loop {
            // Watches first, then the pass: an arrival in between is seen by both.
            let mut dirs = vec![
                self.root.sandboxes_dir(),
                self.root.registry_dir(),
                self.root.human_outbox().sub(crate::maildir::Sub::New),
            ];
            for (s, rel) in self.outboxes() {
                dirs.push(self.root.dir.join(rel).join("new"));
                if s != layout::HUMAN {
                    dirs.push(self.root.sandbox(&s).inbox().sub(crate::maildir::Sub::Cur));
                }
            }
            if let Some(parent) = self.policy_path.as_ref().and_then(|p| p.parent()) {
                dirs.push(if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                });
            }
            for d in &dirs {
                // A directory that is missing or a planted link is not
                // watched; the periodic re-scan still covers it.
                let _ = watcher.add(d);
            }
            // A failing pass (a full disk, a removed directory) is reported
            // and tried again on the next event or re-scan; the watcher
            // does not exit over it.
            if let Err(e) = self.pass(out) {
                eprintln!("lw-mediate: {e}; trying again");
            }
            out.flush().map_err(crate::error::out_err)?;
            // The directories are the truth, not the events: any wake-up
            // (an arrival, an overflow, a removed directory) means a pass.
            match watcher.wait(Some(rescan)) {
                Ok(Woke::Timeout) => {
                    // Quiet: a good moment to save the rate memory.
                    self.save_memory()?;
                }
                Ok(Woke::Changed | Woke::Overflow | Woke::Gone(_)) => {}
                Err(e) => return Err(Error::io("cannot wait on", &self.root.dir, e)),
            }
        }
    }
}

impl Box3 {
    fn has_cur(&self, name: &OsStr) -> bool {
        rfs::statat(&self.cur, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_valid_and_stable() {
        let id = crate::id::new_id();
        assert_eq!(bounce_id(&id), bounce_id(&id));
        assert!(crate::id::is_valid(&bounce_id(&id)));
        assert_ne!(bounce_id(&id), id);
    }
}
