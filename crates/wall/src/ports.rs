//! Host port leases: sandboxes publish their ports on 127.0.0.1 at ports
//! leased from a configured range, so parallel sandboxes never collide.
//!
//! The leases live in one small text file, `ROOT/state/ports`, one lease a
//! line: `PORT OWNER WHAT` (`41003 api 8080/tcp`).  Every change happens
//! under an exclusive lock on `ROOT/state/ports.lock` (flock(2) through
//! `File::lock`, released by the kernel when the holder dies), and is written
//! whole: a temporary file in the same directory, fsync, rename over the
//! file, fsync of the directory.  A reader therefore sees the old leases or
//! the new ones, and a lease that `lease` returned survives a crash.
//!
//! A lease is durable until `release` (lw-sandbox rm) or `retain` (gc, which
//! keeps only the owners that still exist).  A port is leased only when no
//! lease holds it and nothing on the host listens on it at that moment;
//! the engine still refuses a port taken later by something else, which
//! lw-sandbox reports.

use std::fs::{self, File};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};

use base::error::{Error, Exit, Result};

/// The range when the project configures none (`sandbox.ports`).
pub const DEFAULT_RANGE: &str = "41000-41999";
/// The configuration key of the range.
pub const KEY_RANGE: &str = "sandbox.ports";

/// An inclusive range of host ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub lo: u16,
    pub hi: u16,
}

impl Range {
    /// Parses `LO-HI` (or a single port).
    pub fn parse(s: &str) -> Result<Range> {
        let bad = || {
            Error::config(format!(
                "'{s}' is not a port range (LO-HI, 1024-65535, e.g. {DEFAULT_RANGE})"
            ))
        };
        let (lo, hi) = match s.trim().split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<u16>().map_err(|_| bad())?,
                b.trim().parse::<u16>().map_err(|_| bad())?,
            ),
            None => {
                let p = s.trim().parse::<u16>().map_err(|_| bad())?;
                (p, p)
            }
        };
        if lo < 1024 || hi < lo {
            return Err(bad());
        }
        Ok(Range { lo, hi })
    }

    pub fn len(&self) -> usize {
        usize::from(self.hi - self.lo) + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.lo, self.hi)
    }
}

/// One lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub port: u16,
    /// The sandbox holding it.
    pub owner: String,
    /// What it is for: the container port, `8080/tcp`.
    pub what: String,
}

/// The lease file of a mailbox root.
#[derive(Clone, Debug)]
pub struct Leases {
    pub path: PathBuf,
    lock: PathBuf,
}

impl Leases {
    /// The leases kept in the state directory `state`.
    pub fn new(state: &Path) -> Leases {
        Leases {
            path: state.join("ports"),
            lock: state.join("ports.lock"),
        }
    }

    fn locked(&self) -> Result<File> {
        if let Some(dir) = self.path.parent() {
            base::fs::private_dir(dir).map_err(|e| Error::io("cannot create", dir, e))?;
        }
        base::fs::lock(&self.lock).map_err(|e| Error::lock(&self.lock, e))
    }

