//! Who may ask what.  The server listens on loopback, but any page the
//! person's browser has open can send requests there, and any process of
//! any user on the host can connect.  So:
//!
//! - every request must name this server in `Host` (a page reached through
//!   a rebound DNS name says another host, and gets 403);
//! - everything but the page's static script and style needs the token:
//!   in the `x-lw-token` header, or in the cookie the page's first load
//!   set from `?token=` (HttpOnly, SameSite=Strict), so the event stream,
//!   which cannot send headers, is covered;
//! - a request that changes state (POST) needs the token in the header
//!   (a cookie rides along on cross-site requests, a header never does)
//!   and, when the browser says where it came from (`Origin`,
//!   `Sec-Fetch-Site`), this origin.

use hyper::HeaderMap;
use hyper::header::{COOKIE, HOST, ORIGIN};

/// The cookie the page's first load sets.
pub const COOKIE_NAME: &str = "lw-cockpit-token";
/// The header scripts send the token in.
pub const TOKEN_HEADER: &str = "x-lw-token";

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

/// The token a request carries in its cookie.
fn cookie_token(h: &HeaderMap) -> Option<&str> {
    h.get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
}

/// The `token=` parameter of a query string.
pub fn query_token(query: Option<&str>) -> Option<&str> {
    query?.split('&').find_map(|p| p.strip_prefix("token="))
}

/// The hosts this server answers to: `127.0.0.1:PORT`, `localhost:PORT`.
fn host_ok(h: &HeaderMap, port: u16) -> bool {
    let Some(host) = h.get(HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    [format!("127.0.0.1:{port}"), format!("localhost:{port}")]
        .iter()
        .any(|ok| host.eq_ignore_ascii_case(ok))
}

/// The request comes from this server's own pages, as far as the browser says.
fn same_origin(h: &HeaderMap, port: u16) -> bool {
    let origin_ok = h.get(ORIGIN).is_none_or(|o| {
        o.to_str().is_ok_and(|o| {
            o == format!("http://127.0.0.1:{port}") || o == format!("http://localhost:{port}")
        })
    });
    let site_ok = h
        .get("sec-fetch-site")
        .is_none_or(|s| s == "same-origin" || s == "none");
    origin_ok && site_ok
}

/// Judges a request: `path` without query, `query_tok` the `?token=` it
/// carries, `changes` true for a request that changes state.
pub fn judge(
    h: &HeaderMap,
    port: u16,
    token: &str,
    path: &str,
    query_tok: Option<&str>,
    changes: bool,
) -> Verdict {
    if !host_ok(h, port) {
        return Verdict::Deny("the Host header does not name this server");
    }
    if !changes && matches!(path, "/app.js" | "/app.css" | "/favicon.ico") {
        return Verdict::Allow;
    }
    let header = h.get(TOKEN_HEADER).and_then(|v| v.to_str().ok());
    let has = |t: Option<&str>| t.is_some_and(|t| same(t.as_bytes(), token.as_bytes()));
    if changes {
        if !has(header) {
            return Verdict::Deny("a change needs the token in the x-lw-token header");
        }
        if !same_origin(h, port) {
            return Verdict::Deny("a change must come from this page's own origin");
        }
        return Verdict::Allow;
    }
    if has(header) || has(cookie_token(h)) || (path == "/" && has(query_tok)) {
        Verdict::Allow
    } else {
        Verdict::Deny("no valid token: open the URL lw-cockpit printed")
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
    fn the_token_host_and_origin_rules() {
        let t = "abc123";
        let host = ("host", "127.0.0.1:8000");
        let allow = Verdict::Allow;
        // (headers, path, ?token=, a change, allowed)
        type Case<'a> = (
            &'a [(&'static str, &'a str)],
            &'a str,
            Option<&'a str>,
            bool,
            bool,
        );
        let cases: &[Case] = &[
            (&[host], "/", Some("abc123"), false, true),
            (&[host], "/", Some("abc124"), false, false),
            (&[host], "/", None, false, false),
            (&[host], "/api/log", Some("abc123"), false, false),
            (
                &[host, ("cookie", "a=b; lw-cockpit-token=abc123")],
                "/api/log",
                None,
                false,
                true,
            ),
            (&[host], "/app.js", None, false, true),
            (
                &[("host", "evil.example:8000")],
                "/",
                Some("abc123"),
                false,
                false,
            ),
            (
                &[host, ("cookie", "lw-cockpit-token=abc123")],
                "/api/answer",
                None,
                true,
                false,
            ),
            (
                &[host, ("x-lw-token", "abc123")],
                "/api/answer",
                None,
                true,
                true,
            ),
            (
                &[
                    host,
                    ("x-lw-token", "abc123"),
                    ("origin", "http://evil.example"),
                ],
                "/api/answer",
                None,
                true,
                false,
            ),
            (
                &[
                    host,
                    ("x-lw-token", "abc123"),
                    ("sec-fetch-site", "cross-site"),
                ],
                "/api/answer",
                None,
                true,
                false,
            ),
            (
                &[
                    host,
                    ("x-lw-token", "abc123"),
                    ("origin", "http://127.0.0.1:8000"),
                ],
                "/api/answer",
                None,
                true,
                true,
            ),
        ];
        for (h, path, q, changes, ok) in cases {
            let v = judge(&headers(h), 8000, t, path, *q, *changes);
            assert_eq!(v == allow, *ok, "{h:?} {path} {q:?} {changes}: {v:?}");
        }
    }
}
