//! lw-mcp: the sandbox's mailbox door as a Model Context Protocol server.
//!
//! Each tool is one mailbox operation of mailbox-spec.md, done by the same
//! library code as the commands: `post` is lw-post (crates/mailbox/src/post.rs), `inbox`,
//! `show` and `ack` are lw-inbox (crates/mailbox/src/inbox.rs), `wait` is lw-inbox --wait
//! for messages this session has not been shown yet (wait.rs), `whoami` reads the
//! registry that lw-sandbox mounts read-only into the sandbox.  The inbox is
//! also the resource `inbox://`, which a client can subscribe to: each
//! message delivered while it is subscribed is announced by one
//! `notifications/resources/updated` (resource.rs).
//!
//! Two kinds of failure, as MCP separates them: a request that cannot be
//! routed or decoded (unknown tool, arguments of the wrong type or with an
//! unknown field) is a JSON-RPC error (-32602); a message the door refuses
//! (too big, bad kind, rate limit, mailbox gone) is a tool result with
//! `isError` whose text names the problem and the fix.  A refused post
//! leaves nothing in the outbox: everything is checked before the delivery
//! procedure starts, and that procedure never shows a half-written file.
//!
//! The protocol itself is rmcp's (the official Rust SDK); the stdio framing
//! is stdio.rs, which answers malformed input as JSON-RPC asks.

mod handler;
pub mod resource;
pub mod stdio;
pub mod tools;
pub mod wait;

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, ResourceUpdatedNotificationParam};
use rmcp::service::RequestContext;
use serde_json::{Value, json};
use tokio::sync::watch;

use base::error::{Error, Exit};
use mailbox::layout::{Root, SandboxBox};
use mailbox::maildir::{Found, Sub};
use mailbox::message::{Kind, Message};
use mailbox::registry::Registry;

/// Where a sandbox sees the registry (mounted read-only by lw-sandbox).
pub const REGISTRY_DIR: &str = "/lw/registry";

/// A sliding-window limit on posts: at most `count` in any `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub count: usize,
    pub window: Duration,
}

impl Rate {
    /// The default policy's rate (mailbox-spec.md, "POLICY"): posting
    /// faster only gets messages held by the mediator.
    pub const DEFAULT: Rate = Rate {
        count: 120,
        window: Duration::from_secs(60),
    };

    /// `COUNT/DURATION` (`120/1m`) or `off`.
    pub fn parse(s: &str) -> Result<Option<Rate>, String> {
        if s == "off" {
            return Ok(None);
        }
        let (n, w) = s
            .split_once('/')
            .ok_or_else(|| format!("rate '{s}' must be COUNT/DURATION (e.g. 120/1m) or off"))?;
        let count = n
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("rate count '{n}' must be a whole number above 0"))?;
        let window = mailbox::policy::parse_duration(w).map_err(|m| format!("rate: {m}"))?;
        Ok(Some(Rate { count, window }))
    }
}

/// What lw-mcp serves: one sandbox's mailbox.
pub struct Door {
    mailbox: PathBuf,
    from: String,
    branch: Option<String>,
    registry: Option<PathBuf>,
    rate: Option<Rate>,
    posts: Mutex<VecDeque<Instant>>,
    /// Names in `inbox/new/` this session has shown the client (see wait.rs).
    reported: Mutex<HashSet<OsString>>,
    /// The task ringing `inbox://` for a subscribed client (resource.rs).
    bell: Mutex<Option<tokio::task::AbortHandle>>,
    closed: watch::Receiver<bool>,
}

impl Door {
    /// `closed` turns true when the client's input ends (see stdio.rs).
    pub fn new(
        mailbox: PathBuf,
        from: String,
        branch: Option<String>,
        registry: Option<PathBuf>,
        rate: Option<Rate>,
        closed: watch::Receiver<bool>,
    ) -> Door {
        Door {
            mailbox,
            from,
            branch,
            registry,
            rate,
            posts: Mutex::new(VecDeque::new()),
            reported: Mutex::new(HashSet::new()),
            bell: Mutex::new(None),
            closed,
        }
    }

    fn boxdir(&self) -> SandboxBox {
        SandboxBox::new(&self.mailbox)
    }

