//! What the page shows, read from the root as data: the sandboxes (the
//! registry and lw-sandbox's records), the log a page at a time, one entry
//! whole, the queues, the sync state and the radar's verdicts.
//!
//! Everything here is read fresh on each request: the directories are the
//! truth (as for the mediator), and a request costs one listing of the
//! log (`Log::listing`: the names of `log/new/` and of the entries in its
//! batch files) plus the entries it shows.  The log is paged newest first
//! by when each entry was logged: the modification time of the file it is
//! in (its own or its batch's: the mediator writes a file once, into
//! log/new, and never touches it again; no sandbox can write there), then
//! its name.  Not by name: a name
//! starts with the message's id, which is when the message was made, so a
//! message released days after it was held would land pages down.

use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use super::record::record;
use base::error::Result;
use loopwright::sandbox::Record;
use mailbox::layout::Root;
use mailbox::log::{Entry, Log};
use mailbox::maildir::Sub;
use mailbox::registry::Registry;

/// Entries in one page at most.
pub const MAX_PAGE: usize = 200;
/// Entries one filtered page reads at most before it answers with what it
/// found and a cursor (so a filter that matches nothing stays cheap).
pub(super) const MAX_SCAN: usize = 5000;

/// One sandbox as the page lists it.
#[derive(Debug, Serialize)]
pub(super) struct SandboxView {
    pub name: String,
    pub branch: Option<String>,
    pub scope: Vec<String>,
    /// Another host's sandbox (federation): its name.
    pub host: Option<String>,
    /// `ready`, `creating` (a record not yet ready), or `registered` (no
    /// lw-sandbox record on this host: a mailbox party only).
    pub state: String,
    pub engine: Option<String>,
    pub runtime: Option<String>,
    pub kit: Option<String>,
    pub image: Option<String>,
    pub base: Option<String>,
    pub created: Option<String>,
    /// Host ports, with the container's side (`8080/tcp`).
    pub ports: Vec<PortView>,
    pub services: Vec<String>,
    /// The engine's view: this sandbox's `lw-sandbox ls --json` record with
    /// `state_text` (crates/cockpit/src/live.rs); None when the engine was not
    /// reached (yet) or lists no record of that name.
    pub listed: Option<Value>,
    /// Its task branch against its base (commits ahead, diffstat).
    pub stat: Option<super::diff::BranchStat>,
    /// When its model proxy last counted a request (RFC 3339): the proxy's
    /// usage file's `updated`.
    pub last_model_request: Option<String>,
}

#[derive(Debug, Serialize)]
pub(super) struct PortView {
    pub container: String,
    pub host: u16,
    /// Where it is reached when not 127.0.0.1.
    pub ip: Option<String>,
}

