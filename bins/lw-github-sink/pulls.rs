//! Pull requests, commit statuses and reviews as GitHub documents them
//! (docs.github.com/rest/pulls, /rest/commits/statuses): create, list by
//! `head`/`base`/`state` in pages, get and update a pull request; create and
//! list a commit's statuses; list a pull request's reviews and review
//! comments.  GitHub's REST API cannot take a draft out of draft (`PATCH`
//! ignores `draft`); its GraphQL mutation `markPullRequestReadyForReview`
//! can, and `graphql` answers that one mutation.
//!
//! Validation speaks GitHub's words: 422 `Validation Failed` with an
//! `errors` list naming the field (`base` or `head` `invalid` when the branch
//! does not exist, `missing_field`), and the custom message "A pull request
//! already exists for OWNER:BRANCH." for a second open one of the same head.

use serde_json::{Value, json};

use crate::state::{Op, State, StoredPull, StoredReview, StoredStatus};
use crate::wire::{DOCS, Response, gh_error, gh_time, journal_failed, now_s, paged, resp};

/// One authenticated request under `/repos/{repo}/`, as this module needs it.
pub(crate) struct Ctx<'a> {
    pub repo: &'a str,
    pub login: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub q: &'a [(String, String)],
    pub body: &'a [u8],
    /// The token may write pull requests and statuses.
    pub can_write: bool,
}

/// GitHub's 403 for a token without pull-request (or status) rights.
pub(crate) fn forbidden(perm: &str) -> Response {
    let mut r = gh_error(403, "Resource not accessible by personal access token");
    r.headers
        .push(("x-accepted-github-permissions".into(), perm.into()));
    r
}

fn invalid(errors: Value) -> Response {
    resp(
        422,
        json!({ "message": "Validation Failed", "errors": errors, "documentation_url": DOCS, "status": "422" }),
    )
}

fn field_error(field: &str, code: &str) -> Response {
    invalid(json!([{ "resource": "PullRequest", "field": field, "code": code }]))
}

fn custom(message: &str) -> Response {
    invalid(json!([{ "resource": "PullRequest", "code": "custom", "message": message }]))
}

pub(crate) fn node_id(p: &StoredPull) -> String {
    format!("PR_{}_{}", p.repo.replace('/', "_"), p.number)
}

pub(crate) fn pull_json(p: &StoredPull, host: &str) -> Value {
    let owner = p.repo.split('/').next().unwrap_or("");
    json!({
        "id": p.number,
        "node_id": node_id(p),
        "number": p.number,
        "url": format!("http://{host}/repos/{}/pulls/{}", p.repo, p.number),
        "html_url": format!("http://{host}/{}/pull/{}", p.repo, p.number),
        "issue_url": format!("http://{host}/repos/{}/issues/{}", p.repo, p.number),
        "state": p.state,
        "title": p.title,
        "body": p.body,
        "draft": p.draft,
        "merged": p.merged,
        "user": { "login": p.login, "id": 1, "type": "User" },
        "head": { "label": format!("{}:{}", p.head_owner, p.head), "ref": p.head, "sha": p.head_sha,
                  "repo": { "full_name": p.repo } },
        "base": { "label": format!("{owner}:{}", p.base), "ref": p.base, "repo": { "full_name": p.repo } },
        "created_at": gh_time(p.created),
        "updated_at": gh_time(p.updated),
    })
}

/// `head` as GitHub takes it: `branch` or `owner:branch`.
fn head_of<'h>(repo: &'h str, head: &'h str) -> (&'h str, &'h str) {
    match head.split_once(':') {
        Some((o, b)) => (o, b),
        None => (repo.split('/').next().unwrap_or(""), head),
    }
}

fn json_body(body: &[u8]) -> Result<Value, Response> {
    serde_json::from_slice(body).map_err(|_| gh_error(400, "Problems parsing JSON"))
}

