//! The stdio transport of lw-mcp: newline-delimited JSON-RPC 2.0 on standard
//! input and output, as the MCP specification's stdio transport defines it.
//!
//! rmcp ships a stdio transport, but it deliberately stays silent on input
//! that is not JSON (its issue #938) and answers well-formed JSON of the
//! wrong shape with -32600 and no id, so a client that sent `tools/call` with
//! broken params never learns which request failed.  JSON-RPC 2.0 asks for
//! -32700 (parse error), -32600 (invalid request), -32601 (method not found)
//! and -32602 (invalid params); this transport classifies every line and
//! answers those itself, and hands rmcp only messages it can decode.
//!
//! Reading happens in its own task, so rmcp's `receive` (polled inside a
//! `select!`) is a plain channel receive and never drops half a line.  A line
//! is bounded by [`MAX_LINE`]: a longer one is discarded up to its newline
//! without being buffered and answered with -32600 (naming the id when it
//! can be seen near the start of the line).  End of input ends the session;
//! an unterminated last line is classified like any other.

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{CallToolRequestParams, ClientJsonRpcMessage, ClientRequest};
use rmcp::service::TxJsonRpcMessage;
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc, watch};

/// Largest line (one JSON-RPC message) read whole: above the largest valid
/// `post` (a 256 KiB body can grow sixfold when JSON escapes it), and large
/// enough that a 10 MB argument is answered by the tool, naming the limit.
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// JSON-RPC 2.0 error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;

/// Methods of the MCP specification a client may send.  A request naming
/// one whose params do not decode gets -32602; any other method -32601.
const CLIENT_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "tools/call",
    "tools/list",
    "completion/complete",
    "logging/setLevel",
    "server/discover",
    "tasks/get",
    "tasks/list",
    "tasks/cancel",
    "tasks/result",
];

type Writer = Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>;

/// The transport handed to rmcp.
pub struct Stdio {
    rx: mpsc::Receiver<ClientJsonRpcMessage>,
    out: Writer,
}

/// What one line of input turned out to be.
#[derive(Debug)]
pub enum Line {
    /// A message rmcp can decode.
    Message(Box<ClientJsonRpcMessage>),
    /// An error response to send back (already a complete JSON-RPC object).
    Reply(Value),
    /// Nothing to do: a blank line, or a notification or response this
    /// server cannot use (JSON-RPC never answers a notification).
    Ignore,
}

impl Stdio {
    /// A transport over `input` and `output`.  `closed` becomes true when
    /// the input ends, so long-running tools (wait) can stop at once
    /// instead of holding the session open.
    pub fn new<R, W>(input: R, output: W, closed: watch::Sender<bool>) -> Stdio
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let out: Writer = Arc::new(Mutex::new(Box::new(output)));
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(read_loop(BufReader::new(input), tx, out.clone(), closed));
        Stdio { rx, out }
    }
}

async fn write_line(out: &Writer, mut bytes: Vec<u8>) -> std::io::Result<()> {
    bytes.push(b'\n');
    let mut w = out.lock().await;
    w.write_all(&bytes).await?;
    w.flush().await
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut input: BufReader<R>,
    tx: mpsc::Sender<ClientJsonRpcMessage>,
    out: Writer,
    closed: watch::Sender<bool>,
) {
    let mut line = Vec::new();
    // rmcp ends the session when anything but a request comes before
    // `initialize`; a stray notification there is dropped instead.
    let mut initialized = false;
    loop {
        let step = read_bounded(&mut input, &mut line).await;
        let last = matches!(step, Read::LastLine);
        let class = match step {
            Read::Line | Read::LastLine => classify(&line),
            Read::TooLong(head) => Line::Reply(error_reply(
                peek_id(&head),
                INVALID_REQUEST,
                format!(
                    "message is larger than {MAX_LINE} bytes; send smaller arguments (a message body is at most 262144 bytes)"
                ),
            )),
            Read::Eof | Read::Failed => break,
        };
        line.clear();
        match class {
            Line::Message(m) if !initialized && !matches!(*m, ClientJsonRpcMessage::Request(_)) => {
            }
            Line::Message(m) => {
                initialized |= matches!(&*m, ClientJsonRpcMessage::Request(_));
                if tx.send(*m).await.is_err() {
                    break;
                }
            }
            Line::Reply(v) => {
                let bytes = serde_json::to_vec(&v).expect("a JSON value serialises");
                if write_line(&out, bytes).await.is_err() {
                    break;
                }
            }
            Line::Ignore => {}
        }
        if last {
            break;
        }
    }
    let _ = closed.send(true);
}

