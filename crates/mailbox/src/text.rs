//! Text as a person (or a model) reads it: what renders as nothing, and one
//! spelling for characters that render alike.
//!
//! The bell drops what renders as nothing so a fence cannot be spelt to
//! look like the real one; the door folds text before looking for secrets,
//! so a value written in fullwidth letters or interleaved with zero-width
//! characters is still the value (issue 40).

use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_normalization::UnicodeNormalization;

/// True for a format character (Unicode category Cf): zero-width spaces and
/// joiners, the soft hyphen, bidi controls (U+061C, U+200E, U+202A..E,
/// U+2066..9), the byte-order mark.  They render as nothing.
pub fn is_format(c: char) -> bool {
    get_general_category(c) == GeneralCategory::Format
}

/// True for a character that renders as nothing: a format character, or
/// one of the other default-ignorable code points (the combining grapheme
/// joiner U+034F, variation selectors, the Hangul and Khmer fillers, the
/// Mongolian free variation selectors).  Between `<` and `/` any of them
/// would leave a fence that reads as the real one.
pub fn is_invisible(c: char) -> bool {
    is_format(c)
        || matches!(c,
            '\u{34f}' | '\u{115f}' | '\u{1160}' | '\u{17b4}' | '\u{17b5}'
            | '\u{180b}'..='\u{180f}' | '\u{2060}'..='\u{206f}' | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}' | '\u{ffa0}' | '\u{fff0}'..='\u{fff8}'
            | '\u{e0000}'..='\u{e0fff}')
}

/// `s` folded: format characters removed and each character in its NFKC
/// form (fullwidth and small forms, ligatures and compatibility letters as
/// their plain spelling), with the way back to `s`'s bytes.
pub struct Folded {
    pub text: String,
    /// For each byte of `text`, the range of `s` it came from (empty when
    /// `s` needed no folding: then `text` is `s`).
    from: Vec<(u32, u32)>,
}

impl Folded {
    pub fn new(s: &str) -> Folded {
        if s.is_ascii() {
            return Folded {
                text: s.to_string(),
                from: Vec::new(),
            };
        }
        let mut text = String::with_capacity(s.len());
        let mut from = Vec::with_capacity(s.len());
        for (i, c) in s.char_indices() {
            if is_format(c) {
                continue;
            }
            let range = (i as u32, (i + c.len_utf8()) as u32);
            for f in std::iter::once(c).nfkc() {
                text.push(f);
                from.extend(std::iter::repeat_n(range, f.len_utf8()));
            }
        }
        Folded { text, from }
    }

    /// The range of the original text that bytes `start..end` of the folded
    /// one came from.
    pub fn source(&self, start: usize, end: usize) -> (usize, usize) {
        if self.from.is_empty() {
            return (start, end);
        }
        let a = self.from[start].0 as usize;
        let b = self.from[end - 1].1 as usize;
        (a, b)
    }
}

/// `s` folded, without the way back.
pub fn fold(s: &str) -> String {
    Folded::new(s).text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fullwidth_and_zero_width_fold_to_the_plain_spelling() {
        let s = "ｓｋ\u{200b}-li\u{ad}ve\u{200d}！";
        let f = Folded::new(s);
        assert_eq!(f.text, "sk-live!");
        let (a, b) = f.source(0, 2);
        assert_eq!(&s[a..b], "ｓｋ");
        let (a, b) = f.source(3, 8);
        assert_eq!(&s[a..b], "li\u{ad}ve\u{200d}！");
        assert_eq!(fold("﹫login ＃126"), "@login #126");
        assert!(is_format('\u{61c}') && is_format('\u{feff}') && !is_format('a'));
        for c in [
            '\u{200b}',
            '\u{34f}',
            '\u{fe0f}',
            '\u{3164}',
            '\u{e0100}',
            '\u{2064}',
        ] {
            assert!(is_invisible(c), "{c:?}");
        }
        assert!(!is_invisible('<') && !is_invisible('\u{e9}') && !is_invisible('\u{301}'));
    }
}
