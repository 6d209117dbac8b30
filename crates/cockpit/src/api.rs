//! The page's API: what each path answers, as JSON (the diff: plain text).
//! Blocking; called on tokio's blocking pool by crates/cockpit/src/http.rs after
//! the request passed crates/cockpit/src/auth.rs.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::{Cockpit, actions, data, diff};
use base::error::{Error, Result};
use mailbox::log::Log;

/// A query string's parameters, percent-decoded (`+` is a space).
pub(super) fn params(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push(h << 4 | l);
                i += 2;
            }
            (b'+', ..) => out.push(b' '),
            (c, ..) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn opt(p: &HashMap<String, String>, k: &str) -> Option<String> {
    p.get(k).filter(|v| !v.is_empty()).cloned()
}

/// A GET's answer: its content type, its body, and, where a page asks
/// again for what may not have changed, a tag of what it says (an HTTP
/// entity tag: the same tag, the same view).
pub(super) struct Answer {
    pub ctype: &'static str,
    pub body: String,
    pub tag: Option<String>,
}

/// Answers a GET, or None for an unknown path.
pub(super) fn get(c: &Cockpit, path: &str, p: &HashMap<String, String>) -> Result<Option<Answer>> {
    let log = Log::new(c.root.log_dir());
    let v = match path {
        "/api/meta" => json!({
            "operator": c.operator,
            "root": c.root.dir.display().to_string(),
            "kinds": mailbox::message::KINDS.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        }),
        "/api/sandboxes" => {
            let mut live = c.live.snapshot();
            let list = serde_json::to_string(&data::sandboxes(&c.root, &mut live)?)?;
            let engine = live.engine;
            // Tagged without the time the engine was last asked, which
            // changes every round: a page told to look again when nothing
            // it shows changed gets 304 and no body (at 1,000 sandboxes the
            // body is most of a megabyte, serialised once).
            let bare = serde_json::to_string(&super::live::EngineView {
                checked: None,
                ..engine.clone()
            })?;
            let tag = format!(
                "\"{}\"",
                &base::digest::sha256_hex(format!("{list}{bare}").as_bytes())[..32]
            );
            let body = format!(
                "{{\"sandboxes\":{list},\"engine\":{},\"refresh_secs\":{}}}",
                serde_json::to_string(&engine)?,
                super::live::PERIOD.as_secs()
            );
            return Ok(Some(Answer {
                ctype: "application/json",
                body,
                tag: Some(tag),
            }));
        }
        "/api/log" => {
            let q = data::LogQuery {
                before: opt(p, "before"),
                limit: opt(p, "limit").and_then(|l| l.parse().ok()).unwrap_or(50),
                party: opt(p, "sandbox"),
                kind: opt(p, "kind"),
            };
            serde_json::to_value(data::log_page(&log, &q)?)?
        }
        "/api/entry" => match data::entry(&log, p.get("name").map_or("", String::as_str)) {
            Some(e) => serde_json::to_value(e)?,
            None => return Ok(None),
        },
        "/api/queues" => {
            let secrets = c.door.secrets(&c.root)?;
            data::queues(&c.root, &|b| secrets.mask_in(b))?
        }
        "/api/state" => json!({
            "sync": data::sync_state(&c.root, c.github_web.as_deref()),
            "radar": data::radar(&c.root),
        }),
        "/api/diff" => {
            let name = p.get("sandbox").map_or("", String::as_str);
            return Ok(Some(Answer {
                ctype: "text/plain; charset=utf-8",
                body: diff::diff(&c.root, name),
                tag: None,
            }));
        }
        _ => return Ok(None),
    };
    Ok(Some(Answer {
        ctype: "application/json",
        body: v.to_string(),
        tag: None,
    }))
}

fn field<'a>(v: &'a Value, k: &str) -> Result<&'a str> {
    v[k].as_str()
        .ok_or_else(|| Error::usage(format!("the request has no string field '{k}'")))
}

/// Answers a POST (an operator's action), or None for an unknown path.
pub(super) fn post(c: &Cockpit, path: &str, v: &Value) -> Result<Option<Value>> {
    let done = match path {
        "/api/answer" => {
            let m = actions::answer(&c.root, field(v, "id")?, field(v, "text")?, &c.operator)?;
            json!({ "answer": m.id })
        }
        "/api/release" => {
            let e = c.door.release(&c.root, field(v, "id")?)?;
            json!({ "action": e.decision.action.as_str(), "to": e.decision.to })
        }
        "/api/drop" => {
            let reason = v["reason"].as_str().unwrap_or("");
            let e = c
                .door
                .drop_held(&c.root, field(v, "id")?, reason, &c.operator)?;
            json!({ "action": e.decision.action.as_str(), "reason": e.decision.reason })
        }
        _ => return Ok(None),
    };
    Ok(Some(done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_decode() {
        let p = params(Some("sandbox=a%20b&kind=contract-change&x=%zz&y=1+2&z=%4"));
        assert_eq!(p["sandbox"], "a b");
        assert_eq!(p["kind"], "contract-change");
        assert_eq!(p["x"], "%zz");
        assert_eq!(p["y"], "1 2");
        assert_eq!(p["z"], "%4");
    }
}
