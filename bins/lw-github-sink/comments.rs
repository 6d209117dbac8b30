//! Issue comments as GitHub shows them: the JSON of a comment, creating
//! one, and listing an issue's comments in pages with `Link` headers.

use serde_json::{Value, json};

use crate::state::{Op, State, StoredComment};
use crate::wire::{DOCS, Response, gh_error, gh_time, journal_failed, now_s, paged, param, resp};

/// GitHub's documented limit on a comment body, in characters (the same
/// figure lw-sync keeps in crates/sync/src/github; the sink speaks as GitHub does, not
/// as loopwright's client expects).
const MAX_COMMENT_CHARS: usize = 65_536;

pub(crate) fn body_field(body: &[u8]) -> std::result::Result<String, Response> {
    let v: Value =
        serde_json::from_slice(body).map_err(|_| gh_error(400, "Problems parsing JSON"))?;
    let Some(b) = v.get("body").and_then(|b| b.as_str()) else {
        return Err(resp(
            422,
            json!({ "message": "Invalid request.\n\n\"body\" wasn't supplied.", "documentation_url": DOCS, "status": "422" }),
        ));
    };
    if b.chars().count() > MAX_COMMENT_CHARS {
        return Err(too_long());
    }
    Ok(b.to_string())
}

/// GitHub's answer to a comment over 65,536 characters.
pub(crate) fn too_long() -> Response {
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

pub(crate) fn create(
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
        return journal_failed();
    }
    let mut r = resp(201, comment_json(&st.comments[&id], host));
    r.headers.push((
        "Location".into(),
        format!("http://{host}/repos/{repo}/issues/comments/{id}"),
    ));
    r
}

pub(crate) fn comment_json(c: &StoredComment, host: &str) -> Value {
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

pub(crate) fn list(
    st: &State,
    repo: &str,
    issue: u64,
    path: &str,
    q: &[(String, String)],
    host: &str,
) -> Response {
    let since = param(q, "since")
        .and_then(base::time::parse_rfc3339)
        .map(|d| d.as_secs());
    let items: Vec<Value> = st
        .comments
        .values()
        .filter(|c| c.repo == repo && c.issue == issue && since.is_none_or(|s| c.updated >= s))
        .map(|c| comment_json(c, host))
        .collect();
    paged(items, q, path, host)
}