    /// Counts a post against the rate; Err(seconds to wait) when over it.
    fn admit(&self) -> Result<(), Duration> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        let now = Instant::now();
        let mut q = self
            .posts
            .lock()
            .expect("the rate queue is never poisoned because nothing panics holding it");
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= rate.window)
        {
            q.pop_front();
        }
        if q.len() >= rate.count {
            let oldest = *q.front().expect("the queue is full, so it has a front");
            return Err(rate.window.saturating_sub(now.duration_since(oldest)));
        }
        q.push_back(now);
        Ok(())
    }

    /// Gives back a post's place in the rate when it was not posted after all.
    fn unadmit(&self) {
        if self.rate.is_some() {
            self.posts
                .lock()
                .expect("the rate queue is never poisoned because nothing panics holding it")
                .pop_back();
        }
    }

    async fn post(&self, a: tools::PostArgs) -> CallToolResult {
        if let Err(left) = self.admit() {
            let r = self.rate.expect("admit refuses only with a rate");
            return refusal(format!(
                "rate limit: this session posted {} messages in the last {}s, the most allowed \
                 (the mediator holds messages beyond its policy rate). Fix: wait {:.0}s and post \
                 again, or combine several updates into one message.",
                r.count,
                r.window.as_secs(),
                left.as_secs_f64().ceil()
            ));
        }
        let req = mailbox::post::Request {
            kind: a.kind,
            subject: a.subject,
            body: a.body,
            to: a.to,
            refs: a.refs,
            in_reply_to: a.in_reply_to,
        };
        let (mailbox, from) = (self.mailbox.clone(), self.from.clone());
        let res =
            tokio::task::spawn_blocking(move || mailbox::post::post(&mailbox, &from, req)).await;
        match res {
            Ok(Ok(p)) => {
                let m = p.message;
                ok(json!({"id": m.id, "kind": m.kind, "to": m.to, "created": m.created}))
            }
            Ok(Err(e)) => {
                self.unadmit();
                refusal(with_fix(&e))
            }
            Err(e) => {
                self.unadmit();
                refusal(format!("internal error while posting: {e}"))
            }
        }
    }

    fn inbox(&self, a: tools::InboxArgs) -> CallToolResult {
        let inbox = self.boxdir().inbox();
        if let Err(e) = self.ready() {
            return refusal(e);
        }
        let mut messages = Vec::new();
        let mut bad = Vec::new();
        let subs: &[Sub] = if a.all {
            &[Sub::New, Sub::Cur]
        } else {
            &[Sub::New]
        };
        for &sub in subs {
            let entries = match inbox.scan(sub) {
                Ok(e) => e,
                Err(e) => return refusal(with_fix(&e)),
            };
            for e in entries {
                let name = e.display_name();
                match e.found {
                    Found::Message(m) => {
                        if sub == Sub::New {
                            self.report(e.name);
                        }
                        messages.push(json!({
                        "id": m.id, "from": m.from, "kind": m.kind, "subject": m.subject,
                        "created": m.created, "in_reply_to": m.in_reply_to,
                        "state": mailbox::inbox::state(sub),
                        }));
                    }
                    Found::Gone => {}
                    Found::Bad(r) => bad.push(json!({"name": name, "reason": r})),
                    Found::NotFile(w) => bad.push(json!({"name": name,
                        "reason": format!("is a {w}, not a regular file")})),
                }
            }
        }
        let mut v = json!({"messages": messages});
        if !bad.is_empty() {
            v["unreadable"] = bad.into();
        }
        ok(v)
    }

    fn show(&self, a: tools::IdArgs) -> CallToolResult {
        match mailbox::inbox::find(&self.boxdir().inbox(), &a.id) {
            Ok((m, state)) => {
                self.report(OsString::from(&m.id));
                ok(message_json(&m, state))
            }
            Err(e) => refusal(with_fix(&e)),
        }
    }

    async fn ack(&self, a: tools::IdArgs) -> CallToolResult {
        if let Err(e) = self.ready() {
            return refusal(e);
        }
        let inbox = self.boxdir().inbox();
        let id = a.id.clone();
        match tokio::task::spawn_blocking(move || mailbox::inbox::ack(&inbox, &id)).await {
            Ok(Ok(claimed)) => ok(json!({"id": a.id, "already": !claimed})),
            Ok(Err(e)) => refusal(with_fix(&e)),
            Err(e) => refusal(format!("internal error while acknowledging: {e}")),
        }
    }

    async fn wait(&self, a: tools::WaitArgs, ctx: &RequestContext<RoleServer>) -> CallToolResult {
        if !(a.timeout.is_finite() && (0.0..=tools::MAX_WAIT).contains(&a.timeout)) {
            return refusal(format!(
                "timeout {} is out of range; give seconds from 0 to {}",
                a.timeout,
                tools::MAX_WAIT
            ));
        }
        let mut kinds = Vec::new();
        for k in &a.kinds {
            match Kind::parse(k) {
                Some(k) => kinds.push(k),
                None => {
                    return refusal(format!(
                        "unknown kind '{}' in kinds; use any of: {}",
                        k.escape_debug(),
                        mailbox::message::KINDS
                            .iter()
                            .map(|k| k.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        if let Err(e) = self.ready() {
            return refusal(e);
        }
        let mut closed = self.closed.clone();
        let stop = async move {
            tokio::select! {
                _ = ctx.ct.cancelled() => {}
                _ = closed.wait_for(|c| *c) => {}
            }
        };
        let inbox = self.boxdir().inbox();
        let timeout = Duration::from_secs_f64(a.timeout);
        match wait::wait(&inbox, &kinds, timeout, &self.reported, stop).await {
            Ok(wait::Waited::Arrived(ms)) => {
                let ms: Vec<Value> = ms.iter().map(|m| message_json(m, "new")).collect();
                ok(json!({"messages": ms, "timed_out": false}))
            }
            Ok(wait::Waited::TimedOut) => ok(json!({"messages": [], "timed_out": true})),
            Ok(wait::Waited::Stopped) => refusal("the wait was cancelled".into()),
            Err(e) => refusal(with_fix(&e)),
        }
    }

    fn whoami(&self) -> CallToolResult {
        let mut v = json!({
            "name": self.from,
            "branch": self.branch,
            "mailbox": self.mailbox,
            "scope": Value::Null,
            "peers": [],
        });
        let Some(dir) = &self.registry else {
            v["registry"] = "not visible in this sandbox: peers and scopes are unknown".into();
            return ok(v);
        };
        // Listing reads only the registry directory, so any directory works
        // as the registry of a root that is otherwise not there.
        let mut reg = Registry::new(&Root::new(dir.parent().unwrap_or(Path::new("/"))));
        reg.dir = dir.clone();
        match reg.list() {
            Ok((all, bad)) => {
                let mut peers = Vec::new();
                for sb in all {
                    if sb.name == self.from {
                        v["scope"] = json!(sb.scope);
                        if v["branch"].is_null() {
                            v["branch"] = json!(sb.branch);
                        }
                    } else {
                        peers
                            .push(json!({"name": sb.name, "branch": sb.branch, "scope": sb.scope}));
                    }
                }
                v["peers"] = peers.into();
                if !bad.is_empty() {
                    v["unreadable_records"] = bad
                        .iter()
                        .map(|b| json!({"file": b.file, "reason": b.reason}))
                        .collect::<Vec<_>>()
                        .into();
                }
            }
            Err(e) => v["registry"] = format!("cannot read the registry: {e}").into(),
        }
        ok(v)
    }

    /// `inbox://`: the unread messages, whole; they count as shown.
    fn read_inbox(&self) -> Result<Value, String> {
        self.ready()?;
        let inbox = self.boxdir().inbox();
        let mut messages = Vec::new();
        let mut bad = Vec::new();
        for e in inbox.scan(Sub::New).map_err(|e| with_fix(&e))? {
            let name = e.display_name();
            match e.found {
                Found::Message(m) => {
                    self.report(e.name);
                    messages.push(message_json(&m, "new"));
                }
                Found::Gone => {}
                Found::Bad(r) => bad.push(json!({"name": name, "reason": r})),
                Found::NotFile(w) => bad
                    .push(json!({"name": name, "reason": format!("is a {w}, not a regular file")})),
            }
        }
        let mut v = json!({"messages": messages});
        if !bad.is_empty() {
            v["unreadable"] = bad.into();
        }
        Ok(v)
    }

    /// Starts ringing `inbox://` for this client, once (a second subscribe
    /// changes nothing).  The watch is set before this returns, so every
    /// message delivered after the subscription's answer is announced.
    fn subscribe_inbox(&self, peer: rmcp::Peer<RoleServer>) -> Result<(), String> {
        self.ready()?;
        let mut slot = self
            .bell
            .lock()
            .expect("the bell slot is never poisoned because nothing panics holding it");
        if slot.as_ref().is_some_and(|h| !h.is_finished()) {
            return Ok(());
        }
        let mut bell = resource::Bell::start(self.boxdir().inbox()).map_err(|e| with_fix(&e))?;
        let mut closed = self.closed.clone();
        let task = tokio::spawn(async move {
            loop {
                let n = tokio::select! {
                    n = bell.next() => n,
                    _ = closed.wait_for(|c| *c) => return,
                };
                // A watch that fails (the inbox removed) ends the ringing;
                // the tools report the missing mailbox on their next call.
                let Ok(n) = n else { return };
                for _ in 0..n {
                    let note = ResourceUpdatedNotificationParam::new(resource::URI);
                    if peer.notify_resource_updated(note).await.is_err() {
                        return; // the client is gone
                    }
                }
            }
        });
        *slot = Some(task.abort_handle());
        Ok(())
    }

    fn unsubscribe_inbox(&self) {
        if let Some(h) = self
            .bell
            .lock()
            .expect("the bell slot is never poisoned because nothing panics holding it")
            .take()
        {
            h.abort();
        }
    }

    /// Records that the client has been shown message `name`.
    fn report(&self, name: OsString) {
        self.reported
            .lock()
            .expect("the reported set is never poisoned because nothing panics holding it")
            .insert(name);
    }

    /// The mailbox is there; else a refusal text that says what to do.
    fn ready(&self) -> Result<(), String> {
        if self.mailbox.is_dir() {
            let inbox = self.boxdir().inbox();
            if !inbox.sub(Sub::New).is_dir() {
                inbox.create().map_err(|e| with_fix(&e))?;
            }
            Ok(())
        } else {
            Err(format!(
                "mailbox '{}' is gone or is not a directory. Fix: the sandbox's mailbox mount is \
                 missing; ask the operator to recreate the sandbox (lw-sandbox), or set LW_MAILBOX",
                self.mailbox.display()
            ))
        }
    }
}

fn message_json(m: &Message, state: &str) -> Value {
    let mut v = serde_json::to_value(m).expect("a Message serialises because it is plain data");
    v["state"] = state.into();
    v
}

/// A successful result: the JSON as structured content and as text.
fn ok(v: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(v.to_string())]);
    r.structured_content = Some(v);
    r
}

fn refusal(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// A library error as an agent should read it: the problem, then the fix.
fn with_fix(e: &Error) -> String {
    let msg = e.to_string();
    let fix = if msg.starts_with("body is") {
        "shorten the body, or write the text to a file in the repository and name it in refs"
    } else if msg.starts_with("subject") {
        "give a subject of one line, 1 to 200 bytes, without control characters"
    } else if msg.starts_with("unknown kind") || msg.starts_with("kind '") {
        "use one of the kinds listed"
    } else if msg.starts_with("recipient") || msg.starts_with("to has") {
        "name recipients as whoami lists its peers, or mediator or human"
    } else if msg.starts_with("ref") {
        "give at most 64 refs, each a path or contract name of 1 to 1024 bytes on one line"
    } else if msg.starts_with("in_reply_to") || msg.contains("is not a message id") {
        "use a message id exactly as inbox or wait returned it"
    } else if msg.starts_with("no message") {
        "call inbox (with all=true for acknowledged ones) for the ids that exist"
    } else {
        match e.exit {
            Exit::DataErr => "correct the field named and call again",
            Exit::CantCreat | Exit::NoInput => {
                "the sandbox's mailbox is missing or unwritable; ask the operator to check it (lw doctor)"
            }
            Exit::IoErr | Exit::TempFail => "try again; if it persists, tell the operator",
            _ => "tell the operator",
        }
    };
    format!("{msg}. Fix: {fix}.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_limit() {
        assert_eq!(Rate::parse("off"), Ok(None));
        assert_eq!(
            Rate::parse("3/10s"),
            Ok(Some(Rate {
                count: 3,
                window: Duration::from_secs(10)
            }))
        );
        for bad in ["", "3", "0/1m", "x/1m", "3/soon"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
        let (_tx, rx) = watch::channel(false);
        let door = Door::new(
            PathBuf::from("/nonexistent"),
            "api".into(),
            None,
            None,
            Rate::parse("2/1h").expect("valid"),
            rx,
        );
        assert!(door.admit().is_ok() && door.admit().is_ok());
        let left = door
            .admit()
            .expect_err("the third post in the hour is refused");
        assert!(left > Duration::from_secs(3500), "{left:?}");
        door.unadmit();
        assert!(door.admit().is_ok(), "a post given back frees its place");
    }

    #[test]
    fn refusals_name_the_fix() {
        let e = mailbox::post::postable_kind("bounce").expect_err("bounce is the mediator's");
        let t = with_fix(&e);
        assert!(
            t.starts_with("kind 'bounce' is the mediator's: agents may not post it")
                && t.contains(". Fix: "),
            "{t}"
        );
        let e = Error::new(Exit::CantCreat, "mailbox '/x' is not a directory");
        assert!(with_fix(&e).contains("operator"), "{}", with_fix(&e));
    }
}
