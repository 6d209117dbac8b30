//! One glob semantics, for policy scopes (mailbox-spec.md, "Scopes") and for
//! the context paths a layer's Dockerfile reads (lw-build): globset's, with
//! the separator made literal, so
//!
//! * `*` matches any run of characters within one `/`-separated segment,
//! * `?` matches one character other than `/`,
//! * `[a-z]`, `[!a-z]` (or `[^a-z]`) match one character of (not of) a class,
//! * `**` as a whole segment matches any number of segments, none included
//!   (`src/**/*.rs` matches `src/c.rs` and `src/a/b/c.rs`),
//! * `\` escapes the next character, and everything else matches itself, so a
//!   named contract such as `schema:users` matches only itself.
//!
//! A pattern that is not a valid glob (an unclosed `[`) matches only the
//! identical text, as a literal; the commands that take a scope refuse one
//! ([`check`]), so only a record written by hand or by an older version
//! holds it.  Compiled patterns are kept per thread, so
//! a mediator matching the same scopes for every message compiles each once.

use std::cell::RefCell;
use std::collections::HashMap;

use globset::{GlobBuilder, GlobMatcher};

/// How many compiled patterns a thread keeps before it starts afresh.
const CACHE_LIMIT: usize = 4096;

thread_local! {
    static CACHE: RefCell<HashMap<String, Option<GlobMatcher>>> = RefCell::new(HashMap::new());
}

/// True when the glob `pat` matches all of `text`.
pub fn matches(pat: &str, text: &str) -> bool {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if !c.contains_key(pat) {
            if c.len() >= CACHE_LIMIT {
                c.clear();
            }
            let m = build(pat).ok().map(|g| g.compile_matcher());
            c.insert(pat.to_string(), m);
        }
        match &c[pat] {
            Some(m) => m.is_match(text),
            None => pat == text,
        }
    })
}

/// Why `pat` is not a valid glob, as globset says it (`None`: it is one).
pub fn check(pat: &str) -> Option<String> {
    build(pat).err().map(|e| e.kind().to_string())
}

fn build(pat: &str) -> Result<globset::Glob, globset::Error> {
    GlobBuilder::new(pat)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

/// True when `s` holds a character that makes it a pattern, not a literal.
pub fn is_pattern(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_double_stars() {
        assert!(matches("src/api/**", "src/api/v1/user.rs"));
        assert!(!matches("src/api/**", "src/apix/user.rs"));
        assert!(matches("src/**/*.rs", "src/a/b/c.rs"));
        assert!(matches("src/**/*.rs", "src/c.rs"));
        assert!(!matches("src/*.rs", "src/a/c.rs"));
        assert!(matches("*.proto", "user.proto"));
        assert!(!matches("*.lock", "d/a.lock"));
        assert!(matches("d/?.lock", "d/a.lock"));
        assert!(!matches("?", "/"));
    }

    #[test]
    fn classes_escapes_and_literals() {
        assert!(matches("req[a-z]*.txt", "requirements.txt"));
        assert!(!matches("req[!a-z]*.txt", "requirements.txt"));
        assert!(matches(r"a\*b", "a*b"));
        assert!(!matches(r"a\*b", "axb"));
        assert!(matches("schema:users", "schema:users"));
        assert!(!matches("schema:users", "schema:orders"));
        // Not a valid glob: only itself.
        assert!(matches("a[b", "a[b"));
        assert!(!matches("a[b", "ab"));
    }

    #[test]
    fn check_names_what_is_wrong() {
        assert_eq!(check("src/**/*.rs"), None);
        assert_eq!(check("schema:users"), None);
        assert_eq!(check(r"a\[b"), None);
        let why = check("[[").expect("an unclosed class is not a glob");
        assert!(why.contains("unclosed"), "{why}");
        assert!(check("a{b").is_some());
    }
}
