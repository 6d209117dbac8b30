//! Building a layer: the context holds exactly the declared inputs, a
//! Dockerfile that reads anything else is refused before the engine is asked.

use base::error::{Error, Exit, Result};
use base::visible::visible_line;
use engine::{BuildEvent, BuildOutcome, BuildRequest, ImageBuilder};
use std::collections::BTreeSet;

use super::*;

/// Brings a missing layer's image from elsewhere: `Some((id, bytes))` when
/// its tag now points at it, `None` to build it.
pub type Fetcher<'a> = dyn FnMut(&Layer) -> Result<Option<(String, u64)>> + 'a;

/// Options of one build run.
pub struct BuildOptions<'a> {
    /// Every line of build output, as it arrives (`-v`, terminal progress).
    pub on_event: &'a mut dyn FnMut(&Layer, &BuildEvent),
    /// Called before a layer builds.
    pub on_start: &'a mut dyn FnMut(&Layer),
    /// Asked first for a missing layer (the image cache): `Some((id,
    /// bytes))` when it brought the image under the layer's tag, `None` to
    /// build it.
    pub fetch: Option<&'a mut Fetcher<'a>>,
}

/// What happened to a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayerResult {
    Cached(String),
    /// Pulled from the image cache: the id and the bytes read.
    Pulled(String, u64),
    Built(String),
}

/// Builds the layers whose tags are missing, in order.  Stops at the first
/// failure: a failed step is exit 65 with the step's output in the error.
pub fn build(
    engine: &dyn ImageBuilder,
    plan: &mut Plan,
    opts: &mut BuildOptions<'_>,
) -> Result<Vec<LayerResult>> {
    let mut results = Vec::new();
    for layer in plan.layers.iter_mut() {
        if let Some(id) = &layer.image_id {
            results.push(LayerResult::Cached(id.clone()));
            continue;
        }
        if let Some(fetch) = opts.fetch.as_mut()
            && let Some((id, bytes)) = fetch(layer)?
        {
            layer.image_id = Some(id.clone());
            results.push(LayerResult::Pulled(id, bytes));
            continue;
        }
        let df_text = String::from_utf8_lossy(&layer.dockerfile.data).into_owned();
        check_dockerfile(&df_text, layer)?;
        let req = BuildRequest {
            context: layer.context()?,
            dockerfile: layer.request_dockerfile()?.0,
            tag: layer.tag.clone(),
            labels: layer.labels(),
            args: layer.build_args(),
        };
        (opts.on_start)(layer);
        let mut log = Tail::default();
        let outcome = engine.build(&req, &mut |ev| {
            if let BuildEvent::Output(s) = &ev {
                log.push(s);
            }
            (opts.on_event)(layer, &ev);
        })?;
        match outcome {
            BuildOutcome::Built(id) => {
                layer.image_id = Some(id.clone());
                results.push(LayerResult::Built(id));
            }
            BuildOutcome::Failed(msg) => return Err(failure(layer, &msg, &log.lines())),
        }
    }
    Ok(results)
}

/// The last [`TAIL_LINES`] lines of a build's output, all a failed build
/// shows: the rest is not held (a project's install step may print without
/// end).
#[derive(Default)]
pub(super) struct Tail {
    lines: std::collections::VecDeque<String>,
    /// The line not ended yet, at most [`TAIL_LINE_MAX`] bytes kept.
    open: String,
}

const TAIL_LINES: usize = 40;
const TAIL_LINE_MAX: usize = 4096;

impl Tail {
    pub(super) fn push(&mut self, chunk: &str) {
        for piece in chunk.split_inclusive('\n') {
            let body = piece.strip_suffix('\n');
            let text = body.unwrap_or(piece);
            if self.open.len() < TAIL_LINE_MAX {
                let room = TAIL_LINE_MAX - self.open.len();
                let mut end = text.len().min(room);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                self.open.push_str(&text[..end]);
            }
            if body.is_some() {
                self.lines.push_back(std::mem::take(&mut self.open));
                if self.lines.len() > TAIL_LINES {
                    self.lines.pop_front();
                }
            }
        }
    }