/// Every registered sandbox, by name, with what its record says and what
/// the last look at the engine and the branches found (`live`).
pub(super) fn sandboxes(root: &Root, live: &mut super::live::Snapshot) -> Result<Vec<SandboxView>> {
    let (good, _bad) = Registry::new(root).list()?;
    let mut v: Vec<SandboxView> = good
        .into_iter()
        .map(|s| {
            let rec = record(root, &s.name);
            let used = rec
                .as_ref()
                .filter(|r| r.agent.is_some())
                .and_then(|_| agent::proxy::usage(&root.state_dir(), &s.name));
            let mut v = view(s, rec);
            v.listed = live.listed.remove(&v.name);
            v.stat = live.branches.remove(&v.name);
            v.last_model_request = used
                .filter(|u| u.updated > 0)
                .map(|u| base::time::rfc3339(std::time::Duration::from_secs(u.updated as u64)));
            v
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(v)
}

fn view(s: mailbox::registry::Sandbox, rec: Option<Record>) -> SandboxView {
    let state = match &rec {
        None => "registered",
        Some(r) if r.ready => "ready",
        Some(_) => "creating",
    };
    SandboxView {
        state: state.into(),
        engine: rec.as_ref().and_then(|r| r.engine.clone()),
        runtime: rec.as_ref().map(|r| r.runtime_name().to_string()),
        kit: rec
            .as_ref()
            .and_then(|r| r.agent.as_ref().map(|a| a.kit.clone())),
        image: rec.as_ref().map(|r| r.image.clone()),
        base: rec.as_ref().and_then(|r| r.base.clone()),
        created: rec.as_ref().map(|r| r.created.clone()),
        ports: rec
            .as_ref()
            .map(|r| {
                r.ports
                    .iter()
                    .map(|p| PortView {
                        container: p.container.clone(),
                        host: p.host,
                        ip: p.ip.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        services: rec.as_ref().map(|r| r.services.clone()).unwrap_or_default(),
        listed: None,
        stat: None,
        last_model_request: None,
        branch: s.branch.or(rec.map(|r| r.branch)),
        scope: s.scope,
        host: s.host,
        name: s.name,
    }
}

/// What a log request asks for.
#[derive(Debug, Default, Clone)]
pub struct LogQuery {
    /// Entries whose name sorts before this one (the previous page's cursor).
    pub before: Option<String>,
    pub limit: usize,
    /// Entries sent by or addressed to this party.
    pub party: Option<String>,
    /// Entries about a message of this kind.
    pub kind: Option<String>,
}

/// One log entry as the timeline shows it: no body.
#[derive(Debug, Serialize)]
pub struct Line {
    pub name: String,
    /// Its place in the timeline, a cursor for `LogQuery::before`.
    pub key: String,
    pub logged: String,
    pub message_id: String,
    pub sender: String,
    pub to: Vec<String>,
    pub kind: Option<String>,
    pub subject: Option<String>,
    pub action: String,
    pub reason: String,
    pub in_reply_to: Option<String>,
}

impl Line {
    fn of(e: &Entry, key: &str) -> Line {
        Line {
            name: e.name.clone(),
            key: key.to_string(),
            logged: e.logged.clone(),
            message_id: e.message_id.clone(),
            sender: e.sender.clone(),
            to: e.decision.to.clone(),
            kind: e.message.as_ref().map(|m| m.kind.as_str().to_string()),
            subject: e.message.as_ref().map(|m| m.subject.clone()),
            action: e.decision.action.as_str().to_string(),
            reason: e.decision.reason.clone(),
            in_reply_to: e.message.as_ref().and_then(|m| m.in_reply_to.clone()),
        }
    }

    fn matches(&self, q: &LogQuery) -> bool {
        let party = q
            .party
            .as_ref()
            .is_none_or(|p| &self.sender == p || self.to.iter().any(|t| t == p));
        let kind = q
            .kind
            .as_ref()
            .is_none_or(|k| self.kind.as_deref() == Some(k.as_str()));
        party && kind
    }
}

/// A page of the timeline, newest first; `next` continues it.
#[derive(Debug, Serialize)]
pub struct Page {
    pub entries: Vec<Line>,
    pub next: Option<String>,
    /// Entries in the log (all of them, unfiltered).
    pub total: usize,
}

/// The names of the log's entries, in no order.
fn names(log: &Log) -> Result<Vec<String>> {
    Ok(log.listing()?.into_iter().map(|l| l.name).collect())
}

/// (key, name) of every entry, newest logged first; the key is text that
/// sorts in that order: when its file was written, in nanoseconds, then
/// its name.
fn newest_first(log: &Log) -> Result<Vec<(String, String)>> {
    let mut v: Vec<(String, String)> = log
        .listing()?
        .into_iter()
        .map(|l| (format!("{:020}:{}", l.mtime_ns, l.name), l.name))
        .collect();
    v.sort_unstable_by(|a, b| b.0.cmp(&a.0));
    Ok(v)
}

/// One page of the log (see [`LogQuery`]).
pub fn log_page(log: &Log, q: &LogQuery) -> Result<Page> {
    let names = newest_first(log)?;
    let start = match &q.before {
        // Descending order: the first key below the cursor.
        Some(b) => names.partition_point(|(k, _)| k.as_str() >= b.as_str()),
        None => 0,
    };
    let limit = q.limit.clamp(1, MAX_PAGE);
    let mut entries = Vec::new();
    let mut next = None;
    for (scanned, (k, n)) in names[start..].iter().enumerate() {
        if entries.len() == limit || scanned == MAX_SCAN {
            next = Some(names[start + scanned - 1].0.clone());
            break;
        }
        let Ok(e) = log.read(std::ffi::OsStr::new(n)) else {
            continue;
        };
        let line = Line::of(&e, k);
        if line.matches(q) {
            entries.push(line);
        }
    }
    Ok(Page {
        entries,
        next,
        total: names.len(),
    })
}

/// One entry whole (the message with its body), by name.
pub(super) fn entry(log: &Log, name: &str) -> Option<Entry> {
    if name.is_empty() || name.starts_with('.') || name.contains('/') {
        return None;
    }
    log.read(std::ffi::OsStr::new(name)).ok()
}

/// The human and held queues, each message with its recipients and body,
/// so a person sees what they answer or release: as the log keeps them,
/// and for a held message (whose log entry has no body) from the held
/// copy with the secret values the door knows masked by `mask`.
pub(super) fn queues(root: &Root, mask: &dyn Fn(&mut String)) -> Result<Value> {
    use mailbox::log::Action;
    use mailbox::maildir::Found;
    let log = Log::new(root.log_dir());
    let mut held_bodies = std::collections::HashMap::new();
    if let Ok(found) = root.held().scan(Sub::New) {
        for f in found {
            if let Found::Message(m) = f.found {
                held_bodies.insert(m.id, m.body);
            }
        }
    }
    let with_message =
        |items: Vec<mailbox::operator::Queued>, action: Action| -> Result<Vec<Value>> {
            items
                .into_iter()
                .map(|q| {
                    let m = [action, Action::Release, Action::Forward]
                        .into_iter()
                        .find_map(|a| {
                            log.read(std::ffi::OsStr::new(&Entry::name_for(&q.id, a, None)))
                                .ok()
                        })
                        .and_then(|e| e.message);
                    let body = match held_bodies.get(&q.id) {
                        Some(b) if action == Action::Hold => {
                            let mut b = b.clone();
                            mask(&mut b);
                            Some(b)
                        }
                        _ => m.as_ref().map(|m| m.body.clone()),
                    };
                    let mut v = serde_json::to_value(&q)?;
                    v["to"] = json!(m.map(|m| m.to).unwrap_or_default());
                    v["body"] = json!(body);
                    Ok(v)
                })
                .collect()
        };
    let human = with_message(
        mailbox::operator::queue(root, &log, false)?,
        Action::Escalate,
    )?;
    let held = with_message(mailbox::operator::queue(root, &log, true)?, Action::Hold)?;
    Ok(json!({ "human": human, "held": held }))
}

/// What the page says of lw-sync's last error: its state file does not
/// keep one (lw-sync reports errors on its standard error and exit status).
pub(super) const SYNC_ERROR_NOT_KEPT: &str = "lw-sync does not keep its last error in its state file \
(ROOT/state/sync.json); it reports errors on its standard error and in its exit status";

/// The sync state (ROOT/state/sync.json): per target (`owner/repo#N`, with
/// its issue's address) the entries synced and the parts of a comment in
/// flight, and how many log entries no target holds yet; `null` when
/// lw-sync never ran.
pub(super) fn sync_state(root: &Root, web: Option<&str>) -> Value {
    let path = sync::state_path(root);
    let st = match sync::load_state(&path) {
        Ok((st, _)) => st,
        Err(e) => return json!({ "error": format!("{e:#}") }),
    };
    if st.targets.is_empty() && st.login.is_none() {
        return Value::Null;
    }
    let targets: Vec<Value> = st
        .targets
        .iter()
        .map(|(t, s)| {
            json!({
                "target": t,
                "url": web.and_then(|w| issue_url(w, t)),
                "synced": s.synced.len(),
                "in_flight": s.pending.as_ref().map_or(0, |p| p.items.len()),
                "reconciled": s.reconciled,
            })
        })
        .collect();
    let log = Log::new(root.log_dir());
    let not_synced = names(&log).ok().map(|names| {
        names
            .iter()
            .filter(|n| !st.targets.values().any(|t| t.synced.contains_key(*n)))
            .count()
    });
    json!({
        "login": st.login,
        "targets": targets,
        "not_synced": not_synced,
        "last_error": Value::Null,
        "last_error_note": SYNC_ERROR_NOT_KEPT,
    })
}

/// The web address of the GitHub lw-sync talks to, from its API address
/// (`--api-url`'s sources: `$LW_GITHUB_API_URL`, else the project's
/// `api_url`): `https://github.com` for GitHub's API, `https://HOST` for
/// an Enterprise server's `https://HOST/api/v3`; None for any other (a
/// local stand-in has no issue pages: no link rather than a wrong one).
pub(super) fn github_web(api_url: Option<&str>) -> Option<String> {
    let api = api_url
        .unwrap_or("https://api.github.com")
        .trim_end_matches('/');
    let host = api.strip_prefix("https://")?;
    let plain = |h: &str| {
        !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':'))
    };
    if host.eq_ignore_ascii_case("api.github.com") {
        return Some("https://github.com".into());
    }
    let host = host.strip_suffix("/api/v3")?;
    plain(host).then(|| format!("https://{host}"))
}

/// `WEB/OWNER/REPO/issues/N` for a target `OWNER/REPO#N` whose parts are
/// plain names and a number; None otherwise.
fn issue_url(web: &str, target: &str) -> Option<String> {
    let (repo, n) = target.rsplit_once('#')?;
    let (owner, name) = repo.split_once('/')?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    (plain(owner) && plain(name) && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("{web}/{owner}/{name}/issues/{n}"))
}

/// The radar's pairs with a non-empty announced set (ROOT/state/radar.json);
/// `null` when the radar never ran.
pub(super) fn radar(root: &Root) -> Value {
    let path = root.state_dir().join("radar.json");
    let Some(v) = read_json(&path) else {
        return Value::Null;
    };
    let pairs: Vec<Value> = v["pairs"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, p)| p["announced"].as_array().is_some_and(|a| !a.is_empty()))
                .map(|(k, p)| {
                    let (a, b) = k.split_once(' ').unwrap_or((k, ""));
                    json!({ "a": a, "b": b, "announced": p["announced"], "verdict": p["verdict"] })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({ "pairs": pairs })
}

fn read_json(path: &Path) -> Option<Value> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailbox::log::{Action, Decision, LOG_VERSION};

    fn entry_of(id: &str, sender: &str, to: &str, kind: mailbox::message::Kind) -> Entry {
        let m = mailbox::message::Message {
            version: 1,
            id: id.into(),
            from: sender.into(),
            to: vec![to.into()],
            kind,
            subject: "s".into(),
            body: "b".into(),
            refs: vec![],
            in_reply_to: None,
            created: "2024-01-01T00:00:00Z".into(),
        };
        Entry {
            version: LOG_VERSION,
            name: Entry::name_for(id, Action::Forward, None),
            logged: "2024-01-01T00:00:00Z".into(),
            message_id: id.into(),
            sender: sender.into(),
            message: Some(m),
            decision: Decision {
                action: Action::Forward,
                to: vec![to.into()],
                reason: "r".into(),
                quiet: false,
            },
        }
    }

    #[test]
    fn the_issue_link_follows_the_api_url() {
        for (api, web) in [
            (None, Some("https://github.com")),
            (Some("https://api.github.com/"), Some("https://github.com")),
            (
                Some("https://ghe.example.com/api/v3"),
                Some("https://ghe.example.com"),
            ),
            (Some("http://127.0.0.1:9/"), None),
            (Some("https://evil.example/x/api/v3"), None),
            (Some("https://a b/api/v3"), None),
        ] {
            assert_eq!(github_web(api).as_deref(), web, "{api:?}");
        }
        assert_eq!(
            issue_url("https://ghe.example.com", "o/r#4").as_deref(),
            Some("https://ghe.example.com/o/r/issues/4")
        );
        assert_eq!(issue_url("https://github.com", "o/r#x"), None);
    }

    #[test]
    fn pages_go_newest_first_and_filters_apply() {
        let d = std::env::temp_dir().join(format!("lw-cockpit-data-{}", base::id::new_id()));
        std::fs::create_dir_all(&d).unwrap();
        let log = Log::new(d.join("log"));
        log.create().unwrap();
        use mailbox::message::Kind;
        let mut ids = vec![];
        for i in 0..7u128 {
            let id = base::id::id_at(std::time::Duration::from_secs(1_700_000_000 + i as u64), i);
            let kind = if i % 2 == 0 {
                Kind::Status
            } else {
                Kind::Question
            };
            let sender = if i < 3 { "api" } else { "web" };
            log.append(&entry_of(&id, sender, "human", kind)).unwrap();
            ids.push(id);
        }
        let q = LogQuery {
            limit: 3,
            ..Default::default()
        };
        let p = log_page(&log, &q).unwrap();
        assert_eq!(p.total, 7);
        let got: Vec<_> = p.entries.iter().map(|l| l.message_id.clone()).collect();
        assert_eq!(got, vec![ids[6].clone(), ids[5].clone(), ids[4].clone()]);
        let p2 = log_page(
            &log,
            &LogQuery {
                before: p.next,
                ..q.clone()
            },
        )
        .unwrap();
        let got: Vec<_> = p2.entries.iter().map(|l| l.message_id.clone()).collect();
        assert_eq!(got, vec![ids[3].clone(), ids[2].clone(), ids[1].clone()]);
        let f = LogQuery {
            limit: 10,
            party: Some("api".into()),
            kind: Some("status".into()),
            ..Default::default()
        };
        let got: Vec<_> = log_page(&log, &f)
            .unwrap()
            .entries
            .into_iter()
            .map(|l| l.message_id)
            .collect();
        assert_eq!(got, vec![ids[2].clone(), ids[0].clone()]);
        assert!(entry(&log, "../x").is_none());
        // A message made before all of them, logged after them (a release
        // of an old held message): first, by when it was logged.
        let old = base::id::id_at(std::time::Duration::from_secs(1_600_000_000), 9);
        let e = entry_of(&old, "api", "web", Kind::Request);
        log.append(&e).unwrap();
        std::fs::File::options()
            .append(true)
            .open(log.dir.sub(Sub::New).join(&e.name))
            .unwrap()
            .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
            .unwrap();
        let p = log_page(&log, &q).unwrap();
        assert_eq!(p.entries[0].message_id, old);
        assert_eq!(p.entries[1].message_id, ids[6]);
        // Issue 41: the mediator's batch files, beside entry files; their
        // entries are listed, read, and logged when the batch file was.
        let (b1, b2) = (
            base::id::id_at(std::time::Duration::from_secs(1_500_000_000), 10),
            base::id::id_at(std::time::Duration::from_secs(1_500_000_001), 11),
        );
        let (e1, e2) = (
            entry_of(&b1, "api", "web", Kind::Request),
            entry_of(&b2, "web", "api", Kind::Request),
        );
        let (bytes, _) = mailbox::log::batch::encode(&[&e1, &e2]);
        let bf = log
            .dir
            .sub(Sub::New)
            .join(mailbox::log::batch::batch_name());
        std::fs::write(&bf, bytes).unwrap();
        std::fs::File::options()
            .append(true)
            .open(&bf)
            .unwrap()
            .set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(120))
            .unwrap();
        let p = log_page(&log, &q).unwrap();
        assert_eq!(p.total, 10);
        let got: Vec<_> = p.entries.iter().map(|l| l.message_id.clone()).collect();
        assert_eq!(got, vec![b2.clone(), b1.clone(), old.clone()]);
        assert_eq!(entry(&log, &e1.name), Some(e1));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
