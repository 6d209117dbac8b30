//! Mirroring the log to GitHub issue comments, exactly once, and bringing a
//! person's answers back (lw-sync(1); mailbox-spec.md, "GITHUB COMMENT FORMAT").
//!
//! Exactly once rests on two things:
//!
//! 1. The sync state, `ROOT/state/sync.json`, written atomically (tmp file,
//!    fsync, rename, fsync of the directory).  Before a comment is sent its
//!    intent (the entries and parts it carries) is written as `pending`,
//!    together with the write time the rate limits need; after GitHub answers
//!    with the comment, the entries move to `synced` and `pending` is cleared.
//! 2. Reconciliation.  Whenever an outcome is unknown - a `pending` left by a
//!    crash, a dropped connection, a timeout, a 5xx - every page of the
//!    issue's comments is listed and the ids in the headers of lw-sync's own
//!    comments are taken as synced before anything is posted again.  A
//!    missing state file is an unknown outcome too.
//!
//! So a comment is posted at most once for each time its intent is written,
//! and an intent is only rewritten after a listing proved the comment absent.
//! Steady state costs one request per comment: no listing, no `GET` at all.
//!
//! Only comments whose author is the token's user (`GET /user`, once) count
//! as lw-sync's own, so a person cannot forge a header that hides a message.
//! The header itself cannot be broken out of: its JSON has `<`, `>` and `&`
//! escaped, so it never contains `-->`; bodies are in fenced code blocks whose
//! fence is longer than any run of its character in the body, and the parser
//! is structural (header, fence, body, closing fence), never a text search.
//! Code blocks and code spans also keep agents' `@mentions` and `#refs` inert;
//! the only live mentions are the configured people on escalations.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Exit, Result};
use crate::github::{Budget, Client, Comment, MAX_COMMENT_CHARS, Posted, Target};
use crate::layout::Root;
use crate::log::{Action, Decision, Entry, LOG_VERSION, Log};
use crate::message::{self, Kind, Message};

pub const CONFIG_DIR: &str = ".loopwright";
pub const CONFIG_FILE: &str = "sync.json";
pub const HEADER_PREFIX: &str = "<!-- loopwright ";
pub const HEADER_SUFFIX: &str = " -->";
pub const FORMAT_VERSION: u32 = 1;
const SEPARATOR: &str = "\n\n---\n\n";
/// Consecutive unknown outcomes before a run gives up (exit 75).
const MAX_UNKNOWN: u32 = 8;

// ---------------------------------------------------------------- config

/// Where one sandbox's messages go.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    #[serde(default)]
    pub repo: Option<String>,
    pub issue: u64,
}

/// `.loopwright/sync.json`.
#[derive(Clone, Debug, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// API base URL (GitHub Enterprise: `https://HOST/api/v3`).
    #[serde(default)]
    pub api_url: Option<String>,
    /// `OWNER/NAME` of the default target.
    #[serde(default)]
    pub repo: Option<String>,
    /// The run's issue or pull-request number.
    #[serde(default)]
    pub issue: Option<u64>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// GitHub logins mentioned on escalations to a human.
    #[serde(default)]
    pub mention: Vec<String>,
    /// Logins whose `/lw answer` lines are delivered; when empty, the
    /// repository's owners, members and collaborators.
    #[serde(default)]
    pub answerers: Vec<String>,
    /// Further logins whose lw-sync comments are trusted (besides the token's user).
    #[serde(default)]
    pub trust: Vec<String>,
    /// Most log entries in one comment when a backlog is batched.
    #[serde(default)]
    pub batch: Option<usize>,
    /// A sandbox's own task issue or pull request.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, TargetConfig>,
}

impl Config {
    /// `.loopwright/sync.json` in `start` or the nearest parent that has one.
    pub fn find(start: &Path) -> Option<PathBuf> {
        start.ancestors().map(|d| d.join(CONFIG_DIR).join(CONFIG_FILE)).find(|p| p.is_file())
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read(path).map_err(|e| Error::io_as(Exit::Config, "cannot read configuration", path, e))?;
        serde_json::from_slice(&text).map_err(|e| Error::config(format!("configuration '{}' is invalid: {e}", path.display())))
    }

    pub fn batch(&self) -> usize {
        self.batch.unwrap_or(20).max(1)
    }

    fn check(&self) -> Result<()> {
        if let Some(r) = &self.repo {
            Target::parse_repo(r)?;
        }
        for (name, t) in &self.sandboxes {
            if let Some(r) = &t.repo {
                Target::parse_repo(r)?;
            }
            if t.issue == 0 {
                return Err(Error::config(format!("sandbox '{name}' maps to issue 0; issue numbers start at 1")));
            }
        }
        for m in self.mention.iter().chain(&self.answerers) {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(Error::config(format!("'{}' is not a GitHub login", m.escape_debug())));
            }
        }
        Ok(())
    }

    /// The run's issue: `repo` and `issue` must both be set.
    pub fn default_target(&self) -> Result<Target> {
        self.check()?;
        match (&self.repo, self.issue) {
            (Some(r), Some(n)) if n > 0 => Ok(Target { repo: r.clone(), issue: n }),
            (None, _) => Err(Error::config("no repository: set \"repo\" in .loopwright/sync.json or pass --repo OWNER/NAME")),
            _ => Err(Error::config("no issue: set \"issue\" in .loopwright/sync.json or pass --issue N")),
        }
    }

    /// Where an entry goes: its sender's task issue when mapped, else the
    /// first mapped recipient's, else the run's issue.
    pub fn target_for(&self, e: &Entry) -> Result<Target> {
        let mut parties = vec![e.sender.as_str()];
        if let Some(m) = &e.message {
            parties.extend(m.to.iter().map(String::as_str));
        }
        parties.extend(e.decision.to.iter().map(String::as_str));
        for p in parties {
            if let Some(t) = self.sandboxes.get(p) {
                let repo = match t.repo.clone().or_else(|| self.repo.clone()) {
                    Some(r) => r,
                    None => return Err(Error::config(format!("sandbox '{p}' has no repository and there is no default \"repo\""))),
                };
                return Ok(Target { repo, issue: t.issue });
            }
        }
        self.default_target()
    }

    /// Every configured target (for pull and verify).
    pub fn targets(&self) -> Result<Vec<Target>> {
        let mut set = BTreeSet::new();
        if self.repo.is_some() && self.issue.is_some() {
            set.insert(self.default_target()?);
        }
        for (name, t) in &self.sandboxes {
            let repo = t.repo.clone().or_else(|| self.repo.clone()).ok_or_else(|| {
                Error::config(format!("sandbox '{name}' has no repository and there is no default \"repo\""))
            })?;
            set.insert(Target { repo, issue: t.issue });
        }
        if set.is_empty() {
            return Err(self.default_target().expect_err("no target means the default target is incomplete"));
        }
        Ok(set.into_iter().collect())
    }
}