    /// The kept lines, the unended one last, joined by newlines.
    pub(super) fn lines(&self) -> String {
        let mut all: Vec<&str> = self.lines.iter().map(String::as_str).collect();
        if !self.open.is_empty() {
            all.push(&self.open);
        }
        let start = all.len().saturating_sub(TAIL_LINES);
        all[start..].join("\n")
    }
}

/// The error for a failed build: a missing context file points at the input
/// list; anything else shows the step's output, its control characters
/// made visible (a project's build prints what it likes: no escape
/// sequence reaches the person's terminal).
pub(super) fn failure(layer: &Layer, msg: &str, log: &str) -> Error {
    let msg = &*visible_line(msg);
    let lower = msg.to_ascii_lowercase();
    let copy_step = lower.starts_with("copy failed") || lower.starts_with("add failed");
    if lower.contains("file not found in build context")
        || (copy_step
            && (lower.contains("no such file or directory")
                || lower.contains("no source files were specified")))
    {
        return Error::config(format!(
            "layer '{}': {}: the build context holds only the layer's declared inputs; declare the file with 'input PATH' under 'layer {}' in {RUNTIME_FILE} (line {})",
            layer.def.name,
            msg.trim(),
            layer.def.name,
            layer.def.line
        ));
    }
    let mut text = format!(
        "layer '{}' failed to build: {}; no tag was applied",
        layer.def.name,
        msg.trim()
    );
    if !log.is_empty() {
        text.push_str("\n--- build output (last lines) ---\n");
        text.push_str(&shown(log));
    }
    Error::new(Exit::DataErr, text)
}

/// The last [`TAIL_LINES`] lines of `log`, each with its control characters
/// made visible.
fn shown(log: &str) -> String {
    let tail: Vec<String> = log.lines().map(|l| visible_line(l).into_owned()).collect();
    let start = tail.len().saturating_sub(TAIL_LINES);
    tail[start..].join("\n")
}

/// One COPY/ADD source found in a Dockerfile.
#[derive(Debug, PartialEq, Eq)]
pub struct Source {
    pub line: usize,
    pub instruction: String,
    pub path: String,
}

/// Lists the context paths a Dockerfile's COPY and ADD instructions read
/// (not those copied from another stage or fetched from a URL; not those
/// with variables, which only the engine can expand).
pub fn context_sources(dockerfile: &str) -> Vec<Source> {
    let mut out = Vec::new();
    for (start, line) in super::dockerfile::logical_lines(dockerfile) {
        let mut words = line.splitn(2, char::is_whitespace);
        let instr = words.next().unwrap_or("").to_ascii_uppercase();
        if instr != "COPY" && instr != "ADD" {
            continue;
        }
        let rest = words.next().unwrap_or("").trim();
        let mut args: Vec<String> = Vec::new();
        let mut flags_done = false;
        let rest_words: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str::<Vec<String>>(rest).unwrap_or_default()
        } else {
            rest.split_whitespace().map(str::to_string).collect()
        };
        let mut from_stage = false;
        for w in rest_words {
            if !flags_done && w.starts_with("--") {
                if w.starts_with("--from") {
                    from_stage = true;
                }
                continue;
            }
            flags_done = true;
            args.push(w);
        }
        if from_stage || args.len() < 2 || args[0].starts_with("<<") {
            continue;
        }
        args.pop();
        for a in args {
            let is_url = a.contains("://") || a.starts_with("git@");
            if is_url || a.contains('$') {
                continue;
            }
            out.push(Source {
                line: start,
                instruction: instr.clone(),
                path: a,
            });
        }
    }
    out
}

