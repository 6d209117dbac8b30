//! The control API under `/_sink/` (no token): repositories, tokens and
//! human comments, injected faults, and the record of requests and blocked
//! windows.  Control requests are not recorded.

use base::digest::sha256_hex;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::state::{Fault, Op, State, StoredComment, TokenInfo, Window};
use crate::wire::{Request, Response, gh_error, now_s, param, query, resp};

#[derive(Deserialize)]
struct TokenReq {
    token: String,
    #[serde(default)]
    login: Option<String>,
    #[serde(default = "yes")]
    write: bool,
    #[serde(default)]
    revoke: bool,
    /// Pull-request and status rights (default yes).
    #[serde(default = "yes")]
    pulls: bool,
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

fn io_fail(_: std::io::Error) -> Response {
    gh_error(500, "journal write failed")
}

pub(crate) fn control(st: &mut State, req: &Request, ctl: &str) -> Response {
    let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    match (req.method.as_str(), ctl) {
        ("POST", "repos") => {
            let (Some(repo), n) = (v["repo"].as_str(), v["issues"].as_u64().unwrap_or(1)) else {
                return gh_error(422, "repo missing");
            };
            let git = v["git"].as_str().map(std::path::PathBuf::from);
            let made = st.add_repo(repo, n).and_then(|()| match git {
                Some(dir) => st.commit(Op::Git {
                    repo: repo.into(),
                    dir,
                }),
                None => Ok(()),
            });
            match made {
                Ok(()) => resp(201, json!({ "repo": repo, "issues": n })),
                Err(e) => io_fail(e),
            }
        }
        ("POST", "tokens") => token(st, v),
        ("POST", "comments") => human_comment(st, v),
        ("POST", "reviews") => crate::pulls::add_review(st, &v),
        ("GET", c) if c.starts_with("pulls") => {
            let (_, q) = query(&req.target);
            let repo = param(&q, "repo").unwrap_or("");
            let items: Vec<Value> = st
                .pulls
                .values()
                .filter(|p| p.repo == repo)
                .map(|p| crate::pulls::pull_json(p, "sink"))
                .collect();
            resp(200, Value::Array(items))
        }
        ("GET", c) if c.starts_with("statuses") => {
            let (_, q) = query(&req.target);
            let repo = param(&q, "repo").unwrap_or("");
            let items: Vec<Value> = st
                .statuses
                .iter()
                .filter(|s| s.repo == repo)
                .map(|s| json!({ "sha": s.sha, "state": s.state, "context": s.context, "description": s.description }))
                .collect();
            resp(200, Value::Array(items))
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

/// `POST /_sink/tokens`: accept, change or revoke a token.
fn token(st: &mut State, v: Value) -> Response {
    let Ok(t) = serde_json::from_value::<TokenReq>(v) else {
        return gh_error(422, "want {token, login, write, revoke}");
    };
    let sha = sha256_hex(t.token.as_bytes());
    let mut info = st.tokens.get(&sha).cloned().unwrap_or(TokenInfo {
        login: String::new(),
        write: t.write,
        revoked: false,
        pulls: true,
    });
    if let Some(l) = t.login {
        info.login = l;
    }
    info.write = t.write;
    info.pulls = t.pulls;
    info.revoked = t.revoke;
    if info.login.is_empty() {
        return gh_error(422, "login missing");
    }
    match st.commit(Op::Token { sha, info }) {
        Ok(()) => resp(201, json!({ "ok": true })),
        Err(e) => io_fail(e),
    }
}

/// `POST /_sink/comments`: a comment written by a person on the issue.
fn human_comment(st: &mut State, v: Value) -> Response {
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
