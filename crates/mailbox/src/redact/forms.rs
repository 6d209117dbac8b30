//! The disguises of a secret value, and finding them in text.
//!
//! A value is looked for in five spellings (patterns), each a sequence of
//! units, each unit a few alternatives:
//!
//! * **literal**: one unit per character, spelled as itself (ASCII case
//!   ignored), as `%XX` per UTF-8 byte (either case), or as a JSON escape
//!   (`\uXXXX` per UTF-16 unit, or `\"`, `\\`, `\/`, `\n`...); so the
//!   upper- and lower-case value, its percent-encoding and its JSON escapes,
//!   whole or mixed with plain characters, are one pattern.  A whitespace
//!   character of the value may also be absent (`+` stands for a space).
//! * **hex**: one unit per byte, `hh` (either case) or `\xhh`.
//! * **base64**, three patterns: the secret may start at byte 0, 1 or 2 of
//!   a 3-byte group of whatever blob was encoded, and for each alignment
//!   the characters fully determined by the secret's bits alone are the
//!   pattern (those that mix in a neighbour's bits are not, and stay).
//!   `+`/`-` and `/`/`_` are interchangeable, so standard and URL-safe
//!   base64 are one pattern.
//!
//! Between any two units, any run of ASCII whitespace is allowed: a value
//! split by spaces or line breaks, or base64 wrapped as MIME does, still
//! matches.  No alternative begins with whitespace, so skipping it greedily
//! loses no match.
//!
//! The search tries a pattern only where its first two bytes can begin it:
//! a byte that can start some pattern, then the pair of it and the next
//! byte that is not whitespace (a bit per pair for all patterns), then a
//! table from the first byte to its patterns, each with a bit set of what
//! may come next; only then does it walk the units.  Ordinary text rarely
//! gets past the pair.  A few alternatives can both
//! match at one place (a plain `%` and `%25`); the walk then remembers the
//! (unit, position) pairs it has tried, so each is tried once, and the work
//! per start is at most units x span, as a naive string search's is.

use std::collections::HashSet;

/// One way to spell a unit.
struct Alt {
    bytes: Box<[u8]>,
    /// Compare ignoring ASCII case.
    fold: bool,
}

impl Alt {
    fn new(bytes: impl Into<Vec<u8>>, fold: bool) -> Alt {
        Alt {
            bytes: bytes.into().into_boxed_slice(),
            fold,
        }
    }

    fn at(&self, t: &[u8], q: usize) -> bool {
        let b = &*self.bytes;
        t.len() - q >= b.len()
            && if self.fold {
                t[q..q + b.len()].eq_ignore_ascii_case(b)
            } else {
                &t[q..q + b.len()] == b
            }
    }
}

/// One position of a pattern: its spellings.
struct Unit(Vec<Alt>);

/// One spelling of one secret.
struct Pattern {
    secret: u32,
    units: Vec<Unit>,
    /// The bytes that can come after its first byte, whitespace skipped.
    second: Bytes,
}

/// A set of bytes.
#[derive(Clone, Copy, Default)]
struct Bytes([u64; 4]);

impl Bytes {
    fn add(&mut self, b: u8, fold: bool) {
        for b in [
            b,
            if fold { b.to_ascii_uppercase() } else { b },
            if fold { b.to_ascii_lowercase() } else { b },
        ] {
            self.0[b as usize >> 6] |= 1 << (b & 63);
        }
    }

    fn has(&self, b: u8) -> bool {
        self.0[b as usize >> 6] & (1 << (b & 63)) != 0
    }
}

/// Every pattern of every secret, indexed by the bytes that can begin them.
#[derive(Default)]
pub(super) struct Matcher {
    patterns: Vec<Pattern>,
    /// Byte -> the patterns whose first unit can begin with it.
    first: Vec<Vec<u32>>,
    /// The bytes some pattern can begin with.
    starts: Bytes,
    /// Bit `b0 * 256 + b1`: some pattern can begin with b0 and go on with b1.
    pairs: Vec<u64>,
}

/// A match: bytes `start..end` of the text are a spelling of secret `secret`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub start: usize,
    pub end: usize,
    pub secret: u32,
}