    /// Every lease, in port order.
    pub fn list(&self) -> Result<Vec<Lease>> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io_as(Exit::IoErr, "cannot read", &self.path, e)),
        };
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut w = line.split_whitespace();
            let lease = (|| {
                let port = w.next()?.parse().ok()?;
                let owner = w.next()?.to_string();
                let what = w.next().unwrap_or("").to_string();
                Some(Lease { port, owner, what })
            })();
            match lease {
                Some(l) => out.push(l),
                None => {
                    return Err(Error::data(format!(
                        "{}:{}: not a lease ('PORT OWNER WHAT'); fix or remove the line",
                        self.path.display(),
                        i + 1
                    )));
                }
            }
        }
        out.sort_by_key(|l| l.port);
        Ok(out)
    }

    /// Leases one port of `range` for each of `whats`, for `owner`.  Exit 75
    /// when the range has too few free ports.
    pub fn lease(&self, range: Range, owner: &str, whats: &[String]) -> Result<Vec<u16>> {
        self.lease_where(range, owner, whats, &|p| !free_on_host(p), "the host")
    }

    /// [`Leases::lease`] for ports bound elsewhere: `taken` says which ports
    /// are in use where they will be bound (`place`, for the error).
    pub fn lease_where(
        &self,
        range: Range,
        owner: &str,
        whats: &[String],
        taken: &dyn Fn(u16) -> bool,
        place: &str,
    ) -> Result<Vec<u16>> {
        if whats.is_empty() {
            return Ok(vec![]);
        }
        let _lock = self.locked()?;
        let mut leases = self.list()?;
        let mut got = Vec::new();
        for port in range.lo..=range.hi {
            if got.len() == whats.len() {
                break;
            }
            if leases.iter().any(|l| l.port == port) || taken(port) {
                continue;
            }
            got.push(port);
        }
        if got.len() < whats.len() {
            let held = leases
                .iter()
                .filter(|l| l.port >= range.lo && l.port <= range.hi)
                .count();
            return Err(Error::new(
                Exit::TempFail,
                format!(
                    "port range {range} is exhausted: {} wanted, {held} of {} leased, the rest in use on {place}; \
                     widen '{KEY_RANGE}' in .loopwright/config or remove sandboxes (lw-sandbox rm, lw-sandbox gc)",
                    whats.len(),
                    range.len()
                ),
            ));
        }
        for (port, what) in got.iter().zip(whats) {
            leases.push(Lease {
                port: *port,
                owner: owner.to_string(),
                what: what.clone(),
            });
        }
        self.write(&leases)?;
        Ok(got)
    }

    /// Releases every lease of `owner`; returns the ports freed.
    pub fn release(&self, owner: &str) -> Result<Vec<u16>> {
        self.retain(&mut |o| o != owner)
    }

    /// Keeps the leases whose owner `keep` accepts; returns the ports freed.
    pub fn retain(&self, keep: &mut dyn FnMut(&str) -> bool) -> Result<Vec<u16>> {
        let _lock = self.locked()?;
        let leases = self.list()?;
        let (kept, freed): (Vec<Lease>, Vec<Lease>) =
            leases.into_iter().partition(|l| keep(&l.owner));
        if !freed.is_empty() {
            self.write(&kept)?;
        }
        Ok(freed.into_iter().map(|l| l.port).collect())
    }

    fn write(&self, leases: &[Lease]) -> Result<()> {
        let mut text = String::from("# port leases of lw-sandbox(1): PORT OWNER WHAT\n");
        for l in leases {
            text.push_str(&format!("{} {} {}\n", l.port, l.owner, l.what));
        }
        base::fs::write_replace(
            &self.path,
            text.as_bytes(),
            0o600,
            base::fs::Durability::Synced,
        )
        .map_err(|e| Error::io("cannot write", &self.path, e))
    }
}

/// True when nothing listens on 127.0.0.1:`port` right now.
fn free_on_host(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!("lw-ports-{}", base::id::new_id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn ranges() {
        assert_eq!(
            Range::parse("41000-41999").unwrap(),
            Range {
                lo: 41000,
                hi: 41999
            }
        );
        assert_eq!(Range::parse("5000").unwrap().len(), 1);
        for bad in ["", "80-90", "5000-4000", "a-b", "1-70000"] {
            assert_eq!(Range::parse(bad).unwrap_err().exit, Exit::Config, "{bad}");
        }
    }

    #[test]
    fn lease_is_durable_distinct_and_released() {
        let d = tmp();
        let l = Leases::new(&d);
        let r = Range::parse("47100-47103").unwrap();
        let a = l
            .lease(r, "a", &["80/tcp".into(), "443/tcp".into()])
            .unwrap();
        let b = l.lease(r, "b", &["80/tcp".into()]).unwrap();
        assert_eq!(a.len(), 2);
        assert!(!a.contains(&b[0]));
        // A second reader sees them (the file is the truth).
        let again = Leases::new(&d).list().unwrap();
        assert_eq!(again.len(), 3);
        assert_eq!(l.release("a").unwrap().len(), 2);
        assert_eq!(l.list().unwrap().len(), 1);
    }

    #[test]
    fn exhausted_range_is_temp_fail_and_leases_nothing() {
        let d = tmp();
        let l = Leases::new(&d);
        let r = Range::parse("47110-47110").unwrap();
        l.lease(r, "a", &["80/tcp".into()]).unwrap();
        let e = l.lease(r, "b", &["80/tcp".into()]).unwrap_err();
        assert_eq!(e.exit, Exit::TempFail);
        assert!(e.msg.contains("exhausted"), "{e}");
        assert_eq!(l.list().unwrap().len(), 1);
    }

    #[test]
    fn a_port_in_use_on_the_host_is_skipped() {
        let d = tmp();
        let l = Leases::new(&d);
        let busy = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let p = busy.local_addr().unwrap().port();
        if p < 1024 || p == u16::MAX {
            return;
        }
        let got = l
            .lease(Range { lo: p, hi: p + 1 }, "a", &["1/tcp".into()])
            .unwrap();
        assert_ne!(got[0], p);
    }

    #[test]
    fn concurrent_leases_never_collide() {
        let d = tmp();
        let r = Range::parse("47200-47299").unwrap();
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let d = d.clone();
                std::thread::spawn(move || {
                    Leases::new(&d)
                        .lease(r, &format!("s{i}"), &["80/tcp".into(), "81/tcp".into()])
                        .unwrap()
                })
            })
            .collect();
        let mut all: Vec<u16> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_eq!(n, 16);
    }
}
