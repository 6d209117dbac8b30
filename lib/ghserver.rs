//! A GitHub-compatible HTTP server for the issue-comment API, for tests and
//! demonstrations on 127.0.0.1 (lw-github-sink(1)).
//!
//! It is stateful and persistent: every change is one JSON line appended to
//! `DIR/journal.jsonl` and fsynced before the answer is sent, and the journal
//! is replayed on start, so a restarted server has the same issues, comments
//! and ids.  Tokens are stored as SHA-256 digests, never in clear.
//!
//! It speaks what lw-sync uses, as GitHub documents it: `GET /user`,
//! `GET /rate_limit`, `GET /repos/{o}/{r}`, `GET|POST /repos/{o}/{r}/issues`,
//! `GET /repos/{o}/{r}/issues/{n}`, `GET|POST /repos/{o}/{r}/issues/{n}/comments`
//! (`per_page`, `page`, `since`, `Link` with rel next/prev/first/last),
//! `GET|PATCH|DELETE /repos/{o}/{r}/issues/comments/{id}`; `x-ratelimit-*`
//! headers on every answer; 401 for a missing or revoked token, 403 with
//! `x-accepted-github-permissions` for a read-only one, 404 for an unknown
//! repository or issue, 422 for a body over 65,536 characters.
//!
//! The control API under `/_sink/` (no token) sets up repositories, tokens
//! and human comments, injects faults, and returns the record of every
//! request with its time and of every blocked window the server imposed, so
//! tests can check that a client honoured them.
//!
//! One thread per connection, HTTP/1.1 keep-alive, one lock around the state:
//! requests are handled one at a time, which is all a serial client needs.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{Error, Exit, Result};

/// One recorded request (control requests are not recorded).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    /// Milliseconds since the epoch, with microseconds.
    pub t_ms: f64,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub login: Option<String>,
    pub fault: Option<String>,
    /// A content-creating request (POST, PATCH, DELETE).
    pub write: bool,
    /// Sent inside a window the server had blocked for this token.
    pub in_window: bool,
}

/// A window in which the server told the client not to send (`retry-after`
/// or an exhausted primary limit), in milliseconds since the epoch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Window {
    pub from_ms: f64,
    pub until_ms: f64,
    pub why: String,
}

/// An injected fault.  Matching requests (by method and path substring)
/// fire it `count` times (0 = without end), after letting `skip` pass, each
/// with `probability` (default 1).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fault {
    /// `status` (answer `status` without doing anything, or after doing it
    /// when `commit`), `secondary` (403/429 secondary limit, `retry_after`
    /// seconds or no header), `primary` (exhaust the primary limit for
    /// `retry_after` seconds), `drop_after_commit` (do it, then close the
    /// connection without answering), `drop` (close without doing anything),
    /// `not_json` (answer 200 with an HTML page).
    pub kind: String,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path_contains: Option<String>,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub retry_after: Option<u64>,
    #[serde(default)]
    pub commit: bool,
    #[serde(default = "one")]
    pub count: u64,
    #[serde(default)]
    pub skip: u64,
    #[serde(default)]
    pub probability: Option<f64>,
    /// The `message` of a `status` answer (default "Server Error"), e.g.
    /// "Resource not accessible by integration" for a 403 on `/user` as
    /// GitHub gives App installation and Actions tokens.
    #[serde(default)]
    pub message: Option<String>,
}

