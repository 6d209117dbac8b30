//! `.dockerignore` for a layer with a `context` (the project's own
//! Dockerfile): the files it excludes are neither hashed into the layer's
//! tag nor sent to the engine, so a change to an ignored file rebuilds
//! nothing, as with `docker build`.
//!
//! Which file: `DOCKERFILE.dockerignore` beside the Dockerfile when there is
//! one (BuildKit's rule), else `.dockerignore` at the context's top.  The
//! file read is itself an input of the layer (it decides what the build
//! sees).
//!
//! The patterns are Docker's (moby/patternmatcher): a line each, `#`
//! comments, surrounding spaces trimmed, paths cleaned and relative to the
//! context (a leading `/` dropped); `*` and `?` within one path part,
//! `[...]` a class, `\` escapes, `**` any number of parts (`**/` even
//! none); a pattern that matches a folder excludes what is under it; `!`
//! takes a path back; the last pattern that matches decides.  The
//! Dockerfile and the ignore file are always sent, as Docker sends them
//! (a COPY of an ignored Dockerfile then finds nothing, as with Docker).

/// One pattern, compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern {
    tokens: Vec<Tok>,
    keep: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    /// `**` at the end: anything, `/` too.
    All,
    /// `**/` or `**` before more: nothing, or anything ending in `/`.
    Parts,
    /// `*`: anything but `/`.
    Star,
    /// `?`: one character but `/`.
    One,
    /// `[...]`: the set (ranges expanded lazily), negated or not.
    Class(Vec<(char, char)>, bool),
    Lit(char),
}

/// The patterns of an ignore file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ignore {
    patterns: Vec<Pattern>,
}

/// Docker's filepath.Clean of a pattern, with `/` separators.
fn clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for s in p.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

fn compile(p: &str) -> Vec<Tok> {
    let c: Vec<char> = p.chars().collect();
    let mut t = Vec::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '*' if c.get(i + 1) == Some(&'*') => {
                i += 2;
                if c.get(i) == Some(&'/') {
                    i += 1;
                }
                t.push(if i >= c.len() { Tok::All } else { Tok::Parts });
                continue;
            }
            '*' => t.push(Tok::Star),
            '?' => t.push(Tok::One),
            '\\' if i + 1 < c.len() => {
                i += 1;
                t.push(Tok::Lit(c[i]));
            }
            '[' => {
                let mut j = i + 1;
                let neg = matches!(c.get(j), Some('^' | '!'));
                if neg {
                    j += 1;
                }
                let mut set = Vec::new();
                while j < c.len() && (c[j] != ']' || set.is_empty()) {
                    let a = if c[j] == '\\' && j + 1 < c.len() {
                        j += 1;
                        c[j]
                    } else {
                        c[j]
                    };
                    if c.get(j + 1) == Some(&'-') && c.get(j + 2).is_some_and(|e| *e != ']') {
                        set.push((a, c[j + 2]));
                        j += 3;
                    } else {
                        set.push((a, a));
                        j += 1;
                    }
                }
                if j < c.len() {
                    t.push(Tok::Class(set, neg));
                    i = j + 1;
                    continue;
                }
                t.push(Tok::Lit('['));
            }
            ch => t.push(Tok::Lit(ch)),
        }
        i += 1;
    }
    t
}

fn matches(t: &[Tok], s: &[char]) -> bool {
    let Some((first, rest)) = t.split_first() else {
        return s.is_empty();
    };
    match first {
        Tok::All => true,
        Tok::Parts => {
            matches(rest, s) || (0..s.len()).any(|i| s[i] == '/' && matches(rest, &s[i + 1..]))
        }
        Tok::Star => (0..=s.len())
            .take_while(|&i| i == 0 || s[i - 1] != '/')
            .any(|i| matches(rest, &s[i..])),
        Tok::One => s.first().is_some_and(|c| *c != '/') && matches(rest, &s[1..]),
        Tok::Class(set, neg) => {
            s.first()
                .is_some_and(|c| *c != '/' && set.iter().any(|(a, b)| a <= c && c <= b) != *neg)
                && matches(rest, &s[1..])
        }
        Tok::Lit(l) => s.first() == Some(l) && matches(rest, &s[1..]),
    }
}

impl Ignore {
    /// The patterns of `text`.
    pub fn parse(text: &str) -> Ignore {
        let mut patterns = Vec::new();
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') {
                continue;
            }
            let (keep, p) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            let p = clean(p.trim_start_matches('/'));
            if p.is_empty() {
                continue;
            }
            patterns.push(Pattern {
                tokens: compile(&p),
                keep,
            });
        }
        Ignore { patterns }
    }

    /// True when no pattern is there.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `path` (relative to the context, `/` separators) is left out
    /// of the build: the last pattern that matches it or a folder above it
    /// decides.
    pub fn excludes(&self, path: &str) -> bool {
        let chars: Vec<char> = path.chars().collect();
        let ends: Vec<usize> = (0..chars.len())
            .filter(|&i| chars[i] == '/')
            .chain([chars.len()])
            .collect();
        let mut out = false;
        for p in &self.patterns {
            if ends.iter().any(|&e| matches(&p.tokens, &chars[..e])) {
                out = !p.keep;
            }
        }
        out
    }
}

/// The ignore file of a layer whose Dockerfile is `dockerfile` and context
/// `context` (both project-relative, the context empty for the top): the
/// one beside the Dockerfile, else the context's.
pub fn file_for(dockerfile: &str, context: &str) -> [String; 2] {
    let top = if context.is_empty() {
        ".dockerignore".to_string()
    } else {
        format!("{context}/.dockerignore")
    };
    [format!("{dockerfile}.dockerignore"), top]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_pattern_semantics() {
        let ig = Ignore::parse(
            "# comment\n\n  node_modules  \n*.log\n!keep.log\n/build/\n**/secret*\ndocs/**\n!docs/README.md\ntmp?\n[ab].txt\n**.bak\n",
        );
        for (path, out) in [
            ("node_modules", true),
            ("node_modules/x/y.js", true),
            ("a/node_modules", false),
            ("err.log", true),
            ("sub/err.log", false),
            ("keep.log", false),
            ("build/out.o", true),
            ("secret.key", true),
            ("deep/er/secret-x", true),
            ("docs/a/b.md", true),
            ("docs/README.md", false),
            ("tmp1", true),
            ("tmp12", false),
            ("a.txt", true),
            ("c.txt", false),
            ("x/y/.bak", true),
            ("x/y/z.bak", false),
            ("src/main.rs", false),
        ] {
            assert_eq!(ig.excludes(path), out, "{path}");
        }
        assert!(Ignore::parse("*\n!src\n").excludes("Dockerfile"));
        assert!(!Ignore::parse("*\n!src\n").excludes("src/a/b"));
        assert!(Ignore::parse("src/*/b\n").excludes("src/a/b"));
        assert!(!Ignore::parse("src/*/b\n").excludes("src/a/c/b"));
        assert!(Ignore::parse("./a/../b\n").excludes("b"));
        assert!(Ignore::parse(r"\*x").excludes("*x"));
        assert!(!Ignore::parse(r"\*x").excludes("ax"));
        assert!(Ignore::parse("[!a]x\n").excludes("bx"));
        assert!(!Ignore::parse("[!a]x\n").excludes("ax"));
    }
}
