//! GitHub's issue-comment REST API as lw-sync uses it: authentication, the
//! primary rate limit and its headers, injected faults, and the routes.

use base::digest::sha256_hex;
use serde_json::{Value, json};

use crate::comments::{body_field, comment_json, create, list, too_long};
use crate::pulls;
use crate::state::{Fault, Op, Record, State, TokenInfo, Window};
use crate::wire::{
    Limits, Request, Response, empty, gh_error, gh_time, journal_failed, now_ms_f, now_s, query,
    resp,
};

/// Who sent a request, as far as the server knows.
struct Caller {
    login: Option<String>,
    info: Option<TokenInfo>,
    host: String,
}

/// Answers one request: the control API, or the REST API with its record.
pub(crate) fn handle(st: &mut State, limits: &Limits, req: &Request) -> Response {
    let (path, q) = query(&req.target);
    if let Some(ctl) = path.strip_prefix("/_sink/") {
        return crate::control::control(st, req, ctl);
    }
    st.seq += 1;
    let t_ms = now_ms_f();
    let token = req
        .header("authorization")
        .and_then(|a| {
            a.strip_prefix("Bearer ")
                .or_else(|| a.strip_prefix("token "))
        })
        .map(str::trim);
    let info = token.and_then(|t| st.tokens.get(&sha256_hex(t.as_bytes())).cloned());
    let login = info
        .as_ref()
        .filter(|i| !i.revoked)
        .map(|i| i.login.clone());
    let in_window = login.as_ref().is_some_and(|l| {
        st.windows
            .iter()
            .any(|(who, w)| who == l && w.from_ms <= t_ms && t_ms < w.until_ms)
    });
    let mut rec = Record {
        seq: st.seq,
        t_ms,
        method: req.method.clone(),
        path: req.target.clone(),
        status: 0,
        login: login.clone(),
        fault: None,
        write: req.method != "GET",
        in_window,
    };
    let caller = Caller {
        login,
        info,
        host: req.header("host").unwrap_or("127.0.0.1").to_string(),
    };
    let mut res = dispatch(st, limits, req, &path, &q, &caller, &mut rec);
    if req.method == "GET" && res.status == 200 && !res.drop {
        conditional(st, req, caller.login.as_deref(), &mut res);
    }
    rate_headers(st, limits, caller.login.as_deref(), &mut res);
    rec.status = if res.drop { 0 } else { res.status };
    st.records.push(rec);
    res
}

/// GitHub's conditional requests: every 200 to a GET carries an `ETag`
/// (a digest of the body and the `Link` header); a GET whose
/// `If-None-Match` names the current one is answered 304 without a body,
/// and, as on GitHub, does not count against the primary limit.
fn conditional(st: &mut State, req: &Request, login: Option<&str>, res: &mut Response) {
    let links: Vec<&str> = res
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("link"))
        .map(|(_, v)| v.as_str())
        .collect();
    let digest = sha256_hex(&[res.body.as_slice(), links.join("\n").as_bytes()].concat());
    let tag = format!("\"{}\"", &digest[..40]);
    let asked = req.header("if-none-match").is_some_and(|v| {
        v.split(',')
            .any(|t| t.trim().trim_start_matches("W/") == tag)
    });
    res.headers.push(("ETag".into(), tag));
    if asked {
        res.status = 304;
        res.body.clear();
        res.headers.retain(|(k, _)| !k.eq_ignore_ascii_case("link"));
        if let Some(e) = login.and_then(|l| st.primary.get_mut(l)) {
            e.0 += 1;
        }
    }
}