// ---------------------------------------------------------------- format

/// The message fields a header carries (all but the body, which follows it).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct MsgHead {
    pub from: String,
    pub to: Vec<String>,
    pub kind: Kind,
    pub subject: String,
    #[serde(default)]
    pub refs: Vec<String>,
    #[serde(default)]
    pub in_reply_to: Option<String>,
    pub created: String,
}

/// The header of one log entry's section (or one part of it).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct EntryHead {
    pub v: u32,
    /// The log entry's name: the unit lw-sync mirrors.
    pub entry: String,
    /// The message id.
    pub id: String,
    pub action: Action,
    pub sender: String,
    #[serde(default)]
    pub parties: Vec<String>,
    pub reason: String,
    pub logged: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msg: Option<MsgHead>,
    /// `[i, n]`: part i of n.
    pub part: [u32; 2],
    /// The fence around this part's body ("" when there is no message).
    #[serde(default)]
    pub fence: String,
    /// SHA-256 of the whole body, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// lw-sync's answer to a person's comment it could not act on.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct NoticeHead {
    pub v: u32,
    /// The key it is recorded under: `notice/COMMENT/K`.
    pub key: String,
    pub about: u64,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(tag = "t", rename_all = "kebab-case")]
#[allow(clippy::large_enum_variant)] // short-lived, parsed one comment at a time
pub enum Head {
    Entry(EntryHead),
    Notice(NoticeHead),
}

/// One parsed section: its header and its body part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    pub head: Head,
    pub chunk: String,
}

fn header_line(h: &Head) -> String {
    let json = serde_json::to_string(h).expect("headers are plain data");
    // No '<', '>' or '&' in the JSON: it can never hold "-->" and so never
    // ends the HTML comment early, whatever a subject or reason contains.
    let json = json.replace('<', "\\u003c").replace('>', "\\u003e").replace('&', "\\u0026");
    format!("{HEADER_PREFIX}{json}{HEADER_SUFFIX}")
}

/// Text for a code span: one line, no backticks.
fn inline(s: &str) -> String {
    let t: String = s.chars().map(|c| if c.is_control() { ' ' } else if c == '`' { '\'' } else { c }).collect();
    let t = t.trim();
    if t.is_empty() { "` `".into() } else { format!("`{t}`") }
}

/// A fence longer than any run of its character in `body`: backticks, or
/// tildes when the body's tilde runs are shorter.
fn fence_for(body: &str) -> String {
    let run = |ch: char| {
        let (mut best, mut cur) = (0, 0);
        for c in body.chars() {
            if c == ch {
                cur += 1;
                best = best.max(cur);
            } else {
                cur = 0;
            }
        }
        best
    };
    let (b, t) = (run('`'), run('~'));
    if b <= t { "`".repeat((b + 1).max(3)) } else { "~".repeat((t + 1).max(3)) }
}

fn render_section(h: &EntryHead, chunk: &str, mention: &[String]) -> String {
    let mut s = header_line(&Head::Entry(h.clone()));
    s.push('\n');
    match &h.msg {
        Some(m) => {
            let to: Vec<String> = m.to.iter().map(|t| inline(t)).collect();
            s.push_str(&format!("**{}** from {} to {} · **{}**", m.kind, inline(&h.sender), to.join(", "), h.action.as_str()));
        }
        None => s.push_str(&format!("**{}** · message {}", h.action.as_str(), inline(&h.id))),
    }
    if !h.parties.is_empty() && h.msg.as_ref().is_none_or(|m| m.to != h.parties) {
        let p: Vec<String> = h.parties.iter().map(|t| inline(t)).collect();
        s.push_str(&format!(" → {}", p.join(", ")));
    }
    if h.part[1] > 1 {
        s.push_str(&format!(" · part {}/{}", h.part[0], h.part[1]));
    }
    s.push('\n');
    if let Some(m) = &h.msg {
        s.push_str(&format!("\nSubject: {}\n", inline(&m.subject)));
    }
    if !h.reason.is_empty() {
        s.push_str(&format!("\nReason: {}\n", inline(&h.reason)));
    }
    if h.action == Action::Escalate && h.part[0] == 1 && !mention.is_empty() {
        let who: Vec<String> = mention.iter().map(|m| format!("@{m}")).collect();
        s.push_str(&format!(
            "\ncc {} - answer with a line `/lw answer {}` followed by the answer\n",
            who.join(" "),
            h.id
        ));
    }
    if !h.fence.is_empty() {
        s.push_str(&format!("\n{}text\n{chunk}\n{}", h.fence, h.fence));
    }
    s
}

pub fn sha256_hex(b: &[u8]) -> String {
    crate::ghserver::sha256_hex(b)
}

fn head_for(e: &Entry, part: [u32; 2], fence: String) -> EntryHead {
    EntryHead {
        v: FORMAT_VERSION,
        entry: e.name.clone(),
        id: e.message_id.clone(),
        action: e.decision.action,
        sender: e.sender.clone(),
        parties: e.decision.to.clone(),
        reason: e.decision.reason.clone(),
        logged: e.logged.clone(),
        msg: e.message.as_ref().map(|m| MsgHead {
            from: m.from.clone(),
            to: m.to.clone(),
            kind: m.kind,
            subject: m.subject.clone(),
            refs: if part[0] == 1 { m.refs.clone() } else { vec![] },
            in_reply_to: m.in_reply_to.clone(),
            created: m.created.clone(),
        }),
        part,
        fence,
        sha256: e.message.as_ref().map(|m| sha256_hex(m.body.as_bytes())),
    }
}

