//! A pull request's reviews and review comments, read as GitHub documents
//! them (docs.github.com/rest/pulls/reviews, /rest/pulls/comments):
//! `GET /repos/{o}/{r}/pulls/{n}/reviews` and `.../pulls/{n}/comments`,
//! every page (`Link: rel="next"`, never off the API base), conditional on
//! the ETag of the last listing (a 304 costs nothing under the rate limit).
//! Only what lw-sync reads; both are reads, so a failed one is retried like
//! any GET.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{Client, User};
use base::error::{Error, Exit, Result};

const PERM: &str = "pull requests: read";

/// A submitted review: its verdict and its text (empty when the person
/// wrote none, as for a review that only carries review comments).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Review {
    pub id: u64,
    #[serde(default)]
    pub user: Option<User>,
    /// GitHub sends `null` for a review without text.
    #[serde(default)]
    pub body: Option<String>,
    /// `APPROVED`, `CHANGES_REQUESTED`, `COMMENTED`, `DISMISSED` or
    /// `PENDING` (a draft only its author sees).
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub submitted_at: Option<String>,
    #[serde(default)]
    pub author_association: String,
}

/// A comment on a line (or a file) of a pull request's diff.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ReviewComment {
    pub id: u64,
    #[serde(default)]
    pub user: Option<User>,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub path: String,
    /// The line of the diff's right side; `null` for a comment on a whole
    /// file or on a line the pull request's head no longer has.
    #[serde(default)]
    pub line: Option<u64>,
    #[serde(default)]
    pub original_line: Option<u64>,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub created_at: String,
    #[serde(default)]
    pub updated_at: String,
    #[serde(default)]
    pub author_association: String,
}

impl Review {
    pub fn login(&self) -> &str {
        self.user.as_ref().map(|u| u.login.as_str()).unwrap_or("")
    }
}

impl ReviewComment {
    pub fn login(&self) -> &str {
        self.user.as_ref().map(|u| u.login.as_str()).unwrap_or("")
    }
}

/// A conditional listing's answer: None when GitHub answered 304 (nothing
/// changed since the listing whose ETag was sent; free under its rate
/// limit), else every item and the ETag to send next time (for a listing
/// of one page only: a later page can change while the first does not).
pub type Listed<T> = Option<(Vec<T>, Option<String>)>;

impl Client {
    /// Every review of pull request `repo#number`, oldest first; with
    /// `etag`, None when nothing changed.
    pub fn list_reviews(
        &mut self,
        repo: &str,
        number: u64,
        etag: Option<&str>,
    ) -> Result<Listed<Review>> {
        let url = format!(
            "{}/repos/{repo}/pulls/{number}/reviews?per_page=100",
            self.base()
        );
        self.pages(url, &format!("the reviews of {repo}#{number}"), etag)
    }

    /// Every review comment of pull request `repo#number`; with `etag`,
    /// None when nothing changed.
    pub fn list_review_comments(
        &mut self,
        repo: &str,
        number: u64,
        etag: Option<&str>,
    ) -> Result<Listed<ReviewComment>> {
        let url = format!(
            "{}/repos/{repo}/pulls/{number}/comments?per_page=100",
            self.base()
        );
        self.pages(
            url,
            &format!("the review comments of {repo}#{number}"),
            etag,
        )
    }

    fn pages<T: DeserializeOwned>(
        &mut self,
        mut url: String,
        what: &str,
        etag: Option<&str>,
    ) -> Result<Listed<T>> {
        let mut all = Vec::new();
        let mut first_tag = None;
        for page in 1..10_000 {
            let cond = if page == 1 { etag } else { None };
            let Some((v, link, tag)) = self.get_json_if(&url, what, PERM, cond)? else {
                return Ok(None);
            };
            if page == 1 {
                first_tag = tag;
            }
            let items: Vec<T> = serde_json::from_value(v).map_err(|e| {
                Error::new(
                    Exit::Unavailable,
                    format!("GitHub's list of {what} is not what GitHub documents: {e}"),
                )
            })?;
            all.extend(items);
            match self.next_page(link.as_deref(), what)? {
                Some(next) => url = next,
                None => return Ok(Some((all, first_tag.filter(|_| page == 1)))),
            }
        }
        Err(Error::new(
            Exit::Unavailable,
            format!("the pages of {what} never end"),
        ))
    }
}
