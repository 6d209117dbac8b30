//! A small client for GitHub's REST API: the issue-comment endpoints lw-sync
//! needs, spoken exactly as GitHub documents them.
//!
//! Design:
//! - Requests go one at a time (GitHub: "make requests for a single user or
//!   client ID serially").  The client is `&mut self` throughout, so two
//!   requests can never overlap.
//! - Pacing is the client's job, not the caller's: content-creating requests
//!   are at least `min_write_interval` (1 s) apart, fewer than 80 a minute and
//!   500 an hour.  The write times live in a [`Budget`] that the caller
//!   persists, so the limits hold across `--once` runs started by cron and
//!   across crashes.  The write time is handed to the caller *before* the
//!   request is sent (see [`Client::post_comment`]) so that a process killed
//!   mid-request still has it on disk.
//! - A blocked window (primary limit exhausted, `retry-after`, secondary
//!   limit) is recorded in the budget too: no request of any kind is sent
//!   before it ends.  Waits up to `max_wait` happen in place; a longer one is
//!   a temporary failure (exit 75) and the next run honours the same window.
//! - A POST whose outcome is unknown (connection dropped, timeout, 5xx) is
//!   never retried here: it may have created the comment.  It is reported as
//!   [`Posted::Unknown`] and the caller reconciles by listing comments.
//! - The token is a [`Token`], whose `Debug` does not show it; it is only
//!   ever written into the `Authorization` header.  A pagination link that
//!   points anywhere but the configured API base is refused, so the token is
//!   never sent to another host.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Exit, Result};

/// GitHub's documented limit on a comment body, in characters.
pub const MAX_COMMENT_CHARS: usize = 65_536;
pub const DEFAULT_API: &str = "https://api.github.com";
/// The testing knob: lowers the spacing between writes (and scales the
/// minute and hour windows by the same factor).  Documented in lw-sync(1).
pub const INTERVAL_ENV: &str = "LW_SYNC_MIN_WRITE_INTERVAL_MS";

/// An API token.  Never printed: `Debug` shows `Token(..)`.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    pub fn new(s: impl Into<String>) -> Token {
        Token(s.into())
    }

    /// `GH_TOKEN`, else `GITHUB_TOKEN`, else the first line of `file`.
    pub fn load(file: Option<&Path>) -> Result<Token> {
        for var in ["GH_TOKEN", "GITHUB_TOKEN"] {
            if let Ok(v) = std::env::var(var) {
                let v = v.trim();
                if !v.is_empty() {
                    return Token::checked(v, var);
                }
            }
        }
        let Some(file) = file else {
            return Err(Error::config(
                "no GitHub token: set GH_TOKEN or GITHUB_TOKEN, or name a token file with --token-file or \"token_file\" in .loopwright/sync.json",
            ));
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::io_as(Exit::Config, "cannot read token file", file, e))?;
        let line = text.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            return Err(Error::config(format!(
                "token file '{}' is empty",
                file.display()
            )));
        }
        Token::checked(line, &format!("token file '{}'", file.display()))
    }

    fn checked(v: &str, from: &str) -> Result<Token> {
        // The value goes into a header: refuse anything that could split it.
        if v.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(Error::config(format!(
                "the token in {from} contains spaces or control characters"
            )));
        }
        Ok(Token(v.to_string()))
    }

    fn header(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// The value, for masking it in text that leaves (lib/redact.rs) only.
    pub fn value_for_masking(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Pacing limits (GitHub, "Best practices for using the REST API" and
/// "Rate limits for the REST API": secondary limits).
#[derive(Clone, Debug)]
pub struct Limits {
    pub min_write_interval: Duration,
    /// Content-creating requests allowed per `minute` (GitHub: no more than 80).
    pub per_minute: usize,
    /// ... and per `hour` (GitHub: no more than 500).
    pub per_hour: usize,
    pub minute: Duration,
    pub hour: Duration,
    /// The longest wait done in place; a longer one fails with exit 75.
    pub max_wait: Duration,
    /// Attempts for a read that meets 5xx or a dropped connection.
    pub read_attempts: u32,
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait for any read of an answer (its headers, each part of
    /// its body); an exchange as a whole gets connect + 2 x read.
    pub read_timeout: Duration,
    /// Attempts for a read that timed out (each costs a read timeout).
    pub timeout_attempts: u32,
}

/// Default connect timeout (lw-sync(1), --connect-timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default read timeout (lw-sync(1), --read-timeout).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Time as the rate-limit logic sees it, so that its tests need not sleep.
pub trait Clock {
    /// Milliseconds since the epoch.
    fn now_ms(&self) -> u64;
    fn sleep(&self, d: Duration);
}

/// The real clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        crate::time::now_ms()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// Called with the budget whenever it holds a blocked window that is not
/// yet on disk, before any wait: the caller writes it durably, so that a run
/// killed while waiting leaves the window to the next run.
pub type Persist = Box<dyn FnMut(&Budget) -> Result<()>>;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            min_write_interval: Duration::from_secs(1),
            per_minute: 79,
            per_hour: 499,
            minute: Duration::from_secs(60),
            hour: Duration::from_secs(3600),
            max_wait: Duration::from_secs(300),
            read_attempts: 4,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            timeout_attempts: 2,
        }
    }
}

impl Limits {
    /// The defaults, with the testing knob applied when set.
    pub fn from_env() -> Result<Limits> {
        let mut l = Limits::default();
        if let Ok(v) = std::env::var(INTERVAL_ENV) {
            let ms: u64 = v.trim().parse().map_err(|_| {
                Error::config(format!(
                    "{INTERVAL_ENV}='{}' is not a number of milliseconds",
                    v.escape_debug()
                ))
            })?;
            l.scale(ms);
        }
        Ok(l)
    }

    /// Testing only: writes `ms` apart, windows scaled by `ms / 1000`, so the
    /// counts per window stay GitHub's while the test runs faster.
    pub fn scale(&mut self, ms: u64) {
        let f = ms as f64 / 1000.0;
        self.min_write_interval = Duration::from_millis(ms);
        self.minute = Duration::from_secs_f64(60.0 * f);
        self.hour = Duration::from_secs_f64(3600.0 * f);
    }

    /// The base of backoffs (secondary limit without headers, 5xx on reads):
    /// one second, scaled like the windows.
    fn unit(&self) -> Duration {
        self.minute / 60
    }
}

/// What must survive between runs for the limits to hold: recent write times
/// and the end of any blocked window (milliseconds since the epoch).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Budget {
    #[serde(default)]
    pub writes: Vec<u64>,
    #[serde(default)]
    pub blocked_until: u64,
    /// Consecutive secondary-limit answers without a `retry-after`.
    #[serde(default)]
    pub strikes: u32,
}