/// An entry rendered as one or more sections, each at most `limit` characters.
pub fn render_entry(e: &Entry, mention: &[String], limit: usize) -> Result<Vec<String>> {
    let Some(m) = &e.message else {
        let s = render_section(&head_for(e, [1, 1], String::new()), "", mention);
        return if s.chars().count() <= limit { Ok(vec![s]) } else { Err(too_big(e)) };
    };
    let whole = render_section(&head_for(e, [1, 1], fence_for(&m.body)), &m.body, mention);
    if whole.chars().count() <= limit {
        return Ok(vec![whole]);
    }
    // Split on character boundaries; size each chunk with the widest header
    // it can get (part 9999/9999) so the final numbering only shrinks it.
    let chars: Vec<char> = m.body.chars().collect();
    let mut chunks: Vec<String> = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let mut take = (chars.len() - at).min(limit);
        loop {
            let chunk: String = chars[at..at + take].iter().collect();
            let probe = render_section(&head_for(e, [9999, 9999], fence_for(&chunk)), &chunk, mention);
            let n = probe.chars().count();
            if n <= limit {
                chunks.push(chunk);
                break;
            }
            let over = n - limit;
            if take <= 1 || over >= take {
                return Err(too_big(e));
            }
            take -= over.max(take / 16).min(take - 1);
        }
        at += take;
        if chunks.len() > 9999 {
            return Err(too_big(e));
        }
    }
    let n = chunks.len() as u32;
    Ok(chunks
        .iter()
        .enumerate()
        .map(|(i, c)| render_section(&head_for(e, [i as u32 + 1, n], fence_for(c)), c, mention))
        .collect())
}

fn too_big(e: &Entry) -> Error {
    Error::data(format!("log entry '{}' cannot be rendered within GitHub's comment limit (its headers alone are too large)", e.name))
}

/// Parses a comment written by lw-sync.  None when the comment does not
/// start with a header (a person's comment); Err when it starts like one but
/// its structure is broken.
pub fn parse_comment(text: &str) -> Option<std::result::Result<Vec<Section>, String>> {
    let mut rest = text;
    let mut sections = Vec::new();
    loop {
        // Skip blank lines and separators.
        loop {
            let (line, after) = split_line(rest);
            if rest.is_empty() || !(line.trim().is_empty() || line.trim() == "---") {
                break;
            }
            rest = after;
        }
        if rest.is_empty() {
            return Some(Ok(sections));
        }
        let (line, after) = split_line(rest);
        let line = line.trim_end_matches('\r');
        let Some(json) = line.strip_prefix(HEADER_PREFIX).and_then(|l| l.strip_suffix(HEADER_SUFFIX)) else {
            if sections.is_empty() {
                return None;
            }
            return Some(Err(format!("text after section {} is not a header", sections.len())));
        };
        let head: Head = match serde_json::from_str(json) {
            Ok(h) => h,
            Err(e) if sections.is_empty() => return Some(Err(format!("header is not valid: {e}"))),
            Err(e) => return Some(Err(format!("header {} is not valid: {e}", sections.len() + 1))),
        };
        rest = after;
        let fence = match &head {
            Head::Entry(h) => h.fence.clone(),
            Head::Notice(_) => String::new(),
        };
        let mut chunk = String::new();
        if fence.is_empty() {
            // Readable lines up to the next header or the end.
            loop {
                let (l, a) = split_line(rest);
                if rest.is_empty() || l.starts_with(HEADER_PREFIX) {
                    break;
                }
                rest = a;
            }
        } else {
            if fence.len() < 3 || !(fence.bytes().all(|b| b == b'`') || fence.bytes().all(|b| b == b'~')) {
                return Some(Err(format!("section {} names an invalid fence", sections.len() + 1)));
            }
            let open = format!("{fence}text");
            loop {
                let (l, a) = split_line(rest);
                if rest.is_empty() {
                    return Some(Err(format!("section {} has no body", sections.len() + 1)));
                }
                rest = a;
                if l.trim_end_matches('\r') == open {
                    break;
                }
            }
            // The closing fence: a line that is exactly the fence.
            let mut search = 0;
            let close_at = loop {
                let Some(i) = rest[search..].find(&format!("\n{fence}")) else {
                    // An empty body closes on the very next line.
                    if rest.starts_with(&fence) && search == 0 {
                        break None;
                    }
                    return Some(Err(format!("section {} body is not closed", sections.len() + 1)));
                };
                let end = search + i + 1 + fence.len();
                let tail = &rest[end..];
                if tail.is_empty() || tail.starts_with('\n') || tail.starts_with("\r\n") {
                    break Some(search + i);
                }
                search = end;
            };
            match close_at {
                Some(i) => {
                    chunk = rest[..i].to_string();
                    rest = &rest[i + 1 + fence.len()..];
                }
                None => return Some(Err(format!("section {} body is not closed", sections.len() + 1))),
            }
        }
        sections.push(Section { head, chunk });
    }
}

fn split_line(s: &str) -> (&str, &str) {
    match s.find('\n') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    }
}

/// Entry name -> the entry rebuilt from GitHub and the ids of its comments.
pub type Rebuilt = BTreeMap<String, (Entry, Vec<u64>)>;

/// One planned comment: its `(entry, part, parts)` items and its body.
type Planned = (Vec<(String, u32, u32)>, String);

/// Rebuilds log entries from the sections of a list of comments.
/// Returns the complete entries and, for incomplete ones, the parts found.
pub fn reassemble(sections: &[(u64, Section)]) -> (Rebuilt, BTreeMap<String, String>) {
    let mut parts: BTreeMap<String, BTreeMap<u32, (EntryHead, String, u64)>> = BTreeMap::new();
    for (cid, s) in sections {
        if let Head::Entry(h) = &s.head {
            parts.entry(h.entry.clone()).or_default().entry(h.part[0]).or_insert((h.clone(), s.chunk.clone(), *cid));
        }
    }
    let mut done = BTreeMap::new();
    let mut broken = BTreeMap::new();
    for (name, ps) in parts {
        let first = &ps.values().next().expect("a map entry has at least one part").0;
        let n = first.part[1];
        if ps.len() as u32 != n || !(1..=n).all(|i| ps.contains_key(&i)) {
            broken.insert(name, format!("{} of {n} parts on GitHub", ps.len()));
            continue;
        }
        let body: String = ps.values().map(|(_, c, _)| c.as_str()).collect();
        let h = &ps[&1].0;
        if h.sha256.as_deref().is_some_and(|s| s != sha256_hex(body.as_bytes())) {
            broken.insert(name, "body does not match its SHA-256 (edited on GitHub?)".into());
            continue;
        }
        let message = h.msg.as_ref().map(|m| Message {
            version: message::VERSION,
            id: h.id.clone(),
            from: m.from.clone(),
            to: m.to.clone(),
            kind: m.kind,
            subject: m.subject.clone(),
            body: body.clone(),
            refs: m.refs.clone(),
            in_reply_to: m.in_reply_to.clone(),
            created: m.created.clone(),
        });
        let e = Entry {
            version: LOG_VERSION,
            name: h.entry.clone(),
            logged: h.logged.clone(),
            message_id: h.id.clone(),
            sender: h.sender.clone(),
            message,
            decision: Decision { action: h.action, to: h.parties.clone(), reason: h.reason.clone() },
        };
        done.insert(name, (e, ps.values().map(|(_, _, c)| *c).collect()));
    }
    (done, broken)
}

