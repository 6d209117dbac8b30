//! The agent's output cut into lines with a bound: a line longer than
//! [`MAX_LINE`] keeps its first `MAX_LINE` bytes and counts the rest, so an
//! agent that prints without a newline cannot make the host hold its
//! output in memory.  Each byte is looked at once.

/// The longest line kept whole: 8 MiB, well above the agents' largest
/// JSON events (a file's contents in a tool result).
pub(crate) const MAX_LINE: usize = 8 << 20;

/// A line splitter for one stream.
pub(crate) struct Lines {
    buf: Vec<u8>,
    /// Bytes of the current line dropped past the bound, once it is passed.
    cut: Option<u64>,
    max: usize,
}

impl Lines {
    pub(crate) fn new(max: usize) -> Lines {
        Lines {
            buf: Vec::new(),
            cut: None,
            max,
        }
    }

    /// Takes `bytes` and hands each line completed by them to `out`, with
    /// the count of its bytes dropped (0 for a whole line), newline removed.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], out: &mut dyn FnMut(&[u8], u64)) {
        loop {
            let nl = bytes.iter().position(|&c| c == b'\n');
            let end = nl.unwrap_or(bytes.len());
            match &mut self.cut {
                Some(n) => *n += end as u64,
                None => {
                    let room = self.max - self.buf.len();
                    if end <= room {
                        self.buf.extend_from_slice(&bytes[..end]);
                    } else {
                        self.buf.extend_from_slice(&bytes[..room]);
                        self.cut = Some((end - room) as u64);
                    }
                }
            }
            let Some(i) = nl else { return };
            out(&self.buf, self.cut.take().unwrap_or(0));
            self.buf.clear();
            bytes = &bytes[i + 1..];
        }
    }

    /// Hands the last line, if it had no newline, to `out`.
    pub(crate) fn finish(&mut self, out: &mut dyn FnMut(&[u8], u64)) {
        if !self.buf.is_empty() || self.cut.is_some() {
            out(&self.buf, self.cut.take().unwrap_or(0));
            self.buf.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(max: usize, chunks: &[&[u8]]) -> Vec<(String, u64)> {
        let mut got = Vec::new();
        let mut lines = Lines::new(max);
        let mut out = |l: &[u8], d: u64| got.push((String::from_utf8_lossy(l).into_owned(), d));
        for c in chunks {
            lines.feed(c, &mut out);
        }
        lines.finish(&mut out);
        got
    }

    #[test]
    fn lines_across_chunks_and_the_last_without_a_newline() {
        let got = split(100, &[b"ab", b"c\nd", b"\n\nef"]);
        let want = [("abc", 0), ("d", 0), ("", 0), ("ef", 0)];
        let want: Vec<(String, u64)> = want.iter().map(|(s, d)| (s.to_string(), *d)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_line_past_the_bound_keeps_its_head_and_counts_the_rest() {
        // 10 bytes allowed; a 25-byte line in three chunks, then a short one.
        let got = split(10, &[b"0123456", b"789abcdefghij", b"klmno\nxy\n"]);
        assert_eq!(got[0], ("0123456789".to_string(), 15));
        assert_eq!(got[1], ("xy".to_string(), 0));
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn an_endless_line_holds_no_more_than_the_bound() {
        let mut lines = Lines::new(1 << 10);
        let chunk = vec![b'x'; 64 << 10];
        let mut seen = 0;
        for _ in 0..256 {
            lines.feed(&chunk, &mut |_, _| seen += 1);
            assert!(lines.buf.len() <= 1 << 10);
        }
        assert_eq!(seen, 0);
        let mut last = None;
        lines.finish(&mut |l, d| last = Some((l.len(), d)));
        assert_eq!(last, Some((1 << 10, (256u64 * (64 << 10)) - (1 << 10))));
    }
}
