//! The cockpit (lw-cockpit(1)): one local web page over a mailbox root,
//! where a person sees every sandbox and every message and works the
//! queues, live.
//!
//! Shape: an HTTP server on a loopback address (http.rs) answers a page, its script
//! and style (assets/, built into the binary: nothing is fetched from
//! elsewhere) and a small JSON API (api.rs) that reads the root as data
//! (data.rs, diff.rs) and runs the operator's actions exactly as
//! lw-mediate's commands do (actions.rs).  Watchers on the root's
//! directories (events.rs) push a topic name down a server-sent-events
//! stream; the page then fetches that part again.  The engine's view of
//! the sandboxes (lw-sandbox ls's) and their branches' stats are refreshed
//! by one thread while a page is open (live.rs), never on a request.
//!
//! Trust: everything an agent wrote (subjects, bodies, branch names, file
//! names in diffs, sandbox names) is data.  The page inserts it as text
//! (`textContent`), never as markup; the Content-Security-Policy allows
//! only this origin's own script (no inline script, no eval), so markup
//! that slipped through would still not run.  Access: the printed URL
//! carries a one-time ticket that the page trades for a secret of its tab,
//! sent in a header, never a cookie (a browser sends cookies to every port
//! of the host, sandboxes' included); a Host check; and for a change a
//! same-origin check (auth.rs).

mod actions;
mod api;
pub mod auth;
mod data;
mod diff;
mod events;
pub mod http;
mod live;
mod record;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use base::error::{Error, Exit, Result};
use mailbox::layout::Root;

pub use actions::check_operator;
pub use data::{LogQuery, MAX_PAGE, log_page};

/// What the server holds for every request.
pub struct Cockpit {
    pub root: Root,
    /// The tickets and the tabs' secrets.
    pub access: auth::Access,
    /// The address it listens on.
    pub here: auth::Here,
    /// The person acting from the page, named in the log.
    pub operator: String,
    /// The web address of the GitHub lw-sync posts to (data::github_web).
    pub github_web: Option<String>,
    door: actions::Door,
    events: tokio::sync::broadcast::Sender<&'static str>,
    live: std::sync::Arc<live::Live>,
}

/// How to start one.
pub struct Options {
    pub root: Root,
    /// The loopback address and port to listen on (port 0: a free one).
    pub listen: SocketAddr,
    pub operator: String,
    /// lw-mediate's `--policy` (for release and drop).
    pub policy: Option<PathBuf>,
    /// Where the mediator's notes go (a policy reloaded, a record skipped).
    pub report: Notes,
    /// Where the project's configuration (which engine) is looked for, as
    /// lw-sandbox looks from its current directory.
    pub project: PathBuf,
}

/// A reporter the server's threads share (the binary prints its lines).
pub type Notes = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// The directories every mailbox root holds (lw-mediate and lw-sandbox
/// make them); a directory without them is not one.
const ROOT_MARKS: &[&str] = &["log", "human", "held", "sandboxes"];

/// Fails with 66 when `root` is not a mailbox root: the cockpit shows a
/// root, it does not make one in whatever directory it was pointed at.
fn check_is_root(root: &Root) -> Result<()> {
    root.check_exists()?;
    let missing: Vec<&str> = ROOT_MARKS
        .iter()
        .copied()
        .filter(|d| !Path::new(&root.dir).join(d).is_dir())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        Exit::NoInput,
        format!(
            "'{}' is not a mailbox root (no {} in it); pass the root lw-mediate and lw-sandbox \
             use, or make one there first with `lw-mediate --root {} --once`",
            root.dir.display(),
            missing
                .iter()
                .map(|d| format!("{d}/"))
                .collect::<Vec<_>>()
                .join(", "),
            root.dir.display()
        ),
    ))
}

/// Binds the loopback address asked for, exactly, and starts the
/// watchers; `serve` then answers.
pub fn bind(o: Options) -> Result<(TcpListener, Cockpit)> {
    check_operator(&o.operator)?;
    if !o.listen.ip().is_loopback() {
        return Err(Error::usage(format!(
            "--listen {}: lw-cockpit serves a loopback address only",
            o.listen.ip()
        )));
    }
    check_is_root(&o.root)?;
    // A root made before a directory was added gets it, as lw-mediate's
    // first pass would give it.
    o.root.init()?;
    let addr = o.listen;
    let listener = TcpListener::bind(addr).map_err(|e| {
        let exit = if e.kind() == std::io::ErrorKind::AddrInUse {
            Exit::TempFail
        } else {
            Exit::Unavailable
        };
        Error::new(exit, format!("cannot listen on {addr}")).with_source(e)
    })?;
    let bound = listener.local_addr().map_err(|e| {
        Error::new(Exit::Unavailable, "cannot read the bound address").with_source(e)
    })?;
    let events = events::start(&o.root)?;
    // The API address as lw-sync run from here would take it.
    let api_url = std::env::var("LW_GITHUB_API_URL").ok().or_else(|| {
        sync::Config::find(&o.project)
            .and_then(|p| sync::Config::load(&p).ok())
            .and_then(|c| c.api_url)
    });
    let github_web = data::github_web(api_url.as_deref());
    let live = live::start(o.root.clone(), o.project, events.clone())
        .map_err(|e| Error::new(Exit::Unavailable, "cannot start a thread").with_source(e))?;
    Ok((
        listener,
        Cockpit {
            root: o.root,
            access: auth::Access::default(),
            here: auth::Here { addr: bound },
            operator: o.operator,
            github_web,
            door: actions::Door {
                policy: o.policy,
                report: o.report,
            },
            events,
            live,
        },
    ))
}

impl Cockpit {
    /// A URL a person opens: the page with a new ticket, which opens it
    /// once, within auth::TICKET_LIFE.
    pub fn url(&self) -> String {
        self.here.url(&self.access.ticket())
    }
}
