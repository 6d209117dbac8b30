//! Registry credentials as the Docker CLI keeps them, so that `docker login
//! HOST` is all a user does once.
//!
//! `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`) is read,
//! never written.  For a registry host, in the Docker CLI's order:
//! `credHelpers[HOST]` names a helper, else `credsStore` does, else
//! `auths[HOST]` holds `auth` (base64 of `user:password`) or `username` and
//! `password`.  A helper is the program `docker-credential-NAME`, run as
//! `docker-credential-NAME get` with the host on its standard input; it
//! answers `{"Username": ..., "Secret": ...}` or fails when it has nothing.
//!
//! A module of its own, beside the registry client (`distribution`) rather
//! than inside it: the client logs in with these credentials, and the
//! Kubernetes runner hands the same ones to the nodes as pull secrets
//! (kubernetes/pull.rs), so that what `lw-build push` put in `build.cache`
//! is what a pod pulls.  Neither engine module needs the registry client.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use base::error::{Error, Exit, Result};

/// A user name and its secret, with where they came from (for errors).
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub secret: String,
    /// `config.json` or `docker-credential-NAME`.
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({} from {})", self.user, self.source)
    }
}

/// The Docker CLI's configuration file.
pub fn config_path() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The credentials for registry `host` (`HOST[:PORT]`), `None` when the
/// configuration has none.  A configuration that cannot be parsed is 78; a
/// helper that cannot run is 69.
pub fn lookup(host: &str) -> Result<Option<Credentials>> {
    let Some(path) = config_path() else {
        return Ok(None);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io_as(Exit::Config, "cannot read", &path, e)),
    };
    let conf: Value = serde_json::from_str(&text).map_err(|e| {
        Error::config(format!(
            "'{}' is not valid JSON ({e}); fix it or log in again with 'docker login {host}'",
            path.display()
        ))
    })?;
    let helper = conf
        .get("credHelpers")
        .and_then(|h| h.get(host))
        .or_else(|| conf.get("credsStore"))
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty());
    if let Some(h) = helper {
        return from_helper(h, host);
    }
    let Some(auths) = conf.get("auths").and_then(Value::as_object) else {
        return Ok(None);
    };
    let entry = auths.iter().find(|(k, _)| {
        let k = k
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        k.split('/').next() == Some(host)
    });
    let Some((_, entry)) = entry else {
        return Ok(None);
    };
    let source = path.display().to_string();
    if let Some(auth) = entry.get("auth").and_then(Value::as_str) {
        let plain = base64_decode(auth)
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| {
                Error::config(format!(
                    "{source}: auths.\"{host}\".auth is not base64 of 'user:password'; log in again with 'docker login {host}'"
                ))
            })?;
        let (user, secret) = plain.split_once(':').ok_or_else(|| {
            Error::config(format!(
                "{source}: auths.\"{host}\".auth has no ':' between user and password"
            ))
        })?;
        return Ok(Some(Credentials {
            user: user.to_string(),
            secret: secret.to_string(),
            source,
        }));
    }
    let user = entry.get("username").and_then(Value::as_str);
    let secret = entry.get("password").and_then(Value::as_str);
    Ok(match (user, secret) {
        (Some(u), Some(s)) => Some(Credentials {
            user: u.to_string(),
            secret: s.to_string(),
            source,
        }),
        _ => None,
    })
}

fn from_helper(name: &str, host: &str) -> Result<Option<Credentials>> {
    let prog = format!("docker-credential-{name}");
    let mut child = Command::new(&prog)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Error::new(
                Exit::Unavailable,
                format!(
                    "cannot run the credential helper '{prog}' named in {}: {e}; install it or remove it from the Docker configuration",
                    config_path().map_or("config.json".into(), |p| p.display().to_string())
                ),
            )
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(host.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| {
        Error::new(
            Exit::Unavailable,
            format!("credential helper '{prog}' failed: {e}"),
        )
    })?;
    if !out.status.success() {
        // "credentials not found in native keychain": nothing stored.
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        Error::new(
            Exit::Unavailable,
            format!("credential helper '{prog}' did not answer JSON: {e}"),
        )
    })?;
    let field = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let (user, secret) = (field("Username"), field("Secret"));
    if secret.is_empty() {
        return Ok(None);
    }
    Ok(Some(Credentials {
        user,
        secret,
        source: prog,
    }))
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (HTTP Basic authentication).
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(B64[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional); `None` on a bad character.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.trim().bytes().filter(|&c| c != b'=') {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for s in ["", "a", "ab", "abc", "user:pa:ss", "\u{e9}t\u{e9}"] {
            let e = base64_encode(s.as_bytes());
            assert_eq!(base64_decode(&e).as_deref(), Some(s.as_bytes()), "{s}");
        }
        assert_eq!(base64_encode(b"user:secret"), "dXNlcjpzZWNyZXQ=");
        assert!(base64_decode("a*b").is_none());
    }
}
