//! The gate before hyper: reads a request head and refuses, strictly, what
//! hyper's parser tolerates for compatibility but a door should not.  hyper
//! (httparse) takes a bare LF as a line end, keeps one of two equal
//! `content-length` lines and quietly prefers `transfer-encoding` over
//! `content-length`; each is a way to make two readers of the same bytes
//! disagree (request smuggling).  The gate does not parse the request for
//! the proxy: it checks the head's bytes and header names, then hands every
//! byte it read to hyper, which parses it again.
//!
//! Refused 400: a bare CR, LF or NUL; a folded header line; a malformed
//! request or header line; a duplicate hop, framing or key header; both
//! `content-length` and `transfer-encoding`; a coding other than chunked; a
//! malformed `content-length`.  A head over [`HEAD_MAX`] is 431.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::answer::Refuse;

/// The largest request head.
pub(crate) const HEAD_MAX: usize = 32 << 10;

/// Headers that may appear once: a second one is how requests are smuggled
/// (or a second key slipped past the one that is dropped).
const SINGLE: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "content-length",
    "host",
    "expect",
    "authorization",
    "x-api-key",
    "x-goog-api-key",
];

/// Reads from `io` up to the end of the request head.  Returns every byte
/// read (the head and whatever followed it), `None` when the agent closed
/// before sending anything.
pub(crate) async fn read<R: AsyncRead + Unpin>(io: &mut R) -> Result<Option<Vec<u8>>, Refuse> {
    let mut buf = Vec::with_capacity(4096);
    let mut scanned = 0;
    let mut line_start = 0;
    let mut chunk = [0u8; 4096];
    loop {
        let n = io.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            if buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(None);
            }
            return Err(Refuse::bad("an incomplete request head"));
        }
        buf.extend_from_slice(&chunk[..n]);
        while let Some(i) = buf[scanned..].iter().position(|&b| b == b'\n') {
            let end = scanned + i;
            scanned = end + 1;
            if end == 0 || buf[end - 1] != b'\r' {
                // A bare LF: refused at once, not waited on for a CR LF CR LF
                // that never comes.
                return Err(Refuse::bad("a bare CR, LF or NUL in the request head"));
            }
            if end - 1 == line_start {
                if line_start == 0 {
                    return Err(Refuse::bad("a bare CR, LF or NUL in the request head"));
                }
                if line_start > HEAD_MAX {
                    return Err(too_big());
                }
                check(&buf[..line_start])?;
                return Ok(Some(buf));
            }
            line_start = scanned;
        }
        scanned = buf.len();
        if buf.len() > HEAD_MAX {
            return Err(too_big());
        }
    }
}

fn too_big() -> Refuse {
    Refuse::new(
        431,
        "invalid_request_error",
        format!("a request head over {HEAD_MAX} bytes"),
    )
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The head's lines (each without its CR LF), strictly.
fn check(head: &[u8]) -> Result<(), Refuse> {
    let text = head.strip_suffix(b"\r\n").unwrap_or(head);
    let mut lines = text
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().unwrap_or_default();
    let all: Vec<&[u8]> = std::iter::once(first).chain(lines).collect();
    if all.iter().any(|l| l.iter().any(|&b| b == b'\r' || b == 0)) {
        return Err(Refuse::bad("a bare CR, LF or NUL in the request head"));
    }
    let words: Vec<&[u8]> = first.split(|&b| b == b' ').collect();
    let [method, target, version] = words.as_slice() else {
        return Err(Refuse::bad("a malformed request line"));
    };
    if !matches!(*version, b"HTTP/1.1" | b"HTTP/1.0")
        || !is_token(method)
        || target.is_empty()
        || !target.iter().all(|b| b.is_ascii_graphic())
    {
        return Err(Refuse::bad("a malformed request line"));
    }
    let mut seen: Vec<String> = Vec::new();
    let (mut length, mut coding) = (None, None);
    for line in &all[1..] {
        if line.first().is_some_and(|&b| b == b' ' || b == b'\t') {
            return Err(Refuse::bad(
                "a folded header line (obsolete line folding is refused)",
            ));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(Refuse::bad("a malformed header line"));
        };
        if !is_token(&line[..colon]) {
            return Err(Refuse::bad("a malformed header line"));
        }
        let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
        if SINGLE.contains(&name.as_str()) && seen.contains(&name) {
            return Err(Refuse::bad(format!("a duplicate {name} header")));
        }
        let value = String::from_utf8_lossy(&line[colon + 1..])
            .trim_matches([' ', '\t'])
            .to_string();
        match name.as_str() {
            "content-length" => length = Some(value),
            "transfer-encoding" => coding = Some(value),
            _ => {}
        }
        seen.push(name);
    }
    match (length, coding) {
        (Some(_), Some(_)) => Err(Refuse::bad("both content-length and transfer-encoding")),
        (None, Some(c)) if !c.eq_ignore_ascii_case("chunked") => {
            Err(Refuse::bad("a transfer coding other than chunked"))
        }
        (Some(l), None)
            if l.is_empty() || l.len() > 15 || !l.bytes().all(|b| b.is_ascii_digit()) =>
        {
            Err(Refuse::bad("a malformed content-length"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn gate(raw: &str) -> Result<Option<Vec<u8>>, Refuse> {
        read(&mut raw.as_bytes()).await
    }

    #[tokio::test]
    async fn what_hyper_tolerates_the_gate_refuses() {
        for (raw, why) in [
            ("POST / HTTP/1.1\nHost: a\n\n", "bare"),
            ("POST / HTTP/1.1\r\nHost: a\r\n\n", "bare"),
            ("POST / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", "folded"),
            (
                "POST / HTTP/1.1\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n",
                "duplicate content-length",
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
                "both",
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                "other than chunked",
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\n",
                "malformed content-length",
            ),
            ("POST / HTTP/1.1\r\nX-A: b\rc\r\n\r\n", "bare"),
            ("POST  / HTTP/1.1\r\n\r\n", "request line"),
            ("POST / HTTP/2\r\n\r\n", "request line"),
            (
                "POST / HTTP/1.1\r\nx-api-key: a\r\nX-Api-Key: b\r\n\r\n",
                "duplicate x-api-key",
            ),
            ("\r\nPOST / HTTP/1.1\r\n\r\n", "bare"),
            ("POST / HTTP/1.1\r\nHost: a", "incomplete"),
        ] {
            let e = gate(raw).await.expect_err(raw);
            assert_eq!(e.status, 400, "{raw:?}");
            assert!(e.why.contains(why), "{raw:?}: {}", e.why);
        }
        let big = format!("POST / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(HEAD_MAX));
        assert_eq!(gate(&big).await.unwrap_err().status, 431);
        let ok = "POST /v1/messages HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(gate(ok).await.unwrap().unwrap(), ok.as_bytes());
        assert!(gate("").await.unwrap().is_none());
    }
}