fn one() -> u64 {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredComment {
    id: u64,
    repo: String,
    issue: u64,
    body: String,
    login: String,
    association: String,
    created: u64,
    updated: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct TokenInfo {
    login: String,
    write: bool,
    revoked: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Repo {
        repo: String,
    },
    Issue {
        repo: String,
        number: u64,
        title: String,
    },
    Comment {
        c: StoredComment,
    },
    Edit {
        id: u64,
        body: String,
        at: u64,
    },
    Delete {
        id: u64,
    },
    Token {
        sha: String,
        info: TokenInfo,
    },
}

#[derive(Default)]
struct State {
    repos: BTreeMap<String, BTreeMap<u64, String>>,
    comments: BTreeMap<u64, StoredComment>,
    next_id: u64,
    tokens: HashMap<String, TokenInfo>,
    faults: Vec<(Fault, u64, u64)>,
    records: Vec<Record>,
    windows: Vec<(String, Window)>,
    /// Primary limit per login: (remaining, reset epoch seconds).
    primary: HashMap<String, (u64, u64)>,
    journal: Option<std::fs::File>,
    seq: u64,
}

/// The server's configuration.
#[derive(Clone, Debug)]
pub struct Options {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    /// Requests per hour per token before the primary limit answers 403.
    pub hourly_limit: u64,
    /// Comments per page when the client does not say (GitHub: 30).
    pub default_per_page: usize,
}

pub struct Server {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

const DOCS: &str = "https://docs.github.com/rest";

fn now_s() -> u64 {
    crate::time::now().as_secs()
}

fn now_ms_f() -> f64 {
    crate::time::now().as_secs_f64() * 1000.0
}

fn gh_time(s: u64) -> String {
    // GitHub's timestamps have whole seconds.
    let t = crate::time::rfc3339(Duration::from_secs(s));
    format!("{}Z", &t[..19])
}

pub use crate::digest::sha256_hex;

impl State {
    fn apply(&mut self, op: Op) {
        match op {
            Op::Repo { repo } => {
                self.repos.entry(repo).or_default();
            }
            Op::Issue {
                repo,
                number,
                title,
            } => {
                self.repos.entry(repo).or_default().insert(number, title);
            }
            Op::Comment { c } => {
                self.next_id = self.next_id.max(c.id + 1);
                self.comments.insert(c.id, c);
            }
            Op::Edit { id, body, at } => {
                if let Some(c) = self.comments.get_mut(&id) {
                    c.body = body;
                    c.updated = at;
                }
            }
            Op::Delete { id } => {
                self.comments.remove(&id);
            }
            Op::Token { sha, info } => {
                self.tokens.insert(sha, info);
            }
        }
    }

    /// Journals then applies: a change is on disk before anyone hears of it.
    fn commit(&mut self, op: Op) -> std::io::Result<()> {
        if let Some(j) = &mut self.journal {
            let mut line = serde_json::to_vec(&op).expect("journal ops are plain data");
            line.push(b'\n');
            j.write_all(&line)?;
            j.sync_data()?;
        }
        self.apply(op);
        Ok(())
    }
}

impl Server {
    /// Loads `opts.dir`, binds `opts.listen` (loopback only) and serves in
    /// background threads.
    pub fn start(opts: Options) -> Result<Server> {
        if !opts.listen.ip().is_loopback() {
            return Err(Error::usage(format!(
                "refusing to listen on {}: lw-github-sink serves loopback addresses only",
                opts.listen
            )));
        }
        std::fs::create_dir_all(&opts.dir).map_err(|e| Error::io("cannot create", &opts.dir, e))?;
        let jpath = opts.dir.join("journal.jsonl");
        let mut st = State {
            next_id: 1_000_001,
            ..State::default()
        };
        match std::fs::read(&jpath) {
            Ok(bytes) => {
                for line in bytes.split(|&b| b == b'\n') {
                    // A torn last line (crash mid-append) is skipped.
                    if let Ok(op) = serde_json::from_slice::<Op>(line) {
                        st.apply(op);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("cannot read", &jpath, e)),
        }
        st.journal = Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&jpath)
                .map_err(|e| Error::io("cannot open", &jpath, e))?,
        );
        let listener = TcpListener::bind(opts.listen).map_err(|e| {
            Error::new(
                Exit::Unavailable,
                format!("cannot listen on {}", opts.listen),
            )
            .with_source(e)
        })?;
        let addr = listener.local_addr().map_err(|e| {
            Error::new(Exit::Unavailable, "cannot read the bound address").with_source(e)
        })?;
        let state = Arc::new(Mutex::new(st));
        let shared = state.clone();
        let opts = Arc::new(opts);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let state = shared.clone();
                let opts = opts.clone();
                std::thread::spawn(move || serve_conn(conn, state, opts));
            }
        });
        Ok(Server { addr, state })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Blocks for ever (the binary's main loop).
    pub fn wait(&self) -> ! {
        loop {
            std::thread::park();
        }
    }

    /// Accepts `token` for `login` (stored as its digest).
    pub fn add_token(&self, login: &str, token: &str, write: bool) {
        let mut st = self.state.lock().expect("server state lock");
        let info = TokenInfo {
            login: login.into(),
            write,
            revoked: false,
        };
        st.commit(Op::Token {
            sha: sha256_hex(token.as_bytes()),
            info,
        })
        .expect("journal write");
    }

    /// Direct control, without HTTP (tests in the same process).
    pub fn add_repo(&self, repo: &str, issues: u64) {
        let mut st = self.state.lock().expect("server state lock");
        control_repo(&mut st, repo, issues).expect("journal write");
    }
}

fn control_repo(st: &mut State, repo: &str, issues: u64) -> std::io::Result<()> {
    if !st.repos.contains_key(repo) {
        st.commit(Op::Repo { repo: repo.into() })?;
    }
    for n in 1..=issues {
        if !st.repos[repo].contains_key(&n) {
            st.commit(Op::Issue {
                repo: repo.into(),
                number: n,
                title: format!("issue {n}"),
            })?;
        }
    }
    Ok(())
}

struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, n: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.as_str())
    }
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Close the connection without sending anything.
    drop: bool,
}