enum Read {
    /// A whole line ending in a newline is in the buffer.
    Line,
    /// The input ended after a line without a newline (a truncated frame).
    LastLine,
    /// The line was longer than [`MAX_LINE`] and was skipped; its first bytes.
    TooLong(Vec<u8>),
    Eof,
    Failed,
}

/// Reads one line into `buf` without ever holding more than [`MAX_LINE`].
async fn read_bounded<R: AsyncRead + Unpin>(input: &mut BufReader<R>, buf: &mut Vec<u8>) -> Read {
    let mut discarding: Option<Vec<u8>> = None;
    loop {
        let avail = match input.fill_buf().await {
            Ok(a) => a,
            Err(_) => return Read::Failed,
        };
        if avail.is_empty() {
            return match discarding {
                Some(head) => Read::TooLong(head),
                None if buf.is_empty() => Read::Eof,
                None => Read::LastLine,
            };
        }
        let nl = avail.iter().position(|b| *b == b'\n');
        let take = nl.map_or(avail.len(), |i| i + 1);
        if let Some(head) = discarding.as_mut() {
            if head.len() < 4096 {
                head.extend_from_slice(&avail[..take.min(4096 - head.len())]);
            }
        } else if buf.len() + take > MAX_LINE {
            let mut head = std::mem::take(buf);
            head.truncate(4096);
            discarding = Some(head);
        } else {
            buf.extend_from_slice(&avail[..take]);
        }
        input.consume(take);
        if nl.is_some() {
            return match discarding {
                Some(head) => Read::TooLong(head),
                None => Read::Line,
            };
        }
    }
}

fn error_reply(id: Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Decides what one line of input is and what, if anything, to answer.
pub fn classify(raw: &[u8]) -> Line {
    let mut line = raw.strip_suffix(b"\n").unwrap_or(raw);
    line = line.strip_suffix(b"\r").unwrap_or(line);
    line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Line::Ignore;
    }
    let v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Line::Reply(error_reply(
                Value::Null,
                PARSE_ERROR,
                format!("parse error: not JSON ({e}); send one JSON-RPC object per line"),
            ));
        }
    };
    let Some(obj) = v.as_object() else {
        let what = if v.is_array() {
            "a batch (JSON array); MCP sends one object per line"
        } else {
            "not a JSON object"
        };
        return Line::Reply(error_reply(
            Value::Null,
            INVALID_REQUEST,
            format!("invalid request: {what}"),
        ));
    };
    if let Some(refused) = check_envelope(obj) {
        return refused;
    }
    decode(&v, obj)
}

/// The JSON-RPC envelope: `jsonrpc` is "2.0", `method` a string, a
/// request's id a string or a number.  The answer refusing it, if any.
fn check_envelope(obj: &serde_json::Map<String, Value>) -> Option<Line> {
    let id = obj.get("id").cloned();
    let id_ok = matches!(&id, Some(Value::Number(_)) | Some(Value::String(_)));
    let method = obj.get("method");
    if obj.get("jsonrpc") != Some(&Value::String("2.0".into())) {
        return Some(Line::Reply(error_reply(
            if id_ok {
                id.unwrap_or_default()
            } else {
                Value::Null
            },
            INVALID_REQUEST,
            "invalid request: \"jsonrpc\" must be \"2.0\"".into(),
        )));
    }
    match method {
        Some(Value::String(_)) | None => {}
        Some(_) => {
            return Some(Line::Reply(error_reply(
                if id_ok {
                    id.unwrap_or_default()
                } else {
                    Value::Null
                },
                INVALID_REQUEST,
                "invalid request: \"method\" must be a string".into(),
            )));
        }
    }
    if method.is_some() && id.is_some() && !id_ok {
        return Some(Line::Reply(error_reply(
            Value::Null,
            INVALID_REQUEST,
            "invalid request: \"id\" must be a string or a number".into(),
        )));
    }
    None
}

