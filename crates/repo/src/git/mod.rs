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
//!
//! By file: this one runs git; `remote` holds [`Remote`] and the
//! redaction of URLs and text; `config` reads a repository's configuration.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use base::error::{Error, Exit, Result};

mod config;
mod remote;

pub use config::{config_get, origin_url};
pub use remote::{Remote, redact_text, redact_url};

/// `-c` settings that keep a git from running what a repository's own files
/// name: no hook, no fsmonitor (`-c` beats every config file).
pub const NO_HOOKS: &[&str] = &["core.hooksPath=/dev/null", "core.fsmonitor=false"];

/// `-c` settings, after [`NO_HOOKS`], of a git that takes objects a sandbox
/// wrote: no transport but the one the caller allows by name
/// (`protocol.ext.allow`, `protocol.file.allow`), every object checked as
/// it arrives, no maintenance started.
const CHECK_OBJECTS: &[&str] = &[
    "protocol.allow=never",
    "transfer.fsckObjects=true",
    "fetch.fsckObjects=true",
    "gc.auto=0",
    "maintenance.auto=false",
];

/// The fetch's own flags: no tags, no `FETCH_HEAD`, no maintenance, no
/// submodules.
const FETCH_FLAGS: &[&str] = &[
    "fetch",
    "--quiet",
    "--no-tags",
    "--no-write-fetch-head",
    "--no-auto-maintenance",
    "--no-recurse-submodules",
];

/// Adds [`NO_HOOKS`] and the object checks of a git that reads a repository
/// a sandbox wrote, as `-c` settings (so before the subcommand).
pub fn untrusted_config(cmd: &mut Command) -> &mut Command {
    for c in NO_HOOKS.iter().chain(CHECK_OBJECTS) {
        cmd.args(["-c", c]);
    }
    cmd
}

/// Makes `cmd` (a git with its `--git-dir` and the caller's own `-c`
/// settings, such as the one transport it allows) a fetch from a
/// repository a sandbox wrote: [`untrusted_config`], then `fetch` with
/// [`FETCH_FLAGS`]; the caller adds the source and the refspec.  Every such
/// fetch (the radar's, `lw-sandbox push`'s) is made here, so a setting or a
/// flag added once protects them all.
pub fn fetch_untrusted(cmd: &mut Command) -> &mut Command {
    untrusted_config(cmd).args(FETCH_FLAGS)
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
