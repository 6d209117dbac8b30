//! lw-github-sink's pull requests, commit statuses and reviews (#43): the
//! shapes, validation answers, pagination and rights GitHub documents, so
//! `lw-sandbox push --pr` and the radar's statuses are tested without
//! GitHub.

use support::sync as sync_support;

use serde_json::{Value, json};
use sync_support::*;

/// A sink whose octo/proj has the branches of a real bare repository.
fn env_with_git(tag: &str) -> (Env, std::path::PathBuf, String) {
    let env = Env::new(tag);
    env.add_token("lw-bot", TOKEN);
    let up = env.dir.join("up.git");
    let work = env.dir.join("work");
    let git = |dir: &std::path::Path, args: &[&str]| {
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "git {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    git(&env.dir, &["init", "-q", "--bare", "-b", "main", "up.git"]);
    git(&env.dir, &["init", "-q", "-b", "main", "work"]);
    for (b, f) in [("main", "a"), ("task-1", "b")] {
        if b != "main" {
            git(&work, &["checkout", "-q", "-b", b]);
        }
        std::fs::write(work.join(f), f).unwrap();
        git(&work, &["add", f]);
        git(
            &work,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                f,
            ],
        );
        git(&work, &["push", "-q", up.to_str().unwrap(), b]);
    }
    let tip = git(&work, &["rev-parse", "HEAD"]);
    env.ctl(
        "POST",
        "repos",
        json!({ "repo": "octo/proj", "issues": 3, "git": up }),
    );
    (env, up, tip)
}

#[test]
fn pulls_are_created_once_per_head_listed_by_head_and_updated() {
    let (env, _up, tip) = env_with_git("sink-pulls");
    let a = &env.agent;
    let u = |p: &str| format!("{}/repos/octo/proj/{p}", env.url);
    let new = json!({ "title": "task-1", "head": "octo:task-1", "base": "main", "draft": true, "body": "b" });
    let (s, h, v) = call(a, "POST", &u("pulls"), TOKEN, Some(new.clone()));
    assert_eq!(s, 201, "{v}");
    // A pull request takes the next issue number, and its conversation is the issues API.
    assert_eq!(v["number"], 4);
    assert_eq!(
        (v["draft"].clone(), v["state"].clone()),
        (json!(true), json!("open"))
    );
    assert_eq!(v["head"]["sha"], tip.as_str());
    assert!(header(&h, "location").unwrap().ends_with("/pulls/4"));
    let (s, _, c) = call(
        a,
        "POST",
        &u("issues/4/comments"),
        TOKEN,
        Some(json!({"body": "hi"})),
    );
    assert_eq!(s, 201, "{c}");

    // The same head again: GitHub's words.
    let (s, _, v) = call(a, "POST", &u("pulls"), TOKEN, Some(new.clone()));
    assert_eq!(s, 422);
    assert_eq!(v["message"], "Validation Failed");
    assert_eq!(
        v["errors"][0]["message"],
        "A pull request already exists for octo:task-1."
    );
    // A base that does not exist, a head that does not, a missing field.
    for (body, field, code) in [
        (
            json!({"title": "t", "head": "task-1", "base": "nope"}),
            "base",
            "invalid",
        ),
        (
            json!({"title": "t", "head": "gone", "base": "main"}),
            "head",
            "invalid",
        ),
        (
            json!({"head": "task-1", "base": "main"}),
            "title",
            "missing_field",
        ),
    ] {
        let (s, _, v) = call(a, "POST", &u("pulls"), TOKEN, Some(body));
        assert_eq!(s, 422, "{v}");
        assert_eq!(
            (
                v["errors"][0]["field"].as_str(),
                v["errors"][0]["code"].as_str()
            ),
            (Some(field), Some(code)),
            "{v}"
        );
    }

    // Listed by head and state; closed then listed as closed only.
    let (s, _, v) = call(
        a,
        "GET",
        &u("pulls?head=octo:task-1&state=open"),
        TOKEN,
        None,
    );
    assert_eq!((s, v.as_array().unwrap().len()), (200, 1), "{v}");
    let (_, _, v) = call(a, "GET", &u("pulls?head=octo:other"), TOKEN, None);
    assert_eq!(v, json!([]));
    let (s, _, v) = call(
        a,
        "PATCH",
        &u("pulls/4"),
        TOKEN,
        Some(json!({"state": "closed", "title": "t2", "draft": false})),
    );
    assert_eq!(s, 200, "{v}");
    // PATCH ignores `draft`, as GitHub does.
    assert_eq!(
        (
            v["state"].as_str(),
            v["title"].as_str(),
            v["draft"].as_bool()
        ),
        (Some("closed"), Some("t2"), Some(true))
    );
    let (_, _, v) = call(a, "GET", &u("pulls?head=octo:task-1"), TOKEN, None);
    assert_eq!(v, json!([]), "the default state is open");
    let (_, _, v) = call(
        a,
        "GET",
        &u("pulls?head=octo:task-1&state=closed"),
        TOKEN,
        None,
    );
    assert_eq!(v[0]["number"], 4);
    // A closed one does not block a new one; reopening the old one then does.
    let (s, _, v) = call(a, "POST", &u("pulls"), TOKEN, Some(new));
    assert_eq!((s, v["number"].as_u64()), (201, Some(5)), "{v}");
    let (s, _, v) = call(
        a,
        "PATCH",
        &u("pulls/4"),
        TOKEN,
        Some(json!({"state": "open"})),
    );
    assert_eq!(s, 422, "{v}");

    // Out of draft: GraphQL's markPullRequestReadyForReview.
    let (_, _, p) = call(a, "GET", &u("pulls/5"), TOKEN, None);
    let q = json!({ "query": "mutation($id: ID!) { markPullRequestReadyForReview(input: {pullRequestId: $id}) { pullRequest { number isDraft } } }", "variables": { "id": p["node_id"] } });
    let (s, _, v) = call(a, "POST", &format!("{}/graphql", env.url), TOKEN, Some(q));
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["data"]["markPullRequestReadyForReview"]["pullRequest"]["isDraft"],
        false
    );
    let (_, _, p) = call(a, "GET", &u("pulls/5"), TOKEN, None);
    assert_eq!(p["draft"], false);
}

