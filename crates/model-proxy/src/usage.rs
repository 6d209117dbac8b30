//! Reads the provider's `usage` out of an answer as it streams, for the
//! token caps.  Usage values are cumulative within one answer (Anthropic's
//! message_delta repeats output_tokens so far), so each field counts by its
//! largest value; what is new is charged as soon as it is seen, so a cap
//! crossed in the middle of an answer refuses every request after it.

use std::collections::BTreeMap;

use serde_json::Value;

/// Of a whole (not streamed) answer, or of one overlong line, the tail kept
/// to read its usage.
const TAIL: usize = 64 << 10;

/// Usage fields that are tokens the provider processed (OpenAI's
/// input_tokens already holds its cached ones; Anthropic's cache fields are
/// beside it).  Gemini's usageMetadata: the prompt (its cached part inside
/// it), the answer, the thinking and the tool-use prompt.
const TOKEN_FIELDS: &[&str] = &[
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "toolUsePromptTokenCount",
];

pub(crate) struct Usage {
    sse: bool,
    buf: Vec<u8>,
    skip: bool,
    seen: BTreeMap<&'static str, u64>,
    charged: u64,
}

impl Usage {
    pub(crate) fn new(sse: bool) -> Usage {
        Usage {
            sse,
            buf: Vec::new(),
            skip: false,
            seen: BTreeMap::new(),
            charged: 0,
        }
    }

    /// Takes the next bytes of the answer; returns the tokens newly seen.
    pub(crate) fn feed(&mut self, data: &[u8]) -> u64 {
        self.buf.extend_from_slice(data);
        let before = self.charged;
        if !self.sse {
            self.keep_tail();
            return 0;
        }
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=i).collect();
            let line = line.trim_ascii();
            if self.skip {
                // The end of a long line (OpenAI's whole response).
                self.skip = false;
                self.tail_usage(line);
            } else if let Some(data) = line.strip_prefix(b"data:")
                && let Ok(doc) = serde_json::from_slice::<Value>(data)
            {
                self.event(&doc);
            }
        }
        if self.buf.len() > TAIL {
            self.keep_tail();
            self.skip = true;
        }
        self.charged - before
    }

    /// The end of the answer; returns the tokens newly seen.
    pub(crate) fn finish(&mut self) -> u64 {
        let before = self.charged;
        if !self.sse {
            let buf = std::mem::take(&mut self.buf);
            self.tail_usage(&buf);
        }
        self.charged - before
    }

    fn keep_tail(&mut self) {
        if self.buf.len() > TAIL {
            self.buf.drain(..self.buf.len() - TAIL);
        }
    }

    fn usage(&mut self, u: &Value) {
        let Some(u) = u.as_object() else { return };
        for f in TOKEN_FIELDS {
            if let Some(v) = u.get(*f).and_then(Value::as_u64) {
                let e = self.seen.entry(f).or_default();
                *e = (*e).max(v);
            }
        }
        self.charged = self.charged.max(self.seen.values().sum());
    }

    fn event(&mut self, doc: &Value) {
        if !doc.is_object() {
            return;
        }
        self.usage(&doc["usage"]);
        self.usage(&doc["usageMetadata"]);
        for k in ["message", "response"] {
            self.usage(&doc[k]["usage"]);
        }
    }

    /// The last `usage` (or Gemini's `usageMetadata`) object in `data`.
    fn tail_usage(&mut self, data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let i = [text.rfind("\"usage\""), text.rfind("\"usageMetadata\"")]
            .into_iter()
            .flatten()
            .max();
        let Some(j) = i.and_then(|i| text[i..].find('{').map(|j| i + j)) else {
            return;
        };
        let mut it = serde_json::Deserializer::from_str(&text[j..]).into_iter::<Value>();
        if let Some(Ok(v)) = it.next() {
            self.usage(&v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_counts_each_field_by_its_largest_value() {
        let mut u = Usage::new(true);
        let a = u.feed(b"event: message_start\ndata: {\"message\": {\"usage\": {\"input_tokens\": 10, \"output_tokens\": 1}}}\n\n");
        assert_eq!(a, 11);
        let b = u.feed(b"data: {\"usage\": {\"output_tokens\": 5}}\n");
        assert_eq!(b, 4);
        let mut whole = Usage::new(false);
        assert_eq!(
            whole.feed(b"{\"usageMetadata\": {\"promptTokenCount\": 10, "),
            0
        );
        assert_eq!(whole.feed(b"\"candidatesTokenCount\": 5}}"), 0);
        assert_eq!(whole.finish(), 15);
    }
}
