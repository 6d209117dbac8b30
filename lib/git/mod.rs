//! Running the git CLI safely, and keeping credentials out of sight.
//!
//! Every git process the library starts goes through [`command`]: never a
//! shell, arguments passed one by one, and an environment scrubbed of the
//! variables that would make git act on another repository than the one we
//! name (`GIT_DIR`, `GIT_WORK_TREE`, `GIT_OBJECT_DIRECTORY`, ... as set by a
//! hook or an outer git).  Git never prompts (`GIT_TERMINAL_PROMPT=0`): a
//! command that needs a password it was not given fails instead of hanging.
//! Messages are in the C locale so that their text can be classified.
//!
//! # Credentials
//!
//! A URL such as `https://user:token@host/repo.git` must not reach git as is:
//! git would store it in the repository's config, show it in error messages,
//! and anyone could read it in `ps`.  [`Remote::parse`] splits it into the
//! bare URL (`https://host/repo.git`), which is what git sees, stores and
//! prints, and the credentials, which are handed to git as an HTTP
//! `Authorization` header through the environment (`GIT_CONFIG_COUNT`,
//! `GIT_CONFIG_KEY_n`, `GIT_CONFIG_VALUE_n`), scoped to that host.  The token
//! is thus never in argv, never on disk and never in git's output (git
//! redacts the header from its traces; `GIT_TRACE_REDACT` is forced on).

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::error::{Error, Exit, Result};

/// Variables that point git at some other repository or object store; git's
/// own list is `git rev-parse --local-env-vars`.  `GIT_CONFIG_PARAMETERS`
/// and `GIT_CONFIG_COUNT` stay: they are the caller's `-c` settings.
const SCRUBBED: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
    "GIT_GRAFT_FILE",
    "GIT_SHALLOW_FILE",
    "GIT_REPLACE_REF_BASE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_QUARANTINE_PATH",
    "GIT_CONFIG",
];

/// A `git` command with a scrubbed environment, run in `dir` (`git -C dir`).
pub fn command(dir: Option<&Path>) -> Command {
    let mut cmd = Command::new("git");
    for v in SCRUBBED {
        cmd.env_remove(v);
    }
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_TRACE_REDACT", "1")
        .env("LC_ALL", "C")
        .env_remove("LANGUAGE");
    cmd.stdin(Stdio::null());
    if let Some(dir) = dir {
        cmd.arg("-C").arg(dir);
    }
    cmd
}

/// Runs `cmd`, capturing its output; `what` names the step in errors.
/// A git that cannot be started is unavailable (69).
pub fn output(cmd: &mut Command, what: &str) -> Result<Output> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.output().map_err(|e| {
        Error::new(Exit::Unavailable, format!("cannot run git to {what}")).with_source(e)
    })
}

/// The last non-empty line of git's stderr, the one that says why.
pub fn last_words(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("hint:"));
    let fatal = lines
        .clone()
        .find(|l| l.starts_with("fatal:") || l.starts_with("error:"));
    fatal
        .or_else(|| lines.next_back())
        .unwrap_or("git failed without a message")
        .to_string()
}

/// The top of the checkout that contains `dir` and its git directory, found
/// without running git: the nearest directory, from `dir` up, that holds a
/// `.git` directory or a `.git` file (`gitdir: ...`, as in worktrees and
/// submodules).  This is what `git rev-parse --show-toplevel` answers in
/// every ordinary case, at no process's cost; `GIT_DIR` and
/// `GIT_CEILING_DIRECTORIES` are not consulted, because the commands act on
/// the project they are run in.
pub fn find_checkout(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut cur = Some(dir);
    while let Some(d) = cur {
        let dot = d.join(".git");
        if let Ok(md) = std::fs::metadata(&dot) {
            if md.is_dir() && dot.join("HEAD").exists() {
                return Some((d.to_path_buf(), dot));
            }
            if md.is_file() {
                let text = std::fs::read_to_string(&dot).ok()?;
                let target = text.strip_prefix("gitdir:")?.trim();
                return Some((d.to_path_buf(), d.join(target)));
            }
        }
        cur = d.parent();
    }
    None
}

/// `remote.origin.url` of the checkout whose git directory is `git_dir`.
/// The repository's own config file is read directly when it is plain;
/// one with includes or per-worktree config, or one that does not set the
/// key (it may come from the user's config), is asked of git itself.
pub fn origin_url(top: &Path, git_dir: &Path) -> Result<Option<String>> {
    let common = match std::fs::read_to_string(git_dir.join("commondir")) {
        Ok(c) => git_dir.join(c.trim()),
        Err(_) => git_dir.to_path_buf(),
    };
    if let Ok(text) = std::fs::read_to_string(common.join("config")) {
        let lower = text.to_ascii_lowercase();
        if !lower.contains("[include")
            && !lower.contains("worktreeconfig")
            && let Some(url) = config_value(&text, "remote", Some("origin"), "url")
        {
            return Ok(Some(url));
        }
    }
    config_get(top, "remote.origin.url")
}

