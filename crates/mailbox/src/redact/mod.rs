//! Secret values known to the host, kept from leaving through the door
//! (the mediator and lw-sync; mailbox-spec.md, "SECRETS AT THE DOOR").
//!
//! The values are never written anywhere by loopwright (crates/wall/src/secrets.rs): a
//! sandbox's `--secret NAME` value lives in the environment of the command
//! that made the sandbox and in the sandbox's tmpfs.  The door learns them
//! the same way, from its own environment, for the names the root records
//! (names.rs: each sandbox's registry record names the secrets it was given
//! and its project's `door.secrets` and `sandbox.secrets`), whatever the
//! door's working directory; a recorded name it cannot resolve stops it
//! (exit 78).  The project around the working directory and the names the
//! command adds (the sync token) are looked up too, unset ones skipped.
//!
//! A value shorter than [`MIN_SECRET`] bytes is ignored with a warning:
//! masking a one-character "secret" would mask every `a` in every text.
//! A value is matched in its disguises too (forms.rs: case, whitespace and
//! line breaks, percent and JSON escapes, HTML references, hex, base64 and
//! base32 in any alignment, reversed, ROT13), in the text as it is read
//! (text.rs: NFKC, format characters removed; mailbox-spec.md lists what
//! stays out of reach);
//! masking replaces each match (overlapping ones merged, the longest value
//! naming them) with `[secret NAME]`.

mod forms;
mod names;

pub use names::{KEY_DOOR, KEY_SANDBOX, door_names, names_in};

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

use base::config::Project;
use base::error::Result;

/// Shortest value treated as a secret, in bytes.
pub const MIN_SECRET: usize = 6;

/// Known secret values.  `Debug` shows names only.
#[derive(Default)]
pub struct Secrets {
    /// (name, value), longest value first.
    list: Vec<(String, String)>,
    /// Every name already looked up (resolved, or warned about).
    looked_up: BTreeSet<String>,
    /// The registry records (name, registered) whose recorded digests the
    /// values were checked against (names.rs).
    checked: BTreeSet<(String, String)>,
    matcher: forms::Matcher,
}

impl Clone for Secrets {
    fn clone(&self) -> Secrets {
        let mut s = Secrets {
            list: self.list.clone(),
            looked_up: self.looked_up.clone(),
            checked: self.checked.clone(),
            matcher: Default::default(),
        };
        s.rebuild();
        s
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.list.iter().map(|(n, _)| n.as_str()).collect();
        write!(f, "Secrets({names:?})")
    }
}

