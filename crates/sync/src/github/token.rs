//! The API token: never printed, only ever written into the
//! `Authorization` header, read from the environment or a file.

use std::path::{Path, PathBuf};

use base::error::{Error, Exit, Result};

/// An API token.  Never printed: `Debug` shows `Token(..)`.
#[derive(Clone)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    pub fn new(s: impl Into<String>) -> Token {
        Token(s.into())
    }

    /// `GH_TOKEN`, else `GITHUB_TOKEN`, else the first line of `file`.
    pub fn load(file: Option<&Path>) -> Result<Token> {
        for var in ["GH_TOKEN", "GITHUB_TOKEN"] {
            if let Ok(v) = std::env::var(var) {
                let v = v.trim();
                if !v.is_empty() {
                    return Token::checked(v, var);
                }
            }
        }
        let Some(file) = file else {
            return Err(Error::config(
                "no GitHub token: set GH_TOKEN or GITHUB_TOKEN, or name a token file with --token-file or \"token_file\" in .loopwright/sync.json",
            ));
        };
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::io_as(Exit::Config, "cannot read token file", file, e))?;
        let line = text.lines().next().unwrap_or("").trim();
        if line.is_empty() {
            return Err(Error::config(format!(
                "token file '{}' is empty",
                file.display()
            )));
        }
        Token::checked(line, &format!("token file '{}'", file.display()))
    }

    fn checked(v: &str, from: &str) -> Result<Token> {
        // The value goes into a header: refuse anything that could split it.
        if v.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(Error::config(format!(
                "the token in {from} contains spaces or control characters"
            )));
        }
        Ok(Token(v.to_string()))
    }

    pub(super) fn header(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// The value, for masking it in text that leaves (crates/mailbox/src/redact/) only.
    pub fn value_for_masking(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// The default token file: `$XDG_CONFIG_HOME/loopwright/token`.
pub fn default_token_file() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let p = base.join("loopwright").join("token");
    p.is_file().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_debug_hides_the_value() {
        let t = Token::new("ghp_secretsecret");
        assert_eq!(format!("{t:?}"), "Token(..)");
    }
}