/// `POST /repos/{repo}/pulls`.
pub(crate) fn create(st: &mut State, c: &Ctx) -> Response {
    if !c.can_write {
        return forbidden("pull_requests=write");
    }
    let v = match json_body(c.body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    for f in ["title", "head", "base"] {
        if text(f).is_none_or(|s| s.is_empty()) {
            return field_error(f, "missing_field");
        }
    }
    let (title, head, base) = (
        text("title").unwrap(),
        text("head").unwrap(),
        text("base").unwrap(),
    );
    let (owner, branch) = head_of(c.repo, &head);
    if st.branch_tip(c.repo, &base).is_none() {
        return field_error("base", "invalid");
    }
    let Some(sha) = st.branch_tip(c.repo, branch) else {
        return field_error("head", "invalid");
    };
    if st
        .pulls
        .values()
        .any(|p| p.repo == c.repo && p.state == "open" && p.head_owner == owner && p.head == branch)
    {
        return custom(&format!(
            "A pull request already exists for {owner}:{branch}."
        ));
    }
    if st.git.contains_key(c.repo) && st.branch_tip(c.repo, &base).as_deref() == Some(&sha) {
        return custom(&format!("No commits between {base} and {branch}"));
    }
    let number = st.repos[c.repo].keys().next_back().copied().unwrap_or(0) + 1;
    let now = now_s();
    let p = StoredPull {
        repo: c.repo.into(),
        number,
        title,
        body: text("body").unwrap_or_default(),
        head_owner: owner.into(),
        head: branch.into(),
        head_sha: sha,
        base,
        state: "open".into(),
        draft: v.get("draft").and_then(Value::as_bool).unwrap_or(false),
        merged: false,
        login: c.login.into(),
        created: now,
        updated: now,
    };
    if st.commit(Op::Pull { p: p.clone() }).is_err() {
        return journal_failed();
    }
    let mut r = resp(201, pull_json(&p, c.host));
    r.headers.push((
        "Location".into(),
        format!("http://{}/repos/{}/pulls/{number}", c.host, c.repo),
    ));
    r
}

/// `GET /repos/{repo}/pulls?state=&head=&base=`, newest first, in pages.
pub(crate) fn list(st: &State, c: &Ctx) -> Response {
    let want = crate::wire::param(c.q, "state").unwrap_or("open");
    if !matches!(want, "open" | "closed" | "all") {
        return invalid(
            json!([{ "resource": "PullRequest", "field": "state", "code": "invalid" }]),
        );
    }
    let head = crate::wire::param(c.q, "head").map(|h| head_of(c.repo, h));
    let base = crate::wire::param(c.q, "base");
    let mut all: Vec<&StoredPull> = st
        .pulls
        .values()
        .filter(|p| p.repo == c.repo && (want == "all" || p.state == want))
        .filter(|p| head.is_none_or(|(o, b)| p.head_owner == o && p.head == b))
        .filter(|p| base.is_none_or(|b| p.base == b))
        .collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.number));
    let items: Vec<Value> = all.iter().map(|p| pull_json(p, c.host)).collect();
    paged(items, c.q, c.path, c.host)
}

fn pull_of<'s>(st: &'s State, repo: &str, n: &str) -> Option<&'s StoredPull> {
    let n = n.parse::<u64>().ok()?;
    st.pulls.get(&(repo.to_string(), n))
}

/// `GET /repos/{repo}/pulls/{n}`.
pub(crate) fn get(st: &State, c: &Ctx, n: &str) -> Response {
    match pull_of(st, c.repo, n) {
        Some(p) => resp(200, pull_json(p, c.host)),
        None => gh_error(404, "Not Found"),
    }
}

