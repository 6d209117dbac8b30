//! Commit statuses, as GitHub documents them (docs.github.com/rest/commits/statuses):
//! create one on a commit, and list a commit's statuses (newest first).
//! The create is a content-creating request: paced and sent once, as a
//! comment is; an unknown outcome is the caller's to settle by listing.

use serde::Deserialize;

use super::client::Written;
use super::{BeforeSend, Client};
use base::error::{Error, Exit, Result};

const PERM: &str = "commit statuses: write";
/// GitHub's limit on a status's description, in characters.
pub const MAX_STATUS_DESCRIPTION: usize = 140;

/// A commit status, the fields loopwright reads.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Status {
    #[serde(default)]
    pub id: u64,
    pub state: String,
    #[serde(default)]
    pub context: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub creator: Option<super::User>,
}

impl Status {
    pub fn login(&self) -> &str {
        self.creator
            .as_ref()
            .map(|u| u.login.as_str())
            .unwrap_or("")
    }
}

/// A status to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewStatus<'a> {
    /// `error`, `failure`, `pending` or `success`.
    pub state: &'a str,
    pub context: &'a str,
    /// At most [`MAX_STATUS_DESCRIPTION`] characters.
    pub description: &'a str,
}

/// What a status create came to.
#[derive(Debug)]
pub enum StatusWrite {
    Done(Box<Status>),
    /// It may or may not have been made.
    Unknown(String),
}

impl Client {
    /// `POST /repos/{repo}/statuses/{sha}`.
    pub fn create_status(
        &mut self,
        repo: &str,
        sha: &str,
        new: &NewStatus,
        before_send: BeforeSend<'_>,
    ) -> Result<StatusWrite> {
        let url = format!("{}/repos/{repo}/statuses/{sha}", self.base());
        let payload = serde_json::json!({
            "state": new.state, "context": new.context, "description": new.description,
        });
        let what = format!("a commit status on {repo}@{sha}");
        Ok(
            match self.write_json(&url, "POST", &payload, &what, PERM, before_send)? {
                Written::Unknown(why) => StatusWrite::Unknown(why),
                Written::Done(status, v) => match serde_json::from_value::<Status>(v) {
                    Ok(s) => StatusWrite::Done(Box::new(s)),
                    Err(e) => StatusWrite::Unknown(format!(
                        "GitHub answered {status} with a body that is not a status ({e})"
                    )),
                },
            },
        )
    }

    /// The first page (the newest 100) of commit `sha`'s statuses:
    /// `GET /repos/{repo}/commits/{sha}/statuses`.
    pub fn list_statuses(&mut self, repo: &str, sha: &str) -> Result<Vec<Status>> {
        let url = format!(
            "{}/repos/{repo}/commits/{sha}/statuses?per_page=100",
            self.base()
        );
        let what = format!("the commit statuses of {repo}@{sha}");
        let (v, _) = self.get_json(&url, &what, "commit statuses: read")?;
        serde_json::from_value(v).map_err(|e| {
            Error::new(
                Exit::Unavailable,
                format!("GitHub's list of {what} is not a list of statuses: {e}"),
            )
        })
    }
}
