//! The courier's loop: a pass now, then whenever the mediator delivers
//! into a volume-mode sandbox's inbox on this host or a sandbox's ring
//! rings, and every interval while a sandbox has no live ring.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::carry::{Carried, Courier, Due};
use super::lock::{PidFile, lock_path, take_lock};
use super::ring::Rings;
use crate::sandbox::Sandboxes;
use base::error::{Error, Exit, Result};
use mailbox::maildir::Sub;

/// What the loop tells its caller.
#[derive(Clone, Copy, Debug)]
pub enum Told<'a> {
    /// A pass, and what it carried.
    Pass(&'a Carried),
    /// How many of the sandboxes' rings are live, when that changed.
    Rings { live: usize, of: usize },
    /// The warm pool topped up (crate::sandbox::pool): pods made, pods of
    /// an older pool removed.
    Pool {
        key: &'a str,
        made: usize,
        drained: usize,
    },
}

/// `lw-sandbox courier` in the foreground: a line `out N in N read N junk
/// N` for each pass that moved something (every pass with `once`), and
/// `rings N of N live` when that changes.
pub fn foreground(
    sb: &Sandboxes,
    once: bool,
    rings: bool,
    interval_ms: u64,
    out: &mut dyn std::io::Write,
    warn: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut report = |t: Told| {
        let line = match t {
            Told::Pass(c) if once || *c != Carried::default() => {
                let (o, i, r, j) = (c.out, c.into, c.read, c.junk);
                format!("out {o} in {i} read {r} junk {j}")
            }
            Told::Pass(_) => return,
            Told::Rings { live, of } => format!("rings {live} of {of} live"),
            Told::Pool { key, made, drained } => {
                format!("pool {key} made {made} drained {drained}")
            }
        };
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    };
    let interval = std::time::Duration::from_millis(interval_ms.max(1));
    run(sb, interval, once, rings, &mut report, warn)
}

/// `lw-sandbox courier`: passes until killed (or one, `once`), waking when
/// the mediator delivers into a volume-mode sandbox's inbox on this host
/// and every `interval` otherwise.  Holds `ROOT/state/courier.lock`.
pub fn run(
    sb: &Sandboxes,
    interval: Duration,
    once: bool,
    rings: bool,
    report: &mut dyn FnMut(Told),
    warn: &mut dyn FnMut(&str),
) -> Result<()> {
    let lock_path = lock_path(&sb.root);
    let lock = take_lock(&sb.root)?.ok_or_else(|| {
        Error::new(
            Exit::TempFail,
            format!(
                "another courier carries the mail of '{}' (it holds '{}')",
                sb.root.dir.display(),
                lock_path.display()
            ),
        )
    })?;
    let pid = PidFile::write(&sb.root)?;
    serve(sb, interval, once, rings, report, warn, &mut |_| false)?;
    pid.remove();
    drop(lock);
    Ok(())
}

/// Every sandbox is carried whole at least this often, whatever its ring
/// says (a belt for a ring's lost word).
pub const SWEEP: Duration = Duration::from_secs(300);

/// The warm pool is topped up once the root's sandboxes have not changed
/// for this long (a burst of creates takes from the pool with no pod made
/// beside it), at the courier's start and at each sweep.
const POOL_QUIET: Duration = Duration::from_secs(2);
/// At most this many pool pods are made at a time, so mail keeps moving.
const POOL_STEP: usize = 8;