/// `PATCH /repos/{repo}/pulls/{n}`: `title`, `body`, `state`, `base`
/// (`draft` is ignored, as GitHub ignores it).
pub(crate) fn update(st: &mut State, c: &Ctx, n: &str) -> Response {
    let Some(mut p) = pull_of(st, c.repo, n).cloned() else {
        return gh_error(404, "Not Found");
    };
    if !c.can_write {
        return forbidden("pull_requests=write");
    }
    let v = match json_body(c.body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if let Some(t) = v.get("title").and_then(Value::as_str) {
        p.title = t.into();
    }
    if let Some(b) = v.get("body").and_then(Value::as_str) {
        p.body = b.into();
    }
    if let Some(b) = v.get("base").and_then(Value::as_str) {
        if st.branch_tip(c.repo, b).is_none() {
            return field_error("base", "invalid");
        }
        p.base = b.into();
    }
    match v.get("state").and_then(Value::as_str) {
        None => {}
        Some("closed") => p.state = "closed".into(),
        Some("open") if p.merged => return custom("Cannot reopen a merged pull request"),
        Some("open") => {
            if st.pulls.values().any(|o| {
                o.repo == p.repo
                    && o.number != p.number
                    && o.state == "open"
                    && (o.head_owner.as_str(), o.head.as_str()) == (&p.head_owner, &p.head)
            }) {
                return custom(&format!(
                    "A pull request already exists for {}:{}.",
                    p.head_owner, p.head
                ));
            }
            p.state = "open".into();
        }
        Some(_) => return field_error("state", "invalid"),
    }
    p.updated = now_s();
    if st.commit(Op::Pull { p: p.clone() }).is_err() {
        return journal_failed();
    }
    resp(200, pull_json(&p, c.host))
}

fn review_json(r: &StoredReview, host: &str) -> Value {
    let user = json!({ "login": r.login, "id": 1, "type": "User" });
    match &r.path {
        None => json!({
            "id": r.id, "node_id": format!("PRR_{}", r.id), "user": user, "body": r.body,
            "state": r.state, "submitted_at": gh_time(r.created),
            "html_url": format!("http://{host}/{}/pull/{}#pullrequestreview-{}", r.repo, r.pull, r.id),
            "pull_request_url": format!("http://{host}/repos/{}/pulls/{}", r.repo, r.pull),
            "author_association": r.association,
        }),
        Some(path) => json!({
            "id": r.id, "node_id": format!("PRRC_{}", r.id), "user": user, "body": r.body,
            "path": path, "line": r.line, "original_line": r.line, "side": "RIGHT",
            "pull_request_review_id": r.id,
            "created_at": gh_time(r.created), "updated_at": gh_time(r.created),
            "html_url": format!("http://{host}/{}/pull/{}#discussion_r{}", r.repo, r.pull, r.id),
            "pull_request_url": format!("http://{host}/repos/{}/pulls/{}", r.repo, r.pull),
            "author_association": r.association,
        }),
    }
}

/// `GET /repos/{repo}/pulls/{n}/reviews` (`comments` false) or
/// `.../comments` (review comments, `comments` true), oldest first, in pages.
pub(crate) fn reviews(st: &State, c: &Ctx, n: &str, comments: bool) -> Response {
    let Some(p) = pull_of(st, c.repo, n) else {
        return gh_error(404, "Not Found");
    };
    let items: Vec<Value> = st
        .reviews
        .iter()
        .filter(|r| r.repo == p.repo && r.pull == p.number && r.path.is_some() == comments)
        .map(|r| review_json(r, c.host))
        .collect();
    paged(items, c.q, c.path, c.host)
}

fn status_json(s: &StoredStatus, host: &str) -> Value {
    json!({
        "id": s.id, "node_id": format!("SC_{}", s.id),
        "url": format!("http://{host}/repos/{}/statuses/{}", s.repo, s.sha),
        "state": s.state, "description": s.description, "target_url": s.target_url,
        "context": s.context, "created_at": gh_time(s.created), "updated_at": gh_time(s.created),
        "creator": { "login": s.login, "id": 1, "type": "User" },
    })
}

fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `POST /repos/{repo}/statuses/{sha}`.
pub(crate) fn create_status(st: &mut State, c: &Ctx, sha: &str) -> Response {
    if !c.can_write {
        return forbidden("statuses=write");
    }
    let v = match json_body(c.body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let state = v.get("state").and_then(Value::as_str).unwrap_or("");
    if !matches!(state, "error" | "failure" | "pending" | "success") {
        return invalid(
            json!([{ "resource": "Status", "field": "state", "code": "custom",
                     "message": "state is not included in the list" }]),
        );
    }
    if !is_sha(sha) || !st.has_commit(c.repo, sha) {
        return resp(
            422,
            json!({ "message": format!("No commit found for SHA: {sha}"), "documentation_url": DOCS, "status": "422" }),
        );
    }
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let s = StoredStatus {
        id: st.next_id,
        repo: c.repo.into(),
        sha: sha.into(),
        state: state.into(),
        context: text("context").unwrap_or_else(|| "default".into()),
        description: text("description"),
        target_url: text("target_url"),
        login: c.login.into(),
        created: now_s(),
    };
    if st.commit(Op::Status { s: s.clone() }).is_err() {
        return journal_failed();
    }
    resp(201, status_json(&s, c.host))
}

/// `GET /repos/{repo}/commits/{sha}/statuses`, newest first, in pages.
pub(crate) fn list_statuses(st: &State, c: &Ctx, sha: &str) -> Response {
    let items: Vec<Value> = st
        .statuses
        .iter()
        .rev()
        .filter(|s| s.repo == c.repo && s.sha == sha)
        .map(|s| status_json(s, c.host))
        .collect();
    paged(items, c.q, c.path, c.host)
}

/// `POST /graphql`: the one mutation GitHub offers for taking a pull request
/// out of draft, `markPullRequestReadyForReview(input: {pullRequestId})`.
/// GraphQL answers 200 with `errors` for what it refuses.
pub(crate) fn graphql(st: &mut State, can_write: bool, body: &[u8]) -> Response {
    let v = match json_body(body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let q = v.get("query").and_then(Value::as_str).unwrap_or("");
    let gql_error = |kind: &str, msg: &str| {
        resp(
            200,
            json!({ "data": null, "errors": [{ "type": kind, "message": msg }] }),
        )
    };
    if !q.contains("markPullRequestReadyForReview") {
        return gql_error(
            "UNSUPPORTED",
            "lw-github-sink answers markPullRequestReadyForReview only",
        );
    }
    let id = v
        .pointer("/variables/id")
        .or_else(|| v.pointer("/variables/pullRequestId"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(mut p) = st.pulls.values().find(|p| node_id(p) == id).cloned() else {
        return gql_error(
            "NOT_FOUND",
            &format!("Could not resolve to a node with the global id of '{id}'"),
        );
    };
    if !can_write {
        return gql_error(
            "FORBIDDEN",
            "Resource not accessible by personal access token",
        );
    }
    if p.draft {
        p.draft = false;
        p.updated = now_s();
        if st.commit(Op::Pull { p: p.clone() }).is_err() {
            return journal_failed();
        }
    }
    resp(
        200,
        json!({ "data": { "markPullRequestReadyForReview": { "pullRequest": { "number": p.number, "isDraft": p.draft } } } }),
    )
}

/// `POST /_sink/reviews`: a person's review or review comment (`path`,
/// `line`) on a pull request; `association` is its author's
/// `author_association` (default `OWNER`).
pub(crate) fn add_review(st: &mut State, v: &Value) -> Response {
    let (Some(repo), Some(pull), Some(login)) =
        (v["repo"].as_str(), v["pull"].as_u64(), v["login"].as_str())
    else {
        return gh_error(422, "want {repo, pull, login, body, state | path, line}");
    };
    if !st.pulls.contains_key(&(repo.to_string(), pull)) {
        return gh_error(404, "Not Found");
    }
    let r = StoredReview {
        id: st.next_id,
        repo: repo.into(),
        pull,
        login: login.into(),
        state: v["state"].as_str().unwrap_or("COMMENTED").into(),
        body: v["body"].as_str().unwrap_or("").into(),
        path: v["path"].as_str().map(str::to_string),
        line: v["line"].as_u64(),
        created: now_s(),
        association: v["association"].as_str().unwrap_or("OWNER").into(),
    };
    let id = r.id;
    if st.commit(Op::Review { r }).is_err() {
        return journal_failed();
    }
    resp(201, json!({ "id": id }))
}