// ---------------------------------------------------------------- state

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pending {
    /// `(entry, part)` pairs the comment in flight carries.
    pub items: Vec<(String, u32)>,
    pub at_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TargetState {
    /// Listed at least once since the state file was made.
    #[serde(default)]
    pub reconciled: bool,
    /// Entry (or notice key) -> the comment ids holding its parts.
    #[serde(default)]
    pub synced: BTreeMap<String, Vec<u64>>,
    /// Parts of multi-part entries posted so far.
    #[serde(default)]
    pub partial: BTreeMap<String, BTreeMap<u32, u64>>,
    #[serde(default)]
    pub pending: Option<Pending>,
    /// `since` for the next pull.
    #[serde(default)]
    pub pull_since: Option<String>,
    /// People's comments whose `/lw answer` lines were handled.
    #[serde(default)]
    pub answered: BTreeSet<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub version: u32,
    /// The token's user, whose comments are lw-sync's own.
    #[serde(default)]
    pub login: Option<String>,
    #[serde(default)]
    pub login_checked: bool,
    #[serde(default)]
    pub targets: BTreeMap<String, TargetState>,
    #[serde(default)]
    pub budget: Budget,
}

pub fn state_path(root: &Root) -> PathBuf {
    root.state_dir().join("sync.json")
}

pub fn load_state(path: &Path) -> Result<(State, bool)> {
    match std::fs::read(path) {
        Ok(b) => {
            let s: State = serde_json::from_slice(&b)
                .map_err(|e| Error::data(format!("sync state '{}' is damaged ({e}); move it aside and run again to rebuild it from GitHub", path.display())))?;
            Ok((s, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((State { version: 1, ..State::default() }, false)),
        Err(e) => Err(Error::io("cannot read sync state", path, e)),
    }
}

/// Writes `bytes` to `path` atomically: tmp file, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().expect("state files live in a directory");
    let tmp = dir.join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("state")));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| Error::io("cannot create", &tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io("cannot write", &tmp, e))?;
    f.sync_all().map_err(|e| Error::io_as(Exit::IoErr, "cannot fsync", &tmp, e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| Error::io("cannot rename into", path, e))?;
    let d = std::fs::File::open(dir).map_err(|e| Error::io("cannot open", dir, e))?;
    d.sync_all().map_err(|e| Error::io_as(Exit::IoErr, "cannot fsync", dir, e))?;
    Ok(())
}

fn save_state(path: &Path, st: &State) -> Result<()> {
    let mut b = serde_json::to_vec(st).expect("sync state is plain data");
    b.push(b'\n');
    write_atomic(path, &b)
}

/// The lock that keeps cron and a watcher from syncing at once.  Blocks
/// until it is free; released when the file is closed (or the process dies).
pub fn lock(root: &Root, wait: bool) -> Result<std::fs::File> {
    let dir = root.state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create", &dir, e))?;
    let p = dir.join("sync.lock");
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p).map_err(|e| Error::io("cannot open", &p, e))?;
    if wait {
        f.lock().map_err(|e| Error::io("cannot lock", &p, e))?;
    } else {
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::new(Exit::TempFail, format!("another lw-sync holds '{}'; nothing done", p.display())));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("cannot lock", &p, e)),
        }
    }
    Ok(f)
}

// ---------------------------------------------------------------- syncing

/// What a run did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Stats {
    pub entries: usize,
    pub comments: usize,
    pub reconciles: usize,
    pub unknown: usize,
    pub bad: usize,
    pub requests: u64,
    pub writes: u64,
}

/// One line of output per synced entry, notice or problem.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Event {
    Synced { entry: String, target: String, comment: u64, url: String },
    Bad { entry: String, reason: String },
    Unknown { target: String, reason: String },
    Answer { id: String, in_reply_to: String, to: String, comment: u64 },
    Rejected { comment: u64, target: String, reason: String },
    MissingOnGithub { entry: String, target: String },
    MissingLocally { entry: String, target: String },
    Differs { entry: String, target: String },
    Incomplete { entry: String, target: String, reason: String },
    Restored { entry: String },
}

pub struct Syncer {
    pub root: Root,
    pub cfg: Config,
    pub client: Client,
    pub state: State,
    pub state_path: PathBuf,
    state_existed: bool,
    pub stats: Stats,
    pub events: Vec<Event>,
}

impl Syncer {
    pub fn new(root: Root, cfg: Config, client: Client) -> Result<Syncer> {
        let state_path = state_path(&root);
        let (state, state_existed) = load_state(&state_path)?;
        let mut client = client;
        client.budget = state.budget.clone();
        Ok(Syncer { root, cfg, client, state, state_path, state_existed, stats: Stats::default(), events: vec![] })
    }

    /// Rereads the state: another process (cron beside a watcher) may have
    /// synced since.  Call it after taking the lock, before a pass.
    pub fn reload(&mut self) -> Result<()> {
        let (state, existed) = load_state(&self.state_path)?;
        self.client.budget = state.budget.clone();
        self.state = state;
        self.state_existed = existed;
        Ok(())
    }

    fn save(&mut self) -> Result<()> {
        self.state.budget = self.client.budget.clone();
        save_state(&self.state_path, &self.state)
    }

    fn ensure_login(&mut self) -> Result<()> {
        if !self.state.login_checked {
            self.state.login = self.client.user()?;
            self.state.login_checked = true;
            self.save()?;
        }
        Ok(())
    }

