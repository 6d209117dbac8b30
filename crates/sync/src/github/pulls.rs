//! Pull requests, as GitHub documents them (docs.github.com/rest/pulls):
//! list by head, create, update; and out of draft, which GitHub's REST API
//! cannot do (`PATCH` ignores `draft`), through its GraphQL mutation
//! `markPullRequestReadyForReview`.  The writes are paced and sent once,
//! as comments are: an unknown outcome is the caller's to reconcile by
//! listing.

use serde::Deserialize;

use super::client::Written;
use super::{BeforeSend, Client};
use base::error::{Error, Exit, Result};

const PERM: &str = "pull requests: write";

/// A pull request, the fields loopwright reads.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Pull {
    pub number: u64,
    #[serde(default)]
    pub node_id: String,
    pub state: String,
    #[serde(default)]
    pub draft: bool,
    #[serde(default)]
    pub merged: bool,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    pub head: PullRef,
    pub base: PullRef,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PullRef {
    #[serde(rename = "ref")]
    pub branch: String,
    #[serde(default)]
    pub sha: String,
}

/// What a write of a pull request came to.
#[derive(Debug)]
pub enum PullWrite {
    Done(Box<Pull>),
    /// It may or may not have been done.
    Unknown(String),
}

/// A new pull request.
pub struct NewPull<'a> {
    pub title: &'a str,
    pub body: &'a str,
    /// `branch` (of the same repository) or `owner:branch`.
    pub head: &'a str,
    pub base: &'a str,
    pub draft: bool,
}

fn pull_of(w: Written, what: &str) -> Result<PullWrite> {
    Ok(match w {
        Written::Unknown(why) => PullWrite::Unknown(why),
        Written::Done(_, v) => match serde_json::from_value(v) {
            Ok(p) => PullWrite::Done(Box::new(p)),
            Err(e) => PullWrite::Unknown(format!(
                "GitHub's answer to {what} is not a pull request ({e})"
            )),
        },
    })
}

impl Client {
    /// The pull requests of `repo` whose head is `head` (`owner:branch`),
    /// in `state` (`open`, `closed` or `all`), every page.
    pub fn list_pulls(&mut self, repo: &str, head: &str, state: &str) -> Result<Vec<Pull>> {
        let mut url = format!(
            "{}/repos/{repo}/pulls?state={state}&per_page=100&head={}",
            self.base(),
            head.replace(':', "%3A")
        );
        let what = format!("the pull requests of {repo} for {head}");
        let mut all = Vec::new();
        for _ in 0..1000 {
            let (v, link) = self.get_json(&url, &what, "pull requests: read")?;
            let page: Vec<Pull> = serde_json::from_value(v).map_err(|e| {
                Error::new(
                    Exit::Unavailable,
                    format!("GitHub's list of {what} is not a list of pull requests: {e}"),
                )
            })?;
            all.extend(page);
            match self.next_page(link.as_deref(), &what)? {
                Some(next) => url = next,
                None => return Ok(all),
            }
        }
        Err(Error::new(
            Exit::Unavailable,
            format!("the pages of {what} never end"),
        ))
    }

    /// `POST /repos/{repo}/pulls`.
    pub fn create_pull(
        &mut self,
        repo: &str,
        new: &NewPull,
        before_send: BeforeSend<'_>,
    ) -> Result<PullWrite> {
        let url = format!("{}/repos/{repo}/pulls", self.base());
        let payload = serde_json::json!({
            "title": new.title, "body": new.body, "head": new.head, "base": new.base, "draft": new.draft,
        });
        let what = format!("a pull request of {} into {} on {repo}", new.head, new.base);
        let w = self.write_json(&url, "POST", &payload, &what, PERM, before_send)?;
        pull_of(w, &what)
    }

    /// `PATCH /repos/{repo}/pulls/{number}` with `fields` (title, body,
    /// state, base).
    pub fn update_pull(
        &mut self,
        repo: &str,
        number: u64,
        fields: &serde_json::Value,
        before_send: BeforeSend<'_>,
    ) -> Result<PullWrite> {
        let url = format!("{}/repos/{repo}/pulls/{number}", self.base());
        let what = format!("pull request {repo}#{number}");
        let w = self.write_json(&url, "PATCH", fields, &what, PERM, before_send)?;
        pull_of(w, &what)
    }

    /// Takes pull request `p` out of draft: GraphQL's
    /// `markPullRequestReadyForReview`.  True when it is ready now; false
    /// when the outcome is unknown.
    pub fn mark_ready(
        &mut self,
        repo: &str,
        p: &Pull,
        before_send: BeforeSend<'_>,
    ) -> Result<bool> {
        let url = self.graphql_url();
        let payload = serde_json::json!({
            "query": "mutation($id: ID!) { markPullRequestReadyForReview(input: {pullRequestId: $id}) { pullRequest { number isDraft } } }",
            "variables": { "id": p.node_id },
        });
        let what = format!("marking {repo}#{} ready for review", p.number);
        let v = match self.write_json(&url, "POST", &payload, &what, PERM, before_send)? {
            Written::Unknown(_) => return Ok(false),
            Written::Done(_, v) => v,
        };
        if let Some(err) = v.pointer("/errors/0") {
            let kind = err.get("type").and_then(|t| t.as_str()).unwrap_or("");
            let msg = err.get("message").and_then(|t| t.as_str()).unwrap_or("");
            let exit = if kind == "FORBIDDEN" {
                Exit::NoPerm
            } else {
                Exit::Unavailable
            };
            return Err(Error::new(
                exit,
                format!("GitHub refused {what} ({kind}: {msg}); the token needs {PERM}"),
            ));
        }
        Ok(
            v.pointer("/data/markPullRequestReadyForReview/pullRequest/isDraft")
                == Some(&serde_json::Value::Bool(false)),
        )
    }
}
