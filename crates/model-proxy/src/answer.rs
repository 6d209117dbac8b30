//! The proxy's own answers: a refusal in the shape of the provider's errors
//! (Anthropic's, OpenAI's for /v1/responses, Google's for the Gemini API),
//! so the agent's CLI shows and handles it as its own.  The JSON is written
//! as model-proxy.py's `json.dumps` wrote it (`", "` and `": "`), which the
//! tests and perhaps the agents' logs read.

use bytes::Bytes;
use serde_json::Value;

/// Which provider's error shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Anthropic,
    OpenAi,
    Google,
}

/// An answer instead of a forward: status, the provider's error type, why.
#[derive(Debug)]
pub struct Refuse {
    pub status: u16,
    pub kind: &'static str,
    pub why: String,
    pub retry: Option<u64>,
    /// Already logged (a `deny`, `nokey` or `fail` line), so not as `refuse`.
    pub logged: bool,
}

impl Refuse {
    pub fn new(status: u16, kind: &'static str, why: impl Into<String>) -> Refuse {
        Refuse {
            status,
            kind,
            why: why.into(),
            retry: None,
            logged: false,
        }
    }

    pub fn bad(why: impl Into<String>) -> Refuse {
        Refuse::new(400, "invalid_request_error", why)
    }

    pub fn retry(mut self, seconds: u64) -> Refuse {
        self.retry = Some(seconds);
        self
    }

    pub fn logged(mut self) -> Refuse {
        self.logged = true;
        self
    }

    /// The error document, in `shape`.
    pub fn body(&self, shape: Shape) -> Bytes {
        let msg = Value::from(format!("lw-model-proxy: {}", self.why));
        let kind = Value::from(self.kind);
        let doc = match shape {
            Shape::OpenAi => obj(vec![(
                "error",
                obj(vec![
                    ("message", msg),
                    ("type", kind.clone()),
                    ("param", Value::Null),
                    ("code", kind),
                ]),
            )]),
            Shape::Google => obj(vec![(
                "error",
                obj(vec![
                    ("code", Value::from(self.status)),
                    ("message", msg),
                    ("status", Value::from(google_status(self.status))),
                ]),
            )]),
            Shape::Anthropic => obj(vec![
                ("type", Value::from("error")),
                ("error", obj(vec![("type", kind), ("message", msg)])),
            ]),
        };
        let mut out = String::new();
        python_json(&doc, &mut out);
        Bytes::from(out)
    }

    /// The whole answer as bytes on the wire, for refusals made before
    /// hyper has the connection (the head gate, too many connections).
    pub fn raw(&self, shape: Shape) -> Vec<u8> {
        let body = self.body(shape);
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.status,
            reason(self.status),
            body.len()
        );
        if let Some(r) = self.retry {
            head.push_str(&format!("Retry-After: {r}\r\n"));
        }
        head.push_str("Connection: close\r\n\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(&body);
        out
    }
}

/// Google's status names for the answers the proxy gives.
fn google_status(status: u16) -> &'static str {
    match status {
        400 | 413 | 431 => "INVALID_ARGUMENT",
        403 => "PERMISSION_DENIED",
        429 => "RESOURCE_EXHAUSTED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        _ => "UNKNOWN",
    }
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// An object keeping its keys in the order given (serde_json's map sorts).
fn obj(fields: Vec<(&str, Value)>) -> Value {
    Value::Array(
        fields
            .into_iter()
            .map(|(k, v)| Value::Array(vec![Value::from(format!("\u{0}{k}")), v]))
            .collect(),
    )
}

/// Writes `v` as Python's `json.dumps` does: `", "` between items, `": "`
/// after a key, non-ASCII escaped.  An array of `[ "\0key", value ]` pairs
/// is an object (see [`obj`]).
fn python_json(v: &Value, out: &mut String) {
    match v {
        Value::Array(items) if items.iter().all(is_field) && !items.is_empty() => {
            out.push('{');
            for (i, f) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let key = f[0].as_str().unwrap_or_default().trim_start_matches('\0');
                python_string(key, out);
                out.push_str(": ");
                python_json(&f[1], out);
            }
            out.push('}');
        }
        Value::String(s) => python_string(s, out),
        other => out.push_str(&other.to_string()),
    }
}

fn is_field(v: &Value) -> bool {
    matches!(v, Value::Array(p) if p.len() == 2 && p[0].as_str().is_some_and(|k| k.starts_with('\0')))
}

fn python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_written_as_python_wrote_them() {
        let r = Refuse::new(
            403,
            "permission_error",
            "only POST /v1/messages is forwarded",
        );
        assert_eq!(
            r.body(Shape::Anthropic),
            "{\"type\": \"error\", \"error\": {\"type\": \"permission_error\", \"message\": \"lw-model-proxy: only POST /v1/messages is forwarded\"}}"
        );
        assert_eq!(
            r.body(Shape::Google),
            "{\"error\": {\"code\": 403, \"message\": \"lw-model-proxy: only POST /v1/messages is forwarded\", \"status\": \"PERMISSION_DENIED\"}}"
        );
        assert_eq!(
            r.body(Shape::OpenAi),
            "{\"error\": {\"message\": \"lw-model-proxy: only POST /v1/messages is forwarded\", \"type\": \"permission_error\", \"param\": null, \"code\": \"permission_error\"}}"
        );
    }
}