    fn trusted(&self, c: &Comment) -> bool {
        match &self.state.login {
            None => true,
            Some(l) => c.login() == l || self.cfg.trust.iter().any(|t| t == c.login()),
        }
    }

    /// lw-sync's own sections among `comments`, with their comment ids.
    fn own_sections(&mut self, t: &Target, comments: &[Comment]) -> Vec<(u64, Section)> {
        let mut out = Vec::new();
        for c in comments {
            if !self.trusted(c) {
                continue;
            }
            match parse_comment(c.text()) {
                None => {}
                Some(Ok(ss)) => out.extend(ss.into_iter().map(|s| (c.id, s))),
                Some(Err(e)) => self.events.push(Event::Unknown { target: t.to_string(), reason: format!("comment {} is unreadable: {e}", c.id) }),
            }
        }
        out
    }

    /// Lists every comment of `t` and records what is already there.
    fn reconcile(&mut self, t: &Target) -> Result<()> {
        let comments = self.client.list_comments(t, None)?;
        self.stats.reconciles += 1;
        let sections = self.own_sections(t, &comments);
        let key = t.to_string();
        let ts = self.state.targets.entry(key).or_default();
        for (cid, s) in &sections {
            match &s.head {
                Head::Entry(h) => {
                    if h.part[1] <= 1 {
                        ts.synced.entry(h.entry.clone()).or_insert_with(|| vec![*cid]);
                    } else {
                        ts.partial.entry(h.entry.clone()).or_default().entry(h.part[0]).or_insert(*cid);
                    }
                }
                Head::Notice(n) => {
                    ts.synced.entry(n.key.clone()).or_insert_with(|| vec![*cid]);
                }
            }
        }
        complete_partials(ts, &sections);
        ts.pending = None;
        ts.reconciled = true;
        self.save()
    }

