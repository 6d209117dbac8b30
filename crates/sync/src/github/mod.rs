//! A small client for GitHub's REST API: the issue-comment endpoints lw-sync
//! needs, spoken exactly as GitHub documents them.
//!
//! Design:
//! - Requests go one at a time (GitHub: "make requests for a single user or
//!   client ID serially").  The client is `&mut self` throughout, so two
//!   requests can never overlap.
//! - Pacing is the client's job, not the caller's: content-creating requests
//!   are at least `min_write_interval` (1 s) apart, fewer than 80 a minute and
//!   500 an hour.  The write times live in a [`Budget`] that the caller
//!   persists, so the limits hold across `--once` runs started by cron and
//!   across crashes.  The write time is handed to the caller *before* the
//!   request is sent (see [`Client::post_comment`]) so that a process killed
//!   mid-request still has it on disk.
//! - A blocked window (primary limit exhausted, `retry-after`, secondary
//!   limit) is recorded in the budget too: no request of any kind is sent
//!   before it ends.  Waits up to `max_wait` happen in place; a longer one is
//!   a temporary failure (exit 75) and the next run honours the same window.
//! - A POST whose outcome is unknown (connection dropped, timeout, 5xx) is
//!   never retried here: it may have created the comment.  It is reported as
//!   [`Posted::Unknown`] and the caller reconciles by listing comments.
//! - The token is a [`Token`], whose `Debug` does not show it; it is only
//!   ever written into the `Authorization` header.  A pagination link that
//!   points anywhere but the configured API base is refused, so the token is
//!   never sent to another host.

//!
//! The files: `client` (the exchanges and the comment endpoints), `answer`
//! (every error made of an answer carries it as an [`Answer`], so callers
//! match [`status_of`], never the wording), `pulls` (pull requests: list, create,
//! update, ready for review), `statuses` (commit statuses: create, list), `reviews` (a pull request's reviews and
//! review comments, read), `pace` (the limits, the budget, the clock and
//! the waits), `token` (the token and where it comes from).

mod answer;
mod client;
mod pace;
mod pulls;
mod reviews;
mod statuses;
mod token;

use serde::{Deserialize, Serialize};

pub use answer::{Answer, answer_of, status_of};
pub use client::{BeforeSend, Client, Listing, next_link};
pub use pace::{
    Budget, Clock, DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, Limits, Persist, SystemClock,
    next_write_at,
};
pub use pulls::{NewPull, Pull, PullRef, PullWrite};
pub use reviews::{Listed, Review, ReviewComment};
pub use statuses::{MAX_STATUS_DESCRIPTION, NewStatus, Status, StatusWrite};
pub use token::{Token, default_token_file};

use base::error::{Error, Result};

/// GitHub's documented limit on a comment body, in characters.
pub const MAX_COMMENT_CHARS: usize = 65_536;
pub const DEFAULT_API: &str = "https://api.github.com";
/// The testing knob: lowers the spacing between writes (and scales the
/// minute and hour windows by the same factor).  Documented in lw-sync(1).
pub const INTERVAL_ENV: &str = "LW_SYNC_MIN_WRITE_INTERVAL_MS";

/// One issue comment as GitHub returns it (the fields lw-sync reads).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Comment {
    pub id: u64,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub updated_at: String,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub author_association: String,
}

impl Comment {
    pub fn login(&self) -> &str {
        self.user.as_ref().map(|u| u.login.as_str()).unwrap_or("")
    }
    pub fn text(&self) -> &str {
        self.body.as_deref().unwrap_or("")
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct User {
    pub login: String,
}

/// Where comments go: `owner/name` and an issue or pull-request number (pull
/// requests take their conversation comments through the issues endpoints).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub repo: String,
    pub issue: u64,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.repo, self.issue)
    }
}

impl Target {
    pub fn parse_repo(repo: &str) -> Result<()> {
        let ok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        };
        match repo.split_once('/') {
            Some((o, n)) if ok(o) && ok(n) && n != "." && n != ".." => Ok(()),
            _ => Err(Error::config(format!(
                "repository '{}' is not of the form OWNER/NAME",
                repo.escape_debug()
            ))),
        }
    }
}

/// The outcome of creating a comment.
#[derive(Debug)]
pub enum Posted {
    Created(Comment),
    /// The request may or may not have created the comment.
    Unknown(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names() {
        assert!(Target::parse_repo("octo/hello-world").is_ok());
        for bad in ["octo", "/x", "a/b/c", "a/..", "a b/c"] {
            assert!(Target::parse_repo(bad).is_err(), "{bad}");
        }
    }
}
