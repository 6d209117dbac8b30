//! Text from a sandbox, made safe to show to a person.
//!
//! Anything an agent writes (message subjects and bodies, commit subjects,
//! install output, file names) may carry terminal control sequences: an ESC
//! that clears the operator's screen, retitles the window, or hides a line;
//! a C1 CSI that some terminals honour; a bidirectional override that makes
//! text read differently from what it is.  Every text that came from a
//! sandbox passes through [`visible`] (multi-line text) or [`visible_line`]
//! (one field of a one-line record) before it reaches a terminal or a
//! person-facing log.  The mapping is one-way and total:
//!
//! | what                               | shown as          |
//! |------------------------------------|-------------------|
//! | C0 controls (U+0000–U+001F), ESC   | `^@` … `^_` (caret notation, as `cat -v`) |
//! | DEL (U+007F)                       | `^?`              |
//! | C1 controls (U+0080–U+009F)        | `<U+0085>`        |
//! | bidi embeddings, overrides, isolates (U+202A–U+202E, U+2066–U+2069) | `<U+202E>` |
//!
//! [`visible`] keeps newline and tab; [`visible_line`] shows them too (as
//! `^J` and `^I`), so one record stays on one line and columns stay aligned.
//! Text without any of these characters is returned borrowed, untouched.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `s` with every control character but newline and tab made visible.
pub fn visible(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

/// `s` with every control character made visible, newline and tab included.
pub fn visible_line(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

fn needs_escape(c: char, line: bool) -> bool {
    match c {
        '\n' | '\t' => line,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => true,
        _ => false,
    }
}

fn escape(s: &str, line: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| needs_escape(c, line)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !needs_escape(c, line) {
            out.push(c);
            continue;
        }
        match c {
            '\u{0}'..='\u{1f}' => {
                out.push('^');
                out.push(char::from(c as u8 + b'@'));
            }
            '\u{7f}' => out.push_str("^?"),
            _ => {
                let _ = write!(out, "<U+{:04X}>", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_borrowed() {
        assert!(matches!(visible("héllo\n\tworld"), Cow::Borrowed(_)));
    }

    #[test]
    fn escape_sequences_are_shown_not_sent() {
        assert_eq!(visible("a\u{1b}[2Jb"), "a^[[2Jb");
        assert_eq!(visible("\u{1b}]0;title\u{7}"), "^[]0;title^G");
        assert_eq!(visible("x\u{7f}y\r"), "x^?y^M");
        assert_eq!(visible("\u{0}"), "^@");
    }

    #[test]
    fn c1_and_bidi_are_shown_as_code_points() {
        assert_eq!(visible("a\u{9b}31mb"), "a<U+009B>31mb");
        assert_eq!(visible("\u{202e}txt.exe"), "<U+202E>txt.exe");
        assert_eq!(visible("\u{2066}"), "<U+2066>");
    }

    #[test]
    fn newline_and_tab_kept_or_shown() {
        assert_eq!(visible("a\nb\tc"), "a\nb\tc");
        assert_eq!(visible_line("a\nb\tc"), "a^Jb^Ic");
    }

    #[test]
    fn text_made_only_of_controls_stays_visible() {
        let all: String = (0u8..0x20).map(char::from).collect();
        let shown = visible_line(&all);
        assert!(shown.chars().all(|c| !c.is_control()), "{shown:?}");
        assert_eq!(shown.len(), 64);
    }
}