    /// One pass over the log: everything not yet on GitHub is posted.
    pub fn sync(&mut self) -> Result<()> {
        let log = Log::new(self.root.log_dir());
        let (entries, bad) = log.entries()?;
        for b in bad {
            self.stats.bad += 1;
            self.events.push(Event::Bad { entry: b.name, reason: b.reason });
        }
        let mut by_target: BTreeMap<Target, Vec<Entry>> = BTreeMap::new();
        for e in entries {
            if let Some(m) = &e.message
                && let Err(why) = m.validate()
            {
                self.stats.bad += 1;
                self.events.push(Event::Bad { entry: e.name.clone(), reason: format!("message: {why}") });
                continue;
            }
            by_target.entry(self.cfg.target_for(&e)?).or_default().push(e);
        }
        if by_target.is_empty() {
            return Ok(());
        }
        // Nothing new anywhere and nothing in flight: no request at all.
        let idle = by_target.iter().all(|(t, es)| {
            self.state.targets.get(&t.to_string()).is_some_and(|ts| ts.reconciled && ts.pending.is_none() && es.iter().all(|e| ts.synced.contains_key(&e.name)))
        });
        if idle {
            return Ok(());
        }
        self.ensure_login()?;
        let mut first_err = None;
        for (t, es) in by_target {
            match self.sync_target(&t, &es) {
                Ok(()) => {}
                Err(e) if matches!(e.exit, Exit::Config | Exit::DataErr) => {
                    // This target is wrong; the others may be fine.
                    eprintln!("lw-sync: {t}: {e}");
                    first_err.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn sync_target(&mut self, t: &Target, entries: &[Entry]) -> Result<()> {
        let key = t.to_string();
        let mut unknown_in_row = 0;
        let mut unrenderable: BTreeSet<String> = BTreeSet::new();
        loop {
            let ts = self.state.targets.entry(key.clone()).or_default();
            if !ts.reconciled || ts.pending.is_some() || !self.state_existed && ts.synced.is_empty() {
                self.reconcile(t)?;
                self.state_existed = true;
            }
            let ts = self.state.targets.get(&key).expect("reconcile made the target state");
            let todo: Vec<&Entry> = entries.iter().filter(|e| !ts.synced.contains_key(&e.name) && !unrenderable.contains(&e.name)).collect();
            if todo.is_empty() {
                return Ok(());
            }
            let plan = self.plan(&todo, &mut unrenderable)?;
            if plan.is_empty() {
                return Ok(());
            }
            let mut interrupted = false;
            for (items, body) in plan {
                let path = self.state_path.clone();
                let state = &mut self.state;
                let key2 = key.clone();
                let items2: Vec<(String, u32)> = items.iter().map(|(n, p, _)| (n.clone(), *p)).collect();
                let mut before = |b: &Budget| -> Result<()> {
                    state.budget = b.clone();
                    let ts = state.targets.get_mut(&key2).expect("target state exists while posting");
                    ts.pending = Some(Pending { items: items2.clone(), at_ms: crate::github::now_ms() });
                    save_state(&path, state)
                };
                let res = self.client.post_comment(t, &body, &mut before);
                match res {
                    Ok(Posted::Created(c)) => {
                        unknown_in_row = 0;
                        self.stats.comments += 1;
                        let ts = self.state.targets.get_mut(&key).expect("target state exists");
                        for (name, part, n) in &items {
                            mark_part(ts, name, *part, *n, c.id);
                            if ts.synced.contains_key(name) {
                                self.stats.entries += 1;
                                self.events.push(Event::Synced { entry: name.clone(), target: key.clone(), comment: c.id, url: c.html_url.clone() });
                            }
                        }
                        ts.pending = None;
                        self.save()?;
                    }
                    Ok(Posted::Unknown(reason)) => {
                        self.stats.unknown += 1;
                        unknown_in_row += 1;
                        self.events.push(Event::Unknown { target: key.clone(), reason: reason.clone() });
                        self.save()?;
                        if unknown_in_row >= MAX_UNKNOWN {
                            return Err(Error::new(
                                Exit::TempFail,
                                format!("{unknown_in_row} comments in a row on {t} had an unknown outcome (last: {reason}); try again later"),
                            ));
                        }
                        interrupted = true;
                        break;
                    }
                    Err(e) => {
                        // A definite failure: nothing was created.
                        if let Some(ts) = self.state.targets.get_mut(&key) {
                            ts.pending = None;
                        }
                        self.save()?;
                        return Err(e);
                    }
                }
            }
            if !interrupted {
                // Entries that arrived meanwhile are picked up by the next pass.
                return Ok(());
            }
        }
    }

    /// Groups pending entries into comments: a backlog is batched (up to
    /// `batch` entries and the character limit per comment); an entry too
    /// large for one comment is split into parts, one comment each.
    fn plan(&mut self, todo: &[&Entry], unrenderable: &mut BTreeSet<String>) -> Result<Vec<Planned>> {
        let mut plan: Vec<Planned> = Vec::new();
        let mut cur: Planned = (vec![], String::new());
        let batch = self.cfg.batch();
        let ts = self.state.targets.get(&self.key_of(todo[0])?).cloned().unwrap_or_default();
        for e in todo {
            let parts = match render_entry(e, &self.cfg.mention, MAX_COMMENT_CHARS) {
                Ok(p) => p,
                Err(err) => {
                    self.stats.bad += 1;
                    self.events.push(Event::Bad { entry: e.name.clone(), reason: err.msg });
                    unrenderable.insert(e.name.clone());
                    continue;
                }
            };
            if parts.len() > 1 {
                let have = ts.partial.get(&e.name).cloned().unwrap_or_default();
                let n = parts.len() as u32;
                for (i, p) in parts.into_iter().enumerate() {
                    let part = i as u32 + 1;
                    if !have.contains_key(&part) {
                        plan.push((vec![(e.name.clone(), part, n)], p));
                    }
                }
                continue;
            }
            let s = parts.into_iter().next().expect("render_entry gives at least one part");
            let joined = cur.1.chars().count() + SEPARATOR.len() + s.chars().count();
            if !cur.0.is_empty() && (cur.0.len() >= batch || joined > MAX_COMMENT_CHARS) {
                plan.push(std::mem::take(&mut cur));
            }
            if !cur.0.is_empty() {
                cur.1.push_str(SEPARATOR);
            }
            cur.1.push_str(&s);
            cur.0.push((e.name.clone(), 1, 1));
        }
        if !cur.0.is_empty() {
            plan.push(cur);
        }
        Ok(plan)
    }

    fn key_of(&self, e: &Entry) -> Result<String> {
        Ok(self.cfg.target_for(e)?.to_string())
    }

    /// The way back: `/lw answer ID` lines in people's comments become
    /// answers in `ROOT/human-outbox`.
    pub fn pull(&mut self) -> Result<()> {
        self.ensure_login()?;
        let log = Log::new(self.root.log_dir());
        let (entries, _) = log.entries()?;
        let mut known: HashMap<String, (String, String)> = HashMap::new();
        for e in &entries {
            if let Some(m) = &e.message {
                known.entry(e.message_id.clone()).or_insert((e.sender.clone(), m.subject.clone()));
            }
        }
        for t in self.cfg.targets()? {
            self.pull_target(&t, &known)?;
        }
        Ok(())
    }

    fn pull_target(&mut self, t: &Target, known: &HashMap<String, (String, String)>) -> Result<()> {
        let key = t.to_string();
        let ts = self.state.targets.entry(key.clone()).or_default().clone();
        if ts.pending.is_some() || !ts.reconciled {
            // Notices already on the issue must be known before any is posted.
            self.reconcile(t)?;
        }
        let ts = self.state.targets[&key].clone();
        let comments = self.client.list_comments(t, ts.pull_since.as_deref())?;
        let mut known = known.clone();
        for (_, s) in self.own_sections(t, &comments) {
            if let Head::Entry(h) = s.head
                && let Some(m) = h.msg
            {
                known.entry(h.id.clone()).or_insert((h.sender.clone(), m.subject.clone()));
            }
        }
        let mut newest = ts.pull_since.clone();
        for c in &comments {
            if newest.as_deref().is_none_or(|n| c.updated_at.as_str() > n) {
                newest = Some(c.updated_at.clone());
            }
            if ts.answered.contains(&c.id) || (self.trusted(c) && parse_comment(c.text()).is_some()) {
                continue;
            }
            let cmds = parse_answers(c.text());
            if cmds.is_empty() {
                continue;
            }
            let allowed = if self.cfg.answerers.is_empty() {
                matches!(c.author_association.as_str(), "OWNER" | "MEMBER" | "COLLABORATOR")
            } else {
                self.cfg.answerers.iter().any(|a| a == c.login())
            };
            for (k, (id, text)) in cmds.iter().enumerate() {
                let problem = if !allowed {
                    Some(format!("@{} may not answer for this repository (configure \"answerers\")", c.login()))
                } else if let Some((asker, subject)) = known.get(id) {
                    if text.trim().is_empty() {
                        Some(format!("the answer to {id} is empty: write it on the lines after `/lw answer {id}`"))
                    } else {
                        match self.deliver_answer(t, c, k, id, asker, subject, text) {
                            Ok(()) => None,
                            Err(e) if e.exit == Exit::DataErr => Some(e.msg),
                            Err(e) => return Err(e),
                        }
                    }
                } else {
                    Some(format!("no message with id {id} is known to lw-sync; check the id in `/lw answer`"))
                };
                if let Some(p) = problem {
                    self.events.push(Event::Rejected { comment: c.id, target: key.clone(), reason: p.clone() });
                    self.notice(t, c, k, &p)?;
                }
            }
            self.state.targets.get_mut(&key).expect("target state exists").answered.insert(c.id);
            self.save()?;
        }
        self.state.targets.get_mut(&key).expect("target state exists").pull_since = newest;
        self.save()
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver_answer(&mut self, t: &Target, c: &Comment, k: usize, id: &str, asker: &str, subject: &str, text: &str) -> Result<()> {
        let created = crate::time::parse_rfc3339(&c.created_at).unwrap_or_else(crate::time::now);
        let seed = sha256_hex(format!("{}#{}/{}/{k}", t.repo, t.issue, c.id).as_bytes());
        let rand = u128::from_str_radix(&seed[..32], 16).expect("a SHA-256 hex digest is hex");
        let mut subj = format!("Re: {subject}");
        while subj.len() > message::MAX_SUBJECT {
            subj.pop();
        }
        let m = Message {
            version: message::VERSION,
            id: crate::id::id_at(created, rand),
            from: crate::layout::HUMAN.into(),
            to: vec![asker.to_string()],
            kind: Kind::Answer,
            subject: subj,
            body: text.to_string(),
            refs: if c.html_url.is_empty() || c.html_url.len() > message::MAX_REF { vec![] } else { vec![c.html_url.clone()] },
            in_reply_to: Some(id.to_string()),
            created: crate::time::rfc3339(created),
        };
        m.validate().map_err(|e| Error::data(format!("the answer in comment {} is not a valid message: {e}", c.id)))?;
        self.root.human_outbox().deliver_once(&m.id, &m.to_bytes())?;
        self.events.push(Event::Answer { id: m.id.clone(), in_reply_to: id.into(), to: asker.into(), comment: c.id });
        Ok(())
    }

    /// Tells the person on the issue why their answer was not delivered;
    /// once per (comment, answer), with the same intent/reconcile protocol.
    fn notice(&mut self, t: &Target, c: &Comment, k: usize, problem: &str) -> Result<()> {
        let key = t.to_string();
        let nkey = format!("notice/{}/{k}", c.id);
        if self.state.targets.get(&key).is_some_and(|ts| ts.synced.contains_key(&nkey)) {
            return Ok(());
        }
        let head = Head::Notice(NoticeHead { v: FORMAT_VERSION, key: nkey.clone(), about: c.id });
        let body = format!(
            "{}\n**lw-sync** did not deliver the answer in comment {} ({}): {}\n",
            header_line(&head),
            c.id,
            inline(&format!("@{}", c.login())).replace('@', "@\u{200b}"),
            inline(problem)
        );
        let path = self.state_path.clone();
        let state = &mut self.state;
        let items = vec![(nkey.clone(), 1)];
        let key2 = key.clone();
        let mut before = |b: &Budget| -> Result<()> {
            state.budget = b.clone();
            state.targets.entry(key2.clone()).or_default().pending = Some(Pending { items: items.clone(), at_ms: crate::github::now_ms() });
            save_state(&path, state)
        };
        match self.client.post_comment(t, &body, &mut before)? {
            Posted::Created(nc) => {
                let ts = self.state.targets.get_mut(&key).expect("target state exists");
                ts.synced.insert(nkey, vec![nc.id]);
                ts.pending = None;
                self.save()
            }
            Posted::Unknown(_) => self.reconcile(t),
        }
    }

    /// Compares the log with GitHub both ways; with `restore`, appends the
    /// entries found only on GitHub to the log.  True when both agree.
    pub fn verify(&mut self, restore: bool) -> Result<bool> {
        self.ensure_login()?;
        let log = Log::new(self.root.log_dir());
        let (entries, bad) = log.entries()?;
        for b in bad {
            self.events.push(Event::Bad { entry: b.name, reason: b.reason });
        }
        let mut local: BTreeMap<Target, BTreeMap<String, Entry>> = BTreeMap::new();
        for e in entries {
            local.entry(self.cfg.target_for(&e)?).or_default().insert(e.name.clone(), e);
        }
        let mut targets: BTreeSet<Target> = self.cfg.targets()?.into_iter().collect();
        targets.extend(local.keys().cloned());
        let mut same = true;
        for t in targets {
            let comments = self.client.list_comments(&t, None)?;
            let sections = self.own_sections(&t, &comments);
            let (remote, broken) = reassemble(&sections);
            let mine = local.remove(&t).unwrap_or_default();
            let key = t.to_string();
            for (name, e) in &mine {
                match remote.get(name) {
                    None if broken.contains_key(name) => {
                        same = false;
                        self.events.push(Event::Incomplete { entry: name.clone(), target: key.clone(), reason: broken[name].clone() });
                    }
                    None => {
                        same = false;
                        self.events.push(Event::MissingOnGithub { entry: name.clone(), target: key.clone() });
                    }
                    Some((r, _)) if r != e => {
                        same = false;
                        self.events.push(Event::Differs { entry: name.clone(), target: key.clone() });
                    }
                    Some(_) => {}
                }
            }
            for (name, (e, _)) in &remote {
                if !mine.contains_key(name) {
                    same = false;
                    self.events.push(Event::MissingLocally { entry: name.clone(), target: key.clone() });
                    if restore {
                        log.append(e)?;
                        self.events.push(Event::Restored { entry: name.clone() });
                    }
                }
            }
            for (name, why) in &broken {
                if !mine.contains_key(name) {
                    same = false;
                    self.events.push(Event::Incomplete { entry: name.clone(), target: key.clone(), reason: why.clone() });
                }
            }
        }
        Ok(same)
    }

    pub fn finish_stats(&mut self) -> Stats {
        self.stats.requests = self.client.requests;
        self.stats.writes = self.client.writes;
        self.stats.clone()
    }
}

/// Runs `pass` now, then again whenever something is renamed into or
/// created in `dir` (debounced), on a rescan request, and every `period`.
/// Returns when `pass` fails with an error it cannot wait out.
pub fn watch_dir(dir: &Path, period: std::time::Duration, mut pass: impl FnMut() -> Result<()>) -> Result<()> {
    use notify::EventKind;
    use notify::event::{ModifyKind, RenameMode};
    use notify_debouncer_full::{DebounceEventResult, new_debouncer};
    let (tx, rx) = std::sync::mpsc::channel::<DebounceEventResult>();
    let mut deb = new_debouncer(std::time::Duration::from_millis(200), None, tx)
        .map_err(|e| Error::new(Exit::Unavailable, format!("cannot start a file watcher on '{}'", dir.display())).with_source(e))?;
    deb.watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(|e| Error::new(Exit::NoInput, format!("cannot watch '{}'", dir.display())).with_source(e))?;
    loop {
        match pass() {
            Ok(()) => {}
            // Waiting is what a watcher does; the next pass retries.
            Err(e) if matches!(e.exit, Exit::TempFail | Exit::Unavailable) => eprintln!("lw-sync: {e}"),
            Err(e) => return Err(e),
        }
        // Wait for something relevant; other events (our own reads) are drained.
        loop {
            match rx.recv_timeout(period) {
                Ok(Ok(events)) => {
                    let relevant = events.iter().any(|ev| {
                        ev.need_rescan()
                            || matches!(
                                ev.kind,
                                EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both | RenameMode::Any))
                            )
                    });
                    if relevant {
                        break;
                    }
                }
                Ok(Err(errs)) => {
                    for e in errs {
                        eprintln!("lw-sync: watching '{}': {e}; rescanning", dir.display());
                    }
                    break;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Error::new(Exit::Software, format!("the watcher on '{}' stopped", dir.display())));
                }
            }
        }
    }
}

fn mark_part(ts: &mut TargetState, name: &str, part: u32, n: u32, cid: u64) {
    match n {
        n if n > 1 => {
            let ps = ts.partial.entry(name.to_string()).or_default();
            ps.insert(part, cid);
            if ps.len() as u32 == n {
                let ids = ps.values().copied().collect();
                ts.partial.remove(name);
                ts.synced.insert(name.to_string(), ids);
            }
        }
        _ => {
            ts.synced.insert(name.to_string(), vec![cid]);
        }
    }
}

fn complete_partials(ts: &mut TargetState, sections: &[(u64, Section)]) {
    let mut totals: HashMap<String, u32> = HashMap::new();
    for (_, s) in sections {
        if let Head::Entry(h) = &s.head {
            totals.insert(h.entry.clone(), h.part[1]);
        }
    }
    let done: Vec<String> =
        ts.partial.iter().filter(|(n, ps)| totals.get(*n).is_some_and(|&t| ps.len() as u32 == t)).map(|(n, _)| n.clone()).collect();
    for n in done {
        let ps = ts.partial.remove(&n).expect("listed above");
        ts.synced.insert(n, ps.values().copied().collect());
    }
}

/// `/lw answer ID` lines and the text after each, up to the next such line.
pub fn parse_answers(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        let l = line.trim_end_matches('\r');
        if l.trim_start().starts_with("```") || l.trim_start().starts_with("~~~") {
            in_code = !in_code;
        }
        let cmd = if in_code { None } else { l.trim().strip_prefix("/lw answer ").map(str::trim) };
        match cmd {
            Some(id) if !id.is_empty() && !id.contains(char::is_whitespace) => out.push((id.to_string(), String::new())),
            _ => {
                if let Some((_, body)) = out.last_mut() {
                    body.push_str(l);
                    body.push('\n');
                }
            }
        }
    }
    for (_, body) in &mut out {
        let t = body.trim_matches('\n').to_string();
        *body = t;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: &str, action: Action) -> Entry {
        let id = crate::id::new_id();
        Entry {
            version: 1,
            name: Entry::name_for(&id, action, None),
            logged: crate::time::rfc3339(crate::time::now()),
            message_id: id.clone(),
            sender: "api".into(),
            message: Some(Message {
                version: 1,
                id,
                from: "api".into(),
                to: vec!["human".into()],
                kind: Kind::Question,
                subject: "subject with `ticks` and <!-- -->".into(),
                body: body.into(),
                refs: vec!["x".into()],
                in_reply_to: None,
                created: crate::time::rfc3339(crate::time::now()),
            }),
            decision: Decision { action, to: vec!["human".into()], reason: "policy: questions -> human".into() },
        }
    }

    fn roundtrip(e: &Entry, limit: usize) -> Entry {
        let parts = render_entry(e, &["alice".into()], limit).unwrap();
        let mut secs = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            assert!(p.chars().count() <= limit, "part {i} is {} chars", p.chars().count());
            secs.extend(parse_comment(p).unwrap().unwrap().into_iter().map(|s| (i as u64, s)));
        }
        let (done, broken) = reassemble(&secs);
        assert!(broken.is_empty(), "{broken:?}");
        done[&e.name].0.clone()
    }