#[test]
fn pull_listings_page_with_link_headers_and_rights_are_checked() {
    let env = Env::new("sink-pull-pages");
    env.add_token("lw-bot", TOKEN);
    env.ctl(
        "POST",
        "tokens",
        json!({ "token": "no-pulls", "login": "lw-bot", "pulls": false }),
    );
    let a = &env.agent;
    let u = |p: &str| format!("{}/repos/octo/proj/{p}", env.url);
    for i in 0..5 {
        let body = json!({ "title": format!("t{i}"), "head": format!("b{i}"), "base": "main" });
        assert_eq!(call(a, "POST", &u("pulls"), TOKEN, Some(body)).0, 201);
    }
    let mut url = u("pulls?state=all&per_page=2");
    let mut seen = Vec::new();
    loop {
        let (s, h, v) = call(a, "GET", &url, TOKEN, None);
        assert_eq!(s, 200);
        seen.extend(
            v.as_array()
                .unwrap()
                .iter()
                .map(|p| p["number"].as_u64().unwrap()),
        );
        match header(&h, "link").and_then(sync::github::next_link) {
            Some(n) => url = n,
            None => break,
        }
    }
    assert_eq!(seen, vec![8, 7, 6, 5, 4], "newest first, every page once");
    // Without pull-request rights: 403 naming the permission.
    let body = json!({ "title": "t", "head": "x", "base": "main" });
    let (s, h, v) = call(a, "POST", &u("pulls"), "no-pulls", Some(body));
    assert_eq!(s, 403, "{v}");
    assert!(
        header(&h, "x-accepted-github-permissions")
            .unwrap()
            .contains("pull_requests")
    );
    // Reviews and review comments a person wrote, each in its own list.
    env.ctl("POST", "reviews", json!({ "repo": "octo/proj", "pull": 4, "login": "alice", "state": "CHANGES_REQUESTED", "body": "no" }));
    env.ctl("POST", "reviews", json!({ "repo": "octo/proj", "pull": 4, "login": "alice", "body": "here", "path": "src/a.rs", "line": 3 }));
    let (_, _, r) = call(a, "GET", &u("pulls/4/reviews"), TOKEN, None);
    assert_eq!(
        (r.as_array().unwrap().len(), r[0]["state"].as_str()),
        (1, Some("CHANGES_REQUESTED"))
    );
    let (_, _, r) = call(a, "GET", &u("pulls/4/comments"), TOKEN, None);
    assert_eq!(
        (r[0]["path"].as_str(), r[0]["line"].as_u64()),
        (Some("src/a.rs"), Some(3))
    );
    // A secondary rate limit on pulls, as on comments.
    env.faults(json!([{ "kind": "secondary", "path_contains": "/pulls", "retry_after": 1 }]));
    let (s, h, _) = call(a, "GET", &u("pulls"), TOKEN, None);
    assert_eq!((s, header(&h, "retry-after")), (403, Some("1")));
}

#[test]
fn statuses_are_created_and_listed_per_commit() {
    let (env, _up, tip) = env_with_git("sink-statuses");
    let a = &env.agent;
    let u = |p: &str| format!("{}/repos/octo/proj/{p}", env.url);
    let st =
        |state: &str| json!({ "state": state, "context": "loopwright/radar", "description": "d" });
    let (s, _, v) = call(
        a,
        "POST",
        &u(&format!("statuses/{tip}")),
        TOKEN,
        Some(st("failure")),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(
        (v["context"].as_str(), v["state"].as_str()),
        (Some("loopwright/radar"), Some("failure"))
    );
    call(
        a,
        "POST",
        &u(&format!("statuses/{tip}")),
        TOKEN,
        Some(st("success")),
    );
    let (_, _, v) = call(
        a,
        "GET",
        &u(&format!("commits/{tip}/statuses")),
        TOKEN,
        None,
    );
    let states: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["success", "failure"], "newest first");
    let (s, _, _) = call(
        a,
        "POST",
        &u(&format!("statuses/{tip}")),
        TOKEN,
        Some(st("bogus")),
    );
    assert_eq!(s, 422);
    let (s, _, v) = call(
        a,
        "POST",
        &u(&format!("statuses/{}", "0".repeat(40))),
        TOKEN,
        Some(st("success")),
    );
    assert_eq!(s, 422, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("No commit found for SHA")
    );
    let _: Value = v;
}
