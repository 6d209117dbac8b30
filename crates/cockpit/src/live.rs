//! The engine's view of the sandboxes and their branches, refreshed off
//! the request path.
//!
//! One thread (started by `bind`) owns the connection to the container
//! engine.  While at least one page holds the event stream, it asks the
//! engine what `lw-sandbox ls --json` asks (lib/sandbox/ls.rs, the same
//! `Sandboxes::list`, without counting unpushed commits, which would run
//! git inside the sandbox) and reads each task branch's commits ahead of
//! its base and its diffstat from host-owned repositories (the radar's
//! copy, the mirror) with the diff view's hardened, capped git
//! (crates/cockpit/src/diff.rs).  A round starts when a page connects and then
//! every [`PERIOD`] after the previous round ended; with no page open it
//! does nothing.  A round whose result differs from the last sends the
//! `sandboxes` topic, so the page fetches the list again.
//!
//! Requests only read the last result: an engine that does not answer, or
//! answers slowly, never holds up the page; the list then says `engine
//! unreachable` with the engine's error and shows lw-sandbox's records.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

use super::diff::{self, BranchStat, Refs};
use loopwright::sandbox::Sandboxes;
use mailbox::layout::Root;

/// The time between the end of one round and the start of the next.
pub(super) const PERIOD: Duration = Duration::from_secs(2);

/// What the engine said last.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub(super) struct EngineView {
    /// `checking` (no round finished yet), `reachable` or `unreachable`.
    pub state: String,
    /// The engine's address, once connected.
    pub address: Option<String>,
    /// Why it is unreachable (the engine's error, as lw-sandbox says it).
    pub error: Option<String>,
    /// When the last round finished (RFC 3339).
    pub checked: Option<String>,
}

/// The last round's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Snapshot {
    pub engine: EngineView,
    /// Sandbox name -> its `lw-sandbox ls --json` record, plus `state_text`
    /// (`exited (OOM)`, as the `ls` column says it).
    pub listed: HashMap<String, Value>,
    /// Sandbox name -> its task branch against its base.
    pub branches: HashMap<String, BranchStat>,
}

/// Shared by the refresher thread and the requests.
pub(super) struct Live {
    snap: Mutex<Snapshot>,
    wake: (Mutex<bool>, Condvar),
}

impl Live {
    /// The last round's result.
    pub(super) fn snapshot(&self) -> Snapshot {
        self.snap.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Starts a round now (a page connected).
    pub(super) fn wake(&self) {
        let (m, cv) = &self.wake;
        *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_one();
    }

    fn sleep(&self) {
        let (m, cv) = &self.wake;
        let woken = m.lock().unwrap_or_else(|p| p.into_inner());
        let (mut woken, _) = cv
            .wait_timeout_while(woken, PERIOD, |w| !*w)
            .unwrap_or_else(|p| p.into_inner());
        *woken = false;
    }
}

/// Starts the refresher for `root`; `project` is where the project's
/// configuration (its `engine`) is looked for, as lw-sandbox looks from
/// the current directory.
pub(super) fn start(
    root: Root,
    project: PathBuf,
    events: broadcast::Sender<&'static str>,
) -> std::io::Result<Arc<Live>> {
    let live = Arc::new(Live {
        snap: Mutex::new(Snapshot {
            engine: EngineView {
                state: "checking".into(),
                ..EngineView::default()
            },
            ..Snapshot::default()
        }),
        wake: (Mutex::new(false), Condvar::new()),
    });
    let l = live.clone();
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || refresher(&l, &root, &project, &events))?;
    Ok(live)
}

fn refresher(
    live: &Live,
    root: &Root,
    project: &std::path::Path,
    events: &broadcast::Sender<&'static str>,
) {
    let mut engine: Option<engine::Engines> = None;
    let mut stats: HashMap<(PathBuf, String, String), Option<BranchStat>> = HashMap::new();
    loop {
        live.sleep();
        if events.receiver_count() == 0 {
            continue;
        }
        let view = engine_round(root, project, &mut engine);
        let branches = branches(root, &mut stats);
        let (engine_view, listed) = match view {
            Ok((address, listed)) => (
                EngineView {
                    state: "reachable".into(),
                    address: Some(address),
                    ..EngineView::default()
                },
                listed,
            ),
            Err(e) => {
                engine = None;
                let view = EngineView {
                    state: "unreachable".into(),
                    error: Some(format!("{e:#}")),
                    ..EngineView::default()
                };
                (view, HashMap::new())
            }
        };
        let mut snap = live.snap.lock().unwrap_or_else(|p| p.into_inner());
        let changed = snap.listed != listed
            || snap.branches != branches
            || EngineView {
                checked: None,
                ..snap.engine.clone()
            } != engine_view;
        *snap = Snapshot {
            engine: EngineView {
                checked: Some(base::time::rfc3339(base::time::now())),
                ..engine_view
            },
            listed,
            branches,
        };
        drop(snap);
        if changed {
            let _ = events.send("sandboxes");
        }
    }
}

type Listed = (String, HashMap<String, Value>);

/// Connects when not connected, then lists as `lw-sandbox ls --json` does.
fn engine_round(
    root: &Root,
    project: &std::path::Path,
    engine: &mut Option<engine::Engines>,
) -> base::error::Result<Listed> {
    if engine.is_none() {
        let p = wall::config::project(project)?;
        *engine = Some(engine::Engines::connect(p.as_ref().map(|p| &p.config))?);
    }
    let engines = engine.as_ref().expect("connected above");
    let e = engines.runner();
    let sb = Sandboxes::new(root.clone(), engines.pair());
    let listed = sb
        .list(false)?
        .into_iter()
        .map(|s| {
            let mut v = s.json();
            v["state_text"] = Value::String(s.state_text());
            (s.name.clone(), v)
        })
        .collect();
    Ok((e.address().to_string(), listed))
}

/// Every record's task branch against its base; a (repository, base,
/// head) already measured is not measured again.
fn branches(
    root: &Root,
    cache: &mut HashMap<(PathBuf, String, String), Option<BranchStat>>,
) -> HashMap<String, BranchStat> {
    let dir = root.state_dir().join("sandbox");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return HashMap::new();
    };
    let mut mirrors: HashMap<PathBuf, Refs> = HashMap::new();
    let mut out = HashMap::new();
    let mut seen = std::collections::HashSet::new();
    for ent in rd.flatten() {
        let n = ent.file_name().to_string_lossy().into_owned();
        let Some(name) = n.strip_suffix(".json").filter(|_| !n.starts_with('.')) else {
            continue;
        };
        let Some(rec) = super::record::record(root, name) else {
            continue;
        };
        let m = mirrors
            .entry(rec.mirror.clone())
            .or_insert_with(|| Refs::with_head(&rec.mirror));
        let Some((repo, base, head, from)) = diff::locate(root, &rec, m) else {
            continue;
        };
        let key = (repo, base, head);
        seen.insert(key.clone());
        let st = cache
            .entry(key)
            .or_insert_with_key(|(repo, base, head)| diff::stat(repo, base, head, &from));
        if let Some(st) = st {
            out.insert(rec.name.clone(), st.clone());
        }
    }
    cache.retain(|k, _| seen.contains(k));
    out
}