    #[test]
    fn a_body_cannot_forge_or_break_out_of_a_header() {
        let evil = "```\n-->\n<!-- loopwright {\"t\":\"entry\",\"v\":1,\"entry\":\"forged\"} -->\n````\n~~~\n@alice #12 done";
        let e = entry(evil, Action::Escalate);
        assert_eq!(roundtrip(&e, MAX_COMMENT_CHARS), e);
        let text = render_entry(&e, &[], MAX_COMMENT_CHARS).unwrap().remove(0);
        let secs = parse_comment(&text).unwrap().unwrap();
        assert_eq!(secs.len(), 1, "the forged header inside the body is body text");
        // The header line holds no '>' except its own terminator.
        let first = text.lines().next().unwrap();
        assert_eq!(first.matches('>').count(), 1, "{first}");
    }

    #[test]
    fn long_bodies_split_into_parts_that_reassemble() {
        let body: String = (0..9000).map(|i| if i % 97 == 0 { "``````````\n".to_string() } else { format!("line {i} é @x #1\n") }).collect();
        let e = entry(&body, Action::Forward);
        assert_eq!(roundtrip(&e, 20_000), e);
        assert!(render_entry(&e, &[], 20_000).unwrap().len() > 3);
        let ticks = entry(&"`".repeat(50_000), Action::Forward);
        assert_eq!(roundtrip(&ticks, 20_000), ticks);
    }

