//! The cockpit (lw-cockpit(1)): one local web page over a mailbox root,
//! where a person sees every sandbox and every message and works the
//! queues, live.
//!
//! Shape: an HTTP server on 127.0.0.1 (http.rs) answers a page, its script
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
//! that slipped through would still not run.  Access: a random token
//! printed in the URL, as Jupyter does, a Host check, and for a change the
//! token in a header plus a same-origin check (auth.rs).

mod actions;
mod api;
pub mod auth;
mod data;
mod diff;
mod events;
pub mod http;
mod live;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;

use crate::error::{Error, Exit, Result};
use crate::layout::Root;

pub use actions::check_operator;
pub use data::{LogQuery, MAX_PAGE, log_page};

/// What the server holds for every request.
pub struct Cockpit {
    pub root: Root,
    pub token: String,
    pub port: u16,
    /// The person acting from the page, named in the log.
    pub operator: String,
    door: actions::Door,
    events: tokio::sync::broadcast::Sender<&'static str>,
    live: std::sync::Arc<live::Live>,
}

/// How to start one.
pub struct Options {
    pub root: Root,
    /// 0: a free port.
    pub port: u16,
    pub operator: String,
    /// lw-mediate's `--policy` (for release and drop).
    pub policy: Option<PathBuf>,
    /// Use this token instead of a random one (tests and benchmarks).
    pub token: Option<String>,
    /// Where the mediator's notes go (a policy reloaded, a record skipped).
    pub report: Notes,
    /// Where the project's configuration (which engine) is looked for, as
    /// lw-sandbox looks from its current directory.
    pub project: PathBuf,
}

/// A reporter the server's threads share (the binary prints its lines).
pub type Notes = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

/// A new random token: 128 bits as hex.
pub fn new_token() -> String {
    format!("{:032x}", crate::id::random128())
}

/// Binds 127.0.0.1:PORT and starts the watchers; `serve` then answers.
pub fn bind(o: Options) -> Result<(TcpListener, Cockpit)> {
    check_operator(&o.operator)?;
    o.root.check_exists()?;
    o.root.init()?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, o.port));
    let listener = TcpListener::bind(addr).map_err(|e| {
        let exit = if e.kind() == std::io::ErrorKind::AddrInUse {
            Exit::TempFail
        } else {
            Exit::Unavailable
        };
        Error::new(exit, format!("cannot listen on {addr}")).with_source(e)
    })?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::new(Exit::Unavailable, "cannot read the bound address").with_source(e))?
        .port();
    let events = events::start(&o.root)?;
    let live = live::start(o.root.clone(), o.project, events.clone())
        .map_err(|e| Error::new(Exit::Unavailable, "cannot start a thread").with_source(e))?;
    let token = o.token.unwrap_or_else(new_token);
    Ok((
        listener,
        Cockpit {
            root: o.root,
            token,
            port,
            operator: o.operator,
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
    /// The URL a person opens: the page with the token.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/?token={}", self.port, self.token)
    }
}
