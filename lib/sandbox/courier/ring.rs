//! The rings: one long-lived exec of `lw-inbox --courier` per running
//! volume-mode sandbox (the mailbox crate's `ring` is the other end), so the
//! courier carries a sandbox's mail when its ring says so rather than asking
//! the engine every interval.  An idle sandbox with a live ring costs no
//! request; docs/scale.md has the figures.
//!
//! Each ring is a thread of the courier blocked in [`SandboxEngine::exec_io`]
//! (scoped: it never outlives the loop).  Its lines come back over a
//! channel, and an eventfd wakes the loop, which polls it beside the
//! inboxes' watcher.  A sandbox whose ring is not live (starting, ended,
//! silent for [`SILENT`], or a tools volume whose `lw-inbox` has no
//! `--courier`) is carried each interval as before, and its ring is tried
//! again after a backoff.  Ending a ring: a line on its stdin.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::Scope;
use std::time::{Duration, Instant};

use super::carry::{Due, Status};
use crate::sandbox::volume::TOOLS_DIR;
use crate::sandbox::{MAILBOX, Record};
use base::error::{Error, Exit, Result};
use engine::{ExecIo, ExecRequest, OutStream, SandboxEngine};
use mailbox::ring::{Lines, READY, RING, TICK};

/// A live ring that says nothing for this long is taken for dead.
pub const SILENT: Duration = Duration::from_secs(TICK.as_secs() * 3);

/// The first wait before a ring that ended is started again; it doubles
/// up to [`BACKOFF_MAX`], and is reset by a ring that lived a minute.
const BACKOFF: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// What a ring's thread tells the loop.
enum Said {
    Line(String),
    /// The exec ended: its status or error, and the end of its stderr.
    Ended(std::result::Result<i64, String>, String),
}

enum State {
    /// Started, `ready` not said yet.
    Starting,
    Live {
        heard: Instant,
        since: Instant,
    },
    /// Ended; started again at `retry`.
    Down {
        retry: Instant,
    },
}

struct Ring {
    /// Which start of the sandbox's ring this is (lines of an older one
    /// are ignored).
    generation: u64,
    /// Its stdin: a line (or its closing) ends it.
    stop: Option<std::io::PipeWriter>,
    state: State,
    backoff: Duration,
    /// Why the last one ended, said once per kind.
    said: Option<String>,
}

/// The rings of one courier loop.
pub(super) struct Rings<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    engine: &'env dyn SandboxEngine,
    tx: Sender<(String, u64, Said)>,
    rx: Receiver<(String, u64, Said)>,
    bell: Arc<OwnedFd>,
    rings: HashMap<String, Ring>,
    next_generation: u64,
    /// Sandboxes rung since the last pass.
    rung: HashSet<String>,
}