/// A sound envelope decoded as a client message, or the answer refusing it.
fn decode(v: &Value, obj: &serde_json::Map<String, Value>) -> Line {
    let id = obj.get("id").cloned();
    let id_ok = matches!(&id, Some(Value::Number(_)) | Some(Value::String(_)));
    let method = obj.get("method");
    match serde_json::from_value::<ClientJsonRpcMessage>(v.clone()) {
        // rmcp falls back to a custom request when a known method's params
        // do not decode; that is -32602, not an unknown method.
        Ok(ClientJsonRpcMessage::Request(r))
            if matches!(&r.request,
            ClientRequest::CustomRequest(c) if CLIENT_METHODS.contains(&c.method.as_str())) =>
        {
            let m = method.and_then(Value::as_str).unwrap_or_default();
            let why = match m {
                "tools/call" => serde_json::from_value::<CallToolRequestParams>(
                    obj.get("params").cloned().unwrap_or_default(),
                )
                .err()
                .map_or_else(
                    || "they do not match the method".to_string(),
                    |e| e.to_string(),
                ),
                _ => "they do not match the method".to_string(),
            };
            Line::Reply(error_reply(
                json!(r.id),
                INVALID_PARAMS,
                format!("invalid params for {m}: {why}"),
            ))
        }
        Ok(m) => Line::Message(Box::new(m)),
        Err(e) => match (method.and_then(Value::as_str), id) {
            // A notification is never answered, even a broken one.
            (Some(_), None) => Line::Ignore,
            (Some(m), Some(id)) if CLIENT_METHODS.contains(&m) => Line::Reply(error_reply(
                id,
                INVALID_PARAMS,
                format!("invalid params for {m}: {e}"),
            )),
            (Some(m), Some(id)) => Line::Reply(error_reply(
                id,
                METHOD_NOT_FOUND,
                format!(
                    "method not found: {m}; lw-mcp serves initialize, ping, tools/list and tools/call"
                ),
            )),
            // A response to a request this server never sent.
            (None, Some(_)) if obj.contains_key("result") || obj.contains_key("error") => {
                Line::Ignore
            }
            (None, id) => Line::Reply(error_reply(
                id.filter(|_| id_ok).unwrap_or_default(),
                INVALID_REQUEST,
                "invalid request: no \"method\"".into(),
            )),
        },
    }
}

/// The request id of an over-long line, when it appears in its first bytes
/// (clients write `{"jsonrpc":"2.0","id":7,"method":...`), else null.
fn peek_id(head: &[u8]) -> Value {
    let text = String::from_utf8_lossy(head);
    let Some(at) = text.find("\"id\"") else {
        return Value::Null;
    };
    let rest = text[at + 4..].trim_start();
    let Some(rest) = rest.strip_prefix(':') else {
        return Value::Null;
    };
    let rest = rest.trim_start();
    let end = if let Some(quoted) = rest.strip_prefix('"') {
        quoted.find('"').map(|i| i + 2)
    } else {
        rest.find(|c: char| !(c.is_ascii_digit() || c == '-'))
    };
    end.and_then(|e| serde_json::from_str::<Value>(&rest[..e]).ok())
        .filter(|v| v.is_number() || v.is_string())
        .unwrap_or(Value::Null)
}

impl Transport<RoleServer> for Stdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        async move {
            let bytes = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            write_line(&out, bytes).await
        }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.rx.recv().await
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.rx.close();
        self.out.lock().await.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(l: Line) -> Value {
        match l {
            Line::Reply(v) => v,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn each_kind_of_bad_line_gets_its_code() {
        let code = |s: &str| reply(classify(s.as_bytes()))["error"]["code"].as_i64();
        assert_eq!(code("{\"jsonrpc\":"), Some(PARSE_ERROR));
        assert_eq!(code("\x00\x01garbage"), Some(PARSE_ERROR));
        assert_eq!(code("[1,2]"), Some(INVALID_REQUEST));
        assert_eq!(code("7"), Some(INVALID_REQUEST));
        assert_eq!(
            code(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            Some(INVALID_REQUEST)
        );
        let v = reply(classify(
            br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":5}}"#,
        ));
        assert_eq!(
            (v["id"].as_i64(), v["error"]["code"].as_i64()),
            (Some(4), Some(INVALID_PARAMS))
        );
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Line::Message(_)
        ));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","method":"tools/call","params":7}"#),
            Line::Ignore
        ));
        assert!(matches!(classify(b"  \r\n"), Line::Ignore));
        assert!(matches!(
            classify(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Line::Message(_)
        ));
    }

    #[test]
    fn the_id_of_an_overlong_line_is_found_near_its_start() {
        assert_eq!(
            peek_id(br#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"#),
            json!(17)
        );
        assert_eq!(peek_id(br#"{"id": "a-1", "x"#), json!("a-1"));
        assert_eq!(peek_id(br#"{"jsonrpc":"2.0","method":"x"#), Value::Null);
    }
}