/// One issue comment as GitHub returns it (the fields lw-sync reads).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Comment {
    pub id: u64,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub updated_at: String,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub author_association: String,
}

impl Comment {
    pub fn login(&self) -> &str {
        self.user.as_ref().map(|u| u.login.as_str()).unwrap_or("")
    }
    pub fn text(&self) -> &str {
        self.body.as_deref().unwrap_or("")
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct User {
    pub login: String,
}

/// Where comments go: `owner/name` and an issue or pull-request number (pull
/// requests take their conversation comments through the issues endpoints).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub repo: String,
    pub issue: u64,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.repo, self.issue)
    }
}

impl Target {
    pub fn parse_repo(repo: &str) -> Result<()> {
        let ok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        match repo.split_once('/') {
            Some((o, n)) if ok(o) && ok(n) && n != "." && n != ".." => Ok(()),
            _ => Err(Error::config(format!(
                "repository '{}' is not of the form OWNER/NAME",
                repo.escape_debug()
            ))),
        }
    }
}

/// The outcome of creating a comment.
#[derive(Debug)]
pub enum Posted {
    Created(Comment),
    /// The request may or may not have created the comment.
    Unknown(String),
}

/// A finished exchange.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct Client {
    agent: ureq::Agent,
    base: String,
    token: Token,
    pub limits: Limits,
    pub budget: Budget,
    /// Requests sent by this client (for the figures the commands print).
    pub requests: u64,
    pub writes: u64,
    pub clock: Box<dyn Clock>,
    /// Writes the budget durably before a wait (see [`Persist`]).
    pub persist: Option<Persist>,
    /// The blocked window last handed to `persist`.
    persisted_until: u64,
    /// The run's time budget ends here (ms since the epoch): no request is
    /// sent and no wait begins that would end after it.
    pub deadline: Option<u64>,
}