/// The `x-ratelimit-*` headers GitHub sends on every answer.
fn rate_headers(st: &State, limits: &Limits, login: Option<&str>, res: &mut Response) {
    let h = &mut res.headers;
    if let Some(l) = login {
        let limit = limits.hourly_limit;
        let (remaining, reset) = *st.primary.get(l).unwrap_or(&(limit, now_s() + 3600));
        h.push(("x-ratelimit-limit".into(), limit.to_string()));
        h.push(("x-ratelimit-remaining".into(), remaining.to_string()));
        let used = limit - remaining.min(limit);
        h.push(("x-ratelimit-used".into(), used.to_string()));
        h.push(("x-ratelimit-reset".into(), reset.to_string()));
        h.push(("x-ratelimit-resource".into(), "core".into()));
    } else {
        h.push(("x-ratelimit-limit".into(), "60".into()));
        h.push(("x-ratelimit-remaining".into(), "59".into()));
        h.push(("x-ratelimit-reset".into(), (now_s() + 3600).to_string()));
    }
    h.push((
        "x-github-media-type".into(),
        "github.v3; format=json".into(),
    ));
}

/// Picks the first fault that matches and is due.
fn take_fault(st: &mut State, req: &Request, path: &str) -> Option<Fault> {
    for (f, fired, seen) in st.faults.iter_mut() {
        if f.method
            .as_deref()
            .is_some_and(|m| !m.eq_ignore_ascii_case(&req.method))
        {
            continue;
        }
        if f.path_contains
            .as_deref()
            .is_some_and(|p| !path.contains(p))
        {
            continue;
        }
        if f.count != 0 && *fired >= f.count {
            continue;
        }
        *seen += 1;
        if *seen <= f.skip {
            continue;
        }
        if let Some(p) = f.probability {
            let r = (base::id::random128() >> 64) as u64 as f64 / u64::MAX as f64;
            if r >= p {
                continue;
            }
        }
        *fired += 1;
        return Some(f.clone());
    }
    None
}

/// Spends one request of `login`'s primary limit, or answers 403 when it is
/// exhausted.
fn spend_primary(
    st: &mut State,
    limits: &Limits,
    login: &str,
    rec: &mut Record,
) -> Option<Response> {
    let now = now_s();
    let entry = st
        .primary
        .entry(login.to_string())
        .or_insert((limits.hourly_limit, now + 3600));
    if entry.1 <= now {
        *entry = (limits.hourly_limit, now + 3600);
    }
    if entry.0 == 0 {
        rec.fault = Some("primary-exhausted".into());
        return Some(gh_error(
            403,
            &format!(
                "API rate limit exceeded for user ID 1. [rate limit reset at {}]",
                gh_time(entry.1)
            ),
        ));
    }
    entry.0 -= 1;
    None
}

fn dispatch(
    st: &mut State,
    limits: &Limits,
    req: &Request,
    path: &str,
    q: &[(String, String)],
    caller: &Caller,
    rec: &mut Record,
) -> Response {
    let Some(login) = caller.login.as_deref() else {
        return if req.header("authorization").is_none() {
            gh_error(401, "Requires authentication")
        } else {
            gh_error(401, "Bad credentials")
        };
    };
    if let Some(r) = spend_primary(st, limits, login, rec) {
        return r;
    }
    let mut commit_then: Option<Fault> = None;
    if let Some(f) = take_fault(st, req, path) {
        rec.fault = Some(f.kind.clone());
        match fault_answer(st, &f, login, rec) {
            Some(r) => return r,
            None => commit_then = Some(f),
        }
    }
    let route = Route {
        req,
        path,
        q,
        host: &caller.host,
        login,
        can_write: caller.info.as_ref().is_some_and(|i| i.write),
        pulls: caller.info.as_ref().is_some_and(|i| i.pulls),
    };
    let mut res = route.answer(st);
    if let Some(f) = commit_then
        && res.status < 300
    {
        if f.kind == "drop_after_commit" {
            res.drop = true;
        } else {
            res = gh_error(f.status.unwrap_or(502), "Server Error");
        }
    }
    res
}

