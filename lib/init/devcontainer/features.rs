//! `features`: a local one (`./NAME`, a folder beside the configuration
//! with `devcontainer-feature.json` and `install.sh`) becomes a layer of its
//! own, tagged by its files; one from a registry or a URL is refused, naming
//! it and how to vendor it, since lw-build fetches nothing but what the
//! layers declare.

use std::path::{Component, Path};

use serde_json::Value;

use super::mapping::{Feature, Mapping};
use super::vars::{self, Context};

/// The environment variable an option is given as (the specification's
/// rule: non-word characters to `_`, leading digits and `_` to one `_`,
/// upper case).
pub fn option_env(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = s.trim_start_matches(|c: char| c.is_ascii_digit() || c == '_');
    let s = if trimmed.len() < s.len() {
        format!("_{trimmed}")
    } else {
        s
    };
    s.to_ascii_uppercase()
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Takes or refuses each entry of `features`.
pub fn features(m: &mut Mapping, top: &Path, source: &str, val: &Value, cx: &Context) {
    let Some(obj) = val.as_object() else {
        return m.refuse("features", "expected an object of feature: options");
    };
    let base = Path::new(source).parent().unwrap_or(Path::new(""));
    for (id, opts) in obj {
        let key = format!("features[{id}]");
        if !id.starts_with("./") {
            let name = id
                .rsplit('/')
                .next()
                .unwrap_or(id)
                .split([':', '@'])
                .next()
                .unwrap_or("feature");
            m.fatal(
                &key,
                format!(
                    "a feature from a registry or a URL, which lw-build does not fetch; vendor it: on a machine that reaches it, copy the feature's folder (devcontainer-feature.json, install.sh: 'oras pull {id}' and unpack it) into {}/{name}/ and name it \"./{name}\" in features",
                    base.display()
                ),
            );
            continue;
        }
        let dir = base.join(id.trim_start_matches("./"));
        if dir.components().any(|c| matches!(c, Component::ParentDir)) {
            m.fatal(&key, "a local feature lies in the configuration's folder");
            continue;
        }
        match local(top, &dir, opts, cx) {
            Ok(mut f) => {
                f.id = id.clone();
                m.take(
                    &key,
                    format!("layer {}, tagged by the files of {}", layer_name(&f), f.dir),
                );
                m.features.push(f);
            }
            Err(reason) => m.fatal(&key, reason),
        }
    }
}

/// The layer a feature is built in: `feature-NAME`.
pub fn layer_name(f: &Feature) -> String {
    let last = f.dir.rsplit('/').next().unwrap_or("x");
    let s: String = last
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(30)
        .collect();
    format!("feature-{s}")
}

fn local(top: &Path, dir: &Path, opts: &Value, cx: &Context) -> Result<Feature, String> {
    let rel = dir.to_string_lossy().into_owned();
    let meta = top.join(dir).join("devcontainer-feature.json");
    let text = std::fs::read_to_string(&meta)
        .map_err(|e| format!("cannot read '{rel}/devcontainer-feature.json': {e}"))?;
    let meta = super::jsonc::parse(&text)
        .map_err(|e| format!("'{rel}/devcontainer-feature.json': {e}"))?;
    if !top.join(dir).join("install.sh").is_file() {
        return Err(format!("'{rel}' has no install.sh"));
    }
    for wide in [
        "privileged",
        "capAdd",
        "securityOpt",
        "mounts",
        "entrypoint",
    ] {
        if meta.get(wide).is_some_and(|v| v != &Value::Bool(false)) {
            return Err(format!(
                "its devcontainer-feature.json asks for '{wide}', which the wall refuses"
            ));
        }
    }
    let mut options = Vec::new();
    let declared = meta.get("options").and_then(Value::as_object);
    for (name, decl) in declared.into_iter().flatten() {
        if let Some(d) = decl.get("default").and_then(scalar) {
            options.push((option_env(name), d));
        }
    }
    // A bare version string is the option `version`.
    let given: Vec<(String, Value)> = match opts {
        Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Value::String(s) => vec![("version".into(), Value::String(s.clone()))],
        _ => vec![],
    };
    for (name, v) in given {
        let v = scalar(&v).ok_or_else(|| format!("option '{name}': expected a string"))?;
        let v = vars::plain(&v, cx, "features")
            .map_err(|e| format!("{} is not substituted: {}", e.variable, e.reason))?;
        let env = option_env(&name);
        options.retain(|(n, _)| *n != env);
        options.push((env, v));
    }
    let env = meta
        .get("containerEnv")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect();
    Ok(Feature {
        id: String::new(),
        dir: rel,
        options,
        env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_names_become_variables_as_the_specification_says() {
        for (id, env) in [
            ("version", "VERSION"),
            ("installTools", "INSTALLTOOLS"),
            ("node-gyp", "NODE_GYP"),
            ("9lives", "_LIVES"),
            ("_x", "_X"),
            ("a.b", "A_B"),
        ] {
            assert_eq!(option_env(id), env, "{id}");
        }
    }
}