/// Why an exchange failed before an answer came.
#[derive(Debug)]
enum Transport {
    /// Nothing listens, or the host does not resolve: nothing was sent.
    Unreachable(String),
    /// No answer in time; a write may have been done.
    TimedOut(String),
    /// Anything else (a dropped connection).
    Other(String),
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Unreachable(m) | Transport::TimedOut(m) | Transport::Other(m) => {
                f.write_str(m)
            }
        }
    }
}

fn transport(e: ureq::Error) -> Transport {
    let refused = |k: std::io::ErrorKind| {
        matches!(
            k,
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
        )
    };
    match &e {
        ureq::Error::Timeout(_) => Transport::TimedOut(e.to_string()),
        ureq::Error::HostNotFound | ureq::Error::ConnectionFailed => {
            Transport::Unreachable(e.to_string())
        }
        ureq::Error::Io(io) if refused(io.kind()) => Transport::Unreachable(e.to_string()),
        ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            Transport::TimedOut(e.to_string())
        }
        _ => Transport::Other(e.to_string()),
    }
}

/// Called with the time a write is about to be sent; the caller persists it
/// (and its intent) before the request leaves.
pub type BeforeSend<'a> = &'a mut dyn FnMut(&Budget) -> Result<()>;

impl Client {
    pub fn new(base: &str, token: Token, limits: Limits, budget: Budget) -> Result<Client> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(Error::config(format!(
                "API URL '{}' must start with https:// or http://",
                base.escape_debug()
            )));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(limits.connect_timeout))
            .timeout_per_read(Some(limits.read_timeout))
            .timeout_per_call(Some(limits.connect_timeout + 2 * limits.read_timeout))
            .user_agent(concat!("loopwright-lw-sync/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client {
            agent,
            base,
            token,
            limits,
            budget,
            requests: 0,
            writes: 0,
            clock: Box::new(SystemClock),
            persist: None,
            persisted_until: 0,
            deadline: None,
        })
    }

    /// Hands a blocked window that is not on disk yet to `persist`.
    fn persist_window(&mut self) -> Result<()> {
        if self.budget.blocked_until > self.persisted_until
            && let Some(p) = self.persist.as_mut()
        {
            p(&self.budget)?;
            self.persisted_until = self.budget.blocked_until;
        }
        Ok(())
    }

    /// Fails when the run's time budget would be spent before `wait` ends.
    fn check_deadline(&self, wait: Duration) -> Result<()> {
        if let Some(d) = self.deadline
            && self.clock.now_ms() + wait.as_millis() as u64 >= d
        {
            return Err(Error::new(
                Exit::TempFail,
                "the run's time limit (--time-limit) is spent; the next run goes on from here",
            ));
        }
        Ok(())
    }

    /// Sleeps on the client's clock, within the run's time budget.
    fn pause(&mut self, wait: Duration) -> Result<()> {
        self.check_deadline(wait)?;
        self.clock.sleep(wait);
        Ok(())
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn comments_url(&self, t: &Target) -> String {
        format!("{}/repos/{}/issues/{}/comments", self.base, t.repo, t.issue)
    }

    /// Waits out a blocked window (or fails when it is longer than `max_wait`).
    fn wait_blocked(&mut self) -> Result<()> {
        let now = self.clock.now_ms();
        if self.budget.blocked_until > now {
            // Durable before any wait: a run killed while waiting leaves the
            // rest of the window to the next run.
            self.persist_window()?;
            let wait = Duration::from_millis(self.budget.blocked_until - now);
            if wait > self.limits.max_wait {
                return Err(Error::new(
                    Exit::TempFail,
                    format!(
                        "GitHub asked to wait until {} ({}s from now); try again later",
                        crate::time::rfc3339(Duration::from_millis(self.budget.blocked_until)),
                        wait.as_secs()
                    ),
                ));
            }
            self.pause(wait)?;
        }
        Ok(())
    }

    /// Waits until one more write keeps every pacing limit.
    fn wait_write_slot(&mut self) -> Result<()> {
        loop {
            self.wait_blocked()?;
            let now = self.clock.now_ms();
            let hour = self.limits.hour.as_millis() as u64;
            self.budget.writes.retain(|&w| w + hour > now);
            let earliest = next_write_at(&self.limits, &self.budget.writes, now);
            if earliest <= now {
                return Ok(());
            }
            let wait = Duration::from_millis(earliest - now);
            if wait > self.limits.max_wait {
                return Err(Error::new(
                    Exit::TempFail,
                    format!(
                        "the content-creation budget is spent until {}; try again later",
                        crate::time::rfc3339(Duration::from_millis(earliest))
                    ),
                ));
            }
            self.pause(wait)?;
        }
    }

    /// Sends one request, after any blocked window.  `Err` only for failures
    /// that happen before anything is known about the outcome; the caller
    /// decides what a transport error means for its method.
    fn exchange(
        &mut self,
        method: &str,
        url: &str,
        body: Option<&serde_json::Value>,
    ) -> std::result::Result<Reply, Transport> {
        self.requests += 1;
        let auth = self.token.header();
        let res = match (method, body) {
            ("GET", _) => self
                .agent
                .get(url)
                .header("Authorization", &auth)
                .header("Accept", "application/vnd.github+json")
                .header("X-GitHub-Api-Version", "2022-11-28")
                .call(),
            (_, Some(b)) => {
                let req = if method == "PATCH" {
                    self.agent.patch(url)
                } else {
                    self.agent.post(url)
                };
                req.header("Authorization", &auth)
                    .header("Accept", "application/vnd.github+json")
                    .header("X-GitHub-Api-Version", "2022-11-28")
                    .send_json(b)
            }
            _ => unreachable!("every write carries a JSON body"),
        };
        drop(auth);
        let mut resp = res.map_err(transport)?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_vec()
            .map_err(transport)?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// Reads the rate-limit headers of any answer.
    fn note_headers(&mut self, r: &Reply) {
        let remaining = r
            .header("x-ratelimit-remaining")
            .and_then(|v| v.trim().parse::<u64>().ok());
        let reset = r
            .header("x-ratelimit-reset")
            .and_then(|v| v.trim().parse::<u64>().ok());
        // One second of slack for clock skew, as GitHub's examples do.
        if remaining == Some(0)
            && let Some(reset) = reset
        {
            self.budget.blocked_until = self.budget.blocked_until.max(reset * 1000 + 1000);
        }
    }

    /// For 403/429: is this a rate limit, and how long to wait?  GitHub:
    /// retry-after first; else remaining=0 until reset; else a secondary
    /// limit, at least one minute, growing exponentially.
    fn rate_limited(&mut self, r: &Reply) -> Option<u64> {
        if r.status != 403 && r.status != 429 {
            return None;
        }
        let now = self.clock.now_ms();
        if let Some(s) = r
            .header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            self.budget.strikes = 0;
            return Some(now + s * 1000);
        }
        if r.header("x-ratelimit-remaining").map(str::trim) == Some("0")
            && let Some(reset) = r
                .header("x-ratelimit-reset")
                .and_then(|v| v.trim().parse::<u64>().ok())
        {
            return Some((reset * 1000 + 1000).max(now));
        }
        let text = String::from_utf8_lossy(&r.body).to_ascii_lowercase();
        if r.status == 429 || text.contains("rate limit") {
            let unit = self.limits.unit().as_millis() as u64;
            let wait = 60 * unit * (1u64 << self.budget.strikes.min(6));
            self.budget.strikes += 1;
            return Some(now + wait);
        }
        None
    }

    fn error_for(&self, r: &Reply, what: &str, perm: &str) -> Error {
        let with = if perm.is_empty() {
            String::new()
        } else {
            format!(" with {perm}")
        };
        let msg = serde_json::from_slice::<serde_json::Value>(&r.body)
            .ok()
            .and_then(|v| {
                v.get("message")
                    .and_then(|m| m.as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "no message".into());
        let accepted = r
            .header("x-accepted-github-permissions")
            .map(|v| format!(" (GitHub accepts: {v})"))
            .unwrap_or_default();
        match r.status {
            401 => Error::new(
                Exit::NoPerm,
                format!(
                    "GitHub rejected the token (401 {msg}) when asked for {what}: it is missing, expired or revoked; set GH_TOKEN to a valid token{with}"
                ),
            ),
            403 => Error::new(
                Exit::NoPerm,
                format!(
                    "GitHub refused {what} (403 {msg}): the token lacks a permission{with}{accepted}"
                ),
            ),
            404 => Error::new(
                Exit::Config,
                format!(
                    "GitHub answered 404 ({msg}) for {what}: the repository or issue does not exist, or the token cannot see it (it needs {perm})"
                ),
            ),
            410 => Error::new(
                Exit::Config,
                format!("{what} is gone (410 {msg}): issues may be disabled on the repository"),
            ),
            422 => Error::new(
                Exit::DataErr,
                format!(
                    "GitHub did not accept {what} (422 {msg}){}",
                    validation_detail(&r.body)
                ),
            ),
            s => Error::new(
                Exit::Unavailable,
                format!("GitHub answered {s} to {what}: {msg}"),
            ),
        }
    }

    /// Notes an answer's rate-limit headers; when the answer is a rate
    /// limit, records the blocked window and counts it (too many in a row is
    /// an error) and returns true: the request did nothing and may be sent
    /// again once the window has passed.
    fn was_rate_limited(&mut self, r: &Reply, limited: &mut u32, what: &str) -> Result<bool> {
        self.note_headers(r);
        let Some(until) = self.rate_limited(r) else {
            return Ok(false);
        };
        self.budget.blocked_until = self.budget.blocked_until.max(until);
        self.persist_window()?;
        *limited += 1;
        if *limited > MAX_RATE_LIMITED {
            return Err(rate_limited_too_often(what));
        }
        Ok(true)
    }

    /// A GET with retries for transient failures; the parsed JSON and the
    /// answer's `Link` header.
    fn get_json(
        &mut self,
        url: &str,
        what: &str,
        perm: &str,
    ) -> Result<(serde_json::Value, Option<String>)> {
        let mut attempt = 0;
        let mut limited = 0;
        let mut timeouts = 0;
        loop {
            attempt += 1;
            self.wait_blocked()?;
            self.check_deadline(Duration::ZERO)?;
            let transient = match self.exchange("GET", url, None) {
                Err(Transport::Unreachable(e)) => return Err(unreachable(&self.base, what, &e)),
                Err(Transport::TimedOut(e)) => {
                    timeouts += 1;
                    if timeouts >= self.limits.timeout_attempts {
                        return Err(Error::new(
                            Exit::TempFail,
                            format!(
                                "{what}: no answer from '{}' within the read timeout ({e}); gave up after {timeouts} attempts",
                                self.base
                            ),
                        ));
                    }
                    format!("no answer in time: {e}")
                }
                Err(Transport::Other(e)) => format!("the connection failed: {e}"),
                Ok(r) => {
                    if self.was_rate_limited(&r, &mut limited, what)? {
                        attempt -= 1;
                        continue;
                    }
                    if r.status >= 500 {
                        format!("GitHub answered {}", r.status)
                    } else if r.status != 200 {
                        return Err(self.error_for(&r, what, perm));
                    } else {
                        self.budget.strikes = 0;
                        let v = serde_json::from_slice(&r.body).map_err(|e| {
                            Error::new(Exit::Unavailable, format!("GitHub's answer to {what} is not JSON ({e}); is the API URL '{}' right?", self.base))
                        })?;
                        return Ok((v, r.header("link").map(str::to_string)));
                    }
                }
            };
            if attempt >= self.limits.read_attempts {
                return Err(Error::new(
                    Exit::TempFail,
                    format!("{what}: {transient}; gave up after {attempt} attempts"),
                ));
            }
            let backoff = self.limits.unit() * (1 << attempt);
            self.pause(backoff)?;
        }
    }

    /// The token's user (`GET /user`): checks the token and names whose
    /// comments are lw-sync's own.  None when the token may not read it
    /// (GitHub App installation tokens).
    pub fn user(&mut self) -> Result<Option<String>> {
        let url = format!("{}/user", self.base);
        match self.get_json(&url, "the token's user", "") {
            Ok((v, _)) => Ok(v.get("login").and_then(|l| l.as_str()).map(str::to_string)),
            Err(e) if e.exit == Exit::NoPerm && e.msg.contains("403") => Ok(None),
            Err(e) if e.exit == Exit::Config && e.msg.contains("404") => {
                Err(Error::config(format!(
                    "GitHub answered 404 for the token's user (GET {url}): the API URL '{}' does not look like GitHub's REST API; check --api-url or \"api_url\"",
                    self.base
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Every comment of an issue, following `Link: rel="next"` to the last
    /// page.  `since` (RFC 3339) limits the list to comments updated since.
    pub fn list_comments(&mut self, t: &Target, since: Option<&str>) -> Result<Vec<Comment>> {
        let mut url = format!("{}?per_page=100", self.comments_url(t));
        if let Some(s) = since {
            url.push_str("&since=");
            url.push_str(&s.replace(':', "%3A"));
        }
        let what = format!("the comments of {t}");
        let mut all = Vec::new();
        let mut pages = 0;
        loop {
            pages += 1;
            let (v, link) = self.get_json(
                &url,
                &what,
                "issues: read (pull requests: read for a pull request)",
            )?;
            let page: Vec<Comment> = serde_json::from_value(v).map_err(|e| {
                Error::new(
                    Exit::Unavailable,
                    format!("GitHub's list of {what} is not a list of comments: {e}"),
                )
            })?;
            all.extend(page);
            match link.as_deref().and_then(next_link) {
                Some(next) => {
                    if !next.starts_with(&format!("{}/", self.base)) {
                        return Err(Error::new(
                            Exit::Unavailable,
                            format!(
                                "GitHub's next-page link for {what} leaves the API URL '{}'; refusing to send the token there",
                                self.base
                            ),
                        ));
                    }
                    if pages > 100_000 {
                        return Err(Error::new(
                            Exit::Unavailable,
                            format!("the pages of {what} never end"),
                        ));
                    }
                    url = next;
                }
                None => return Ok(all),
            }
        }
    }

    /// Creates a comment.  `before_send` runs after pacing, with the write
    /// already counted in the budget, right before the request leaves.
    pub fn post_comment(
        &mut self,
        t: &Target,
        body: &str,
        before_send: BeforeSend<'_>,
    ) -> Result<Posted> {
        let url = self.comments_url(t);
        let payload = serde_json::json!({ "body": body });
        self.write(
            &url,
            "POST",
            &payload,
            &format!("a comment on {t}"),
            before_send,
        )
    }

    /// Edits a comment (`PATCH /repos/{owner}/{repo}/issues/comments/{id}`).
    pub fn edit_comment(
        &mut self,
        repo: &str,
        id: u64,
        body: &str,
        before_send: BeforeSend<'_>,
    ) -> Result<Posted> {
        let url = format!("{}/repos/{repo}/issues/comments/{id}", self.base);
        let payload = serde_json::json!({ "body": body });
        self.write(
            &url,
            "PATCH",
            &payload,
            &format!("comment {id} of {repo}"),
            before_send,
        )
    }

    fn write(
        &mut self,
        url: &str,
        method: &str,
        payload: &serde_json::Value,
        what: &str,
        before_send: BeforeSend<'_>,
    ) -> Result<Posted> {
        let perm = "issues: write (pull requests: write for a pull request)";
        let mut limited = 0;
        loop {
            self.wait_write_slot()?;
            self.check_deadline(Duration::ZERO)?;
            // Persisted before sending, a little ahead of the real send time, so
            // that a run killed mid-request still spaces its successor; replaced
            // by the time the answer came once it comes.
            // (A quarter of the spacing: 250 ms at GitHub's 1 s.)
            self.budget
                .writes
                .push(self.clock.now_ms() + self.limits.min_write_interval.as_millis() as u64 / 4);
            before_send(&self.budget)?;
            self.writes += 1;
            let sent = self.exchange(method, url, Some(payload));
            if let Some(last) = self.budget.writes.last_mut() {
                *last = self.clock.now_ms();
            }
            let r = match sent {
                // Nothing listened: nothing can have been created.
                Err(Transport::Unreachable(e)) => return Err(unreachable(&self.base, what, &e)),
                Err(Transport::TimedOut(e)) => {
                    return Ok(Posted::Unknown(format!("no answer in time: {e}")));
                }
                Err(Transport::Other(e)) => {
                    return Ok(Posted::Unknown(format!("the connection failed: {e}")));
                }
                Ok(r) => r,
            };
            // A rate-limited request did nothing; it is safe to send again.
            if self.was_rate_limited(&r, &mut limited, what)? {
                continue;
            }
            if r.status >= 500 {
                return Ok(Posted::Unknown(format!("GitHub answered {}", r.status)));
            }
            if r.status != 200 && r.status != 201 {
                return Err(self.error_for(&r, what, perm));
            }
            self.budget.strikes = 0;
            return Ok(match serde_json::from_slice::<Comment>(&r.body) {
                Ok(c) => Posted::Created(c),
                Err(e) => Posted::Unknown(format!(
                    "GitHub answered {} with a body that is not a comment ({e})",
                    r.status
                )),
            });
        }
    }
}

/// The earliest time (ms) the next write keeps the spacing and the minute
/// and hour counts, given the recent write times in order.
pub fn next_write_at(l: &Limits, writes: &[u64], now: u64) -> u64 {
    let (minute, hour) = (l.minute.as_millis() as u64, l.hour.as_millis() as u64);
    let mut earliest = 0u64;
    if let Some(&last) = writes.last() {
        earliest = last + l.min_write_interval.as_millis() as u64;
    }
    let in_minute: Vec<u64> = writes
        .iter()
        .copied()
        .filter(|&w| w + minute > now)
        .collect();
    if in_minute.len() >= l.per_minute {
        earliest = earliest.max(in_minute[in_minute.len() - l.per_minute] + minute);
    }
    let in_hour: Vec<u64> = writes.iter().copied().filter(|&w| w + hour > now).collect();
    if in_hour.len() >= l.per_hour {
        earliest = earliest.max(in_hour[in_hour.len() - l.per_hour] + hour);
    }
    earliest
}

/// The error for an API URL nothing answers at: unavailable (69), not a
/// temporary failure, since trying again soon changes nothing by itself.
fn unreachable(base: &str, what: &str, e: &str) -> Error {
    Error::new(
        Exit::Unavailable,
        format!(
            "cannot connect to '{base}' for {what} ({e}): nothing answers there; check the API URL and the network"
        ),
    )
}

/// Rate-limit answers to one request before giving up (GitHub: "throw an
/// error after a specific number of retries").
const MAX_RATE_LIMITED: u32 = 8;

fn rate_limited_too_often(what: &str) -> Error {
    Error::new(
        Exit::TempFail,
        format!("GitHub rate-limited {what} {MAX_RATE_LIMITED} times in a row; try again later"),
    )
}

/// The URL of `rel="next"` in a `Link` header.
pub fn next_link(link: &str) -> Option<String> {
    for part in link.split(',') {
        let mut bits = part.split(';');
        let url = bits.next()?.trim();
        if bits.any(|b| matches!(b.trim(), "rel=\"next\"" | "rel=next")) {
            return Some(
                url.trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string(),
            );
        }
    }
    None
}

fn validation_detail(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let Some(errs) = v.get("errors").and_then(|e| e.as_array()) else {
        return String::new();
    };
    let parts: Vec<String> = errs
        .iter()
        .filter_map(|e| {
            e.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
}

/// The default token file: `$XDG_CONFIG_HOME/loopwright/token`.
pub fn default_token_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let p = base.join("loopwright").join("token");
    p.is_file().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_next_link() {
        let h = r#"<https://api.github.com/repositories/1/issues/7/comments?page=2>; rel="next", <https://api.github.com/repositories/1/issues/7/comments?page=9>; rel="last""#;
        assert_eq!(
            next_link(h).as_deref(),
            Some("https://api.github.com/repositories/1/issues/7/comments?page=2")
        );
        let last = r#"<https://x/a?page=1>; rel="prev", <https://x/a?page=1>; rel="first""#;
        assert_eq!(next_link(last), None);
    }

    #[test]
    fn pacing_keeps_spacing_and_the_minute_and_hour_counts() {
        let l = Limits::default();
        let now = 10_000_000u64;
        assert_eq!(next_write_at(&l, &[], now), 0);
        assert_eq!(
            next_write_at(&l, &[now - 300], now),
            now + 700,
            "1 s after the last write"
        );
        // 499 writes in the last hour, 2 s apart: the 500th waits for the oldest to age out.
        let hour: Vec<u64> = (0..499).map(|i| now - 998_000 + i * 2000).collect();
        assert_eq!(next_write_at(&l, &hour, now), hour[0] + 3_600_000);
        // 498 leave room: only the spacing applies.
        assert_eq!(next_write_at(&l, &hour[1..], now), hour[498] + 1000);
        // 79 writes in the last minute (only reachable with a shorter spacing).
        let mut fast = l.clone();
        fast.min_write_interval = Duration::from_millis(100);
        let minute: Vec<u64> = (0..79).map(|i| now - 7_900 + i * 100).collect();
        assert_eq!(next_write_at(&fast, &minute, now), minute[0] + 60_000);
    }

    #[test]
    fn token_debug_hides_the_value() {
        let t = Token::new("ghp_secretsecret");
        assert_eq!(format!("{t:?}"), "Token(..)");
    }

    #[test]
    fn scaled_limits_keep_the_counts() {
        let mut l = Limits::default();
        l.scale(10);
        assert_eq!(l.min_write_interval, Duration::from_millis(10));
        assert_eq!(l.minute, Duration::from_millis(600));
        assert_eq!(l.per_minute, 79);
    }

    /// A clock that moves only when slept on, and notes each sleep.
    struct FakeClock {
        now: std::rc::Rc<std::cell::Cell<u64>>,
        log: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
    }

    impl Clock for FakeClock {
        fn now_ms(&self) -> u64 {
            self.now.get()
        }
        fn sleep(&self, d: Duration) {
            self.log
                .borrow_mut()
                .push(format!("sleep {}", d.as_millis()));
            self.now.set(self.now.get() + d.as_millis() as u64);
        }
    }

    type Shared<T> = std::rc::Rc<std::cell::RefCell<T>>;

    fn fake_client(
        now: u64,
    ) -> (
        Client,
        Shared<Vec<String>>,
        std::rc::Rc<std::cell::Cell<u64>>,
    ) {
        let log: Shared<Vec<String>> = Default::default();
        let clock = std::rc::Rc::new(std::cell::Cell::new(now));
        let mut c = Client::new(
            "http://127.0.0.1:9",
            Token::new("t"),
            Limits::default(),
            Budget::default(),
        )
        .unwrap();
        c.clock = Box::new(FakeClock {
            now: clock.clone(),
            log: log.clone(),
        });
        let l = log.clone();
        c.persist = Some(Box::new(move |b: &Budget| {
            l.borrow_mut()
                .push(format!("persist until {}", b.blocked_until));
            Ok(())
        }));
        (c, log, clock)
    }

    #[test]
    fn a_blocked_window_is_persisted_before_the_wait_and_only_once() {
        let (mut c, log, clock) = fake_client(1_000_000);
        c.budget.blocked_until = 1_030_000;
        c.wait_blocked().unwrap();
        assert_eq!(
            *log.borrow(),
            ["persist until 1030000", "sleep 30000"],
            "durable first, then the wait"
        );
        assert_eq!(clock.get(), 1_030_000);
        // Already on disk: a second wait on the same window writes nothing.
        c.budget.blocked_until = 1_040_000;
        c.persisted_until = 1_040_000;
        log.borrow_mut().clear();
        c.wait_blocked().unwrap();
        assert_eq!(*log.borrow(), ["sleep 10000"]);
    }

    #[test]
    fn a_window_longer_than_max_wait_is_persisted_then_refused() {
        let (mut c, log, _) = fake_client(5_000);
        c.budget.blocked_until = 5_000 + 301_000;
        let e = c.wait_blocked().unwrap_err();
        assert_eq!(e.exit, Exit::TempFail);
        assert_eq!(*log.borrow(), ["persist until 306000"], "no sleep");
    }

    #[test]
    fn the_run_budget_stops_a_wait_that_would_outlast_it() {
        let (mut c, log, _) = fake_client(10_000);
        c.deadline = Some(20_000);
        c.budget.blocked_until = 25_000;
        let e = c.wait_blocked().unwrap_err();
        assert!(e.msg.contains("--time-limit"), "{}", e.msg);
        assert_eq!(*log.borrow(), ["persist until 25000"]);
        // The write slot waits on the same clock: 1 s after the last write.
        c.deadline = None;
        c.budget.blocked_until = 0;
        c.budget.writes = vec![25_000];
        log.borrow_mut().clear();
        c.wait_write_slot().unwrap();
        assert_eq!(*log.borrow(), ["sleep 16000"]);
    }

    #[test]
    fn errors_for_the_token_user_read_once_and_name_no_issue() {
        let c = Client::new(
            "http://127.0.0.1:9",
            Token::new("t"),
            Limits::default(),
            Budget::default(),
        )
        .unwrap();
        let reply = |status| Reply {
            status,
            headers: vec![],
            body: br#"{"message":"Bad credentials"}"#.to_vec(),
        };
        let e = c.error_for(&reply(401), "the token's user", "");
        assert_eq!(e.msg.matches("valid token").count(), 1, "{}", e.msg);
        let e = c.error_for(&reply(401), "a comment on o/r#1", "issues: write");
        assert!(
            e.msg.ends_with("a valid token with issues: write"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn repo_names() {
        assert!(Target::parse_repo("octo/hello-world").is_ok());
        for bad in ["octo", "/x", "a/b/c", "a/..", "a b/c"] {
            assert!(Target::parse_repo(bad).is_err(), "{bad}");
        }
    }
}