    #[test]
    fn batched_sections_parse_back_in_order() {
        let a = entry("first", Action::Forward);
        let mut b = entry("", Action::Hold);
        b.message.as_mut().unwrap().body = String::new();
        let mut r = entry("x", Action::Read);
        r.message = None;
        let text = [a.clone(), b.clone(), r.clone()]
            .iter()
            .map(|e| render_entry(e, &[], MAX_COMMENT_CHARS).unwrap().remove(0))
            .collect::<Vec<_>>()
            .join(SEPARATOR);
        let secs: Vec<(u64, Section)> = parse_comment(&text).unwrap().unwrap().into_iter().map(|s| (1, s)).collect();
        let (done, _) = reassemble(&secs);
        assert_eq!(done[&a.name].0, a);
        assert_eq!(done[&b.name].0, b);
        assert_eq!(done[&r.name].0, r);
    }

    #[test]
    fn mentions_only_on_escalations() {
        let e = entry("@bob look #3", Action::Escalate);
        let t = render_entry(&e, &["alice".into()], MAX_COMMENT_CHARS).unwrap().remove(0);
        assert!(t.contains("cc @alice"));
        let f = entry("x", Action::Forward);
        let t = render_entry(&f, &["alice".into()], MAX_COMMENT_CHARS).unwrap().remove(0);
        assert!(!t.contains("@alice"));
    }

    #[test]
    fn human_comments_are_not_ours_and_answers_parse() {
        assert!(parse_comment("Thanks!\n/lw answer 1.2.3\nyes").is_none());
        let a = parse_answers("hi\n/lw answer AAA\nuse v2\n\n/lw answer BBB\nno\n```\n/lw answer CCC\n```\n");
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], ("AAA".into(), "use v2".into()));
        assert_eq!(a[1].0, "BBB");
    }
}
