//! Reading comments back: lw-sync's sections parsed structurally (header,
//! fence, body, closing fence; never a text search), entries reassembled
//! from their parts and checked against their digests, and people's
//! `/lw answer ID` lines.

use std::collections::BTreeMap;

use super::format::{
    EntryHead, HEADER_PREFIX, HEADER_SUFFIX, Head, Section, entry_digest, unquiet,
};
use base::digest::sha256_hex;
use mailbox::log::{Decision, Entry, LOG_VERSION};
use mailbox::message::{self, Message};

/// Parses a comment written by lw-sync.  None when the comment does not
/// start with a header (a person's comment); Err when it starts like one but
/// its structure is broken.
pub fn parse_comment(text: &str) -> Option<std::result::Result<Vec<Section>, String>> {
    let mut rest = text;
    let mut sections = Vec::new();
    loop {
        rest = skip_blank(rest);
        if rest.is_empty() {
            return Some(Ok(sections));
        }
        let (line, after) = split_line(rest);
        let n = sections.len();
        let head = match parse_head(line, n) {
            Ok(Some(h)) => h,
            Ok(None) if n == 0 => return None,
            Ok(None) => return Some(Err(format!("text after section {n} is not a header"))),
            Err(e) => return Some(Err(e)),
        };
        rest = after;
        let fence = match &head {
            Head::Entry(h) => h.fence.clone(),
            Head::Notice(_) | Head::Host(_) => String::new(),
        };
        let chunk = if fence.is_empty() {
            // Readable lines up to the next header or the end.
            rest = skip_readable(rest);
            String::new()
        } else {
            match fenced_body(rest, &fence, n + 1) {
                Ok((chunk, after)) => {
                    rest = after;
                    chunk
                }
                Err(e) => return Some(Err(e)),
            }
        };
        sections.push(Section { head, chunk });
    }
}

/// `rest` after its blank lines and separators.
fn skip_blank(mut rest: &str) -> &str {
    loop {
        let (line, after) = split_line(rest);
        if rest.is_empty() || !(line.trim().is_empty() || line.trim() == "---") {
            return rest;
        }
        rest = after;
    }
}

/// `rest` from the next header line on (or empty).
fn skip_readable(mut rest: &str) -> &str {
    loop {
        let (l, a) = split_line(rest);
        if rest.is_empty() || l.starts_with(HEADER_PREFIX) {
            return rest;
        }
        rest = a;
    }
}

/// The head on `line`, the header of section `n` + 1; None when the line is
/// not a header at all.
fn parse_head(line: &str, n: usize) -> std::result::Result<Option<Head>, String> {
    let line = line.trim_end_matches('\r');
    let Some(json) = line
        .strip_prefix(HEADER_PREFIX)
        .and_then(|l| l.strip_suffix(HEADER_SUFFIX))
    else {
        return Ok(None);
    };
    serde_json::from_str(json).map(Some).map_err(|e| {
        if n == 0 {
            format!("header is not valid: {e}")
        } else {
            format!("header {} is not valid: {e}", n + 1)
        }
    })
}

/// The body of section `k` in its fenced code block at the start of
/// `rest`, and what follows the closing fence.
fn fenced_body<'a>(
    rest: &'a str,
    fence: &str,
    k: usize,
) -> std::result::Result<(String, &'a str), String> {
    if fence.len() < 3 || !(fence.bytes().all(|b| b == b'`') || fence.bytes().all(|b| b == b'~')) {
        return Err(format!("section {k} names an invalid fence"));
    }
    let open = format!("{fence}text");
    let mut rest = rest;
    loop {
        let (l, a) = split_line(rest);
        if rest.is_empty() {
            return Err(format!("section {k} has no body"));
        }
        rest = a;
        if l.trim_end_matches('\r') == open {
            break;
        }
    }
    // The closing fence: a line that is exactly the fence.
    let mut search = 0;
    loop {
        let Some(i) = rest[search..].find(&format!("\n{fence}")) else {
            return Err(format!("section {k} body is not closed"));
        };
        let end = search + i + 1 + fence.len();
        let tail = &rest[end..];
        if tail.is_empty() || tail.starts_with('\n') || tail.starts_with("\r\n") {
            let i = search + i;
            return Ok((rest[..i].to_string(), &rest[i + 1 + fence.len()..]));
        }
        search = end;
    }
}

