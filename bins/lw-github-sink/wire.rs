//! The words every module of the sink shares: a request and an answer as the
//! handlers see them, GitHub's error shape, its timestamps, the query string
//! and the `Link` header of a page.  It names no other module of the sink,
//! so `api`, `comments`, `pulls` and `control` all stand on it without a
//! circle.

use std::time::Duration;

use serde_json::{Value, json};

pub(crate) const DOCS: &str = "https://docs.github.com/rest";

/// A request as the handlers see it (the HTTP layer reads the body whole).
pub(crate) struct Request {
    pub method: String,
    /// The request target: path and query, as sent.
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub(crate) fn header(&self, n: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Close the connection without sending anything.
    pub drop: bool,
}

/// Fixed settings of the API.
pub(crate) struct Limits {
    /// Requests per hour per token before the primary limit answers 403.
    pub hourly_limit: u64,
}

pub(crate) fn now_s() -> u64 {
    base::time::now().as_secs()
}

pub(crate) fn now_ms_f() -> f64 {
    base::time::now().as_secs_f64() * 1000.0
}

pub(crate) fn gh_time(s: u64) -> String {
    // GitHub's timestamps have whole seconds.
    let t = base::time::rfc3339(Duration::from_secs(s));
    format!("{}Z", &t[..19])
}

pub(crate) fn resp(status: u16, v: Value) -> Response {
    Response {
        status,
        headers: vec![],
        body: serde_json::to_vec(&v).expect("JSON values serialise"),
        drop: false,
    }
}

pub(crate) fn gh_error(status: u16, msg: &str) -> Response {
    resp(
        status,
        json!({ "message": msg, "documentation_url": DOCS, "status": status.to_string() }),
    )
}

pub(crate) fn empty(status: u16, drop: bool) -> Response {
    Response {
        status,
        headers: vec![],
        body: vec![],
        drop,
    }
}

pub(crate) fn query(target: &str) -> (String, Vec<(String, String)>) {
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

pub(crate) fn param<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

pub(crate) fn journal_failed() -> Response {
    gh_error(500, "journal write failed")
}

/// The `Link` header's parts for `page` of `last`.
pub(crate) fn page_links(
    page: usize,
    last: usize,
    link_for: impl Fn(usize) -> String,
) -> Vec<String> {
    let mut links = Vec::new();
    if page < last {
        links.push(format!("{}; rel=\"next\"", link_for(page + 1)));
        links.push(format!("{}; rel=\"last\"", link_for(last)));
    }
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", link_for(page - 1)));
        links.push(format!("{}; rel=\"first\"", link_for(1)));
    }
    links
}

/// One page of `items` as GitHub pages a list: `per_page` (default 30, at
/// most 100) and `page`, with a `Link` header of the pages around it.
pub(crate) fn paged(items: Vec<Value>, q: &[(String, String)], path: &str, host: &str) -> Response {
    let per_page = param(q, "per_page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(30)
        .clamp(1, 100);
    let page = param(q, "page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let last = items.len().div_ceil(per_page).max(1);
    let items: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut r = resp(200, Value::Array(items));
    let links = page_links(page, last, |p| {
        let mut qs: Vec<String> = q
            .iter()
            .filter(|(k, _)| k != "page")
            .map(|(k, v)| format!("{k}={}", v.replace(':', "%3A")))
            .collect();
        qs.push(format!("page={p}"));
        format!("<http://{host}{path}?{}>", qs.join("&"))
    });
    if !links.is_empty() {
        r.headers.push(("Link".into(), links.join(", ")));
    }
    r
}
