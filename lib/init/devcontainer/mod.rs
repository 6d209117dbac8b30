//! The devcontainer.json a repository already has, as the source of its
//! loopwright runtime (#44).
//!
//! `find` lists the configurations at the three places the specification
//! names (`.devcontainer/devcontainer.json`, `.devcontainer.json`,
//! `.devcontainer/NAME/devcontainer.json`); `choose` takes the one asked
//! for, or the only one, and refuses to guess between several.  `read`
//! parses it (jsonc: comments and trailing commas) and `map` turns it into
//! a [`Mapping`]: each key taken (into the runtime's layers, the sandbox's
//! environment, the report) or refused with a named reason, the wall
//! winning.  `render` writes the runtime from a mapping.  Nothing here
//! talks to an engine; the network only in [`fetch_features`] (lw init's
//! fetching of registry features, registry.rs); the only files read are
//! the configuration, the local features it names, and lw init's record.

use std::path::Path;

use base::error::{Error, Exit, Result};

mod build;
mod features;
pub mod jsonc;
mod map;
mod mapping;
pub mod registry;
pub mod render;
pub mod vars;

pub use map::*;
pub use mapping::*;

/// The `.loopwright/config` key naming the host variables a
/// devcontainer.json may read (`${localEnv:NAME}`); see [`vars`].
pub const KEY_LOCAL_ENV: &str = "devcontainer.local-env";

/// The `.loopwright/config` key naming a PEM file of the certificate
/// authorities lw init trusts for feature registries (instead of the
/// system's).
pub const KEY_FEATURE_CA: &str = "devcontainer.feature-ca";

/// The `.loopwright/config` key bounding each request lw init sends a
/// feature registry (a duration, default 60s).
pub const KEY_FETCH_TIMEOUT: &str = "devcontainer.fetch-timeout";

/// Where the record of what lw init took from a devcontainer.json is kept
/// (lw doctor reads it).
pub const RECORD: &str = ".loopwright/runtime/devcontainer.record";