fn resp(status: u16, v: Value) -> Response {
    Response {
        status,
        headers: vec![],
        body: serde_json::to_vec(&v).expect("JSON values serialise"),
        drop: false,
    }
}

fn gh_error(status: u16, msg: &str) -> Response {
    resp(
        status,
        json!({ "message": msg, "documentation_url": DOCS, "status": status.to_string() }),
    )
}

fn read_request(r: &mut BufReader<TcpStream>) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(std::io::Error::other("bad request line"));
    };
    let (method, target) = (method.to_string(), target.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if headers.len() > 200 {
            return Err(std::io::Error::other("too many headers"));
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    let mut req = Request {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| std::io::Error::other("bad chunk size"))?;
            if n == 0 {
                let mut end = String::new();
                r.read_line(&mut end)?;
                break;
            }
            let start = req.body.len();
            req.body.resize(start + n, 0);
            r.read_exact(&mut req.body[start..])?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    } else if let Some(n) = req
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        if n > 64 * 1024 * 1024 {
            return Err(std::io::Error::other("body too large"));
        }
        req.body.resize(n, 0);
        r.read_exact(&mut req.body)?;
    }
    Ok(Some(req))
}

fn serve_conn(conn: TcpStream, state: Arc<Mutex<State>>, opts: Arc<Options>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(300)));
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    loop {
        let req = match read_request(&mut r) {
            Ok(Some(req)) => req,
            _ => return,
        };
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let host = req.header("host").unwrap_or("127.0.0.1").to_string();
        let res = {
            let mut st = state.lock().expect("server state lock");
            handle(&mut st, &opts, &req, &host)
        };
        if res.drop {
            let _ = w.shutdown(Shutdown::Both);
            return;
        }
        let reason = match res.status {
            200 => "OK",
            201 => "Created",
            204 => "No Content",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            422 => "Unprocessable Entity",
            429 => "Too Many Requests",
            _ => "Status",
        };
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Length: {}\r\n",
            res.status,
            res.body.len()
        );
        if !res
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            head.push_str("Content-Type: application/json; charset=utf-8\r\n");
        }
        for (k, v) in &res.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(if close {
            "Connection: close\r\n\r\n"
        } else {
            "Connection: keep-alive\r\n\r\n"
        });
        if w.write_all(head.as_bytes())
            .and_then(|_| w.write_all(&res.body))
            .and_then(|_| w.flush())
            .is_err()
            || close
        {
            return;
        }
    }
}

fn query(target: &str) -> (String, Vec<(String, String)>) {
    let (path, q) = target.split_once('?').unwrap_or((target, ""));
    let params = q
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_string(), v.replace("%3A", ":").replace("%3a", ":"))
        })
        .collect();
    (path.to_string(), params)
}

fn param<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

