//! The grammar of a kit's values (crates/agent/src/kit.rs): names, exact
//! versions, upstream URLs, endpoints, variable names, relative paths and
//! command lines, each checked with an error that names the key.

use base::config::Config;
use base::error::{Error, Result};

/// True for a kit name: lower-case letters, digits and `-`, starting with a letter.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.as_bytes()[0].is_ascii_lowercase()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An exact version: `MAJOR.MINOR.PATCH` with an optional `-pre` part.
/// Ranges, tags (`latest`) and wildcards are refused.
pub fn exact_version(v: &str) -> bool {
    let (core, pre) = match v.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (v, None),
    };
    let nums: Vec<&str> = core.split('.').collect();
    nums.len() == 3
        && nums
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && pre.is_none_or(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
}

fn env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.as_bytes()[0].is_ascii_digit()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks an `upstream` value: `https://HOST[:PORT]` (or `http://`), no
/// path, query or credentials.  Returns (scheme, host, port).
pub fn parse_upstream(v: &str) -> std::result::Result<(String, String, u16), String> {
    let (scheme, rest) = v
        .split_once("://")
        .ok_or_else(|| format!("'{v}' is not https://HOST[:PORT]"))?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err(format!("'{v}': the scheme must be https (or http)")),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.contains(['/', '@', '?', '#', ' ']) {
        return Err(format!(
            "'{v}' is not https://HOST[:PORT] (no path, user or query)"
        ));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("'{v}': bad port '{p}'"))?,
        ),
        None => (rest, default_port),
    };
    let ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if !ok {
        return Err(format!("'{v}': bad host '{host}'"));
    }
    Ok((scheme.to_string(), host.to_ascii_lowercase(), port))
}

fn words(v: &str) -> Vec<String> {
    v.split_whitespace().map(str::to_string).collect()
}

/// A kit's keys, read with errors that name the file and the key.
pub(super) struct Fields<'a> {
    pub(super) cfg: &'a Config,
    pub(super) source: &'a str,
}

impl Fields<'_> {
    pub(super) fn bad(&self, key: &str, why: String) -> Error {
        Error::config(format!("{}: {key}: {why}", self.source))
    }

    pub(super) fn need(&self, key: &str) -> Result<String> {
        self.cfg
            .get(key)
            .map(str::to_string)
            .ok_or_else(|| self.bad(key, "missing; every kit names it".into()))
    }

    /// The value of `key`, accepted by `ok`.
    pub(super) fn check(
        &self,
        key: &str,
        ok: impl Fn(&str) -> std::result::Result<(), String>,
    ) -> Result<String> {
        let v = self.need(key)?;
        ok(&v).map_err(|m| self.bad(key, m))?;
        Ok(v)
    }

    /// A command line with the word {prompt} once, split at spaces.
    pub(super) fn command(&self, key: &str) -> Result<Vec<String>> {
        let w = words(&self.need(key)?);
        if w.iter().filter(|x| *x == "{prompt}").count() != 1 {
            return Err(self.bad(key, "must hold the word {prompt} exactly once".to_string()));
        }
        if w.iter().any(|x| x.contains(['\'', '"', '\\', '$', '`'])) {
            return Err(self.bad(
                key,
                "words are split at spaces; quotes, '$', '`' and '\\' are not interpreted"
                    .to_string(),
            ));
        }
        Ok(w)
    }
}

/// An npm package name: `name` or `@scope/name`.
pub(super) fn check_package(package: &str) -> std::result::Result<(), String> {
    let body = package.strip_prefix('@').unwrap_or(package);
    let parts: Vec<&str> = body.split('/').collect();
    let scoped = package.starts_with('@');
    let ok = (parts.len() == if scoped { 2 } else { 1 })
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{package}' is not an npm package name (name or @scope/name)"
        ))
    }
}

pub(super) fn check_program(program: &str) -> std::result::Result<(), String> {
    if !program
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        || program.is_empty()
    {
        return Err(format!("'{program}' is not a command name"));
    }
    Ok(())
}

/// `METHOD /path`, or several separated by commas.  A path may hold
/// `{model}` where the API names the model (Gemini's
/// `/v1beta/models/{model}:generateContent`): the model proxy matches one
/// name there (letters, digits, `.`, `_`, `-`), never a `/`, `?` or `:`.
pub(super) fn parse_endpoints(
    endpoint: &str,
) -> std::result::Result<Vec<(String, String)>, String> {
    let bad = || {
        format!(
            "'{endpoint}' is not 'METHOD /path' (or several, separated by commas), e.g. 'POST /v1/messages'"
        )
    };
    let mut out = Vec::new();
    for one in endpoint.split(',') {
        match one.split_whitespace().collect::<Vec<_>>().as_slice() {
            [m, p]
                if !m.is_empty()
                    && m.bytes().all(|b| b.is_ascii_uppercase())
                    && p.starts_with('/')
                    && !p.contains(['?', '#'])
                    && p.replace("{model}", "")
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/-._~:".contains(&b)) =>
            {
                out.push((m.to_string(), p.to_string()));
            }
            _ => return Err(bad()),
        }
    }
    Ok(out)
}

pub(super) fn check_env_name(v: &str) -> std::result::Result<(), String> {
    if env_name(v) {
        Ok(())
    } else {
        Err(format!("'{v}' is not a variable name"))
    }
}

/// A path relative to the agent's HOME, without `.` or `..`.
pub(super) fn check_relative(v: &str) -> std::result::Result<(), String> {
    let ok = !v.starts_with('/') && v.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(format!("'{v}' must be a path relative to the agent's HOME"))
    }
}

/// `NAME=VALUE` words.
pub(super) fn parse_env(v: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut env = Vec::new();
    for pair in words(v) {
        match pair.split_once('=') {
            Some((k, v)) if env_name(k) => env.push((k.to_string(), v.to_string())),
            _ => return Err(format!("'{pair}' is not NAME=VALUE")),
        }
    }
    Ok(env)
}