/// The configurations in the checkout at `top`, relative paths, in the
/// specification's order of preference (then by NAME).
pub fn find(top: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for p in [".devcontainer/devcontainer.json", ".devcontainer.json"] {
        if top.join(p).is_file() {
            v.push(p.to_string());
        }
    }
    let mut named: Vec<String> = std::fs::read_dir(top.join(".devcontainer"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|n| format!(".devcontainer/{n}/devcontainer.json"))
        .filter(|p| top.join(p).is_file())
        .collect();
    named.sort();
    v.extend(named);
    v
}

/// The configuration to use: `asked` (a path relative to `top` or the
/// current directory, which must exist), else the only one found, else
/// none; several and none asked for is a usage error naming them.
pub fn choose(top: &Path, asked: Option<&Path>) -> Result<Option<String>> {
    let found = find(top);
    if let Some(a) = asked {
        let abs = if a.is_absolute() {
            a.to_path_buf()
        } else {
            std::env::current_dir()
                .map(|d| d.join(a))
                .unwrap_or_else(|_| a.to_path_buf())
        };
        let rel = [abs.as_path(), &top.join(a)].into_iter().find_map(|p| {
            let p = p.canonicalize().ok()?;
            let t = top.canonicalize().ok()?;
            p.strip_prefix(&t)
                .ok()
                .map(|r| r.to_string_lossy().into_owned())
        });
        return match rel {
            Some(r) if top.join(&r).is_file() => Ok(Some(r)),
            _ => Err(Error::new(
                Exit::NoInput,
                format!(
                    "--devcontainer '{}': no such file in the repository{}",
                    a.display(),
                    listing(&found)
                ),
            )),
        };
    }
    match found.len() {
        0 | 1 => Ok(found.into_iter().next()),
        _ => Err(Error::usage(format!(
            "several devcontainer configurations; choose one with --devcontainer PATH: {}",
            found.join(", ")
        ))),
    }
}

fn listing(found: &[String]) -> String {
    if found.is_empty() {
        " (none found)".into()
    } else {
        format!(" (found: {})", found.join(", "))
    }
}

/// Reads and parses the configuration at `top/rel` (65 when it is not
/// JSON with comments, naming the line).
pub fn read(top: &Path, rel: &str) -> Result<serde_json::Value> {
    use std::io::Read as _;
    let p = top.join(rel);
    let f = std::fs::File::open(&p).map_err(|e| Error::io("cannot read", &p, e))?;
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", &p, e))?;
    if bytes.len() as u64 > MAX_CONFIG {
        return Err(Error::data(format!(
            "'{rel}': larger than {} KiB, which no devcontainer.json is; choose another with --devcontainer PATH, or --no-devcontainer",
            MAX_CONFIG >> 10
        )));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| Error::data(format!("'{rel}': not UTF-8 text")))?;
    let v = jsonc::parse(&text).map_err(|e| Error::data(format!("'{rel}': {e}")))?;
    if !v.is_object() {
        return Err(Error::data(format!(
            "'{rel}': a devcontainer.json holds one object {{...}}"
        )));
    }
    Ok(v)
}

/// A devcontainer.json larger than this is refused unread (65).
pub const MAX_CONFIG: u64 = 1 << 20;

/// The sha256 of the configuration's bytes (the record keeps it, so lw
/// doctor can say the file changed since lw init).
pub fn digest(top: &Path, rel: &str) -> Option<String> {
    std::fs::read(top.join(rel))
        .ok()
        .map(|b| base::digest::sha256_hex(&b))
}

/// The configuration at `rel` read and mapped: the whole step lw init and
/// lw doctor share.
pub fn load(top: &Path, rel: &str, allowed: &[String]) -> Result<Mapping> {
    let local = top.to_string_lossy();
    let env = |n: &str| std::env::var(n).ok();
    let cx = vars::Context {
        local_folder: &local,
        container_folder: wall::REPO,
        allowed,
        local_env: &env,
    };
    load_with(top, rel, &cx)
}

/// [`load`] with the variables' context given (tests give the host's
/// environment; lw init gives the real one).
pub fn load_with(top: &Path, rel: &str, cx: &vars::Context) -> Result<Mapping> {
    let v = read(top, rel)?;
    Ok(map(top, rel, &v, cx))
}

/// The configuration lw init uses ([`choose`]), mapped with the host
/// variables allowed (`local_env` and the project's
/// `devcontainer.local-env`), starting from `from` when given; with the
/// allowed names, which lw init writes into the config.  Refusals are in
/// the mapping ([`refusal_error`]).
pub fn chosen(
    top: &Path,
    asked: Option<&Path>,
    local_env: &[String],
    from: Option<&str>,
) -> Result<Option<(Mapping, Vec<String>)>> {
    let Some(rel) = choose(top, asked)? else {
        return Ok(None);
    };
    let mut allowed = local_env.to_vec();
    let conf = top.join(base::config::FILE);
    let mut reach = registry::Reach::default();
    let mut feature_ca = None;
    let mut fetch_timeout = None;
    let mut uid = None;
    if let Ok(text) = std::fs::read_to_string(&conf) {
        let c = base::config::Config::parse_project(&text, &conf, wall::config::CHECK)?;
        allowed.extend(self::allowed(&c));
        feature_ca = c.get(KEY_FEATURE_CA).map(str::to_string);
        uid = c.get("sandbox.uid").and_then(|u| u.parse().ok());
        reach.ca_file = feature_ca.as_ref().map(|p| top.join(p));
        fetch_timeout = c.get(KEY_FETCH_TIMEOUT).map(str::to_string);
        if let Some(v) = &fetch_timeout {
            reach.timeout = base::config::parse_duration(v)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    Error::new(
                        Exit::Config,
                        format!(
                            "'{KEY_FETCH_TIMEOUT} = {v}' in '{}' is not a duration above 0; write e.g. 30s or 2m",
                            conf.display()
                        ),
                    )
                })?;
        }
    }
    allowed.sort();
    allowed.dedup();
    let mut m = load(top, &rel, &allowed)?;
    if let Some(f) = from {
        m.start_from(f);
    }
    m.feature_ca = feature_ca;
    m.fetch_timeout = fetch_timeout;
    m.uid = uid;
    let before = std::fs::read_to_string(top.join(RECORD)).unwrap_or_default();
    fetch_features(&mut m, &reach, &render::recorded_features(&before));
    Ok(Some((m, allowed)))
}