/// The last value of `section.subsection.key` in git config text, or `None`
/// when it is absent or the text is beyond this reader (then ask git).
fn config_value(text: &str, section: &str, sub: Option<&str>, key: &str) -> Option<String> {
    let mut inside = false;
    let mut found = None;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let l = line.trim_start();
        if l.starts_with('[') {
            let end = l.find(']')?;
            let head = &l[1..end];
            inside = match head.split_once(char::is_whitespace) {
                Some((s, rest)) => {
                    let q = rest.trim();
                    let q = q.strip_prefix('"')?.strip_suffix('"')?;
                    if q.contains('\\') {
                        return None;
                    }
                    s.eq_ignore_ascii_case(section) && Some(q) == sub
                }
                None => {
                    // `[remote.origin]`, the old spelling, is lower-cased by git.
                    let (s, q) = match head.split_once('.') {
                        Some((s, q)) => (s, Some(q.to_ascii_lowercase())),
                        None => (head, None),
                    };
                    s.eq_ignore_ascii_case(section) && q.as_deref() == sub
                }
            };
            let rest = l[end + 1..].trim_start();
            if !(rest.is_empty() || rest.starts_with('#') || rest.starts_with(';')) {
                return None; // `[section] key = value` on one line: leave it to git
            }
            continue;
        }
        if !inside || l.is_empty() || l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let (k, v) = match l.split_once('=') {
            Some((k, v)) => (k.trim(), v),
            None => (l.trim(), ""),
        };
        if !k.eq_ignore_ascii_case(key) {
            continue;
        }
        let mut raw = v.to_string();
        while raw.trim_end().ends_with('\\') && !raw.trim_end().ends_with("\\\\") {
            let t = raw.trim_end();
            raw = format!("{}{}", &t[..t.len() - 1], lines.next()?);
        }
        found = Some(unquote(&raw)?);
    }
    found
}

/// A git config value: quotes removed, escapes resolved, comments cut.
fn unquote(raw: &str) -> Option<String> {
    let mut out = String::new();
    let mut quoted = false;
    let mut pending_space = String::new();
    let mut chars = raw.trim_start().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(match chars.next()? {
                    'n' => '\n',
                    't' => '\t',
                    'b' => '\u{8}',
                    '"' => '"',
                    '\\' => '\\',
                    _ => return None,
                });
            }
            '#' | ';' if !quoted => break,
            c if c.is_whitespace() && !quoted => pending_space.push(c),
            c => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(c);
            }
        }
    }
    (!quoted).then_some(out)
}

/// `git config --get KEY` in `dir`; `None` when unset.
pub fn config_get(dir: &Path, key: &str) -> Result<Option<String>> {
    let out = output(
        command(Some(dir)).args(["config", "--get", key]),
        "read the configuration",
    )?;
    match out.status.code() {
        Some(0) => Ok(Some(
            String::from_utf8_lossy(&out.stdout)
                .trim_end_matches('\n')
                .to_string(),
        )),
        Some(1) => Ok(None),
        _ => Err(Error::config(format!(
            "cannot read '{key}' in '{}': {}",
            dir.display(),
            last_words(&out.stderr)
        ))),
    }
}

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

    #[test]
    fn reads_origin_from_plain_config_text_as_git_does() {
        let text = "[core]\n\tbare = false\n[remote \"upstream\"]\n\turl = /u\n[Remote \"origin\"]\n\tURL = https://h/x.git ; a comment\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("https://h/x.git")
        );
        let text = "[remote \"origin\"]\n  url = \"/path with/#hash\"  # c\n[remote \"origin\"]\n  url = /later\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("/later")
        );
        let text = "[remote \"origin\"]\n  url = \"/a/#b\"\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("/a/#b")
        );
        let text = "[remote.origin]\n  url = /old\n";
        assert_eq!(
            config_value(text, "remote", Some("origin"), "url").as_deref(),
            Some("/old")
        );
        let text = "[remote \"Origin\"]\n  url = /other\n";
        assert_eq!(config_value(text, "remote", Some("origin"), "url"), None);
        assert_eq!(
            config_value(
                "[remote \"origin\"]\n url = \"/open\n",
                "remote",
                Some("origin"),
                "url"
            ),
            None
        );
    }

    #[test]
    fn config_reader_agrees_with_git() {
        let dir = std::env::temp_dir().join(format!("lw-git-config-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = output(command(None).args(["init", "-q"]).arg(&dir), "init").unwrap();
        assert!(out.status.success());
        for url in [
            "https://h/x.git",
            "/p a/t\"h#q;s",
            "  lead",
            "ssh://git@h:22/x",
        ] {
            let out = output(
                command(Some(&dir)).args(["config", "remote.origin.url", url]),
                "set",
            )
            .unwrap();
            assert!(out.status.success());
            let text = std::fs::read_to_string(dir.join(".git/config")).unwrap();
            let ours = config_value(&text, "remote", Some("origin"), "url");
            assert_eq!(
                ours,
                config_get(&dir, "remote.origin.url").unwrap(),
                "{url:?} in {text}"
            );
            let (top, git_dir) = find_checkout(&dir.join(".git/refs")).unwrap_or_default();
            assert_eq!(top, dir);
            assert_eq!(origin_url(&top, &git_dir).unwrap().as_deref(), Some(url));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn last_words_prefers_fatal_lines() {
        assert_eq!(
            last_words(b"hint: x\nfatal: no such repo\nmore\n"),
            "fatal: no such repo"
        );
        assert_eq!(last_words(b"warning: a\nb\n"), "b");
        assert_eq!(last_words(b""), "git failed without a message");
    }
}
