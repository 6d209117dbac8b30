//! A remote's URL with its credentials cut out ([`Remote`]): git sees,
//! stores and prints the bare URL; the credentials reach it as an HTTP
//! header through the environment.  And the redaction of URLs and text
//! that may hold credentials.

use std::ffi::OsString;
use std::fmt;
use std::path::Path;
use std::process::Command;

use base::error::{Error, Result};

/// A remote repository: the URL git may see and store, and the credentials
/// that were cut out of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Remote {
    /// The URL without credentials; safe to print and to store.
    pub url: String,
    creds: Option<Credentials>,
}

#[derive(Clone, PartialEq, Eq)]
struct Credentials {
    user: String,
    password: String,
    /// `scheme://host[:port]/`, the scope of the header.
    origin: String,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .field("creds", &self.creds.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Remote {
    /// Splits credentials out of `url`.  Relative local paths are made
    /// absolute against `base`, since git will run in another directory.
    pub fn parse(url: &str, base: &Path) -> Result<Remote> {
        let url = url.trim();
        if url.is_empty() {
            return Err(Error::usage("empty repository URL"));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            if is_scp_like(url) {
                return Ok(Remote {
                    url: url.to_string(),
                    creds: None,
                });
            }
            let p = Path::new(url);
            let abs = if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            };
            return Ok(Remote {
                url: abs.to_string_lossy().into_owned(),
                creds: None,
            });
        };
        let scheme_l = scheme.to_ascii_lowercase();
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let Some((userinfo, host)) = authority.rsplit_once('@') else {
            return Ok(Remote {
                url: url.to_string(),
                creds: None,
            });
        };
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (percent_decode(u), Some(percent_decode(p))),
            None => (percent_decode(userinfo), None),
        };
        let bare = format!("{scheme}://{host}{path}");
        if scheme_l == "http" || scheme_l == "https" {
            // Either part may be the secret (a token is often sent as the user name).
            let creds = Credentials {
                user,
                password: password.unwrap_or_default(),
                origin: format!("{scheme_l}://{host}/"),
            };
            return Ok(Remote {
                url: bare,
                creds: Some(creds),
            });
        }
        if password.is_some() {
            return Err(Error::usage(format!(
                "a password in a '{scheme}' URL cannot be used ('{}'); use a key or a credential helper",
                redact_url(url)
            )));
        }
        // ssh://user@host/...: the user name is not a secret and ssh needs it.
        Ok(Remote {
            url: url.to_string(),
            creds: None,
        })
    }

    /// True when credentials were cut out of the URL.
    pub fn has_credentials(&self) -> bool {
        self.creds.is_some()
    }

    /// Hands the credentials to a git command through its environment.
    pub fn authorize(&self, cmd: &mut Command) {
        let Some(c) = &self.creds else { return };
        let n: usize = std::env::var("GIT_CONFIG_COUNT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let header = format!(
            "Authorization: Basic {}",
            base64(format!("{}:{}", c.user, c.password).as_bytes())
        );
        cmd.env(
            format!("GIT_CONFIG_KEY_{n}"),
            format!("http.{}.extraHeader", c.origin),
        )
        .env(format!("GIT_CONFIG_VALUE_{n}"), header)
        .env("GIT_CONFIG_COUNT", OsString::from((n + 1).to_string()));
    }

    /// Removes every trace of the credentials from `text` (git's messages),
    /// in case some layer below echoes them.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = redact_text(text);
        if let Some(c) = &self.creds {
            for secret in [&c.password, &c.user] {
                if secret.len() >= 4 {
                    text = text.replace(secret.as_str(), "<redacted>");
                }
            }
        }
        text
    }
}

/// `host:path` and `user@host:path`: a colon before the first slash.
fn is_scp_like(url: &str) -> bool {
    match (url.find(':'), url.find('/')) {
        (Some(c), Some(s)) => c < s && c > 1,
        (Some(c), None) => c > 1,
        _ => false,
    }
}