/// Fetches each registry feature of `m` (lw init; lw doctor does not):
/// its files, options and order filled in, or a fatal refusal naming it,
/// the cause and how to vendor it.  A feature whose tag now points at
/// another manifest than `before` recorded is said in its taken line.
pub fn fetch_features(m: &mut Mapping, reach: &registry::Reach, before: &[(String, String)]) {
    let base = Path::new(&m.source)
        .parent()
        .unwrap_or(Path::new(""))
        .to_path_buf();
    // Each round fetches what is not yet fetched, then adds what the
    // fetched ones' dependsOn name and nothing lists (the reference's
    // rule), until a round adds nothing.  A chain is bounded, a circle
    // ends since a feature once added (fetched or refused) is never added
    // again.
    let mut tried = Vec::new();
    loop {
        fetch_round(m, reach, &base);
        if !add_wanted(m, &mut tried) {
            break;
        }
    }
    for f in &m.features {
        let Some((r, Some(d))) = f.remote.as_ref().map(|r| (r, r.digest.as_ref())) else {
            continue;
        };
        let key = format!("features[{}]", f.id);
        let moved = before
            .iter()
            .find(|(id, old)| *id == f.id && old != d)
            .map(|(_, old)| format!("; {} moved since the last lw init, from {old}", r.reference));
        if let Some(t) = m.taken.iter_mut().find(|t| t.key == key) {
            t.how = format!("{}, manifest {d}{}", t.how, moved.unwrap_or_default());
        }
    }
    features::order(m);
}

/// Fetches every registry feature not fetched yet; one that fails leaves
/// the list, refused naming how to vendor it.
fn fetch_round(m: &mut Mapping, reach: &registry::Reach, base: &Path) {
    let mut failed = Vec::new();
    for f in m.features.iter_mut() {
        let Some(remote) = f.remote.as_mut().filter(|r| r.digest.is_none()) else {
            continue;
        };
        let got = registry::fetch(&remote.reference, reach).and_then(|got| {
            let meta = got
                .files
                .iter()
                .find(|(p, _, _)| p == "devcontainer-feature.json")
                .map(|(_, b, _)| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default();
            features::from_meta(&f.dir, &meta, remote.given.clone())
                .map(|meta| (got, meta))
                .map_err(Error::data)
        });
        match got {
            Ok((got, meta)) => {
                f.options = meta.options;
                f.env = meta.env;
                f.after = meta.after;
                f.depends = meta.depends;
                f.wants = meta.wants;
                remote.digest = Some(got.digest);
                remote.files = got.files;
            }
            Err(e) => failed.push((f.id.clone(), e.msg)),
        }
    }
    for (id, cause) in failed {
        let key = format!("features[{id}]");
        m.features.retain(|f| f.id != id);
        m.taken.retain(|t| t.key != key);
        m.fatal(&key, features::vendor_hint(&id, base, &cause));
    }
}

/// The most features a configuration may come to with what their
/// `dependsOn` add: a feature's dependencies are a handful; a chain longer
/// than this is a registry leading lw init on.
pub const MAX_FEATURES: usize = 32;

/// Adds, as registry features to fetch, what a listed feature's `dependsOn`
/// names and nothing lists, with the options it gives; `tried` holds what
/// was added before (one that failed to fetch has left the list, refused).
/// False when it adds none (or refuses to go on: over [`MAX_FEATURES`], or
/// two features would share a folder).
fn add_wanted(m: &mut Mapping, tried: &mut Vec<String>) -> bool {
    let resource = |f: &Feature| match &f.remote {
        Some(r) => r.reference.resource(),
        None => f.id.clone(),
    };
    let mut present: Vec<String> = m.features.iter().map(resource).collect();
    present.extend(tried.iter().cloned());
    let mut added = Vec::new();
    for f in &m.features {
        for (id, given) in &f.wants {
            let Some(r) = registry::parse_ref(id) else {
                continue; // a local path or a URL: order() refuses it by name
            };
            if present.contains(&r.resource()) {
                continue;
            }
            present.push(r.resource());
            added.push((f.id.clone(), id.clone(), r, given.clone()));
        }
    }
    if added.is_empty() {
        return false;
    }
    if m.features.len() + added.len() > MAX_FEATURES {
        let ids: Vec<&str> = added.iter().map(|a| a.1.as_str()).collect();
        m.fatal(
            "features",
            format!(
                "dependsOn would bring the features to more than {MAX_FEATURES} (next: {}); vendor them as local features",
                ids.join(", ")
            ),
        );
        return false;
    }
    tried.extend(added.iter().map(|a| a.2.resource()));
    for (by, id, r, given) in added {
        let key = format!("features[{id}]");
        let dir = format!("{}/{}", features::FETCHED_DIR, r.name());
        if let Some(other) = m.features.iter().find(|f| f.dir == dir) {
            let why = format!(
                "the dependsOn of {by} names it, but its folder {dir} is {}'s already; vendor one of them as a local feature",
                other.id
            );
            m.fatal(&key, why);
            return false;
        }
        m.take(
            &key,
            format!(
                "added as a dependsOn of {by}: fetched from {} by lw init into {dir}/, a layer of its own",
                r.registry
            ),
        );
        m.features.push(features::unfetched(id, r, given));
    }
    true
}

/// `--input` paths: files or folders in the checkout at `top`, as the
/// deps layer declares them (66 when one is not there).
pub fn inputs(top: &Path, given: &[String]) -> Result<Vec<String>> {
    let mut v = Vec::new();
    for i in given {
        let rel = i.trim_start_matches("./").trim_end_matches('/');
        let inside =
            !rel.is_empty() && !Path::new(rel).is_absolute() && !rel.split('/').any(|p| p == "..");
        if !inside || !top.join(rel).exists() {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "--input '{i}': no such file in the repository (a path relative to '{}')",
                    top.display()
                ),
            ));
        }
        v.push(rel.to_string());
    }
    Ok(v)
}