impl<'scope, 'env> Rings<'scope, 'env> {
    pub(super) fn new(
        scope: &'scope Scope<'scope, 'env>,
        engine: &'env dyn SandboxEngine,
    ) -> Result<Rings<'scope, 'env>> {
        let bell = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| Error::new(Exit::IoErr, format!("cannot make an eventfd: {e}")))?;
        let (tx, rx) = channel();
        Ok(Rings {
            scope,
            engine,
            tx,
            rx,
            bell: Arc::new(bell),
            rings: HashMap::new(),
            next_generation: 0,
            rung: HashSet::new(),
        })
    }

    /// The descriptor that is readable when a ring said something.
    pub(super) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.bell.as_fd()
    }

    /// Starts a ring for each of `recs` without one (or whose backoff is
    /// over) and ends those of sandboxes no longer in `recs`.
    pub(super) fn keep(&mut self, recs: &[Record]) {
        let names: HashSet<&str> = recs.iter().map(|r| r.name.as_str()).collect();
        let gone: Vec<String> = self
            .rings
            .keys()
            .filter(|n| !names.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            if let Some(mut r) = self.rings.remove(&n) {
                end(&mut r);
            }
        }
        let now = Instant::now();
        for rec in recs {
            let due = match self.rings.get(&rec.name) {
                None => true,
                Some(r) => matches!(r.state, State::Down { retry } if retry <= now),
            };
            if due {
                self.start(rec);
            }
        }
    }

    fn start(&mut self, rec: &Record) {
        let (reader, writer) = match std::io::pipe() {
            Ok(p) => p,
            Err(_) => return,
        };
        self.next_generation += 1;
        let generation = self.next_generation;
        let prev = self.rings.remove(&rec.name);
        let (backoff, said) = prev.map_or((BACKOFF, None), |r| (r.backoff, r.said));
        self.rings.insert(
            rec.name.clone(),
            Ring {
                generation,
                stop: Some(writer),
                state: State::Starting,
                backoff,
                said,
            },
        );
        let req = ExecRequest {
            cmd: vec![
                format!("{TOOLS_DIR}/lw-inbox"),
                "--courier".into(),
                "--mailbox".into(),
                MAILBOX.into(),
            ],
            user: Some(format!("{0}:{0}", rec.uid)),
            ..Default::default()
        };
        let (engine, tx, bell) = (self.engine, self.tx.clone(), self.bell.clone());
        let (name, container) = (rec.name.clone(), rec.container.clone());
        self.scope.spawn(move || {
            let mut lines = Lines::default();
            let mut err = Vec::new();
            let mut on = |s: OutStream, b: &[u8]| match s {
                OutStream::Stdout => {
                    lines.feed(b, &mut |l| {
                        let _ = tx.send((name.clone(), generation, Said::Line(l.to_string())));
                    });
                    ring_bell(&bell);
                }
                _ => {
                    err.extend_from_slice(b);
                    let keep = err.len().saturating_sub(512);
                    err.drain(..keep);
                }
            };
            let io = ExecIo {
                stdin: Some(Box::new(reader)),
                tty: false,
                size: None,
                on_output: &mut on,
                stop: None,
            };
            let res = engine
                .exec_io(&container, &req, io)
                .map_err(|e| e.to_string());
            let err = String::from_utf8_lossy(&err).trim().to_string();
            let _ = tx.send((name, generation, Said::Ended(res, err)));
            ring_bell(&bell);
        });
    }

    /// Takes what the rings said since the last call: the sandboxes to
    /// carry now (a ring, or a ring that just became live).  A ring that
    /// ended is said through `warn` (once per reason).
    pub(super) fn take(&mut self, warn: &mut dyn FnMut(&str)) -> HashSet<String> {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&*self.bell, &mut b);
        let now = Instant::now();
        while let Ok((name, generation, said)) = self.rx.try_recv() {
            let Some(r) = self.rings.get_mut(&name) else {
                continue;
            };
            if r.generation != generation {
                continue;
            }
            match said {
                Said::Line(l) => {
                    let since = match r.state {
                        State::Live { since, .. } => since,
                        _ => now,
                    };
                    if l == READY || l == RING {
                        self.rung.insert(name.clone());
                    }
                    r.state = State::Live { heard: now, since };
                }
                Said::Ended(res, err) => {
                    let lived = match r.state {
                        State::Live { since, .. } => now - since,
                        _ => Duration::ZERO,
                    };
                    if lived >= BACKOFF_MAX {
                        r.backoff = BACKOFF;
                    }
                    let why = match res {
                        Ok(code) if err.is_empty() => format!("exit {code}"),
                        Ok(code) => format!("exit {code}: {}", base::visible::visible(&err)),
                        Err(e) => e,
                    };
                    let kind = why.split(':').next().unwrap_or("").to_string();
                    if r.said.as_deref() != Some(kind.as_str()) {
                        warn(&format!(
                            "sandbox '{name}': its ring ended ({why}); its mail is looked at every interval until it is back"
                        ));
                        r.said = Some(kind);
                    }
                    r.state = State::Down {
                        retry: now + r.backoff,
                    };
                    r.backoff = (r.backoff * 2).min(BACKOFF_MAX);
                    r.stop = None;
                    // Anything posted while it was down: carried each
                    // interval from now on (Due::POLL).
                }
            }
        }
        // A live ring silent too long: ended, and started again.
        for r in self.rings.values_mut() {
            if let State::Live { heard, .. } = r.state
                && now - heard > SILENT
            {
                end(r);
                r.state = State::Down { retry: now };
            }
        }
        std::mem::take(&mut self.rung)
    }

    /// What a pass does for `rec`: everything each interval without a live
    /// ring; with one, the outbox only when it rang (`rung`), the inbox's
    /// deliveries always (they cost a request only when there are some).
    /// `sweep`: everything, once in a while, whatever the ring says.
    pub(super) fn due(&self, rec: &Record, rung: &HashSet<String>, sweep: bool) -> Due {
        let live = matches!(
            self.rings.get(&rec.name).map(|r| &r.state),
            Some(State::Live { .. })
        );
        if !live {
            return Due::POLL;
        }
        if sweep {
            return Due {
                out: true,
                status: Status::Now,
                running: false,
            };
        }
        let rang = rung.contains(&rec.name);
        Due {
            out: rang,
            status: if rang { Status::Now } else { Status::Later },
            running: true,
        }
    }

    /// How long the loop may wait: `interval` while one of the `sandboxes`
    /// has no live ring, else until the first live ring would be silent
    /// too long (or the sweep is due).
    pub(super) fn timeout(
        &self,
        sandboxes: usize,
        interval: Duration,
        sweep_left: Duration,
    ) -> Duration {
        if self.live().0 < sandboxes {
            return interval;
        }
        let now = Instant::now();
        let silent = self.rings.values().filter_map(|r| match r.state {
            State::Live { heard, .. } => {
                Some((heard + SILENT).saturating_duration_since(now) + BACKOFF)
            }
            _ => None,
        });
        silent.fold(sweep_left, Duration::min)
    }

    /// How many rings are live, of how many.
    pub(super) fn live(&self) -> (usize, usize) {
        let live = self
            .rings
            .values()
            .filter(|r| matches!(r.state, State::Live { .. }))
            .count();
        (live, self.rings.len())
    }

    /// Ends every ring (before the loop's scope joins their threads).
    pub(super) fn end_all(&mut self) {
        for r in self.rings.values_mut() {
            end(r);
        }
    }
}

/// Ends a ring: a line on its stdin, then its end.
fn end(r: &mut Ring) {
    if let Some(mut w) = r.stop.take() {
        let _ = w.write_all(b"stop\n");
    }
}

fn ring_bell(bell: &OwnedFd) {
    let _ = rustix::io::write(bell, &1u64.to_ne_bytes());
}