fn split_line(s: &str) -> (&str, &str) {
    match s.find('\n') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    }
}

/// Entry name -> the entry rebuilt from GitHub and the ids of its comments.
pub type Rebuilt = BTreeMap<String, (Entry, Vec<u64>)>;

/// Rebuilds log entries from the sections of a list of comments.
/// Returns the complete entries and, for incomplete ones, the parts found.
pub fn reassemble(sections: &[(u64, Section)]) -> (Rebuilt, BTreeMap<String, String>) {
    let mut parts: BTreeMap<String, BTreeMap<u32, (EntryHead, String, u64)>> = BTreeMap::new();
    for (cid, s) in sections {
        if let Head::Entry(h) = &s.head {
            parts
                .entry(h.entry.clone())
                .or_default()
                .entry(h.part[0])
                .or_insert((h.clone(), s.chunk.clone(), *cid));
        }
    }
    let mut done = BTreeMap::new();
    let mut broken = BTreeMap::new();
    for (name, ps) in parts {
        let first = &ps
            .values()
            .next()
            .expect("a map entry has at least one part")
            .0;
        let n = first.part[1];
        if ps.len() as u32 != n || !(1..=n).all(|i| ps.contains_key(&i)) {
            broken.insert(name, format!("{} of {n} parts on GitHub", ps.len()));
            continue;
        }
        let body: String = ps.values().map(|(_, c, _)| c.as_str()).collect();
        let h = &ps[&1].0;
        let body = if h.v >= 3 { unquiet(&body) } else { body };
        if h.v < 2
            && h.sha256
                .as_deref()
                .is_some_and(|s| s != sha256_hex(body.as_bytes()))
        {
            broken.insert(
                name,
                "body does not match its SHA-256 (edited on GitHub?)".into(),
            );
            continue;
        }
        if h.v >= 2 && ps.values().any(|(p, _, _)| p.sha256 != h.sha256) {
            broken.insert(
                name,
                "its parts carry different digests (edited on GitHub?)".into(),
            );
            continue;
        }
        let e = rebuild(h, body);
        if h.v >= 2 && h.sha256.as_deref() != Some(entry_digest(&e).as_str()) {
            broken.insert(
                name,
                "header or body does not match its SHA-256 (edited on GitHub?)".into(),
            );
            continue;
        }
        done.insert(name, (e, ps.values().map(|(_, _, c)| *c).collect()));
    }
    (done, broken)
}

/// The log entry a complete set of sections stands for.
fn rebuild(h: &EntryHead, body: String) -> Entry {
    let message = h.msg.as_ref().map(|m| Message {
        version: message::VERSION,
        id: h.id.clone(),
        from: m.from.clone(),
        to: m.to.clone(),
        kind: m.kind,
        subject: m.subject.clone(),
        body,
        refs: m.refs.clone(),
        in_reply_to: m.in_reply_to.clone(),
        created: m.created.clone(),
    });
    Entry {
        version: LOG_VERSION,
        name: h.entry.clone(),
        logged: h.logged.clone(),
        message_id: h.id.clone(),
        sender: h.sender.clone(),
        message,
        decision: Decision {
            quiet: false,
            action: h.action,
            to: h.parties.clone(),
            reason: h.reason.clone(),
        },
    }
}

/// `/lw answer ID` lines and the text after each, up to the next such line.
pub fn parse_answers(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        let l = line.trim_end_matches('\r');
        if l.trim_start().starts_with("```") || l.trim_start().starts_with("~~~") {
            in_code = !in_code;
        }
        let cmd = if in_code {
            None
        } else {
            l.trim().strip_prefix("/lw answer ").map(str::trim)
        };
        match cmd {
            Some(id) if !id.is_empty() && !id.contains(char::is_whitespace) => {
                out.push((id.to_string(), String::new()))
            }
            _ => {
                if let Some((_, body)) = out.last_mut() {
                    body.push_str(l);
                    body.push('\n');
                }
            }
        }
    }
    for (_, body) in &mut out {
        let t = body.trim_matches('\n').to_string();
        *body = t;
    }
    out
}