fn handle(st: &mut State, opts: &Options, req: &Request, host: &str) -> Response {
    let (path, q) = query(&req.target);
    if let Some(ctl) = path.strip_prefix("/_sink/") {
        return control(st, req, ctl);
    }
    st.seq += 1;
    let t_ms = now_ms_f();
    let write = req.method != "GET";
    // Who is asking.
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
        write,
        in_window,
    };

    let mut res = dispatch(
        st,
        opts,
        req,
        &path,
        &q,
        host,
        login.as_deref(),
        info.as_ref(),
        &mut rec,
    );
    if let Some(l) = &login {
        let (remaining, reset) = *st
            .primary
            .get(l)
            .unwrap_or(&(opts.hourly_limit, now_s() + 3600));
        res.headers
            .push(("x-ratelimit-limit".into(), opts.hourly_limit.to_string()));
        res.headers
            .push(("x-ratelimit-remaining".into(), remaining.to_string()));
        res.headers.push((
            "x-ratelimit-used".into(),
            (opts.hourly_limit - remaining.min(opts.hourly_limit)).to_string(),
        ));
        res.headers
            .push(("x-ratelimit-reset".into(), reset.to_string()));
        res.headers
            .push(("x-ratelimit-resource".into(), "core".into()));
    } else {
        res.headers.push(("x-ratelimit-limit".into(), "60".into()));
        res.headers
            .push(("x-ratelimit-remaining".into(), "59".into()));
        res.headers
            .push(("x-ratelimit-reset".into(), (now_s() + 3600).to_string()));
    }
    res.headers.push((
        "x-github-media-type".into(),
        "github.v3; format=json".into(),
    ));
    rec.status = if res.drop { 0 } else { res.status };
    st.records.push(rec);
    res
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
            let r = (crate::id::random128() >> 64) as u64 as f64 / u64::MAX as f64;
            if r >= p {
                continue;
            }
        }
        *fired += 1;
        return Some(f.clone());
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn dispatch(
    st: &mut State,
    opts: &Options,
    req: &Request,
    path: &str,
    q: &[(String, String)],
    host: &str,
    login: Option<&str>,
    info: Option<&TokenInfo>,
    rec: &mut Record,
) -> Response {
    let Some(login) = login else {
        return if req.header("authorization").is_none() {
            gh_error(401, "Requires authentication")
        } else {
            gh_error(401, "Bad credentials")
        };
    };
    // Primary limit.
    let now = now_s();
    let entry = st
        .primary
        .entry(login.to_string())
        .or_insert((opts.hourly_limit, now + 3600));
    if entry.1 <= now {
        *entry = (opts.hourly_limit, now + 3600);
    }
    if entry.0 == 0 {
        rec.fault = Some("primary-exhausted".into());
        let reset = entry.1;
        return gh_error(
            403,
            &format!(
                "API rate limit exceeded for user ID 1. [rate limit reset at {}]",
                gh_time(reset)
            ),
        );
    }
    entry.0 -= 1;

    let mut commit_then: Option<Fault> = None;
    if let Some(f) = take_fault(st, req, path) {
        rec.fault = Some(f.kind.clone());
        match f.kind.as_str() {
            "secondary" => {
                let status = f.status.unwrap_or(403);
                let mut r = gh_error(
                    status,
                    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
                );
                if let Some(s) = f.retry_after {
                    r.headers.push(("retry-after".into(), s.to_string()));
                    st.windows.push((
                        login.into(),
                        Window {
                            from_ms: rec.t_ms,
                            until_ms: rec.t_ms + s as f64 * 1000.0,
                            why: "retry-after".into(),
                        },
                    ));
                } else {
                    // GitHub: without headers, wait at least one minute.
                    st.windows.push((
                        login.into(),
                        Window {
                            from_ms: rec.t_ms,
                            until_ms: rec.t_ms + 60_000.0,
                            why: "secondary".into(),
                        },
                    ));
                }
                return r;
            }
            "primary" => {
                let secs = f.retry_after.unwrap_or(2);
                let reset = now + secs;
                st.primary.insert(login.into(), (0, reset));
                st.windows.push((
                    login.into(),
                    Window {
                        from_ms: rec.t_ms,
                        until_ms: reset as f64 * 1000.0,
                        why: "primary".into(),
                    },
                ));
                // The headers added in `handle` report remaining 0 and the reset.
                return gh_error(403, "API rate limit exceeded for user ID 1.");
            }
            "drop" => {
                return Response {
                    status: 0,
                    headers: vec![],
                    body: vec![],
                    drop: true,
                };
            }
            "not_json" => {
                return Response {
                    status: 200,
                    headers: vec![("Content-Type".into(), "text/html".into())],
                    body:
                        b"<html><body>Unicorn! This page is taking too long to load.</body></html>"
                            .to_vec(),
                    drop: false,
                };
            }
            "status" if !f.commit && f.status == Some(422) => return too_long(),
            "status" if !f.commit => {
                return gh_error(
                    f.status.unwrap_or(502),
                    f.message.as_deref().unwrap_or("Server Error"),
                );
            }
            _ => commit_then = Some(f),
        }
    }
    let mut res = route(st, req, path, q, host, login, info);
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

fn route(
    st: &mut State,
    req: &Request,
    path: &str,
    q: &[(String, String)],
    host: &str,
    login: &str,
    info: Option<&TokenInfo>,
) -> Response {
    let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
    let m = req.method.as_str();
    let can_write = info.is_some_and(|i| i.write);
    let forbidden = || {
        let mut r = gh_error(403, "Resource not accessible by personal access token");
        r.headers.push((
            "x-accepted-github-permissions".into(),
            "issues=write; pull_requests=write".into(),
        ));
        r
    };
    match (m, seg.as_slice()) {
        ("GET", ["user"]) => resp(200, json!({ "login": login, "id": 1, "type": "User" })),
        ("GET", ["rate_limit"]) => {
            let (rem, reset) = st.primary.get(login).copied().unwrap_or((0, 0));
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
                gh_error(404, "Not Found")
            }
        }
        (_, ["repos", o, r, rest @ ..]) => {
            let full = format!("{o}/{r}");
            let Some(issues) = st.repos.get(&full) else {
                return gh_error(404, "Not Found");
            };
            match (m, rest) {
                ("POST", ["issues"]) => {
                    if !can_write {
                        return forbidden();
                    }
                    let title = serde_json::from_slice::<Value>(&req.body)
                        .ok()
                        .and_then(|v| v["title"].as_str().map(str::to_string));
                    let Some(title) = title else {
                        return gh_error(422, "Validation Failed");
                    };
                    let number = issues.keys().next_back().copied().unwrap_or(0) + 1;
                    if st
                        .commit(Op::Issue {
                            repo: full.clone(),
                            number,
                            title: title.clone(),
                        })
                        .is_err()
                    {
                        return gh_error(500, "journal write failed");
                    }
                    resp(201, json!({ "number": number, "title": title }))
                }
                ("GET", ["issues", n]) => match n
                    .parse::<u64>()
                    .ok()
                    .and_then(|n| issues.get(&n).map(|t| (n, t.clone())))
                {
                    Some((n, t)) => resp(200, json!({ "number": n, "title": t, "state": "open" })),
                    None => gh_error(404, "Not Found"),
                },
                (_, ["issues", n, "comments"]) => {
                    let Some(n) = n.parse::<u64>().ok().filter(|n| issues.contains_key(n)) else {
                        return gh_error(404, "Not Found");
                    };
                    if m == "GET" {
                        list(st, &full, n, path, q, host)
                    } else if m == "POST" {
                        if !can_write {
                            return forbidden();
                        }
                        create(st, &full, n, &req.body, login, host)
                    } else {
                        gh_error(404, "Not Found")
                    }
                }
                (_, ["issues", "comments", id]) => {
                    let Some(id) = id
                        .parse::<u64>()
                        .ok()
                        .filter(|id| st.comments.get(id).is_some_and(|c| c.repo == full))
                    else {
                        return gh_error(404, "Not Found");
                    };
                    match m {
                        "GET" => resp(200, comment_json(&st.comments[&id], host)),
                        "PATCH" | "DELETE" if !can_write => forbidden(),
                        "PATCH" => {
                            let body = match body_field(&req.body) {
                                Ok(b) => b,
                                Err(r) => return r,
                            };
                            if st
                                .commit(Op::Edit {
                                    id,
                                    body,
                                    at: now_s(),
                                })
                                .is_err()
                            {
                                return gh_error(500, "journal write failed");
                            }
                            resp(200, comment_json(&st.comments[&id], host))
                        }
                        "DELETE" => {
                            if st.commit(Op::Delete { id }).is_err() {
                                return gh_error(500, "journal write failed");
                            }
                            Response {
                                status: 204,
                                headers: vec![],
                                body: vec![],
                                drop: false,
                            }
                        }
                        _ => gh_error(404, "Not Found"),
                    }
                }
                _ => gh_error(404, "Not Found"),
            }
        }
        _ => gh_error(404, "Not Found"),
    }
}