/// The answer of a fault that fires before the request is done, or None for
/// one that lets it be done first (`commit`, `drop_after_commit`).
fn fault_answer(st: &mut State, f: &Fault, login: &str, rec: &Record) -> Option<Response> {
    let window = |until_ms: f64, why: &str| Window {
        from_ms: rec.t_ms,
        until_ms,
        why: why.into(),
    };
    match f.kind.as_str() {
        "secondary" => {
            let mut r = gh_error(
                f.status.unwrap_or(403),
                "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            );
            if let Some(s) = f.retry_after {
                r.headers.push(("retry-after".into(), s.to_string()));
                let w = window(rec.t_ms + s as f64 * 1000.0, "retry-after");
                st.windows.push((login.into(), w));
            } else {
                // GitHub: without headers, wait at least one minute.
                let w = window(rec.t_ms + 60_000.0, "secondary");
                st.windows.push((login.into(), w));
            }
            Some(r)
        }
        "primary" => {
            let reset = now_s() + f.retry_after.unwrap_or(2);
            st.primary.insert(login.into(), (0, reset));
            let w = window(reset as f64 * 1000.0, "primary");
            st.windows.push((login.into(), w));
            // The headers added in `handle` report remaining 0 and the reset.
            Some(gh_error(403, "API rate limit exceeded for user ID 1."))
        }
        "drop" => Some(empty(0, true)),
        "not_json" => Some(Response {
            status: 200,
            headers: vec![("Content-Type".into(), "text/html".into())],
            body: b"<html><body>Unicorn! This page is taking too long to load.</body></html>"
                .to_vec(),
            drop: false,
        }),
        "status" if !f.commit && f.status == Some(422) => Some(too_long()),
        "status" if !f.commit => Some(gh_error(
            f.status.unwrap_or(502),
            f.message.as_deref().unwrap_or("Server Error"),
        )),
        _ => None,
    }
}

/// One authenticated REST request being routed.
struct Route<'a> {
    req: &'a Request,
    path: &'a str,
    q: &'a [(String, String)],
    host: &'a str,
    login: &'a str,
    can_write: bool,
    /// The token has pull-request (and status) rights.
    pulls: bool,
}

fn forbidden() -> Response {
    let mut r = gh_error(403, "Resource not accessible by personal access token");
    r.headers.push((
        "x-accepted-github-permissions".into(),
        "issues=write; pull_requests=write".into(),
    ));
    r
}

fn not_found() -> Response {
    gh_error(404, "Not Found")
}