/// Refuses a Dockerfile that reads a context path the layer did not declare,
/// before the engine is asked, naming the Dockerfile line and the input list.
pub(super) fn check_dockerfile(text: &str, layer: &Layer) -> Result<()> {
    let df = &layer.dockerfile.path;
    if let Some(c) = &layer.def.context {
        return check_own(text, layer, c);
    }
    if !text.lines().any(|l| {
        let t = l.trim_start();
        t.len() > 5 && t[..5].eq_ignore_ascii_case("FROM ") && t.contains("LW_PARENT")
    }) {
        return Err(Error::config(format!(
            "{df}: no 'FROM ${{LW_PARENT}}': a layer starts from its parent; write 'ARG LW_PARENT' then 'FROM ${{LW_PARENT}}'"
        )));
    }
    let mut present: BTreeSet<&str> = layer.files.iter().map(|f| f.path.as_str()).collect();
    present.insert(df.as_str());
    for src in context_sources(text) {
        let p = normalize(src.path.trim_start_matches('/'));
        if p.is_empty() {
            continue; // `.`: the whole context, whatever was declared.
        }
        let found = if p.contains(['*', '?', '[']) {
            present.iter().any(|f| {
                let depth = p.matches('/').count() + 1;
                let prefix: Vec<&str> = f.split('/').take(depth).collect();
                prefix.len() == depth && base::glob::matches(&p, &prefix.join("/"))
            })
        } else {
            present.contains(p.as_str()) || present.iter().any(|f| f.starts_with(&format!("{p}/")))
        };
        if !found {
            let declared: Vec<String> = layer.def.inputs.iter().map(|i| i.path.clone()).collect();
            return Err(Error::config(format!(
                "{df}:{}: {} reads '{}', which is not an input of layer '{}'; the build context holds only the declared inputs ({}); add 'input {}' under 'layer {}' ({RUNTIME_FILE}:{})",
                src.line,
                src.instruction,
                src.path,
                layer.def.name,
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.join(", ")
                },
                p,
                layer.def.name,
                layer.def.line
            )));
        }
    }
    Ok(())
}

/// [`check_dockerfile`] for the project's own Dockerfile: its FROM lines are
/// its own, and what it COPYs is read from its context `c`, inside it.
fn check_own(text: &str, layer: &Layer, c: &str) -> Result<()> {
    let df = &layer.dockerfile.path;
    let ctx = if c.is_empty() { "." } else { c };
    for src in context_sources(text) {
        let raw = src.path.trim_start_matches('/');
        if super::definition::check_rel_path(raw).is_err_and(|e| e.contains("escapes")) {
            return Err(Error::config(format!(
                "{df}:{}: {} reads '{}', outside the build context '{ctx}'; the engine never sees a file outside it: move the file into '{ctx}'",
                src.line, src.instruction, src.path
            )));
        }
        let p = normalize(raw);
        let full = if c.is_empty() || p.is_empty() {
            format!("{c}{}", p)
        } else {
            format!("{c}/{p}")
        };
        let found = p.is_empty()
            || p.contains(['*', '?', '['])
            || layer
                .files
                .iter()
                .any(|f| f.path == full || f.path.starts_with(&format!("{full}/")));
        if !found {
            return Err(Error::config(format!(
                "{df}:{}: {} reads '{}' ({full}), which is not an input of layer '{}'; add 'input {full}' under 'layer {}' ({RUNTIME_FILE}:{}), or run lw init --force to read the Dockerfile again",
                src.line, src.instruction, src.path, layer.def.name, layer.def.name, layer.def.line
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tail_tests {
    use super::*;

    #[test]
    fn a_build_that_prints_without_end_keeps_forty_short_lines() {
        let mut t = Tail::default();
        for i in 0..10_000 {
            t.push(&format!("line {i}\n"));
        }
        // One line of 64 MiB, in chunks, never ended.
        let chunk = "y".repeat(1 << 20);
        for _ in 0..64 {
            t.push(&chunk);
        }
        let text = t.lines();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line 9961");
        assert_eq!(lines[TAIL_LINES - 1].len(), TAIL_LINE_MAX);
        assert!(t.open.capacity() < 1 << 20, "the open line was held whole");
    }

    #[test]
    fn a_line_cut_inside_a_character_stays_text() {
        let mut t = Tail::default();
        t.push(&"é".repeat(TAIL_LINE_MAX));
        t.push("\n");
        assert!(t.lines().len() <= TAIL_LINE_MAX);
    }

    #[test]
    fn the_shown_output_carries_no_escape_sequence() {
        let mut t = Tail::default();
        t.push("\u{1b}[91mERROR\u{1b}[0m\r\n\u{1b}]0;owned\u{7}\n");
        let text = shown(&t.lines());
        assert!(!text.contains('\u{1b}') && !text.contains('\r') && !text.contains('\u{7}'));
        assert!(text.contains("^[[91mERROR"), "{text}");
    }
}