fn body_field(body: &[u8]) -> std::result::Result<String, Response> {
    let v: Value =
        serde_json::from_slice(body).map_err(|_| gh_error(400, "Problems parsing JSON"))?;
    let Some(b) = v.get("body").and_then(|b| b.as_str()) else {
        return Err(resp(
            422,
            json!({ "message": "Invalid request.\n\n\"body\" wasn't supplied.", "documentation_url": DOCS, "status": "422" }),
        ));
    };
    if b.chars().count() > crate::github::MAX_COMMENT_CHARS {
        return Err(too_long());
    }
    Ok(b.to_string())
}

/// GitHub's answer to a comment over 65,536 characters.
fn too_long() -> Response {
    resp(
        422,
        json!({
            "message": "Validation Failed",
            "errors": [{ "resource": "IssueComment", "code": "custom", "field": "body", "message": "body is too long (maximum is 65536 characters)" }],
            "documentation_url": DOCS,
            "status": "422"
        }),
    )
}

fn create(
    st: &mut State,
    repo: &str,
    issue: u64,
    body: &[u8],
    login: &str,
    host: &str,
) -> Response {
    let body = match body_field(body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let now = now_s();
    let c = StoredComment {
        id: st.next_id,
        repo: repo.into(),
        issue,
        body,
        login: login.into(),
        association: "OWNER".into(),
        created: now,
        updated: now,
    };
    let id = c.id;
    if st.commit(Op::Comment { c }).is_err() {
        return gh_error(500, "journal write failed");
    }
    let mut r = resp(201, comment_json(&st.comments[&id], host));
    r.headers.push((
        "Location".into(),
        format!("http://{host}/repos/{repo}/issues/comments/{id}"),
    ));
    r
}

fn comment_json(c: &StoredComment, host: &str) -> Value {
    json!({
        "id": c.id,
        "node_id": format!("IC_{}", c.id),
        "url": format!("http://{host}/repos/{}/issues/comments/{}", c.repo, c.id),
        "html_url": format!("http://{host}/{}/issues/{}#issuecomment-{}", c.repo, c.issue, c.id),
        "issue_url": format!("http://{host}/repos/{}/issues/{}", c.repo, c.issue),
        "body": c.body,
        "user": { "login": c.login, "id": 1, "type": "User" },
        "created_at": gh_time(c.created),
        "updated_at": gh_time(c.updated),
        "author_association": c.association,
    })
}

fn list(
    st: &State,
    repo: &str,
    issue: u64,
    path: &str,
    q: &[(String, String)],
    host: &str,
) -> Response {
    let per_page = param(q, "per_page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page = param(q, "page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let since = param(q, "since")
        .and_then(crate::time::parse_rfc3339)
        .map(|d| d.as_secs());
    let all: Vec<&StoredComment> = st
        .comments
        .values()
        .filter(|c| c.repo == repo && c.issue == issue && since.is_none_or(|s| c.updated >= s))
        .collect();
    let last = all.len().div_ceil(per_page).max(1);
    let items: Vec<Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|c| comment_json(c, host))
        .collect();
    let mut r = resp(200, Value::Array(items));
    let link_for = |p: usize| {
        let mut qs: Vec<String> = q
            .iter()
            .filter(|(k, _)| k != "page")
            .map(|(k, v)| format!("{k}={}", v.replace(':', "%3A")))
            .collect();
        qs.push(format!("page={p}"));
        format!("<http://{host}{path}?{}>", qs.join("&"))
    };
    let mut links = Vec::new();
    if page < last {
        links.push(format!("{}; rel=\"next\"", link_for(page + 1)));
        links.push(format!("{}; rel=\"last\"", link_for(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", link_for(page - 1)));
        links.push(format!("{}; rel=\"first\"", link_for(1)));
    }
    if !links.is_empty() {
        r.headers.push(("Link".into(), links.join(", ")));
    }
    r
}

#[derive(Deserialize)]
struct TokenReq {
    token: String,
    #[serde(default)]
    login: Option<String>,
    #[serde(default = "yes")]
    write: bool,
    #[serde(default)]
    revoke: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct HumanComment {
    repo: String,
    issue: u64,
    body: String,
    login: String,
    #[serde(default = "owner")]
    association: String,
}

fn owner() -> String {
    "OWNER".into()
}

fn control(st: &mut State, req: &Request, ctl: &str) -> Response {
    let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let io_fail = |_| gh_error(500, "journal write failed");
    match (req.method.as_str(), ctl) {
        ("POST", "repos") => {
            let (Some(repo), n) = (v["repo"].as_str(), v["issues"].as_u64().unwrap_or(1)) else {
                return gh_error(422, "repo missing");
            };
            match control_repo(st, repo, n) {
                Ok(()) => resp(201, json!({ "repo": repo, "issues": n })),
                Err(e) => io_fail(e),
            }
        }
        ("POST", "tokens") => {
            let Ok(t) = serde_json::from_value::<TokenReq>(v) else {
                return gh_error(422, "want {token, login, write, revoke}");
            };
            let sha = sha256_hex(t.token.as_bytes());
            let mut info = st.tokens.get(&sha).cloned().unwrap_or(TokenInfo {
                login: String::new(),
                write: t.write,
                revoked: false,
            });
            if let Some(l) = t.login {
                info.login = l;
            }
            info.write = t.write;
            info.revoked = t.revoke;
            if info.login.is_empty() {
                return gh_error(422, "login missing");
            }
            match st.commit(Op::Token { sha, info }) {
                Ok(()) => resp(201, json!({ "ok": true })),
                Err(e) => io_fail(e),
            }
        }
        ("POST", "comments") => {
            let Ok(h) = serde_json::from_value::<HumanComment>(v) else {
                return gh_error(422, "want {repo, issue, body, login}");
            };
            if !st
                .repos
                .get(&h.repo)
                .is_some_and(|i| i.contains_key(&h.issue))
            {
                return gh_error(404, "Not Found");
            }
            let now = now_s();
            let c = StoredComment {
                id: st.next_id,
                repo: h.repo,
                issue: h.issue,
                body: h.body,
                login: h.login,
                association: h.association,
                created: now,
                updated: now,
            };
            let id = c.id;
            match st.commit(Op::Comment { c }) {
                Ok(()) => resp(201, json!({ "id": id })),
                Err(e) => io_fail(e),
            }
        }
        ("GET", c) if c.starts_with("comments") => {
            let (_, q) = query(&req.target);
            let repo = param(&q, "repo").unwrap_or("");
            let issue = param(&q, "issue")
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            let items: Vec<Value> = st
                .comments
                .values()
                .filter(|c| c.repo == repo && c.issue == issue)
                .map(|c| json!({ "id": c.id, "body": c.body, "login": c.login }))
                .collect();
            resp(200, Value::Array(items))
        }
        ("POST", "faults") => match serde_json::from_value::<Vec<Fault>>(v["faults"].clone()) {
            Ok(fs) => {
                st.faults.extend(fs.into_iter().map(|f| (f, 0, 0)));
                resp(201, json!({ "faults": st.faults.len() }))
            }
            Err(e) => gh_error(422, &format!("bad faults: {e}")),
        },
        ("DELETE", "faults") => {
            st.faults.clear();
            resp(200, json!({ "faults": 0 }))
        }
        ("GET", "requests") => {
            let windows: Vec<&Window> = st.windows.iter().map(|(_, w)| w).collect();
            resp(200, json!({ "requests": st.records, "windows": windows }))
        }
        ("DELETE", "requests") => {
            st.records.clear();
            st.windows.clear();
            resp(200, json!({}))
        }
        _ => gh_error(404, "Not Found"),
    }
}

/// The directory a server keeps its journal in.
pub fn journal_path(dir: &Path) -> PathBuf {
    dir.join("journal.jsonl")
}
