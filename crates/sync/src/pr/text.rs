//! A pull request's title and body, made from the task: the sandbox's
//! branch, scope and agent kit, its commits, and a link to the run's issue
//! thread.  What a sandbox wrote (commit subjects) goes into a fenced code
//! block whose fence is longer than any run of backticks in it, so its
//! `@mentions` and `#refs` stay inert, as in lw-sync's comments.

/// What the text is made from.
pub struct Task<'a> {
    pub name: &'a str,
    pub branch: &'a str,
    pub base: &'a str,
    pub scope: &'a [String],
    pub agent: Option<&'a str>,
    /// `abbrev subject`, newest first.
    pub commits: &'a [String],
    /// The run's issue thread, `OWNER/NAME#N`.
    pub thread: Option<String>,
}

/// `BRANCH: subject of its oldest commit` (just the branch without one),
/// at most 200 characters, on one line.
pub fn title(t: &Task) -> String {
    let first = t
        .commits
        .last()
        .and_then(|c| c.split_once(' ').map(|(_, s)| s.to_string()));
    let s = match first {
        Some(s) => format!("{}: {s}", t.branch),
        None => t.branch.to_string(),
    };
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    s.chars().take(200).collect()
}

/// The body: a machine-readable header, the task, the thread, the commits.
pub fn body(t: &Task) -> String {
    let head = serde_json::json!({ "sandbox": t.name, "branch": t.branch, "base": t.base });
    let head = head
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let mut b = format!("<!-- loopwright:pull-request {head} -->\n");
    b.push_str(&format!(
        "Task branch `{}` of sandbox `{}`, into `{}`.\n\n",
        t.branch, t.name, t.base
    ));
    let scope = if t.scope.is_empty() {
        "(none)".to_string()
    } else {
        t.scope
            .iter()
            .map(|s| format!("`{}`", s.replace('`', "'")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    b.push_str(&format!("- scope: {scope}\n"));
    b.push_str(&format!(
        "- agent kit: {}\n",
        t.agent.map_or("(none)".to_string(), |k| format!("`{k}`"))
    ));
    if let Some(th) = &t.thread {
        b.push_str(&format!("- the run's thread: {th}\n"));
    }
    let list = t.commits.join("\n");
    let longest = list.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    b.push_str(&format!(
        "\nCommits ({}):\n\n{fence}\n{list}\n{fence}\n",
        t.commits.len()
    ));
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_the_task_and_fences_what_a_sandbox_wrote() {
        let scope = vec!["src/api/**".to_string()];
        let commits = vec![
            "b2 fix ```@team``` #1".to_string(),
            "a1 add the api".to_string(),
        ];
        let t = Task {
            name: "api",
            branch: "task-api",
            base: "main",
            scope: &scope,
            agent: Some("claude"),
            commits: &commits,
            thread: Some("octo/proj#1".into()),
        };
        assert_eq!(title(&t), "task-api: add the api");
        let b = body(&t);
        assert!(b.starts_with("<!-- loopwright:pull-request {"), "{b}");
        assert!(b.contains("`src/api/**`") && b.contains("`claude`") && b.contains("octo/proj#1"));
        assert!(
            b.contains("\n````\nb2 fix ```@team``` #1\na1 add the api\n````\n"),
            "{b}"
        );
    }
}
