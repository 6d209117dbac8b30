//! `push --pr`: after the push, the task branch's pull request (crates/sync/src/pr).
//!
//! Where it goes is lw-sync's configuration (`.loopwright/sync.json`:
//! `repo`, `api_url`, `token_file`; `issue` is the run's thread the body
//! links), so one file says where a project's GitHub is.  The base is
//! `sandbox.pr-base` of `.loopwright/config`, else the upstream's default
//! branch (the mirror's HEAD); it must exist upstream before anything is
//! asked of GitHub.  The number lands in the pull-request record (lw-sync
//! reads it) and in the sandbox's record (`ls --json`).

use super::{Record, Sandboxes};
use base::config::Project;
use base::error::{Error, Result};
use repo::git;
use sync::Config as SyncConfig;
use sync::github::{Client, DEFAULT_API, Limits, Token, default_token_file};
use sync::pr::{self, Ask, Opened, Task};

/// The environment variable naming the API URL (as for lw-sync).
pub const API_ENV: &str = "LW_GITHUB_API_URL";

/// Whether `push` opens the pull request without `--pr`: `sandbox.push-pr`.
pub fn pr_by_default(project: Option<&Project>) -> Result<bool> {
    let Some(v) = project.and_then(|p| p.config.get("sandbox.push-pr")) else {
        return Ok(false);
    };
    match v {
        "true" | "yes" | "on" => Ok(true),
        "false" | "no" | "off" => Ok(false),
        _ => Err(Error::config(format!(
            "'sandbox.push-pr = {v}' in .loopwright/config: expected true or false"
        ))),
    }
}

fn mirror_git(rec: &Record, args: &[&str], what: &str) -> Result<Option<String>> {
    let out = git::output(
        git::command(None)
            .arg("--git-dir")
            .arg(&rec.mirror)
            .args(args),
        what,
    )?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(out.status.success().then_some(s))
}

impl Sandboxes<'_> {
    /// Whether `push NAME` opens the pull request without `--pr`: the
    /// `sandbox.push-pr` of the sandbox's project.
    pub fn push_pr_by_default(&self, name: &str) -> Result<bool> {
        let rec = self.get(name)?;
        if rec.project.as_os_str().is_empty() {
            return Ok(false);
        }
        pr_by_default(wall::config::project(&rec.project)?.as_ref())
    }

    /// Finds or opens the pull request of sandbox `name`'s branch, whose
    /// tip `commit` was just pushed; out of draft with `ready`.
    pub fn open_pull_request(&self, name: &str, commit: &str, ready: bool) -> Result<Opened> {
        let rec = self.get(name)?;
        let project = if rec.project.as_os_str().is_empty() {
            None
        } else {
            wall::config::project(&rec.project)?
        };
        let Some(cfg_path) = SyncConfig::find(&rec.project) else {
            return Err(Error::config(format!(
                "--pr needs the project's GitHub repository: write .loopwright/sync.json in '{}' with \"repo\": \"OWNER/NAME\" (lw-sync(1)); branch '{}' is pushed",
                rec.project.display(),
                rec.branch
            )));
        };
        let cfg = SyncConfig::load(&cfg_path)?;
        let Some(repo) = cfg.repo.clone() else {
            return Err(Error::config(format!(
                "--pr needs \"repo\": \"OWNER/NAME\" in '{}'; branch '{}' is pushed",
                cfg_path.display(),
                rec.branch
            )));
        };
        sync::github::Target::parse_repo(&repo)?;
        let base = match project.as_ref().and_then(|p| p.config.get("sandbox.pr-base")) {
            Some(b) => b.to_string(),
            None => mirror_git(&rec, &["symbolic-ref", "--short", "HEAD"], "read the upstream's default branch")?
                .ok_or_else(|| {
                    Error::config(format!(
                        "the upstream of sandbox '{name}' names no default branch; set sandbox.pr-base in .loopwright/config"
                    ))
                })?,
        };
        super::check_branch(&base)
            .map_err(|e| Error::config(format!("sandbox.pr-base: {}", e.msg)))?;
        if mirror_git(
            &rec,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{base}^{{commit}}"),
            ],
            "read the base branch",
        )?
        .is_none()
        {
            return Err(Error::config(format!(
                "base branch '{base}' does not exist upstream, so no pull request can go into it: push '{base}' there, or name an existing base with sandbox.pr-base in .loopwright/config; branch '{}' is pushed",
                rec.branch
            )));
        }
        let log = mirror_git(
            &rec,
            &[
                "log",
                "--no-decorate",
                "--format=%h %s",
                "-n",
                "50",
                &format!("refs/heads/{base}..{commit}"),
                "--",
            ],
            "list the branch's commits",
        )?
        .unwrap_or_default();
        let commits: Vec<String> = log.lines().map(str::to_string).collect();
        let task = Task {
            name,
            branch: &rec.branch,
            base: &base,
            scope: &rec.scope,
            agent: rec.agent.as_ref().map(|a| a.kit.as_str()),
            commits: &commits,
            thread: cfg.issue.map(|n| format!("{repo}#{n}")),
        };
        let (title, body) = (pr::title(&task), pr::body(&task));
        let api = std::env::var(API_ENV)
            .ok()
            .or(cfg.api_url.clone())
            .unwrap_or_else(|| DEFAULT_API.into());
        let token = Token::load(
            cfg.token_file
                .clone()
                .or_else(default_token_file)
                .as_deref(),
        )?;
        let mut client = Client::new(&api, token, Limits::from_env()?, Default::default())?;
        let ask = Ask {
            name,
            repo: &repo,
            branch: &rec.branch,
            base: &base,
            title: &title,
            body: &body,
            ready,
        };
        let opened = pr::open(&self.root.state_dir(), &mut client, &ask)?;
        self.note_pull_request(name, opened.number)?;
        Ok(opened)
    }

    /// The sandbox's record learns its pull request's number.
    fn note_pull_request(&self, name: &str, number: u64) -> Result<()> {
        let _held = self.lock(name, true)?;
        let mut rec = self.get(name)?;
        if rec.pull_request == Some(number) {
            return Ok(());
        }
        rec.pull_request = Some(number);
        self.write_record(&rec)
    }
}
