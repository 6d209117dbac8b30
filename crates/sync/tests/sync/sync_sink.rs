//! lw-github-sink, the GitHub-compatible server the lw-sync tests and demos
//! run against: it speaks the documented API, keeps its state across
//! restarts, and serves loopback only.

use support::sync as sync_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::json;
use sync_support::*;

fn start(dir: &std::path::Path, tokens: &std::path::Path, listen: &str) -> (Child, String) {
    let mut c = Command::new(support::bin("lw-github-sink"))
        .arg("--dir")
        .arg(dir)
        .arg("--listen")
        .arg(listen)
        .args(["--repo", "octo/proj:2", "--tokens"])
        .arg(tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (c, line.trim().to_string())
}

#[test]
fn the_sink_speaks_the_comment_api_and_survives_a_restart() {
    let d = tempdir("sink");
    let tokens = d.join("tokens");
    std::fs::write(&tokens, "lw-bot tok-w\nreader tok-r read-only\n").unwrap();
    let (mut child, url) = start(&d.join("state"), &tokens, "127.0.0.1:0");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let comments = format!("{url}/repos/octo/proj/issues/1/comments");

    let (s, h, v) = call(&agent, "GET", &format!("{url}/user"), "tok-w", None);
    assert_eq!((s, v["login"].as_str()), (200, Some("lw-bot")));
    assert!(
        header(&h, "x-ratelimit-remaining").is_some() && header(&h, "x-ratelimit-reset").is_some()
    );
    assert_eq!(
        call(&agent, "GET", &format!("{url}/user"), "nope", None).0,
        401
    );
    let (s, h, _) = call(
        &agent,
        "POST",
        &comments,
        "tok-r",
        Some(json!({ "body": "x" })),
    );
    assert_eq!(s, 403);
    assert_eq!(
        header(&h, "x-accepted-github-permissions"),
        Some("issues=write; pull_requests=write")
    );
    assert_eq!(
        call(
            &agent,
            "GET",
            &format!("{url}/repos/octo/other/issues/1/comments"),
            "tok-w",
            None
        )
        .0,
        404
    );
    assert_eq!(
        call(
            &agent,
            "GET",
            &format!("{url}/repos/octo/proj/issues/9/comments"),
            "tok-w",
            None
        )
        .0,
        404
    );
    let (s, _, v) = call(
        &agent,
        "POST",
        &comments,
        "tok-w",
        Some(json!({ "body": "é".repeat(65_537) })),
    );
    assert_eq!(s, 422);
    assert!(
        v["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("maximum is 65536 characters")
    );
    assert_eq!(
        call(
            &agent,
            "POST",
            &comments,
            "tok-w",
            Some(json!({ "body": "é".repeat(65_536) }))
        )
        .0,
        201
    );
    let mut ids = vec![];
    for i in 0..69 {
        let (s, _, v) = call(
            &agent,
            "POST",
            &comments,
            "tok-w",
            Some(json!({ "body": format!("c{i}") })),
        );
        assert_eq!(s, 201);
        ids.push(v["id"].as_u64().unwrap());
    }
    let (_, _, v) = call(
        &agent,
        "PATCH",
        &format!("{url}/repos/octo/proj/issues/comments/{}", ids[0]),
        "tok-w",
        Some(json!({ "body": "edited" })),
    );
    assert_eq!(v["body"], "edited");

    // Pagination: 70 comments, 30 a page by default, Link to next and last.
    let (_, h, v) = call(&agent, "GET", &comments, "tok-w", None);
    assert_eq!(v.as_array().unwrap().len(), 30);
    let link = header(&h, "link").unwrap().to_string();
    assert!(
        link.contains("page=2>; rel=\"next\"") && link.contains("page=3>; rel=\"last\""),
        "{link}"
    );
    let next = sync::github::next_link(&link).unwrap();
    let (_, h, v) = call(&agent, "GET", &next, "tok-w", None);
    assert_eq!(v[0]["body"], "c29");
    assert!(header(&h, "link").unwrap().contains("rel=\"prev\""));

    // Restart on the same directory: same comments, ids continue.
    child.kill().unwrap();
    child.wait().unwrap();
    let (mut child, url2) = start(&d.join("state"), &tokens, "127.0.0.1:0");
    let comments2 = format!("{url2}/repos/octo/proj/issues/1/comments");
    let (_, _, v) = call(
        &agent,
        "GET",
        &format!("{comments2}?per_page=100"),
        "tok-w",
        None,
    );
    let all = v.as_array().unwrap();
    assert_eq!(all.len(), 70);
    assert_eq!(all[1]["body"], "edited");
    let (_, _, v) = call(
        &agent,
        "POST",
        &comments2,
        "tok-w",
        Some(json!({ "body": "after" })),
    );
    assert!(v["id"].as_u64().unwrap() > *ids.last().unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    // Tokens are kept as digests only.
    let journal = std::fs::read_to_string(d.join("state/journal.jsonl")).unwrap();
    assert!(!journal.contains("tok-w"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_sink_refuses_to_listen_beyond_loopback() {
    let d = tempdir("sink-lo");
    let tokens = d.join("tokens");
    std::fs::write(&tokens, "").unwrap();
    let o = Command::new(support::bin("lw-github-sink"))
        .arg("--dir")
        .arg(&d)
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(text(&o.stderr).contains("loopback"), "{}", text(&o.stderr));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn usage_errors_and_help() {
    let o = Command::new(env!("CARGO_BIN_EXE_lw-sync"))
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(
        text(&o.stderr).starts_with("lw-sync: "),
        "{}",
        text(&o.stderr)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_lw-sync"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    for flag in [
        "--once",
        "--watch",
        "--root",
        "--api-url",
        "--token-file",
        "--json",
        "pull",
        "verify",
    ] {
        assert!(text(&o.stdout).contains(flag), "{flag}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_lw-sync"))
        .env_remove("LW_ROOT")
        .arg("--once")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(text(&o.stderr).contains("--root"), "{}", text(&o.stderr));
    // --token is not a flag: the token never goes on the command line.
    let o = Command::new(env!("CARGO_BIN_EXE_lw-sync"))
        .args(["--token", "x"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
}

/// The man pages name every long flag the commands accept, in roff's
/// `\-\-flag` form, and have the sections a reader looks for.
#[test]
fn man_pages_cover_every_flag() {
    for (bin, page) in [
        (
            std::path::PathBuf::from(env!("CARGO_BIN_EXE_lw-sync")),
            "man/lw-sync.1",
        ),
        (support::bin("lw-github-sink"), "man/lw-github-sink.1"),
    ] {
        let man = std::fs::read_to_string(support::workspace().join(page)).unwrap();
        for sec in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "OPTIONS",
            "ENVIRONMENT",
            "FILES",
            "EXIT STATUS",
            "EXAMPLES",
            "SEE ALSO",
        ] {
            assert!(man.contains(&format!(".SH {sec}\n")), "{page}: {sec}");
        }
        let mut helps = vec![text(
            &Command::new(&bin).arg("--help").output().unwrap().stdout,
        )];
        if page.ends_with("lw-sync.1") {
            for sub in ["pull", "verify"] {
                helps.push(text(
                    &Command::new(&bin)
                        .args([sub, "--help"])
                        .output()
                        .unwrap()
                        .stdout,
                ));
            }
        }
        for help in helps {
            for word in help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
            {
                if let Some(flag) = word.strip_prefix("--") {
                    let flag = flag
                        .split('=')
                        .next()
                        .unwrap()
                        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
                    if flag.is_empty() {
                        continue;
                    }
                    assert!(
                        man.contains(&format!("\\-\\-{}", flag.replace('-', "\\-"))),
                        "{page} lacks --{flag}"
                    );
                }
            }
        }
    }
}

#[test]
fn an_oversized_comment_gets_422_named() {
    let env = Env::new("422");
    let mut limits = sync::github::Limits::default();
    limits.scale(5);
    let mut c = sync::github::Client::new(
        &env.url,
        sync::github::Token::new(TOKEN),
        limits,
        Default::default(),
    )
    .unwrap();
    let t = sync::github::Target {
        repo: "octo/proj".into(),
        issue: 1,
    };
    let err = c
        .post_comment(&t, &"x".repeat(65_537), &mut |_| Ok(()))
        .unwrap_err();
    assert_eq!(err.exit, base::Exit::DataErr);
    assert!(
        err.to_string().contains("maximum is 65536 characters"),
        "{err}"
    );
    assert!(env.comments(1).is_empty());
}