impl Secrets {
    pub fn new() -> Secrets {
        Secrets::default()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when `name` was already looked up (added, or warned about).
    pub fn knows(&self, name: &str) -> bool {
        self.looked_up.contains(name)
    }

    fn rebuild(&mut self) {
        let folded: Vec<String> = self
            .list
            .iter()
            .map(|(_, v)| crate::text::fold(v))
            .collect();
        self.matcher = forms::Matcher::new(folded.iter().map(|v| v.as_str()));
    }

    /// Adds a value; returns a warning instead when it is too short to
    /// mask safely or not UTF-8 (no message can then contain it).
    pub fn add(&mut self, name: &str, value: &[u8]) -> Option<String> {
        self.looked_up.insert(name.to_string());
        let value = match std::str::from_utf8(value) {
            Ok(v) => v.trim_end_matches(['\n', '\r']),
            Err(_) => {
                return Some(format!(
                    "secret {name} is not UTF-8, so no message can contain it; not watched for"
                ));
            }
        };
        if value.len() < MIN_SECRET {
            return Some(format!(
                "secret {name} is shorter than {MIN_SECRET} bytes; ignored, so that the door does not mask every occurrence of it in ordinary text"
            ));
        }
        if !self.list.iter().any(|(_, v)| v == value) {
            self.list.push((name.to_string(), value.to_string()));
            self.list.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
            self.rebuild();
        }
        None
    }

    /// Adds the values of environment variables `names` (unset ones are skipped).
    pub fn add_env(
        &mut self,
        names: &[String],
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        for n in names {
            if let Some(v) = env(n).filter(|v| !v.is_empty()) {
                warnings.extend(self.add(n, &v.into_encoded_bytes()));
            }
        }
        warnings
    }

    /// The secrets of the project around `dir` (none outside a project):
    /// the values of `sandbox.secrets` and `door.secrets` in `env`.
    pub fn for_project(
        dir: &Path,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<(Secrets, Vec<String>)> {
        let mut s = Secrets::new();
        let w = s.add_project(dir, env)?;
        Ok((s, w))
    }

    /// Adds the secrets of the project around `dir`, if any, as
    /// [`Secrets::for_project`]; returns the warnings.
    pub fn add_project(
        &mut self,
        dir: &Path,
        env: &dyn Fn(&str) -> Option<OsString>,
    ) -> Result<Vec<String>> {
        let Some(p) = Project::find(dir, crate::config::CHECK)? else {
            return Ok(vec![]);
        };
        let names = names_in(&p.config)?;
        Ok(self.add_env(&names, env))
    }

    /// The name of a secret whose value, in any disguise, occurs in `text`.
    pub fn find(&self, text: &str) -> Option<&str> {
        let folded = crate::text::Folded::new(text);
        let s = self.matcher.spans(folded.text.as_bytes(), true);
        s.first().map(|s| self.list[s.secret as usize].0.as_str())
    }

    /// `text` with every known value, in any disguise, replaced by `[secret NAME]`.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        // Matched in the text as read (NFKC, format characters gone), masked
        // in the text as written.
        let folded = crate::text::Folded::new(text);
        let mut spans = self.matcher.spans(folded.text.as_bytes(), false);
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        for s in &mut spans {
            (s.start, s.end) = folded.source(s.start, s.end);
        }
        // Where matches overlap, one mask covers them all, named by the
        // earliest and then longest.
        spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        let mut i = 0;
        while i < spans.len() {
            let s = spans[i];
            let mut end = s.end;
            i += 1;
            while i < spans.len() && spans[i].start < end {
                end = end.max(spans[i].end);
                i += 1;
            }
            out.push_str(&text[at..s.start]);
            out.push_str("[secret ");
            out.push_str(&self.list[s.secret as usize].0);
            out.push(']');
            at = end;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    /// Masks `s` in place.
    pub fn mask_in(&self, s: &mut String) {
        if let Cow::Owned(m) = self.mask(s) {
            *s = m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_masks_longest_first() {
        let mut s = Secrets::new();
        assert!(s.add("SHORT", b"abcdef").is_none());
        assert!(s.add("LONG", b"abcdefghij").is_none());
        assert_eq!(s.find("x abcdefghij y"), Some("LONG"));
        assert_eq!(
            s.mask("abcdefghij and abcdef"),
            "[secret LONG] and [secret SHORT]"
        );
        assert!(matches!(s.mask("nothing here"), Cow::Borrowed(_)));
        assert!(!format!("{s:?}").contains("abcdef"));
    }

    #[test]
    fn a_one_character_secret_is_ignored_with_a_warning() {
        let mut s = Secrets::new();
        let w = s.add("A", b"a").expect("a warning");
        assert!(w.contains("shorter than 6 bytes"), "{w}");
        assert!(s.is_empty());
        assert_eq!(s.mask("banana"), "banana");
        assert!(
            s.add("BIN", &[0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa])
                .is_some()
        );
    }

    const KEY: &str = "sk-live-7f3a9c2b41";

    fn with_key() -> Secrets {
        let mut s = Secrets::new();
        assert!(s.add("API_KEY", KEY.as_bytes()).is_none());
        s
    }

    fn hex(b: &[u8], upper: bool) -> String {
        b.iter()
            .map(|b| {
                if upper {
                    format!("{b:02X}")
                } else {
                    format!("{b:02x}")
                }
            })
            .collect()
    }

    fn percent(v: &str, every: usize) -> String {
        v.bytes()
            .enumerate()
            .map(|(i, b)| {
                if i % every == 0 {
                    format!("%{b:02X}")
                } else {
                    (b as char).to_string()
                }
            })
            .collect()
    }

    fn json_u(v: &str, every: usize) -> String {
        v.chars()
            .enumerate()
            .map(|(i, c)| {
                if i % every == 0 {
                    format!("\\u{:04x}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect()
    }

    /// `chunk` characters, then `sep`, and so on.
    fn split(v: &str, chunk: usize, sep: &str) -> String {
        let cs: Vec<char> = v.chars().collect();
        cs.chunks(chunk)
            .map(|c| c.iter().collect::<String>())
            .collect::<Vec<_>>()
            .join(sep)
    }

    #[test]
    fn every_disguise_is_found_and_masked_whole() {
        let s = with_key();
        let b64 = |pre: &str| forms::base64_std(format!("{pre}{KEY}!").as_bytes());
        let cases: Vec<(&str, String)> = vec![
            ("literal", KEY.into()),
            ("upper case", KEY.to_uppercase()),
            ("mixed case", "Sk-LiVe-7F3A9c2B41".into()),
            ("split by spaces", split(KEY, 3, " ")),
            ("split by line breaks", split(KEY, 5, "\n")),
            ("one character a line", split(KEY, 1, "\r\n")),
            (
                "split by tabs and upper case",
                split(&KEY.to_uppercase(), 4, "\t  "),
            ),
            ("percent, every byte", percent(KEY, 1)),
            ("percent, lower case", percent(KEY, 1).to_lowercase()),
            ("percent, mixed with plain", percent(KEY, 3)),
            ("json, every character", json_u(KEY, 1)),
            ("json, mixed with plain", json_u(KEY, 2)),
            (
                "json, upper hex",
                json_u(KEY, 1).to_uppercase().replace("\\U", "\\u"),
            ),
            ("hex, lower", hex(KEY.as_bytes(), false)),
            ("hex, upper", hex(KEY.as_bytes(), true)),
            ("hex, split", split(&hex(KEY.as_bytes(), false), 8, "\n")),
            (
                "hex, \\x escapes",
                KEY.bytes().map(|b| format!("\\x{b:02x}")).collect(),
            ),
            ("base64, aligned", b64("")),
            ("base64, offset 1", b64("u")),
            ("base64, offset 2", b64("us")),
            ("base64, offset 0 after a group", b64("usr")),
            (
                "base64 url-safe",
                b64("").replace('+', "-").replace('/', "_"),
            ),
            ("base64 wrapped as MIME", split(&b64("u"), 4, "\r\n")),
            // Issue 40.
            ("reversed", KEY.chars().rev().collect()),
            ("rot13", "fx-yvir-7s3n9p2o41".into()),
            ("base32", forms::base32_std(format!("ab{KEY}").as_bytes())),
            (
                "base32, lower case",
                forms::base32_std(KEY.as_bytes()).to_lowercase(),
            ),
            (
                "0x bytes",
                KEY.bytes()
                    .map(|b| format!("0x{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            (
                "HTML entities",
                KEY.chars().map(|c| format!("&#{};", c as u32)).collect(),
            ),
            (
                "HTML hex entities, mixed",
                KEY.chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if i % 2 == 0 {
                            format!("&#x{:X};", c as u32)
                        } else {
                            c.to_string()
                        }
                    })
                    .collect(),
            ),
            (
                "fullwidth letters",
                KEY.chars()
                    .map(|c| char::from_u32(c as u32 + 0xfee0).unwrap())
                    .collect(),
            ),
            (
                "interleaved with U+200B, U+00AD, U+200D",
                KEY.chars()
                    .zip(['\u{200b}', '\u{ad}', '\u{200d}'].into_iter().cycle())
                    .map(|(c, z)| format!("{c}{z}"))
                    .collect(),
            ),
        ];
        for (what, form) in cases {
            let text = format!("see <{form}> here");
            assert_eq!(s.find(&text), Some("API_KEY"), "{what}: {text:?}");
            let m = s.mask(&text);
            assert!(m.contains("[secret API_KEY]"), "{what}: {m:?}");
            assert!(
                m.starts_with("see <") && m.ends_with("> here"),
                "{what}: {m:?}"
            );
            assert!(!m.contains(&form), "{what}: {m:?}");
        }
    }

    #[test]
    fn base64_in_either_alphabet_leaves_only_the_characters_neighbours_share() {
        // A value whose base64 has '+' and '/' in it.
        const V: &str = "???>>>~~~???>>>";
        let mut s = Secrets::new();
        assert!(s.add("V", V.as_bytes()).is_none());
        for pre in ["", "x", "xy"] {
            let std = forms::base64_std(format!("{pre}{V}").as_bytes());
            assert!(std.contains('+') || std.contains('/'), "{std}");
            for enc in [std.clone(), std.replace('+', "-").replace('/', "_")] {
                let m = s.mask(&enc);
                // Before the mask, the prefix's own characters and one that
                // mixes its bits with the value's; after it, at most one
                // such character and the padding's.
                let (a, b) = m.split_once("[secret V]").expect("masked");
                assert!(
                    a.len() <= pre.len() + 1 && b.len() <= 3,
                    "{pre:?}: {enc} -> {m}"
                );
            }
        }
    }

    #[test]
    fn ordinary_text_is_not_masked() {
        let s = with_key();
        let near = [
            "sk-live-7f3a9c2b42",
            "sk-live-7f3a9c2b4",
            "sk_live_7f3a9c2b41",
            "the quick brown fox jumps over the lazy dog",
            "commit 7f3a9c2b41d0e5aa and sk-live keys",
            "%73%6b%2d%6c%69%76%65 only a prefix",
            "736b2d6c6976652d37663361396332623432",
            "c2stbGl2ZS03ZjNhOWMyYjQy",
            "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3",
            "",
        ];
        for t in near {
            assert!(
                matches!(s.mask(t), Cow::Borrowed(_)),
                "{t:?}: {}",
                s.mask(t)
            );
            assert_eq!(s.find(t), None, "{t:?}");
        }
    }

    #[test]
    fn a_value_with_spaces_escapes_and_multibyte_characters() {
        let mut s = Secrets::new();
        assert!(s.add("PHRASE", "pass wörd/\"x\"".as_bytes()).is_none());
        for t in [
            "pass wörd/\"x\"",
            "PASS\nWÖrd/\"X\"".replace('Ö', "ö").as_str(),
            "pass+w%C3%B6rd%2F%22x%22",
            "passwörd/\"x\"",
            "pass\\u0020w\\u00f6rd\\/\\\"x\\\"",
        ] {
            assert_eq!(s.mask(&format!("<{t}>")), "<[secret PHRASE]>", "{t:?}");
        }
        // A space second: the search looks past it for the third byte.
        let mut s = Secrets::new();
        assert!(s.add("GAP", b"k 3y-s3cr3t").is_none());
        for t in [
            "k3y-s3cr3t",
            "k+3y-s3cr3t",
            "K%203Y-S3CR3T",
            "k \n 3y-s3cr3t",
        ] {
            assert_eq!(s.mask(&format!("<{t}>")), "<[secret GAP]>", "{t:?}");
        }
    }

    /// The cost of masking a 64 KiB message, the old way (the literal
    /// value only) and now (every disguise), with 8 secrets: printed, and
    /// both give the same text when only literal copies are there.
    #[test]
    fn masking_cost_per_message() {
        let mut s = Secrets::new();
        let values: Vec<String> = (0..8)
            .map(|i| format!("tok-{i}-{}", "q7Zp2xLm9".repeat(i % 3 + 1)))
            .collect();
        for (i, v) in values.iter().enumerate() {
            assert!(s.add(&format!("S{i}"), v.as_bytes()).is_none());
        }
        let prose = "Ship the schema change: users.email is now unique; run \
                     `cargo test` and post status=ok to api (see src/api/users.rs:42). ";
        let mut text = String::new();
        while text.len() < 64 * 1024 {
            text.push_str(prose);
            if text.len().is_multiple_of(7) {
                text.push_str(&values[text.len() % 8]);
            }
        }
        text.push_str(&values[3]);
        let old = |t: &str| {
            let mut out = t.to_string();
            for (i, v) in values.iter().enumerate() {
                if out.contains(v.as_str()) {
                    out = out.replace(v.as_str(), &format!("[secret S{i}]"));
                }
            }
            out
        };
        assert_eq!(old(&text), s.mask(&text), "the same on literal copies");
        let time = |f: &dyn Fn() -> usize| {
            let n = 20;
            let t = std::time::Instant::now();
            let mut k = 0;
            for _ in 0..n {
                k += std::hint::black_box(f());
            }
            assert!(k > 0);
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        };
        let before = time(&|| old(&text).len());
        let now = time(&|| s.mask(&text).len());
        let clean = time(&|| s.mask(&prose.repeat(64 * 1024 / prose.len())).len());
        println!(
            "redact: masking a 64 KiB message with 8 secrets: literal only {before:.0} us, every disguise {now:.0} us ({:.1}x); a clean 64 KiB message {clean:.0} us",
            now / before
        );
    }
}
