//! Secrets for sandboxes: only names the project allows, values from the
//! host environment at the moment they are needed.
//!
//! The project lists the names a sandbox may ask for in `.loopwright/config`:
//!
//! ```text
//! sandbox.secrets = OPENAI_API_KEY NPM_TOKEN
//! ```
//!
//! `lw-sandbox create --secret NAME` refuses a name not listed (exit 78) and
//! a listed name unset or empty in its own environment (exit 66).  The value
//! never goes into argv, an image, a label, a log, the mailbox or a file of
//! the project: lw-sandbox streams it over the engine's exec connection into
//! the command `cat` running inside the sandbox, which writes it to
//! `/run/secrets/NAME` (mode 0400) on a tmpfs that only the sandbox's user
//! can enter.  The value is therefore visible to: processes inside that
//! sandbox (the point), the memory of lw-sandbox while it runs, the engine
//! while it relays the stream, and the host's root (who can read any
//! container's memory).  It is not in `docker inspect`, `/proc/1/environ`,
//! the workspace volume or anything on disk, and it is gone when the
//! sandbox stops; `lw-sandbox start` writes it again from the environment
//! of the `start` command.

use std::fmt;

use base::config::Config;
use base::error::{Error, Exit, Result};

/// The configuration key listing the allowed names.
pub const KEY_ALLOWED: &str = "sandbox.secrets";
/// Where secrets appear inside a sandbox (a tmpfs).
pub const DIR: &str = "/run/secrets";

/// A secret's value; `Debug` and `Display` never show it.
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    pub value: Vec<u8>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Secret({}, <redacted {} bytes>)",
            self.name,
            self.value.len()
        )
    }
}

/// True for a name usable as an environment variable and a file name.
pub fn valid_name(name: &str) -> bool {
    base::config::valid_var_name(name)
}

/// The names the project allows, in the order written.
pub fn allowed(config: &Config) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for n in config
        .get(KEY_ALLOWED)
        .unwrap_or("")
        .split(|c: char| c.is_whitespace() || c == ',')
    {
        if n.is_empty() {
            continue;
        }
        if !valid_name(n) {
            return Err(Error::config(format!(
                "'{n}' in '{KEY_ALLOWED}' is not a secret name (letters, digits and '_', not starting with a digit)"
            )));
        }
        out.push(n.to_string());
    }
    Ok(out)
}

/// Checks that every name is allowed, without reading any value.
pub fn check_allowed(names: &[String], allowed: &[String]) -> Result<()> {
    for n in names {
        if !valid_name(n) {
            return Err(Error::usage(format!(
                "'{n}' is not a secret name (letters, digits and '_')"
            )));
        }
        if !allowed.contains(n) {
            let list = if allowed.is_empty() {
                "none are allowed".to_string()
            } else {
                format!("allowed: {}", allowed.join(" "))
            };
            return Err(Error::config(format!(
                "secret '{n}' is not allowed by the project ({list}); add it to '{KEY_ALLOWED}' in .loopwright/config"
            )));
        }
    }
    Ok(())
}

/// Reads the values of `names` (already allowed) from `env`.
pub fn resolve(
    names: &[String],
    env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Vec<Secret>> {
    let mut out: Vec<Secret> = Vec::new();
    for n in names {
        if out.iter().any(|s| &s.name == n) {
            continue;
        }
        let value = env(n).map(|v| v.into_encoded_bytes()).unwrap_or_default();
        if value.is_empty() {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "secret '{n}' is not set in the environment; export {n}=... before running lw-sandbox"
                ),
            ));
        }
        out.push(Secret {
            name: n.clone(),
            value,
        });
    }
    Ok(out)
}

/// The command that writes one secret, read from its stdin, inside a
/// sandbox: the name is an argument, the value never is.
pub fn install_cmd(name: &str) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("umask 077 && rm -f {DIR}/\"$1\" && cat > {DIR}/\"$1\" && chmod 0400 {DIR}/\"$1\""),
        "lw-secret".into(),
        name.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn only_allowed_names_and_set_values() {
        let c = Config::parse("sandbox.secrets = API_KEY, NPM_TOKEN\n", Path::new("c")).unwrap();
        let a = allowed(&c).unwrap();
        assert_eq!(a, ["API_KEY", "NPM_TOKEN"]);
        assert!(check_allowed(&["API_KEY".into()], &a).is_ok());
        assert_eq!(
            check_allowed(&["HOME".into()], &a).unwrap_err().exit,
            Exit::Config
        );
        assert_eq!(
            check_allowed(&["no-dash".into()], &a).unwrap_err().exit,
            Exit::Usage
        );
        let env = |n: &str| (n == "API_KEY").then(|| std::ffi::OsString::from("s3cr3t"));
        let s = resolve(&["API_KEY".into()], &env).unwrap();
        assert_eq!(s[0].value, b"s3cr3t");
        assert!(!format!("{s:?}").contains("s3cr3t"));
        assert_eq!(
            resolve(&["NPM_TOKEN".into()], &env).unwrap_err().exit,
            Exit::NoInput
        );
    }

    #[test]
    fn the_door_reads_the_same_key() {
        // crates/mailbox/src/redact reads the allowed names itself (the door does not
        // import the wall); both must name one key.
        assert_eq!(KEY_ALLOWED, mailbox::redact::KEY_SANDBOX);
    }

    #[test]
    fn bad_config_names_are_config_errors() {
        let c = Config::parse("sandbox.secrets = 9LIVES\n", Path::new("c")).unwrap();
        assert_eq!(allowed(&c).unwrap_err().exit, Exit::Config);
    }
}
