//! JSON with comments and trailing commas (the dialect devcontainer.json is
//! written in), read by turning it into plain JSON and handing that to
//! serde_json.
//!
//! The pass walks the text once, knowing at each byte whether it is inside a
//! string: there `//`, `/*` and `,` are text, and an escaped quote does not
//! end the string.  Outside a string a comment becomes spaces (its newlines
//! kept), and a comma whose next significant byte is `}` or `]` becomes a
//! space, so serde_json's line and column in an error are the file's own.
//! An unterminated block comment or string is an error here, at the line
//! it starts on.

/// Where a JSONC text is malformed: 1-based line and column, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsoncError {
    pub line: usize,
    pub column: usize,
    pub msg: String,
}

impl std::fmt::Display for JsoncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {} column {}: {}", self.line, self.column, self.msg)
    }
}

/// Parses JSONC `text` (a leading byte-order mark allowed).
pub fn parse(text: &str) -> Result<serde_json::Value, JsoncError> {
    let plain = strip(text)?;
    serde_json::from_str(&plain).map_err(|e| JsoncError {
        line: e.line(),
        column: e.column(),
        msg: e.to_string().split(" at line ").next().unwrap_or("").into(),
    })
}

fn at(b: &[u8], i: usize, msg: &str) -> JsoncError {
    let before = &b[..i];
    let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
    let column = i - before
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |p| p + 1)
        + 1;
    JsoncError {
        line,
        column,
        msg: msg.into(),
    }
}

/// The same text as plain JSON: comments and trailing commas blanked.
pub fn strip(text: &str) -> Result<String, JsoncError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let b = text.as_bytes();
    let mut out = b.to_vec();
    // The byte offset of a comma not yet known to be trailing.
    let mut comma: Option<usize> = None;
    // The last significant byte: a comma after `[`, `{` or `,` is no
    // trailing comma but an error serde_json reports.
    let mut last = b'[';
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let start = i;
                i += 1;
                loop {
                    match b.get(i) {
                        None => return Err(at(b, start, "unterminated string")),
                        Some(b'\\') => i += 2,
                        Some(b'"') => break,
                        Some(_) => i += 1,
                    }
                }
                comma = None;
                last = b'"';
                i += 1;
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    out[i] = b' ';
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start = i;
                let end = text[i + 2..]
                    .find("*/")
                    .map(|n| i + 2 + n + 2)
                    .ok_or_else(|| at(b, start, "unterminated /* comment"))?;
                for c in &mut out[i..end] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
                i = end;
                continue;
            }
            b',' if !matches!(last, b'[' | b'{' | b',') => comma = Some(i),
            b',' => comma = None,
            b'}' | b']' => {
                if let Some(c) = comma.take() {
                    out[c] = b' ';
                }
            }
            c if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            _ => comma = None,
        }
        last = b[i];
        i += 1;
    }
    // Only ASCII bytes were replaced, by ASCII: still UTF-8.
    Ok(String::from_utf8(out).expect("blanking ASCII keeps UTF-8 valid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn comments_and_trailing_commas_go_and_strings_keep_what_looks_like_them() {
        let cases: &[(&str, serde_json::Value)] = &[
            ("{}", json!({})),
            ("\u{feff}{\"a\": 1}", json!({"a": 1})),
            ("// top\n{\"a\": 1, // after\n}", json!({"a": 1})),
            ("{\"a\": [1, 2, ], }", json!({"a": [1, 2]})),
            (
                "{\"a\": [1, 2 /* x */ , /* y */ ] , /* z */ }",
                json!({"a": [1, 2]}),
            ),
            ("{\"u\": \"http://x//y\"}", json!({"u": "http://x//y"})),
            (
                "{\"c\": \"/* not */ a comment\"}",
                json!({"c": "/* not */ a comment"}),
            ),
            (
                "{\"q\": \"say \\\"//\\\" ,}\"}",
                json!({"q": "say \"//\" ,}"}),
            ),
            (
                "{\"b\": \"a\\\\\", \"c\": \"//\"}",
                json!({"b": "a\\", "c": "//"}),
            ),
            ("{\"k\": \",]\" ,\n}", json!({"k": ",]"})),
            ("{/**/\"a\"/**/:/**/1/**/}", json!({"a": 1})),
            ("{\"a\": \"é // ü\", // ß\n}", json!({"a": "é // ü"})),
            ("{\"a\": 1}\n// end without newline", json!({"a": 1})),
            ("{\"a\": 1 /* ** / */}", json!({"a": 1})),
        ];
        for (text, want) in cases {
            assert_eq!(&parse(text).expect(text), want, "{text}");
        }
    }

    #[test]
    fn malformed_text_is_named_at_its_line() {
        let cases: &[(&str, usize, &str)] = &[
            ("{\n\"a\": /* open\n}", 2, "unterminated /* comment"),
            ("{\n\n\"a\": \"open}", 3, "unterminated string"),
            ("{\"a\": 1,,}", 1, "key must be a string"),
            ("{\n\"a\": 1\n\"b\": 2}", 3, "expected `,`"),
            ("[1, 2", 1, "EOF"),
            // A lone comma is not a trailing one.
            ("[,]", 1, "expected value"),
        ];
        for (text, line, msg) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, *line, "{text}: {e}");
            assert!(e.msg.contains(msg), "{text}: {e}");
        }
    }
}
