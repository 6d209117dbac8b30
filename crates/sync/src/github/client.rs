//! The exchanges with the API, one at a time, and the endpoints lw-sync
//! uses: the token's user, listing, posting and editing comments.

use std::time::Duration;

use super::answer::{Answer, status_of, validation_detail};
use super::{Budget, Clock, Comment, Limits, Persist, Posted, SystemClock, Target, Token};
use base::error::{Error, Exit, Result};

/// A finished exchange.
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
}

impl Reply {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
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
    /// Of those, conditional GETs answered 304 (free under the rate limit).
    pub not_modified: u64,
    pub writes: u64,
    pub clock: Box<dyn Clock>,
    /// Writes the budget durably before a wait (see [`Persist`]).
    pub persist: Option<Persist>,
    /// The blocked window last handed to `persist`.
    pub(super) persisted_until: u64,
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

/// A GET's JSON, `Link` and `ETag`.
pub(super) type Got = (serde_json::Value, Option<String>, Option<String>);

/// A conditional listing's answer.
pub enum Listing {
    /// 304: nothing changed since the listing whose ETag was sent.
    NotModified,
    /// The comments, and the ETag to send next time (only for a listing of
    /// one page: a later page can change while the first does not).
    Comments(Vec<Comment>, Option<String>),
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
            not_modified: 0,
            writes: 0,
            clock: Box::new(SystemClock),
            persist: None,
            persisted_until: 0,
            deadline: None,
        })
    }

    /// The GraphQL endpoint beside the REST base: `/graphql` on
    /// api.github.com, `/api/graphql` for GitHub Enterprise's `/api/v3`.
    pub fn graphql_url(&self) -> String {
        match self.base.strip_suffix("/api/v3") {
            Some(host) => format!("{host}/api/graphql"),
            None => format!("{}/graphql", self.base),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn comments_url(&self, t: &Target) -> String {
        format!("{}/repos/{}/issues/{}/comments", self.base, t.repo, t.issue)
    }

    /// Sends one request, after any blocked window.  `Err` only for failures
    /// that happen before anything is known about the outcome; the caller
    /// decides what a transport error means for its method.
    fn exchange(
        &mut self,
        method: &str,
        url: &str,
        body: Option<&serde_json::Value>,
        if_none_match: Option<&str>,
    ) -> std::result::Result<Reply, Transport> {
        self.requests += 1;
        let auth = self.token.header();
        let res = match (method, body) {
            ("GET", _) => {
                let mut req = self
                    .agent
                    .get(url)
                    .header("Authorization", &auth)
                    .header("Accept", "application/vnd.github+json")
                    .header("X-GitHub-Api-Version", "2022-11-28");
                if let Some(tag) = if_none_match {
                    req = req.header("If-None-Match", tag);
                }
                req.call()
            }
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
        let answer = Answer {
            status: r.status,
            message: msg,
        };
        let e = match r.status {
            401 => Error::new(
                Exit::NoPerm,
                format!(
                    "GitHub rejected the token when asked for {what}: it is missing, expired or revoked; set GH_TOKEN to a valid token{with}"
                ),
            ),
            403 => Error::new(
                Exit::NoPerm,
                format!("GitHub refused {what}: the token lacks a permission{with}{accepted}"),
            ),
            404 => Error::new(
                Exit::Config,
                format!(
                    "GitHub has no {what}: the repository or issue does not exist, or the token cannot see it (it needs {perm})"
                ),
            ),
            410 => Error::new(
                Exit::Config,
                format!("{what} is gone: issues may be disabled on the repository"),
            ),
            422 => Error::new(
                Exit::DataErr,
                format!("GitHub did not accept {what}{}", validation_detail(&r.body)),
            ),
            _ => Error::new(Exit::Unavailable, format!("GitHub failed {what}")),
        };
        e.with_source(answer)
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
    pub(super) fn get_json(
        &mut self,
        url: &str,
        what: &str,
        perm: &str,
    ) -> Result<(serde_json::Value, Option<String>)> {
        let got = self.get_json_if(url, what, perm, None)?;
        let got = got.expect("an unconditional GET is never answered 304");
        Ok((got.0, got.1))
    }

    /// A GET as [`Client::get_json`], conditional on `if_none_match` (an
    /// ETag of an earlier answer): None when GitHub answers 304 Not
    /// Modified, which its rate limit does not count; else the JSON, the
    /// `Link` header and the answer's `ETag`.
    pub(super) fn get_json_if(
        &mut self,
        url: &str,
        what: &str,
        perm: &str,
        if_none_match: Option<&str>,
    ) -> Result<Option<Got>> {
        let mut attempt = 0;
        let mut limited = 0;
        let mut timeouts = 0;
        loop {
            attempt += 1;
            self.wait_blocked()?;
            self.check_deadline(Duration::ZERO)?;
            let transient = match self.exchange("GET", url, None, if_none_match) {
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
                    } else if r.status == 304 && if_none_match.is_some() {
                        self.not_modified += 1;
                        return Ok(None);
                    } else if r.status != 200 {
                        return Err(self.error_for(&r, what, perm));
                    } else {
                        self.budget.strikes = 0;
                        let v = serde_json::from_slice(&r.body).map_err(|e| {
                            Error::new(Exit::Unavailable, format!("GitHub's answer to {what} is not JSON ({e}); is the API URL '{}' right?", self.base))
                        })?;
                        let link = r.header("link").map(str::to_string);
                        return Ok(Some((v, link, r.header("etag").map(str::to_string))));
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
            Err(e) if status_of(&e) == Some(403) => Ok(None),
            Err(e) if status_of(&e) == Some(404) => Err(Error::config(format!(
                "GitHub answered 404 for the token's user (GET {url}): the API URL '{}' does not look like GitHub's REST API; check --api-url or \"api_url\"",
                self.base
            ))),
            Err(e) => Err(e),
        }
    }

    /// Every comment of an issue, following `Link: rel="next"` to the last
    /// page.  `since` (RFC 3339) limits the list to comments updated since.
    pub fn list_comments(&mut self, t: &Target, since: Option<&str>) -> Result<Vec<Comment>> {
        match self.list_comments_if(t, since, None)? {
            Listing::Comments(all, _) => Ok(all),
            Listing::NotModified => unreachable!("an unconditional listing is never 304"),
        }
    }

    /// [`Client::list_comments`], conditional on the ETag of an earlier
    /// listing of the same `since`: GitHub answers 304 when nothing changed.
    pub fn list_comments_if(
        &mut self,
        t: &Target,
        since: Option<&str>,
        etag: Option<&str>,
    ) -> Result<Listing> {
        let mut url = format!("{}?per_page=100", self.comments_url(t));
        if let Some(s) = since {
            url.push_str("&since=");
            url.push_str(&s.replace(':', "%3A"));
        }
        let what = format!("the comments of {t}");
        let mut all = Vec::new();
        let mut pages = 0;
        let mut first_tag = None;
        loop {
            pages += 1;
            let cond = if pages == 1 { etag } else { None };
            let Some((v, link, tag)) = self.get_json_if(
                &url,
                &what,
                "issues: read (pull requests: read for a pull request)",
                cond,
            )?
            else {
                return Ok(Listing::NotModified);
            };
            if pages == 1 {
                first_tag = tag;
            }
            let page: Vec<Comment> = serde_json::from_value(v).map_err(|e| {
                Error::new(
                    Exit::Unavailable,
                    format!("GitHub's list of {what} is not a list of comments: {e}"),
                )
            })?;
            all.extend(page);
            match self.next_page(link.as_deref(), &what)? {
                Some(next) => {
                    if pages > 100_000 {
                        return Err(Error::new(
                            Exit::Unavailable,
                            format!("the pages of {what} never end"),
                        ));
                    }
                    url = next;
                }
                None => {
                    let tag = first_tag.filter(|_| pages == 1);
                    return Ok(Listing::Comments(all, tag));
                }
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
        Ok(
            match self.write_json(url, method, payload, what, perm, before_send)? {
                Written::Unknown(why) => Posted::Unknown(why),
                Written::Done(status, v) => match serde_json::from_value::<Comment>(v) {
                    Ok(c) => Posted::Created(c),
                    Err(e) => Posted::Unknown(format!(
                        "GitHub answered {status} with a body that is not a comment ({e})"
                    )),
                },
            },
        )
    }

    /// A content-creating request, paced, sent once: its answer's status
    /// and JSON, or [`Written::Unknown`] when it may or may not have been
    /// done (never retried here).  `perm` names the permission an error
    /// asks for.
    pub(super) fn write_json(
        &mut self,
        url: &str,
        method: &str,
        payload: &serde_json::Value,
        what: &str,
        perm: &str,
        before_send: BeforeSend<'_>,
    ) -> Result<Written> {
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
            let sent = self.exchange(method, url, Some(payload), None);
            if let Some(last) = self.budget.writes.last_mut() {
                *last = self.clock.now_ms();
            }
            let r = match sent {
                // Nothing listened: nothing can have been created.
                Err(Transport::Unreachable(e)) => return Err(unreachable(&self.base, what, &e)),
                Err(Transport::TimedOut(e)) => {
                    return Ok(Written::Unknown(format!("no answer in time: {e}")));
                }
                Err(Transport::Other(e)) => {
                    return Ok(Written::Unknown(format!("the connection failed: {e}")));
                }
                Ok(r) => r,
            };
            // A rate-limited request did nothing; it is safe to send again.
            if self.was_rate_limited(&r, &mut limited, what)? {
                continue;
            }
            if r.status >= 500 {
                return Ok(Written::Unknown(format!("GitHub answered {}", r.status)));
            }
            if r.status != 200 && r.status != 201 {
                return Err(self.error_for(&r, what, perm));
            }
            self.budget.strikes = 0;
            return Ok(match serde_json::from_slice(&r.body) {
                Ok(v) => Written::Done(r.status, v),
                Err(e) => Written::Unknown(format!(
                    "GitHub answered {} with a body that is not JSON ({e})",
                    r.status
                )),
            });
        }
    }
}

/// The outcome of a content-creating request.
pub(super) enum Written {
    /// 200 or 201, and the answer's JSON.
    Done(u16, serde_json::Value),
    /// It may or may not have been done.
    Unknown(String),
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

impl Client {
    /// The next page's URL from a listing's `Link` header: None on the last
    /// page; refused when it leaves this client's API URL (the token would
    /// go with it).
    pub(super) fn next_page(&self, link: Option<&str>, what: &str) -> Result<Option<String>> {
        match link.and_then(next_link) {
            Some(next) if next.starts_with(&format!("{}/", self.base)) => Ok(Some(next)),
            Some(_) => Err(Error::new(
                Exit::Unavailable,
                format!(
                    "GitHub's next-page link for {what} leaves the API URL '{}'; refusing to send the token there",
                    self.base
                ),
            )),
            None => Ok(None),
        }
    }
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

#[cfg(test)]
mod tests;