impl Matcher {
    /// The patterns of `values` (secret i is `values[i]`).
    pub(super) fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Matcher {
        let mut patterns = Vec::new();
        for (i, v) in values.into_iter().enumerate() {
            let reversed: String = v.chars().rev().collect();
            let mut forms = vec![literal(v), hex(v.as_bytes()), literal(&reversed)];
            if rot13(v) != v {
                forms.push(literal(&rot13(v)));
            }
            forms.extend((0..3).map(|a| base64(v.as_bytes(), a)));
            forms.extend((0..5).map(|a| base32(v.as_bytes(), a)));
            // A pattern of one unit would need no second byte: values
            // are at least 6 bytes, so none is that short.
            for units in forms.into_iter().filter(|u| u.len() >= 2) {
                let mut second = Bytes::default();
                for a in &units[0].0 {
                    match a.bytes.get(1) {
                        Some(&b) => second.add(b, a.fold),
                        None => {
                            // The next unit's first byte, or, when that
                            // unit may be empty, the one after's too.
                            for u in &units[1..] {
                                for n in &u.0 {
                                    if let Some(&b) = n.bytes.first() {
                                        second.add(b, n.fold);
                                    }
                                }
                                if u.0.iter().all(|n| !n.bytes.is_empty()) {
                                    break;
                                }
                            }
                        }
                    }
                }
                patterns.push(Pattern {
                    secret: i as u32,
                    units,
                    second,
                });
            }
        }
        let mut first = vec![Vec::new(); 256];
        let mut pairs = vec![0u64; 1024];
        let mut all = Bytes::default();
        for (i, p) in patterns.iter().enumerate() {
            let mut starts = Bytes::default();
            for a in &p.units[0].0 {
                starts.add(a.bytes[0], a.fold);
                all.add(a.bytes[0], a.fold);
            }
            for b0 in (0..=255u8).filter(|b| starts.has(*b)) {
                first[b0 as usize].push(i as u32);
                for b1 in (0..=255u8).filter(|b| p.second.has(*b)) {
                    let k = (b0 as usize) << 8 | b1 as usize;
                    pairs[k >> 6] |= 1 << (k & 63);
                }
            }
        }
        Matcher {
            patterns,
            first,
            starts: all,
            pairs,
        }
    }

    /// Every match in `t`, in order of start (`first_only`: the first one).
    pub(super) fn spans(&self, t: &[u8], first_only: bool) -> Vec<Span> {
        let mut out = Vec::new();
        if self.patterns.is_empty() {
            return out;
        }
        for i in 0..t.len().saturating_sub(1) {
            let b0 = t[i];
            if !self.starts.has(b0) {
                continue;
            }
            let Some(&b1) = t.get(skip_ws(t, i + 1)) else {
                continue;
            };
            let k = (b0 as usize) << 8 | b1 as usize;
            if self.pairs[k >> 6] & (1 << (k & 63)) == 0 {
                continue;
            }
            for &pi in &self.first[b0 as usize] {
                let p = &self.patterns[pi as usize];
                if !p.second.has(b1) {
                    continue;
                }
                if let Some(end) = match_at(&p.units, t, i) {
                    out.push(Span {
                        start: i,
                        end,
                        secret: p.secret,
                    });
                    if first_only {
                        return out;
                    }
                }
            }
        }
        out
    }
}

fn skip_ws(t: &[u8], mut p: usize) -> usize {
    while p < t.len() && t[p].is_ascii_whitespace() {
        p += 1;
    }
    p
}

/// The end of a match of `units` starting exactly at `start`, if any.
fn match_at(units: &[Unit], t: &[u8], start: usize) -> Option<usize> {
    // States are (unit, position).  Along one unbranched path the unit only
    // grows, so nothing repeats; once two alternatives both match, paths
    // can meet, and from then on each state is entered once.
    let mut stack: Vec<(usize, usize)> = Vec::new();
    let mut seen: Option<HashSet<(usize, usize)>> = None;
    let (mut u, mut p) = (0, start);
    loop {
        if u == units.len() {
            return Some(p);
        }
        let q = if u == 0 { p } else { skip_ws(t, p) };
        let mut next = None;
        for a in &units[u].0 {
            if !a.at(t, q) {
                continue;
            }
            let e = (u + 1, q + a.bytes.len());
            match (next, &mut seen) {
                (None, None) => next = Some(e),
                (None, Some(s)) => {
                    if s.insert(e) {
                        next = Some(e);
                    }
                }
                (Some(f), s) => {
                    let s = s.get_or_insert_with(|| HashSet::from([f]));
                    if s.insert(e) {
                        stack.push(e);
                    }
                }
            }
        }
        (u, p) = next.or_else(|| stack.pop())?;
    }
}

fn hex_of(bytes: &[u8], prefix: &str) -> String {
    bytes.iter().map(|b| format!("{prefix}{b:02x}")).collect()
}

/// The literal pattern: each character plain (case ignored), percent-encoded
/// or JSON-escaped; whitespace characters may be absent.
fn literal(v: &str) -> Vec<Unit> {
    let mut units: Vec<Unit> = Vec::new();
    for c in v.chars() {
        let mut buf = [0u8; 4];
        let raw = c.encode_utf8(&mut buf).as_bytes();
        let mut alts = Vec::new();
        if c.is_ascii_whitespace() {
            // Any whitespace is skipped before a unit; this one may be absent.
            alts.push(Alt::new(Vec::new(), false));
            if c == ' ' {
                alts.push(Alt::new(*b"+", false));
            }
        } else {
            alts.push(Alt::new(raw, true));
        }
        alts.push(Alt::new(hex_of(raw, "%"), true));
        let mut u16s = [0u16; 2];
        let json: String = c
            .encode_utf16(&mut u16s)
            .iter()
            .map(|u| format!("\\u{u:04x}"))
            .collect();
        alts.push(Alt::new(json, true));
        let short = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '/' => "\\/",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            _ => "",
        };
        if !short.is_empty() {
            alts.push(Alt::new(short, false));
        }
        // HTML character references, decimal and hex.
        alts.push(Alt::new(format!("&#{};", c as u32), false));
        alts.push(Alt::new(format!("&#x{:x};", c as u32), true));
        units.push(Unit(alts));
    }
    // A pattern neither begins nor ends with a unit that may be empty.
    let may_be_empty = |u: &Unit| u.0.iter().any(|a| a.bytes.is_empty());
    while units.last().is_some_and(may_be_empty) {
        units.pop();
    }
    let lead = units.iter().take_while(|u| may_be_empty(u)).count();
    units.drain(..lead);
    units
}