/// What lw init says about a mapping, one line each: what it took, then
/// what it refused and why.
pub fn report(m: &Mapping) -> Vec<String> {
    let mut v = vec![format!("devcontainer: {}", m.source)];
    for t in &m.taken {
        v.push(format!("devcontainer: took {}: {}", t.key, t.how));
    }
    for r in &m.refused {
        let what = if r.fatal { "cannot take" } else { "refused" };
        v.push(format!("devcontainer: {what} {}: {}", r.key, r.reason));
    }
    v
}

/// The error that stops lw init when a refusal is fatal (78, naming each).
pub fn refusal_error(m: &Mapping) -> Option<Error> {
    let fatal: Vec<String> = m
        .fatal_refusals()
        .map(|r| format!("{}: {}", r.key, r.reason))
        .collect();
    (!fatal.is_empty()).then(|| {
        Error::config(format!(
            "'{}' cannot be the runtime as it is; nothing written: {}",
            m.source,
            fatal.join("; ")
        ))
    })
}

/// The host variables a configuration may read: `devcontainer.local-env`
/// (names separated by commas or spaces).
pub fn allowed(config: &base::config::Config) -> Vec<String> {
    config
        .get(KEY_LOCAL_ENV)
        .unwrap_or("")
        .split([',', ' ', '\t'])
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_places_and_a_choice_among_several() {
        let d = std::env::temp_dir().join(format!(
            "lw-dc-find-{}-{:x}",
            std::process::id(),
            base::id::random128() as u32
        ));
        std::fs::create_dir_all(d.join(".devcontainer/python")).unwrap();
        std::fs::create_dir_all(d.join(".devcontainer/node")).unwrap();
        std::fs::create_dir_all(d.join(".devcontainer/empty")).unwrap();
        assert_eq!(choose(&d, None).unwrap(), None);
        std::fs::write(d.join(".devcontainer/python/devcontainer.json"), "{}").unwrap();
        assert_eq!(
            choose(&d, None).unwrap().as_deref(),
            Some(".devcontainer/python/devcontainer.json")
        );
        std::fs::write(d.join(".devcontainer/node/devcontainer.json"), "{}").unwrap();
        std::fs::write(d.join(".devcontainer.json"), "{}").unwrap();
        assert_eq!(
            find(&d),
            [
                ".devcontainer.json",
                ".devcontainer/node/devcontainer.json",
                ".devcontainer/python/devcontainer.json"
            ]
        );
        let e = choose(&d, None).unwrap_err();
        assert_eq!(e.exit, Exit::Usage);
        assert!(e.msg.contains("--devcontainer PATH: .devcontainer.json, .devcontainer/node/devcontainer.json, .devcontainer/python/devcontainer.json"), "{}", e.msg);
        assert_eq!(
            choose(&d, Some(Path::new(".devcontainer/node/devcontainer.json")))
                .unwrap()
                .as_deref(),
            Some(".devcontainer/node/devcontainer.json")
        );
        let e = choose(&d, Some(Path::new(".devcontainer/go/devcontainer.json"))).unwrap_err();
        assert_eq!(e.exit, Exit::NoInput);
        assert!(e.msg.contains("found: .devcontainer.json"), "{}", e.msg);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
