//! `build` (and the older top-level `dockerFile`/`context`): the project's
//! own Dockerfile becomes the runtime's first layer, `project`, built by
//! lw-build with its `context`, `args` and `target`.  Its inputs are the
//! Dockerfile and the files its COPY and ADD lines read (not the whole
//! context: with the usual `"context": ".."` that would be the whole
//! repository, and every commit would rebuild every layer).
//!
//! Refused, naming the key and the fix, the wall winning: a context or a
//! Dockerfile outside the repository (a symlink counts where it leads), a
//! COPY that climbs out of the context, a COPY of the whole repository, a
//! target that is no stage.  Nothing here runs the engine: whether its FROM
//! images are there is lw-build's question.

use std::path::{Component, Path};

use serde_json::{Map, Value};

use super::mapping::{Build, Mapping};
use super::vars::{self, Context};
use wall::image::{context_sources, dockerfile};

/// A Dockerfile larger than this is no Dockerfile.
const MAX_DOCKERFILE: u64 = 1 << 20;

/// `dir/p` as a path relative to the checkout's top, `None` when it is
/// absolute or climbs above the top.
fn resolve(dir: &Path, p: &str) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in dir.join(p).components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

fn shown(p: &str) -> &str {
    if p.is_empty() { "." } else { p }
}

/// Takes the configuration's Dockerfile, or refuses it; `None` in `obj`
/// leaves the mapping as it was.
pub(super) fn build(m: &mut Mapping, top: &Path, obj: &Map<String, Value>, cx: &Context) {
    let b = obj.get("build").and_then(Value::as_object);
    let file = b
        .and_then(|b| b.get("dockerfile"))
        .or_else(|| obj.get("dockerFile"))
        .or_else(|| obj.get("dockerfile"));
    let key = if b.is_some() {
        "build"
    } else if obj.contains_key("dockerFile") {
        "dockerFile"
    } else {
        "dockerfile"
    };
    let Some(file) = file else {
        for k in ["build", "context"] {
            if obj.contains_key(k) {
                m.refuse(k, "no Dockerfile named ('build.dockerfile'); ignored");
            }
        }
        return;
    };
    if m.image.is_some() {
        return m.refuse(
            key,
            "the configuration names an image too; the image is used",
        );
    }
    let Some(file) = file.as_str() else {
        return m.fatal(key, "expected the Dockerfile's path (a string)");
    };
    let context = b
        .and_then(|b| b.get("context"))
        .or_else(|| obj.get("context"))
        .map(|c| c.as_str().unwrap_or("\u{0}"))
        .unwrap_or(".");
    for k in b.into_iter().flat_map(|b| b.keys()) {
        if !["dockerfile", "context", "args", "target"].contains(&k.as_str()) {
            m.refuse(
                &format!("build.{k}"),
                "ignored: lw-build builds from the engine's images and the declared inputs only",
            );
        }
    }
    match take(m, top, file, context, b, cx) {
        Ok(build) => {
            let mut how = format!(
                "the first layer, 'project', builds {} (context {}",
                build.dockerfile,
                shown(&build.context)
            );
            if let Some(t) = &build.target {
                how.push_str(&format!(", target {t}"));
            }
            for (k, v) in &build.args {
                how.push_str(&format!(", {k}={v}"));
            }
            how.push_str(&format!(
                ") from {}; its inputs: the Dockerfile",
                build.from
            ));
            for i in &build.inputs {
                how.push_str(&format!(", {i}"));
            }
            m.take(key, how);
            m.build = Some(build);
        }
        Err((k, why)) => m.fatal(&k, why),
    }
}

type Refused = (String, String);

