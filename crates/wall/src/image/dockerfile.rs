//! A project's own Dockerfile read as far as lw-build needs it: the images
//! its FROM lines start from (the build arguments substituted, stage names
//! followed), so each can be found in the engine before a build asks a
//! registry for it, and the text up to a `target` stage.
//!
//! Only what the engine would do with the same text: `ARG` lines before the
//! first FROM give defaults, a layer's `arg` wins, `$X`, `${X}`, `${X:-d}`
//! and `${X:+v}` expand; a FROM naming an earlier stage (`AS NAME`) or
//! `scratch` needs no image.  Line continuations and comments are the
//! Dockerfile's own.

/// One logical line: the 1-based number it starts on, and its text
/// (continuations joined, comments and blank lines left out).
pub(super) fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    let mut cur = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim();
        if cur.is_empty() {
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            start = i + 1;
        } else if t.starts_with('#') {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        v.push((start, std::mem::take(&mut cur)));
    }
    if !cur.is_empty() {
        v.push((start, cur));
    }
    v
}

/// `$X`, `${X}`, `${X:-d}`, `${X:+v}` of `s` from `vars` (unset: empty).
fn expand(s: &str, vars: &[(String, String)]) -> String {
    let get = |n: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(body) = after.strip_prefix('{')
            && let Some(end) = body.find('}')
        {
            let inner = &body[..end];
            let (name, op) = match inner.find(':') {
                Some(c) => (&inner[..c], Some(&inner[c + 1..])),
                None => (inner, None),
            };
            let val = get(name).filter(|v| !v.is_empty());
            match op {
                Some(o) if o.starts_with('-') => {
                    out.push_str(&val.unwrap_or_else(|| expand(&o[1..], vars)))
                }
                Some(o) if o.starts_with('+') => {
                    if val.is_some() {
                        out.push_str(&expand(&o[1..], vars));
                    }
                }
                _ => out.push_str(&val.unwrap_or_default()),
            }
            rest = &body[end + 1..];
        } else {
            let n = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if n == 0 {
                out.push('$');
            } else {
                out.push_str(&get(&after[..n]).unwrap_or_default());
            }
            rest = &after[n..];
        }
    }
    out.push_str(rest);
    out
}

/// A FROM line: where it is, the image it names (expanded), and its stage name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct From {
    pub line: usize,
    pub image: String,
    pub stage: Option<String>,
}

/// The FROM lines of `text`, with `args` (`arg NAME=VALUE`) over the
/// defaults of the ARG lines before the first FROM.
pub fn froms(text: &str, args: &[(String, String)]) -> Vec<From> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for (line, l) in logical_lines(text) {
        let mut words = l.split_whitespace();
        let instr = words.next().unwrap_or("").to_ascii_uppercase();
        if instr == "ARG" && out.is_empty() {
            for w in words {
                let (k, v) = w.split_once('=').unwrap_or((w, ""));
                let v = v.trim_matches('"').to_string();
                vars.push((k.to_string(), v));
            }
            vars.extend(args.iter().cloned());
        } else if instr == "FROM" {
            if out.is_empty() {
                vars.extend(args.iter().cloned());
            }
            let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
            let Some(img) = rest.first() else { continue };
            let stage = match rest.as_slice() {
                [_, a, n] if a.eq_ignore_ascii_case("as") => Some(n.to_ascii_lowercase()),
                _ => None,
            };
            out.push(From {
                line,
                image: expand(img, &vars),
                stage,
            });
        }
    }
    out
}

/// The images `text` starts from that must be in the engine: not a stage
/// named before, not `scratch`; each with the line naming it first.
pub fn external_images(text: &str, args: &[(String, String)]) -> Vec<From> {
    let all = froms(text, args);
    let mut v: Vec<From> = Vec::new();
    for (i, f) in all.iter().enumerate() {
        let stage = all[..i]
            .iter()
            .any(|p| p.stage.as_deref() == Some(&f.image.to_ascii_lowercase()));
        if stage || f.image == "scratch" || v.iter().any(|p| p.image == f.image) {
            continue;
        }
        v.push(f.clone());
    }
    v
}

/// The image the last stage (or the `target` stage) starts from, its
/// stage names followed back to an image.
pub fn final_image(text: &str, args: &[(String, String)], target: Option<&str>) -> Option<String> {
    let all = froms(text, args);
    let mut at = match target {
        Some(t) => all
            .iter()
            .position(|f| f.stage.as_deref() == Some(&t.to_ascii_lowercase()))?,
        None => all.len().checked_sub(1)?,
    };
    loop {
        let img = all[at].image.to_ascii_lowercase();
        match all[..at]
            .iter()
            .rposition(|p| p.stage.as_deref() == Some(&img))
        {
            Some(p) => at = p,
            None => return Some(all[at].image.clone()),
        }
    }
}

/// `text` cut before the FROM that follows stage `target`: what the engine
/// builds for `--target`, for an engine request that has no such option.
/// None when no stage is named `target`.
pub fn up_to_target(text: &str, target: &str) -> Option<String> {
    let all = froms(text, &[]);
    let i = all
        .iter()
        .position(|f| f.stage.as_deref() == Some(&target.to_ascii_lowercase()))?;
    let Some(next) = all.get(i + 1) else {
        return Some(text.to_string());
    };
    let kept: Vec<&str> = text.lines().take(next.line - 1).collect();
    Some(kept.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DF: &str = "# syntax\nARG VARIANT=bookworm\nARG REG\nFROM ${REG:+$REG/}debian:${VARIANT}-slim AS base\nRUN x \\\n  && y\nFROM base AS dev\nRUN useradd dev\nFROM --platform=linux/amd64 scratch AS empty\nFROM golang:1.22 as tools\nFROM dev\n";

    #[test]
    fn from_lines_expand_args_and_follow_stages() {
        let f = froms(DF, &[]);
        let imgs: Vec<(usize, &str)> = f.iter().map(|f| (f.line, f.image.as_str())).collect();
        assert_eq!(
            imgs,
            [
                (4, "debian:bookworm-slim"),
                (7, "base"),
                (9, "scratch"),
                (10, "golang:1.22"),
                (11, "dev")
            ]
        );
        let args = [("VARIANT".to_string(), "trixie".to_string())];
        let ext: Vec<String> = external_images(DF, &args)
            .into_iter()
            .map(|f| f.image)
            .collect();
        assert_eq!(ext, ["debian:trixie-slim", "golang:1.22"]);
        let reg = [("REG".to_string(), "r.example".to_string())];
        assert_eq!(
            final_image(DF, &reg, None).as_deref(),
            Some("r.example/debian:bookworm-slim")
        );
        assert_eq!(
            final_image(DF, &[], Some("tools")).as_deref(),
            Some("golang:1.22")
        );
        assert_eq!(final_image(DF, &[], Some("nope")), None);
    }

    #[test]
    fn a_target_cuts_the_stages_after_it() {
        let cut = up_to_target(DF, "dev").expect("a stage named dev");
        assert!(cut.ends_with("RUN useradd dev\n"), "{cut}");
        assert!(!cut.contains("scratch"));
        assert_eq!(up_to_target(DF, "DEV"), Some(cut));
        assert_eq!(up_to_target(DF, "missing"), None);
        assert_eq!(up_to_target(DF, "tools").unwrap().lines().count(), 10);
    }
}