/// The passes of a courier that holds the lock; before each, `idle` is
/// told how many volume-mode sandboxes the root has, and ends the loop by
/// answering true (the detached courier, daemon.rs).  Between passes it
/// waits for the mediator's deliveries on this host (the inboxes' watcher)
/// and the sandboxes' rings (ring.rs), or `interval` while some sandbox has
/// no live ring.  Without `ring` (`courier --poll`), no ring is kept and
/// every outbox is looked at each interval.
pub fn serve(
    sb: &Sandboxes,
    interval: Duration,
    once: bool,
    ring: bool,
    report: &mut dyn FnMut(Told),
    warn: &mut dyn FnMut(&str),
    idle: &mut dyn FnMut(usize) -> bool,
) -> Result<()> {
    let mut courier = Courier::new(sb);
    if once {
        if idle(courier.sandboxes()?.len()) {
            return Ok(());
        }
        let c = courier.pass(&|_| Some(Due::POLL), warn)?;
        report(Told::Pass(&c));
        return Ok(());
    }
    let watcher = base::fs::Watcher::new()
        .map_err(|e| Error::new(Exit::IoErr, format!("cannot watch the inboxes: {e}")))?;
    let mut watched = HashSet::new();
    // A sandbox created meanwhile: its record arrives here (by rename).
    let records = sb.root.state_dir().join("sandbox");
    let mut records_watched = false;
    std::thread::scope(|scope| {
        let mut rings = Rings::new(scope, sb.engine)?;
        let mut swept = Instant::now();
        let mut was_live = (0, 0);
        let mut count = 0;
        let mut pool = PoolTimer::new();
        let res = loop {
            if !records_watched {
                records_watched = watcher.add_arrivals(&records).is_ok();
            }
            match courier.sandboxes_of_all() {
                Ok((recs, all)) => {
                    // A create under way shows as a record not yet ready.
                    pool.saw((recs.len(), all));
                    count = recs.len();
                    if idle(recs.len()) {
                        break Ok(());
                    }
                    for r in &recs {
                        let dir = sb.root.sandbox(&r.name).inbox().sub(Sub::New);
                        if !watched.contains(&dir) && watcher.add(&dir).is_ok() {
                            watched.insert(dir);
                        }
                    }
                    if ring {
                        rings.keep(&recs);
                    }
                }
                Err(e) => warn(&e.to_string()),
            }
            let rung = rings.take(warn);
            let now_live = rings.live();
            if now_live != was_live {
                was_live = now_live;
                report(Told::Rings {
                    live: now_live.0,
                    of: now_live.1,
                });
            }
            let sweep = swept.elapsed() >= SWEEP;
            if sweep {
                swept = Instant::now();
                pool.due = true;
            }
            match courier.pass(&|r| Some(rings.due(r, &rung, sweep)), warn) {
                Ok(c) => report(Told::Pass(&c)),
                Err(e) => warn(&e.to_string()),
            }
            pool.refill(sb, report, warn);
            let mut timeout = rings.timeout(count, interval, SWEEP.saturating_sub(swept.elapsed()));
            timeout = pool.timeout(timeout);
            if courier.behind() {
                // An outbox left behind is read again next interval.
                timeout = timeout.min(interval);
            }
            if let Err(e) = wait(&watcher, &rings, timeout) {
                break Err(e);
            }
        };
        rings.end_all();
        res
    })
}

/// When the courier tops the warm pool up (crate::sandbox::pool): at its
/// start, when the sandboxes or their records change (after POOL_QUIET
/// without a change: creates have paused) and at each sweep.
struct PoolTimer {
    due: bool,
    seen: (usize, usize),
    changed: Instant,
}

impl PoolTimer {
    fn new() -> PoolTimer {
        PoolTimer {
            due: true,
            seen: (0, 0),
            changed: Instant::now()
                .checked_sub(POOL_QUIET)
                .unwrap_or_else(Instant::now),
        }
    }

    /// The sandboxes and records counted now.
    fn saw(&mut self, now: (usize, usize)) {
        if now != self.seen {
            self.seen = now;
            self.changed = Instant::now();
            self.due = true;
        }
    }

    /// Tops the pool up when due and creates have paused.
    fn refill(&mut self, sb: &Sandboxes, report: &mut dyn FnMut(Told), warn: &mut dyn FnMut(&str)) {
        if !self.due || self.changed.elapsed() < POOL_QUIET {
            return;
        }
        match crate::sandbox::pool::refill(sb, POOL_STEP) {
            Ok(Some(r)) => {
                if r.made + r.drained > 0 {
                    report(Told::Pool {
                        key: &r.key,
                        made: r.made,
                        drained: r.drained,
                    });
                }
                self.due = r.more;
            }
            Ok(None) => self.due = false,
            Err(e) => {
                // Tried again at the next change or sweep.
                warn(&format!("cannot refill the warm pool: {e}"));
                self.due = false;
            }
        }
    }

    /// `timeout`, shortened to wake when a due refill's pause ends.
    fn timeout(&self, timeout: Duration) -> Duration {
        if self.due {
            timeout.min(POOL_QUIET.saturating_sub(self.changed.elapsed()))
        } else {
            timeout
        }
    }
}

/// Waits up to `timeout` for a delivery into a watched inbox or a ring's
/// word, and takes the watcher's events (the rings' are taken by the pass).
fn wait(watcher: &base::fs::Watcher, rings: &Rings, timeout: Duration) -> Result<()> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let ino = std::os::fd::AsFd::as_fd(watcher);
    let bell = rings.fd();
    let mut fds = [
        PollFd::new(&ino, PollFlags::IN),
        PollFd::new(&bell, PollFlags::IN),
    ];
    let ts = Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    match poll(&mut fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => {
            return Err(Error::new(
                Exit::IoErr,
                format!("cannot wait for the inboxes: {e}"),
            ));
        }
    }
    if !fds[0].revents().is_empty() {
        let _ = watcher.take_events();
    }
    Ok(())
}