/// The hex pattern: each byte as `hh` (case ignored) or `\xhh`.
fn hex(v: &[u8]) -> Vec<Unit> {
    v.iter()
        .map(|b| {
            Unit(vec![
                Alt::new(format!("{b:02x}"), true),
                Alt::new(format!("\\x{b:02x}"), true),
                Alt::new(format!("0x{b:02x}"), true),
            ])
        })
        .collect()
}

/// ROT13 of `v` (ASCII letters only).
fn rot13(v: &str) -> String {
    v.chars()
        .map(|c| match c {
            'a'..='m' | 'A'..='M' => (c as u8 + 13) as char,
            'n'..='z' | 'N'..='Z' => (c as u8 - 13) as char,
            _ => c,
        })
        .collect()
}

const B32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Base32 (RFC 4648) of `b`, without padding.
pub(super) fn base32_std(b: &[u8]) -> String {
    let mut out = String::new();
    let (mut acc, mut bits) = (0u32, 0);
    for &x in b {
        acc = (acc << 8) | x as u32;
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(B32[(acc >> bits & 31) as usize] as char);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(B32[(acc << (5 - bits) & 31) as usize] as char);
    }
    out
}

/// The base32 pattern of `v` starting at byte `align` (0-4) of a 5-byte
/// group: the characters whose five bits all come from `v` (case ignored).
fn base32(v: &[u8], align: usize) -> Vec<Unit> {
    let mut buf = vec![0u8; align];
    buf.extend_from_slice(v);
    let enc = base32_std(&buf);
    let (k0, k1) = ((8 * align).div_ceil(5), 8 * (align + v.len()) / 5);
    if k1 <= k0 {
        return Vec::new();
    }
    enc.as_bytes()[k0..k1]
        .iter()
        .map(|&c| Unit(vec![Alt::new([c], true)]))
        .collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 of `b`, without padding.
pub(super) fn base64_std(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for g in b.chunks(3) {
        let n = (g[0] as u32) << 16
            | (*g.get(1).unwrap_or(&0) as u32) << 8
            | *g.get(2).unwrap_or(&0) as u32;
        let chars = g.len() + 1;
        for k in 0..chars {
            out.push(B64[(n >> (18 - 6 * k) & 63) as usize] as char);
        }
    }
    out
}

/// The base64 pattern of `v` starting at byte `align` (0-2) of a group:
/// the characters whose six bits all come from `v`.
fn base64(v: &[u8], align: usize) -> Vec<Unit> {
    let mut buf = vec![0u8; align];
    buf.extend_from_slice(v);
    let enc = base64_std(&buf);
    let (k0, k1) = ((8 * align).div_ceil(6), 8 * (align + v.len()) / 6);
    if k1 <= k0 {
        return Vec::new();
    }
    enc.as_bytes()[k0..k1]
        .iter()
        .map(|&c| {
            let mut alts = vec![Alt::new([c], false)];
            match c {
                b'+' => alts.push(Alt::new(*b"-", false)),
                b'/' => alts.push(Alt::new(*b"_", false)),
                _ => {}
            }
            Unit(alts)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_known_encodings() {
        assert_eq!(base32_std(b"f"), "MY");
        assert_eq!(base32_std(b"foobar"), "MZXW6YTBOI");
    }

    #[test]
    fn base64_matches_known_encodings() {
        assert_eq!(base64_std(b""), "");
        assert_eq!(base64_std(b"f"), "Zg");
        assert_eq!(base64_std(b"fo"), "Zm8");
        assert_eq!(base64_std(b"foo"), "Zm9v");
        assert_eq!(base64_std(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_std(&[0xfb, 0xff]), "+/8");
    }

    #[test]
    fn a_walk_with_many_ambiguous_units_stays_bounded() {
        // Every unit can be one backslash or two (`\\`): without the memory
        // of tried states, a failing walk over 40 of them is 2^40 paths.
        let m = Matcher::new([format!("{}y", "\\".repeat(40)).as_str()]);
        let text = format!("{}x", "\\".repeat(79));
        let t = std::time::Instant::now();
        assert!(m.spans(text.as_bytes(), false).is_empty());
        assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
    }
}
