//! Who may ask what.  The server listens on loopback, but any page the
//! person's browser has open can send requests there, and any process of
//! any user on the host can connect.
//!
//! No cookie: a browser sends a cookie set by 127.0.0.1 to every port of
//! 127.0.0.1, so a sandbox's published port (which the page links to)
//! would receive it, and a page served there can plant cookies of its own
//! for this server.  So this server sets none and reads none, and:
//!
//! - every request must name this server in `Host`, as it listens (a page
//!   reached through a rebound DNS name says another host, and gets 403);
//! - the page, its script and its style are the same for everyone and hold
//!   nothing secret: they need no credential;
//! - the URL lw-cockpit prints carries a ticket in its fragment (which a
//!   browser never sends to any server); the page trades it, once and
//!   within [`TICKET_LIFE`], for a secret of the tab's own (`POST
//!   /api/session`), keeps that in the tab's sessionStorage (per origin, so
//!   per port) and sends it in the `x-lw-session` header of every other
//!   request, the event stream's included (read with fetch, which can send
//!   a header, where EventSource cannot);
//! - a request that changes state (POST, the trade included) must come,
//!   when the browser says where it came from (`Origin`, `Sec-Fetch-Site`),
//!   from this origin: a header never rides along on a cross-site request,
//!   and this check keeps a page elsewhere from trading a ticket it guessed.
//!
//! Tickets and secrets are 128 random bits, compared in constant time.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::HeaderMap;
use hyper::header::{HOST, ORIGIN};

/// The header a tab sends its secret in.
pub const SESSION_HEADER: &str = "x-lw-session";
/// How long a ticket can be traded after it was made.
pub const TICKET_LIFE: Duration = Duration::from_secs(600);
/// Tickets not yet traded, and tabs' secrets, kept at most: the oldest
/// goes first (a secret is made only by trading a ticket, and a ticket
/// only at start, on SIGUSR1 or by a tab that holds a secret).
const MAX_KEYS: usize = 64;

/// The verdict on one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// 403 with the reason, said in the body.
    Deny(&'static str),
}

/// True when `a` and `b` are equal, in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 128 random bits as hex.
pub fn new_secret() -> String {
    format!("{:032x}", base::id::random128())
}

/// The tickets and the tabs' secrets of one server.
#[derive(Default)]
pub struct Access {
    keys: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    tickets: VecDeque<(String, Instant)>,
    sessions: VecDeque<String>,
}

impl Access {
    fn keys(&self) -> std::sync::MutexGuard<'_, Keys> {
        // A panic while holding it leaves nothing half-written.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new ticket: good for one trade within [`TICKET_LIFE`].
    pub fn ticket(&self) -> String {
        let t = new_secret();
        let mut k = self.keys();
        k.tickets.retain(|(_, at)| at.elapsed() < TICKET_LIFE);
        if k.tickets.len() >= MAX_KEYS {
            k.tickets.pop_front();
        }
        k.tickets.push_back((t.clone(), Instant::now()));
        t
    }

    /// Trades `ticket` for a new tab's secret; None when it is not one of
    /// ours, was traded already, or is older than [`TICKET_LIFE`].
    pub fn trade(&self, ticket: &str) -> Option<String> {
        let mut k = self.keys();
        // Every ticket is compared, each in constant time.
        let hit = k
            .tickets
            .iter()
            .enumerate()
            .fold(None, |hit, (i, (t, _))| {
                if same(t.as_bytes(), ticket.as_bytes()) {
                    Some(i)
                } else {
                    hit
                }
            })?;
        let (_, at) = k.tickets.remove(hit)?;
        if at.elapsed() >= TICKET_LIFE {
            return None;
        }
        let s = new_secret();
        if k.sessions.len() >= MAX_KEYS {
            k.sessions.pop_front();
        }
        k.sessions.push_back(s.clone());
        Some(s)
    }

    /// True when `secret` is a tab's.
    pub fn session(&self, secret: &str) -> bool {
        self.keys()
            .sessions
            .iter()
            .fold(false, |ok, s| ok | same(s.as_bytes(), secret.as_bytes()))
    }
}

/// Where this server listens, as a browser names it.
pub struct Here {
    pub addr: SocketAddr,
}

impl Here {
    /// The `Host` values that name this server: its address and port
    /// (`127.0.0.2:PORT`, `[::1]:PORT`), and `localhost:PORT` when the
    /// address is the one localhost names.
    fn hosts(&self) -> Vec<String> {
        let mut v = vec![self.addr.to_string()];
        let localhost = match self.addr.ip() {
            IpAddr::V4(ip) => ip == std::net::Ipv4Addr::LOCALHOST,
            IpAddr::V6(ip) => ip == std::net::Ipv6Addr::LOCALHOST,
        };
        if localhost {
            v.push(format!("localhost:{}", self.addr.port()));
        }
        v
    }

    fn host_ok(&self, h: &HeaderMap) -> bool {
        let Some(host) = h.get(HOST).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        self.hosts().iter().any(|ok| host.eq_ignore_ascii_case(ok))
    }

    /// The request comes from this server's own pages, as far as the
    /// browser says.
    fn same_origin(&self, h: &HeaderMap) -> bool {
        let origin_ok = h.get(ORIGIN).is_none_or(|o| {
            o.to_str().is_ok_and(|o| {
                self.hosts()
                    .iter()
                    .any(|ok| o.eq_ignore_ascii_case(&format!("http://{ok}")))
            })
        });
        let site_ok = h
            .get("sec-fetch-site")
            .is_none_or(|s| s == "same-origin" || s == "none");
        origin_ok && site_ok
    }

    /// The page's address, with `ticket` in its fragment.
    pub fn url(&self, ticket: &str) -> String {
        format!("http://{}/#ticket={ticket}", self.addr)
    }
}