/// `scheme://user:pass@host/x` -> `scheme://<redacted>@host/x`; other text as is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://<redacted>{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// Redacts the userinfo of every `scheme://...@` URL found in `text`.
pub fn redact_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(at) => {
                out.push_str("<redacted>");
                rest = &tail[at..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::command;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn https_credentials_are_cut_out_of_the_url() {
        let r = Remote::parse(
            "https://bob:s3cr%40t@example.com:8443/a/b.git",
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(r.url, "https://example.com:8443/a/b.git");
        assert!(r.has_credentials());
        let c = r.creds.as_ref().unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("bob", "s3cr@t"));
        assert_eq!(c.origin, "https://example.com:8443/");
        assert!(!format!("{r:?}").contains("s3cr"));
    }

    #[test]
    fn token_as_user_name_is_a_credential_too() {
        let r = Remote::parse("https://ghp_abcdef@example.com/x", Path::new("/")).unwrap();
        assert_eq!(r.url, "https://example.com/x");
        assert_eq!(r.creds.as_ref().unwrap().user, "ghp_abcdef");
    }

    #[test]
    fn credentials_go_to_the_environment_never_to_argv() {
        let r = Remote::parse("https://u:tok123456@example.com/x", Path::new("/")).unwrap();
        let mut cmd = command(None);
        cmd.args(["fetch", &r.url]);
        r.authorize(&mut cmd);
        assert!(
            cmd.get_args()
                .all(|a| !a.to_string_lossy().contains("tok123456"))
        );
        let envs: Vec<(String, String)> = cmd
            .get_envs()
            .filter_map(|(k, v)| {
                Some((
                    k.to_string_lossy().into_owned(),
                    v?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        let key = envs
            .iter()
            .find(|(k, _)| k.starts_with("GIT_CONFIG_KEY_"))
            .unwrap();
        assert_eq!(key.1, "http.https://example.com/.extraHeader");
        let value = envs
            .iter()
            .find(|(k, _)| k.starts_with("GIT_CONFIG_VALUE_"))
            .unwrap();
        assert_eq!(
            value.1,
            format!("Authorization: Basic {}", base64(b"u:tok123456"))
        );
    }

    #[test]
    fn ssh_user_names_stay_and_passwords_are_refused() {
        let r = Remote::parse("ssh://git@example.com/x.git", Path::new("/")).unwrap();
        assert_eq!(r.url, "ssh://git@example.com/x.git");
        let e = Remote::parse("ssh://git:pw1234@example.com/x.git", Path::new("/")).unwrap_err();
        assert!(!e.to_string().contains("pw1234"), "{e}");
        assert_eq!(
            Remote::parse("git@example.com:x.git", Path::new("/"))
                .unwrap()
                .url,
            "git@example.com:x.git"
        );
    }

    #[test]
    fn relative_paths_become_absolute() {
        assert_eq!(
            Remote::parse("../up", Path::new("/p/q")).unwrap().url,
            "/p/q/../up"
        );
        assert_eq!(
            Remote::parse("/abs/up.git", Path::new("/p")).unwrap().url,
            "/abs/up.git"
        );
        assert_eq!(
            Remote::parse("file:///abs/up", Path::new("/p"))
                .unwrap()
                .url,
            "file:///abs/up"
        );
    }

    #[test]
    fn text_redaction() {
        assert_eq!(
            redact_text("fatal: unable to access 'https://u:p@h/x': 403"),
            "fatal: unable to access 'https://<redacted>@h/x': 403"
        );
        assert_eq!(
            redact_text("see https://h/x and ssh://a@b/c"),
            "see https://h/x and ssh://<redacted>@b/c"
        );
        assert_eq!(redact_url("https://tok@h/x"), "https://<redacted>@h/x");
        let r = Remote::parse("https://user1:verysecret@h/x", Path::new("/")).unwrap();
        assert_eq!(
            r.scrub("said verysecret and user1"),
            "said <redacted> and <redacted>"
        );
    }
}
