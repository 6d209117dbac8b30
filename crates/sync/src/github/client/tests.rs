//! The client's unit tests: links, pages and errors.

use super::*;

#[test]
fn finds_next_link() {
    let h = r#"<https://api.github.com/repositories/1/issues/7/comments?page=2>; rel="next", <https://api.github.com/repositories/1/issues/7/comments?page=9>; rel="last""#;
    assert_eq!(
        next_link(h).as_deref(),
        Some("https://api.github.com/repositories/1/issues/7/comments?page=2")
    );
    let last = r#"<https://x/a?page=1>; rel="prev", <https://x/a?page=1>; rel="first""#;
    assert_eq!(next_link(last), None);
}

#[test]
fn a_next_page_off_the_api_url_is_refused() {
    let c = Client::new(
        "http://127.0.0.1:9/api",
        Token::new("t"),
        Limits::default(),
        Budget::default(),
    )
    .unwrap();
    let link = |u: &str| format!(r#"<{u}>; rel="next""#);
    let ok = link("http://127.0.0.1:9/api/repos/o/r/pulls?page=2");
    assert_eq!(
        c.next_page(Some(&ok), "x").unwrap().as_deref(),
        Some("http://127.0.0.1:9/api/repos/o/r/pulls?page=2")
    );
    assert_eq!(c.next_page(None, "x").unwrap(), None);
    // Another host, a longer host name, the API path's sibling.
    for off in [
        "http://evil.example/api/repos/o/r/pulls?page=2",
        "http://127.0.0.1:9/api.evil/x",
        "http://127.0.0.1:9.evil.example/api/x",
    ] {
        let e = c
            .next_page(Some(&link(off)), "the pull requests")
            .unwrap_err();
        assert!(e.msg.contains("refusing to send the token"), "{off}: {e}");
    }
}

#[test]
fn errors_for_the_token_user_read_once_and_name_no_issue() {
    let c = Client::new(
        "http://127.0.0.1:9",
        Token::new("t"),
        Limits::default(),
        Budget::default(),
    )
    .unwrap();
    let reply = |status| Reply {
        status,
        headers: vec![],
        body: br#"{"message":"Bad credentials"}"#.to_vec(),
    };
    let e = c.error_for(&reply(401), "the token's user", "");
    assert_eq!(e.msg.matches("valid token").count(), 1, "{}", e.msg);
    // The status is typed: callers match it, not the text.
    assert_eq!(status_of(&e), Some(401));
    let forbidden = c.error_for(&reply(403), "a pull request", "pull requests: write");
    assert_eq!(
        (status_of(&forbidden), forbidden.exit),
        (Some(403), Exit::NoPerm)
    );
    assert!(!forbidden.msg.contains("403"), "{}", forbidden.msg);
    assert!(forbidden.to_string().ends_with("HTTP 403 Bad credentials"));
    let e = c.error_for(&reply(401), "a comment on o/r#1", "issues: write");
    assert!(
        e.msg.ends_with("a valid token with issues: write"),
        "{}",
        e.msg
    );
}