/// What needs no credential: the page, its script and style.
const PUBLIC: &[&str] = &["/", "/app.js", "/app.css", "/favicon.ico"];
/// Where a ticket is traded: the ticket in the body is the credential.
pub const TRADE: &str = "/api/session";

/// Judges a request: `path` without query, `changes` true for a request
/// that changes state.  Cookies are never looked at.
pub fn judge(h: &HeaderMap, here: &Here, access: &Access, path: &str, changes: bool) -> Verdict {
    if !here.host_ok(h) {
        return Verdict::Deny("the Host header does not name this server");
    }
    if !changes && PUBLIC.contains(&path) {
        return Verdict::Allow;
    }
    if changes && !here.same_origin(h) {
        return Verdict::Deny("a change must come from this page's own origin");
    }
    if changes && path == TRADE {
        return Verdict::Allow;
    }
    let secret = h.get(SESSION_HEADER).and_then(|v| v.to_str().ok());
    if secret.is_some_and(|s| access.session(s)) {
        Verdict::Allow
    } else {
        Verdict::Deny(
            "no valid x-lw-session header: open a URL lw-cockpit printed \
             (each works once; kill -USR1 its pid prints another)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_ticket_is_traded_once_for_a_secret() {
        let a = Access::default();
        let t = a.ticket();
        assert_eq!(t.len(), 32);
        assert!(a.trade("0123456789abcdef0123456789abcdef").is_none());
        assert!(!a.session(&t), "a ticket is not a secret");
        let s = a.trade(&t).expect("a fresh ticket trades");
        assert!(a.session(&s) && s != t);
        assert!(a.trade(&t).is_none(), "twice");
        let (t1, t2) = (a.ticket(), a.ticket());
        let (s1, s2) = (a.trade(&t2).unwrap(), a.trade(&t1).unwrap());
        assert!(a.session(&s1) && a.session(&s2) && a.session(&s) && s1 != s2);
        assert!(!a.session("") && !a.session(&s[..31]));
    }

    #[test]
    fn an_old_ticket_does_not_trade() {
        let a = Access::default();
        let t = a.ticket();
        a.keys().tickets[0].1 -= TICKET_LIFE;
        assert!(a.trade(&t).is_none());
        assert!(a.keys().tickets.is_empty(), "and is gone");
    }

    #[test]
    fn the_session_host_and_origin_rules() {
        let a = Access::default();
        let s = a.trade(&a.ticket()).unwrap();
        let here = Here {
            addr: "127.0.0.1:8000".parse().unwrap(),
        };
        let host = ("host", "127.0.0.1:8000");
        let cookie = format!("lw-cockpit-token={s}; x-lw-session={s}");
        // (headers, path, a change, allowed)
        type Case<'a> = (Vec<(&'static str, &'a str)>, &'a str, bool, bool);
        let cases: Vec<Case> = vec![
            (vec![host], "/", false, true),
            (vec![host], "/app.js", false, true),
            (vec![("host", "localhost:8000")], "/", false, true),
            (vec![("host", "evil.example:8000")], "/", false, false),
            (vec![("host", "127.0.0.1:8001")], "/", false, false),
            (vec![host], "/api/log", false, false),
            (vec![host, ("x-lw-session", &s)], "/api/log", false, true),
            (
                vec![host, ("x-lw-session", "abc")],
                "/api/log",
                false,
                false,
            ),
            (vec![host, ("cookie", &cookie)], "/api/log", false, false),
            (vec![host, ("cookie", &cookie)], "/api/events", false, false),
            (vec![host, ("x-lw-session", &s)], "/api/answer", true, true),
            (vec![host, ("cookie", &cookie)], "/api/answer", true, false),
            (
                vec![
                    host,
                    ("x-lw-session", &s),
                    ("origin", "http://evil.example"),
                ],
                "/api/answer",
                true,
                false,
            ),
            (
                vec![host, ("x-lw-session", &s), ("origin", "http://127.0.0.1:9")],
                "/api/answer",
                true,
                false,
            ),
            (
                vec![host, ("x-lw-session", &s), ("sec-fetch-site", "same-site")],
                "/api/answer",
                true,
                false,
            ),
            (
                vec![
                    host,
                    ("x-lw-session", &s),
                    ("origin", "http://127.0.0.1:8000"),
                ],
                "/api/answer",
                true,
                true,
            ),
            (vec![host], TRADE, true, true),
            (
                vec![host, ("origin", "http://127.0.0.1:9")],
                TRADE,
                true,
                false,
            ),
            (vec![host], TRADE, false, false),
        ];
        for (h, path, changes, ok) in &cases {
            let v = judge(&headers(h), &here, &a, path, *changes);
            assert_eq!(v == Verdict::Allow, *ok, "{h:?} {path} {changes}: {v:?}");
        }
    }

    #[test]
    fn another_loopback_address_is_named_as_it_is() {
        let a = Access::default();
        let here = Here {
            addr: "127.0.0.2:8000".parse().unwrap(),
        };
        for (host, ok) in [
            ("127.0.0.2:8000", true),
            ("127.0.0.1:8000", false),
            ("localhost:8000", false),
        ] {
            let v = judge(&headers(&[("host", host)]), &here, &a, "/", false);
            assert_eq!(v == Verdict::Allow, ok, "{host}");
        }
        let six = Here {
            addr: "[::1]:8000".parse().unwrap(),
        };
        assert_eq!(six.url("t"), "http://[::1]:8000/#ticket=t");
        let h = headers(&[("host", "[::1]:8000"), ("origin", "http://[::1]:8000")]);
        assert_eq!(judge(&h, &six, &a, TRADE, true), Verdict::Allow);
    }
}