impl Route<'_> {
    fn answer(&self, st: &mut State) -> Response {
        let seg: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        match (self.req.method.as_str(), seg.as_slice()) {
            ("GET", ["user"]) => resp(200, json!({ "login": self.login, "id": 1, "type": "User" })),
            ("GET", ["rate_limit"]) => {
                let (rem, reset) = st.primary.get(self.login).copied().unwrap_or((0, 0));
                resp(
                    200,
                    json!({ "resources": { "core": { "remaining": rem, "reset": reset } }, "rate": { "remaining": rem, "reset": reset } }),
                )
            }
            ("GET", ["repos", o, r]) => {
                let full = format!("{o}/{r}");
                if st.repos.contains_key(&full) {
                    resp(200, json!({ "full_name": full, "has_issues": true }))
                } else {
                    not_found()
                }
            }
            ("POST", ["graphql"]) => {
                pulls::graphql(st, self.can_write && self.pulls, &self.req.body)
            }
            (_, ["repos", o, r, rest @ ..]) => {
                let full = format!("{o}/{r}");
                if !st.repos.contains_key(&full) {
                    return not_found();
                }
                self.in_repo(st, &full, rest)
            }
            _ => not_found(),
        }
    }

    /// Routes under `/repos/{full}/`.
    fn in_repo(&self, st: &mut State, full: &str, rest: &[&str]) -> Response {
        let m = self.req.method.as_str();
        let issues = &st.repos[full];
        match (m, rest) {
            ("POST", ["issues"]) => self.new_issue(st, full),
            ("GET", ["issues", n]) => match n
                .parse::<u64>()
                .ok()
                .and_then(|n| issues.get(&n).map(|t| (n, t.clone())))
            {
                Some((n, t)) => resp(200, json!({ "number": n, "title": t, "state": "open" })),
                None => not_found(),
            },
            (_, ["issues", n, "comments"]) => {
                let Some(n) = n.parse::<u64>().ok().filter(|n| issues.contains_key(n)) else {
                    return not_found();
                };
                match m {
                    "GET" => list(st, full, n, self.path, self.q, self.host),
                    "POST" if !self.can_write => forbidden(),
                    "POST" => create(st, full, n, &self.req.body, self.login, self.host),
                    _ => not_found(),
                }
            }
            (_, ["pulls", ..] | ["statuses", _] | ["commits", _, "statuses"]) => {
                self.in_pulls(st, full, rest)
            }
            (_, ["issues", "comments", id]) => {
                let Some(id) = id
                    .parse::<u64>()
                    .ok()
                    .filter(|id| st.comments.get(id).is_some_and(|c| c.repo == full))
                else {
                    return not_found();
                };
                self.comment(st, id)
            }
            _ => not_found(),
        }
    }

    /// Pull requests, their reviews, and commit statuses (`pulls`).
    fn in_pulls(&self, st: &mut State, full: &str, rest: &[&str]) -> Response {
        let c = pulls::Ctx {
            repo: full,
            login: self.login,
            host: self.host,
            path: self.path,
            q: self.q,
            body: &self.req.body,
            can_write: self.can_write && self.pulls,
        };
        if !self.pulls {
            return pulls::forbidden("pull_requests=read");
        }
        match (self.req.method.as_str(), rest) {
            ("GET", ["pulls"]) => pulls::list(st, &c),
            ("POST", ["pulls"]) => pulls::create(st, &c),
            ("GET", ["pulls", n]) => pulls::get(st, &c, n),
            ("PATCH", ["pulls", n]) => pulls::update(st, &c, n),
            ("GET", ["pulls", n, "reviews"]) => pulls::reviews(st, &c, n, false),
            ("GET", ["pulls", n, "comments"]) => pulls::reviews(st, &c, n, true),
            ("POST", ["statuses", sha]) => pulls::create_status(st, &c, sha),
            ("GET", ["commits", sha, "statuses"]) => pulls::list_statuses(st, &c, sha),
            _ => not_found(),
        }
    }

    fn new_issue(&self, st: &mut State, full: &str) -> Response {
        if !self.can_write {
            return forbidden();
        }
        let title = serde_json::from_slice::<Value>(&self.req.body)
            .ok()
            .and_then(|v| v["title"].as_str().map(str::to_string));
        let Some(title) = title else {
            return gh_error(422, "Validation Failed");
        };
        let number = st.repos[full].keys().next_back().copied().unwrap_or(0) + 1;
        let op = Op::Issue {
            repo: full.into(),
            number,
            title: title.clone(),
        };
        if st.commit(op).is_err() {
            return journal_failed();
        }
        resp(201, json!({ "number": number, "title": title }))
    }

    /// `/repos/{o}/{r}/issues/comments/{id}` of an existing comment.
    fn comment(&self, st: &mut State, id: u64) -> Response {
        match self.req.method.as_str() {
            "GET" => resp(200, comment_json(&st.comments[&id], self.host)),
            "PATCH" | "DELETE" if !self.can_write => forbidden(),
            "PATCH" => {
                let body = match body_field(&self.req.body) {
                    Ok(b) => b,
                    Err(r) => return r,
                };
                let at = now_s();
                if st.commit(Op::Edit { id, body, at }).is_err() {
                    return journal_failed();
                }
                resp(200, comment_json(&st.comments[&id], self.host))
            }
            "DELETE" => {
                if st.commit(Op::Delete { id }).is_err() {
                    return journal_failed();
                }
                empty(204, false)
            }
            _ => not_found(),
        }
    }
}
