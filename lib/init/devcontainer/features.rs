//! `features`: a local one (`./NAME`, a folder beside the configuration
//! with `devcontainer-feature.json` and `install.sh`) becomes a layer of its
//! own, tagged by its files; one from a registry is fetched by lw init
//! (registry.rs) and becomes one, as does each registry feature its
//! `dependsOn` names that is not listed; one from a URL is refused, naming it and
//! how to vendor it, since lw-build fetches nothing but what the layers
//! declare.  They install in the order written, each moved after those its
//! `installsAfter` and `dependsOn` name.

use std::path::{Component, Path};

use serde_json::Value;

use super::mapping::{Feature, Mapping, Remote};
use super::registry;
use super::vars::{self, Context};

/// The environment variable an option is given as (the specification's
/// rule: non-word characters to `_`, leading digits and `_` to one `_`,
/// upper case).
pub(super) fn option_env(id: &str) -> String {
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

/// Where lw init writes a registry feature's files: the runtime's own
/// folder, so lw-build reads it like a local one.
pub(super) const FETCHED_DIR: &str = ".loopwright/runtime/features";

/// Takes or refuses each entry of `features`.  A registry feature is taken
/// unfetched ([`super::fetch_features`] fetches it, lw init only).
pub(super) fn features(m: &mut Mapping, top: &Path, source: &str, val: &Value, cx: &Context) {
    let Some(obj) = val.as_object() else {
        return m.refuse("features", "expected an object of feature: options");
    };
    let base = Path::new(source).parent().unwrap_or(Path::new(""));
    for (id, opts) in obj {
        let key = format!("features[{id}]");
        let given = match given_options(opts, cx) {
            Ok(g) => g,
            Err(reason) => {
                m.fatal(&key, reason);
                continue;
            }
        };
        if !id.starts_with("./") {
            match registry::parse_ref(id) {
                Some(r) => {
                    m.take(
                        &key,
                        format!(
                            "fetched from {} by lw init into {FETCHED_DIR}/{}/, a layer of its own",
                            r.registry,
                            r.name()
                        ),
                    );
                    m.features.push(unfetched(id.clone(), r, given));
                }
                None => m.fatal(&key, vendor_hint(id, base, "")),
            }
            continue;
        }
        let dir = base.join(id.trim_start_matches("./"));
        if dir.components().any(|c| matches!(c, Component::ParentDir)) {
            m.fatal(&key, "a local feature lies in the configuration's folder");
            continue;
        }
        match local(top, &dir, given) {
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
    order(m);
}

/// A registry feature not fetched yet: its folder under [`FETCHED_DIR`],
/// named after it.
pub(super) fn unfetched(
    id: String,
    reference: super::registry::FeatureRef,
    given: Vec<(String, String)>,
) -> Feature {
    Feature {
        id,
        dir: format!("{FETCHED_DIR}/{}", reference.name()),
        options: vec![],
        env: vec![],
        after: vec![],
        depends: vec![],
        wants: vec![],
        remote: Some(Remote {
            reference,
            given,
            digest: None,
            files: vec![],
        }),
    }
}

/// The layer a feature is built in: `feature-NAME`.
pub(super) fn layer_name(f: &Feature) -> String {
    let last = f.dir.rsplit('/').next().unwrap_or("x");
    let s: String = last
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(30)
        .collect();
    format!("feature-{s}")
}

/// The refusal of a feature lw init cannot fetch: how to vendor it.
pub(super) fn vendor_hint(id: &str, base: &Path, cause: &str) -> String {
    let name = id
        .rsplit('/')
        .next()
        .unwrap_or(id)
        .split([':', '@'])
        .next()
        .unwrap_or("feature");
    let what = if cause.is_empty() {
        "a feature from a URL or by a legacy name, which lw init does not fetch".to_string()
    } else {
        format!("cannot fetch it: {cause}")
    };
    let get = if id.contains("://") {
        format!("download {id} and unpack it")
    } else {
        format!("'oras pull {id}' and unpack it")
    };
    format!(
        "{what}; vendor it: on a machine that reaches it, copy the feature's folder (devcontainer-feature.json, install.sh: {get}) into {}/{name}/ and name it \"./{name}\" in features",
        base.display()
    )
}

/// The options given to a feature, as install.sh reads them.
fn given_options(opts: &Value, cx: &Context) -> Result<Vec<(String, String)>, String> {
    // A bare version string is the option `version`.
    let given: Vec<(String, Value)> = match opts {
        Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Value::String(s) => vec![("version".into(), Value::String(s.clone()))],
        _ => vec![],
    };
    let mut out = Vec::new();
    for (name, v) in given {
        let v = scalar(&v).ok_or_else(|| format!("option '{name}': expected a string"))?;
        let v = vars::plain(&v, cx, "features")
            .map_err(|e| format!("{} is not substituted: {}", e.variable, e.reason))?;
        out.push((option_env(&name), v));
    }
    Ok(out)
}

/// Installs each feature after those its `installsAfter` and `dependsOn`
/// name, else in the order written (the reference's rule).  A `dependsOn`
/// that is not there is refused, naming it: lw init has fetched every one
/// from a registry by then ([`super::fetch_features`]), so what is left is
/// one it could not fetch (a local path, a URL).
pub(super) fn order(m: &mut Mapping) {
    let key_of = |f: &Feature| match &f.remote {
        Some(r) => r.reference.resource(),
        None => f.id.clone(),
    };
    let present: Vec<String> = m.features.iter().map(key_of).collect();
    let mut missing = Vec::new();
    for f in &m.features {
        for d in &f.depends {
            if !present.contains(d) {
                missing.push((format!("features[{}]", f.id), d.clone()));
            }
        }
    }
    for (key, d) in missing {
        let why =
            format!("its dependsOn names {d}, which lw init cannot fetch: name it in features");
        if !m.refused.iter().any(|r| r.key == key && r.reason == why) {
            m.fatal(&key, why);
        }
    }
    let mut left = std::mem::take(&mut m.features);
    while !left.is_empty() {
        let placed: Vec<String> = m.features.iter().map(key_of).collect();
        let ready = left.iter().position(|f| {
            f.after
                .iter()
                .all(|a| placed.contains(a) || !present.contains(a) || *a == key_of(f))
        });
        let Some(i) = ready else {
            let ids: Vec<String> = left.iter().map(|f| f.id.clone()).collect();
            m.fatal(
                "features",
                format!(
                    "installsAfter/dependsOn form a circle among {}",
                    ids.join(", ")
                ),
            );
            m.features.append(&mut left);
            return;
        };
        m.features.push(left.remove(i));
    }
}

/// A feature's folder checked (no widening of the wall), its options'
/// defaults filled in and the given ones over them.
pub(super) fn from_meta(
    rel: &str,
    meta: &str,
    given: Vec<(String, String)>,
) -> Result<Feature, String> {
    let meta =
        super::jsonc::parse(meta).map_err(|e| format!("'{rel}/devcontainer-feature.json': {e}"))?;
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
    for (env, v) in given {
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
    // installsAfter is a list of identifiers; dependsOn an object of them.
    let unversioned = |id: &str| match registry::parse_ref(id) {
        Some(r) => r.resource(),
        None => id.to_string(),
    };
    let depends_on = meta.get("dependsOn").and_then(Value::as_object);
    let depends: Vec<String> = depends_on
        .into_iter()
        .flatten()
        .map(|(k, _)| unversioned(k))
        .collect();
    let mut wants = Vec::new();
    for (id, opts) in depends_on.into_iter().flatten() {
        let mut given = Vec::new();
        for (name, v) in opts.as_object().into_iter().flatten() {
            let v = scalar(v).ok_or_else(|| {
                format!("its dependsOn gives {id} option '{name}' that is not a string")
            })?;
            given.push((option_env(name), v));
        }
        wants.push((id.clone(), given));
    }
    let mut after: Vec<String> = meta
        .get("installsAfter")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(unversioned)
        .collect();
    after.extend(depends.iter().cloned());
    Ok(Feature {
        id: String::new(),
        dir: rel.to_string(),
        options,
        env,
        after,
        depends,
        wants,
        remote: None,
    })
}

fn local(top: &Path, dir: &Path, given: Vec<(String, String)>) -> Result<Feature, String> {
    let rel = dir.to_string_lossy().into_owned();
    let meta = top.join(dir).join("devcontainer-feature.json");
    let text = std::fs::read_to_string(&meta)
        .map_err(|e| format!("cannot read '{rel}/devcontainer-feature.json': {e}"))?;
    if !top.join(dir).join("install.sh").is_file() {
        return Err(format!("'{rel}' has no install.sh"));
    }
    from_meta(&rel, &text, given)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feat(id: &str, meta: &str) -> Feature {
        let mut f = from_meta(id, meta, vec![]).expect("meta reads");
        f.id = id.to_string();
        f.remote = registry::parse_ref(id).map(|reference| Remote {
            reference,
            given: vec![],
            digest: None,
            files: vec![],
        });
        f
    }

    #[test]
    fn features_install_after_what_they_name_else_as_written() {
        let with = |features| Mapping {
            features,
            ..Mapping::default()
        };
        let mut m = with(vec![
            feat(
                "ghcr.io/x/python:1",
                r#"{"installsAfter": ["ghcr.io/x/common"]}"#,
            ),
            feat("./mine", r#"{"dependsOn": {"ghcr.io/x/python:1": {}}}"#),
            feat("ghcr.io/x/common:2", "{}"),
        ]);
        order(&mut m);
        let ids: Vec<&str> = m.features.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["ghcr.io/x/common:2", "ghcr.io/x/python:1", "./mine"]);
        assert!(m.refused.is_empty(), "{:?}", m.refused);

        let mut m = with(vec![feat(
            "./mine",
            r#"{"dependsOn": {"ghcr.io/x/go:1": {}}}"#,
        )]);
        order(&mut m);
        order(&mut m);
        assert_eq!(m.refused.len(), 1, "said once: {:?}", m.refused);
        assert!(m.refused[0].fatal && m.refused[0].reason.contains("ghcr.io/x/go"));

        let mut m = with(vec![
            feat("ghcr.io/x/a:1", r#"{"installsAfter": ["ghcr.io/x/b"]}"#),
            feat("ghcr.io/x/b:1", r#"{"installsAfter": ["ghcr.io/x/a"]}"#),
        ]);
        order(&mut m);
        assert_eq!(m.features.len(), 2);
        assert!(m.refused[0].reason.contains("circle"), "{:?}", m.refused);
    }

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