fn take(
    m: &Mapping,
    top: &Path,
    file: &str,
    context: &str,
    b: Option<&Map<String, Value>>,
    cx: &Context,
) -> Result<Build, Refused> {
    let here = Path::new(&m.source).parent().unwrap_or(Path::new(""));
    let no = |k: &str, why: String| (k.to_string(), why);
    let ctx = resolve(here, context).ok_or_else(|| {
        no(
            "build.context",
            format!(
                "'{context}' is outside the repository; the build context is the repository's own files: name a folder inside it"
            ),
        )
    })?;
    let df = resolve(here, file).ok_or_else(|| {
        no(
            "build.dockerfile",
            format!("'{file}' is outside the repository; keep the Dockerfile in it"),
        )
    })?;
    let text = read_dockerfile(top, &df).map_err(|w| no("build.dockerfile", w))?;
    let mut args = Vec::new();
    for (k, v) in b
        .and_then(|b| b.get("args"))
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let key = format!("build.args.{k}");
        let v = match v.as_str().map(|s| vars::plain(s, cx, "build.args")) {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                return Err(no(
                    &key,
                    format!("{} is not substituted: {}", e.variable, e.reason),
                ));
            }
            None => return Err(no(&key, "expected a string".into())),
        };
        let plain = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace) && !s.contains('#');
        if !plain(k) || (!v.is_empty() && !plain(&v)) {
            return Err(no(
                &key,
                "a name or value with spaces or '#' cannot be a runtime.conf 'arg'; give it as the Dockerfile's ARG default".into(),
            ));
        }
        args.push((k.clone(), v));
    }
    let target = match b.and_then(|b| b.get("target")) {
        None => None,
        Some(Value::String(t)) if !t.trim().is_empty() => Some(t.clone()),
        Some(_) => return Err(no("build.target", "expected a stage name".into())),
    };
    let text = match &target {
        Some(t) => dockerfile::up_to_target(&text, t).ok_or_else(|| {
            no(
                "build.target",
                format!("'{t}' is no stage of {df} (no 'FROM IMAGE AS {t}')"),
            )
        })?,
        None => text,
    };
    let from = dockerfile::final_image(&text, &args, None)
        .filter(|f| !f.is_empty() && !f.contains('$'))
        .ok_or_else(|| {
            no(
                "build.dockerfile",
                format!("{df}: its last FROM names no image once its build arguments are given"),
            )
        })?;
    let inputs = copied(top, &df, &ctx, &text)?;
    let user = last_user(&text);
    Ok(Build {
        dockerfile: df,
        context: ctx,
        args,
        target,
        inputs,
        from,
        user,
    })
}

/// The last `USER` of the last stage of `text`, unless root.
fn last_user(text: &str) -> Option<String> {
    let mut user = None;
    for l in text.lines() {
        let mut w = l.split_whitespace();
        match w.next().map(str::to_ascii_uppercase).as_deref() {
            Some("FROM") => user = None,
            Some("USER") => user = w.next().map(str::to_string),
            _ => {}
        }
    }
    user.filter(|u| !matches!(u.split(':').next(), Some("root" | "0")))
}

/// The Dockerfile's text, when it is a file in the repository (where a
/// symlink leads counts).
fn read_dockerfile(top: &Path, df: &str) -> Result<String, String> {
    let p = top.join(df);
    let canon_top = top.canonicalize().map_err(|e| e.to_string())?;
    let real = p
        .canonicalize()
        .map_err(|_| format!("'{df}' is not in the repository"))?;
    if !real.starts_with(&canon_top) {
        return Err(format!(
            "'{df}' leads to '{}', outside the repository; refused",
            real.display()
        ));
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("'{df}': {e}"))?;
    if !meta.is_file() || meta.len() > MAX_DOCKERFILE {
        return Err(format!(
            "'{df}' is not a Dockerfile (a regular file under 1 MiB)"
        ));
    }
    std::fs::read_to_string(&real).map_err(|e| format!("'{df}': {e}"))
}

/// The files the Dockerfile's COPY and ADD lines read, relative to the top.
fn copied(top: &Path, df: &str, ctx: &str, text: &str) -> Result<Vec<String>, Refused> {
    let mut v: Vec<String> = Vec::new();
    for s in context_sources(text) {
        let at = format!("{df}:{} {} '{}'", s.line, s.instruction, s.path);
        let no = |why: &str| ("build.dockerfile".to_string(), format!("{at}: {why}"));
        let Some(p) = resolve(Path::new(ctx), s.path.trim_start_matches('/')) else {
            return Err(no(
                "reads outside the build context; the engine never sees such a file: move it into the context",
            ));
        };
        if !(ctx.is_empty() || p == ctx || p.starts_with(&format!("{ctx}/"))) {
            return Err(no(
                "reads outside the build context; the engine never sees such a file: move it into the context",
            ));
        }
        if p.is_empty() {
            return Err(no(
                "copies the whole repository into the image; a sandbox has its own clone at /work/repo: copy only the files the image needs",
            ));
        }
        let found: Vec<String> = if p.contains(['*', '?', '[']) {
            let (dir, pat) = p.rsplit_once('/').unwrap_or(("", &p));
            let names = std::fs::read_dir(top.join(dir)).into_iter().flatten();
            names
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| base::glob::matches(pat, n))
                .map(|n| {
                    if dir.is_empty() {
                        n
                    } else {
                        format!("{dir}/{n}")
                    }
                })
                .collect()
        } else if std::fs::symlink_metadata(top.join(&p)).is_ok() {
            vec![p]
        } else {
            return Err(no("no such file in the build context"));
        };
        for f in found {
            if !v.contains(&f) {
                v.push(f);
            }
        }
    }
    v.retain(|f| f != df);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_top_or_not_at_all() {
        let d = Path::new(".devcontainer");
        assert_eq!(resolve(d, "..").as_deref(), Some(""));
        assert_eq!(
            resolve(d, "Dockerfile").as_deref(),
            Some(".devcontainer/Dockerfile")
        );
        assert_eq!(resolve(d, "../../x"), None);
        assert_eq!(resolve(Path::new(""), ".."), None);
        assert_eq!(resolve(d, "/etc/passwd"), None);
    }
}
