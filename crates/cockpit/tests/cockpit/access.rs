//! Issue 40 §2: the cockpit's access in a real browser.  No credential
//! ever reaches another port of 127.0.0.1 (a sandbox's published port,
//! which the page links to, records every byte it is sent); cookies a page
//! there plants change nothing; the printed URL opens the page once; two
//! cockpits in one browser both work after reloads.  And the two ways the
//! command was loose: `--listen` is honoured exactly, and a directory that
//! is not a mailbox root is refused, untouched.

use super::*;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// A hostile server on a sandbox's published port: keeps every byte it is
/// sent, and answers every request with a page that plants cookies for
/// 127.0.0.1 (by Set-Cookie and by script: the cockpit's old cookie name on
/// the event stream's path, the page's session key, a cookie bomb of 170 x
/// 4 KB).
fn recorder() -> (u16, Arc<Mutex<Vec<u8>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut got = Vec::new();
            let mut buf = [0u8; 65536];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            keep.lock().unwrap().extend_from_slice(&got);
            let page = "<!doctype html><title>sandbox</title><script>\
                for (let i = 0; i < 170; i++) document.cookie = 'bomb' + i + '=' + 'x'.repeat(4000) + '; path=/';\
                document.cookie = 'lw-cockpit-token=planted-by-script; path=/api/events';\
                document.title = 'planted';</script>";
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                 Set-Cookie: lw-cockpit-token=planted; Path=/api/events\r\n\
                 Set-Cookie: lw-cockpit-session=planted; Path=/\r\n\
                 Set-Cookie: x-lw-session=planted; Path=/api/session\r\n\
                 Connection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    (port, seen)
}

/// lw-sandbox's record of `name` with container port 8080 published on
/// the host's `port`.
fn record_with_port(root: &Root, name: &str, port: u16) {
    let rec = serde_json::json!({
        "version": 1, "name": name, "branch": format!("task/{name}"), "scope": [],
        "container": format!("lw-sb-{}-{name}", wall::root_id(&root.dir)),
        "volume": format!("lw-sb-x-{name}-work"), "image": "loopwright/test-busybox:latest",
        "network": "none", "ports": [{"container": "8080/tcp", "host": port}],
        "secrets": [], "uid": 1000, "project": "/nonexistent", "mirror": "/nonexistent",
        "created": "2026-01-01T00:00:00Z", "ready": true,
    });
    let dir = root.state_dir().join("sandbox");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), rec.to_string()).unwrap();
}

fn count(hay: &[u8], needle: &str) -> usize {
    hay.windows(needle.len())
        .filter(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
        .count()
}

#[test]
fn a_sandboxs_port_sees_no_credential_and_its_planted_cookies_change_nothing() {
    let root = root("ports", &[("api", None)]);
    let _m = mediator(&root);
    let (port, seen) = recorder();
    record_with_port(&root, "api", port);
    let qid = post_as(&root, "api", "question", "which port?", "8080");
    let nowhere = format!(
        "unix://{}",
        root.dir.parent().unwrap().join("no-engine.sock").display()
    );
    let c = cockpit_with(&root, "ada", &[], &[("DOCKER_HOST", &nowhere)]);
    let rec = format!("http://127.0.0.1:{port}/");
    let r = browser(
        "ports",
        &c,
        &root,
        &[
            ("RECORDER", rec),
            ("QID", qid.clone()),
            ("SANDBOX", "api".into()),
        ],
    );
    let seen = seen.lock().unwrap().clone();
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.starts_with("GET / HTTP/1.1"),
        "the link was followed: {text:.200}"
    );
    let tab = r["secret"].as_str().unwrap();
    let mut found = 0;
    let cockpit_addr = format!("127.0.0.1:{}", c.port);
    for (what, needle) in [
        ("the printed ticket", c.ticket.as_str()),
        ("the tab's secret", tab),
        ("the test's own secret", c.secret.as_str()),
        ("the session header", "x-lw-session:"),
        ("the cockpit's address (a referrer)", cockpit_addr.as_str()),
    ] {
        let n = count(&seen, needle);
        eprintln!(
            "{what}: {n} in the {} bytes the sandbox's port received",
            seen.len()
        );
        found += n;
    }
    assert_eq!(
        found, 0,
        "credential bytes reached the sandbox's port:\n{text:.2000}"
    );
    assert_eq!(r["rel"], "noopener noreferrer");
    assert_eq!(r["opener"], true, "the sandbox's page has no window.opener");
    eprintln!(
        "planted: {} cookies, {} bytes; the page then reloaded, stayed live and answered",
        r["cookies"], r["cookie_bytes"]
    );
    // Both answers, made before and after the plant, reached the asker.
    let inbox = root.sandbox("api").inbox();
    let qid2 = r["qid2"].as_str().unwrap().to_string();
    inbox
        .wait_until(Some(Duration::from_secs(10)), || {
            let replies: Vec<String> = inbox
                .names(Sub::New)?
                .iter()
                .filter_map(|n| match inbox.read(Sub::New, n) {
                    Found::Message(m) => m.in_reply_to,
                    _ => None,
                })
                .collect();
            Ok(replies.contains(&qid) && replies.contains(&qid2))
        })
        .unwrap();
}

#[test]
fn the_printed_url_opens_one_tab_once_and_new_tab_makes_another() {
    let root = root("twice", &[("api", None)]);
    let c = cockpit(&root, "ada");
    let r = browser("twice", &c, &root, &[]);
    let said = r["said"].as_str().unwrap();
    assert!(
        said.contains("used already") && said.contains("kill -USR1"),
        "{said}"
    );
    assert_eq!(r["ready2"], "", "the second opening loaded the page");
    let (a, b) = (r["a"].as_str().unwrap(), r["b"].as_str().unwrap());
    assert!(a.len() == 32 && b.len() == 32 && a != b, "{r}");
    assert_eq!(r["opener"], true, "the new tab is opened apart");
    // The tab's secret is no ticket either.
    let (status, _) = trade(c.port, a, "");
    assert_eq!(status, 403);
}

#[test]
fn two_cockpits_in_one_browser_both_work_after_reloads() {
    let one = root("two-a", &[("api", None)]);
    let two = root("two-b", &[("api", None)]);
    let (_m1, _m2) = (mediator(&one), mediator(&two));
    let (c1, c2) = (cockpit(&one, "ada"), cockpit(&two, "ada"));
    let r = browser(
        "two",
        &c1,
        &one,
        &[
            ("COCKPIT_URL2", c2.url.clone()),
            ("LW_ROOT2", two.dir.display().to_string()),
            ("SANDBOX", "api".into()),
        ],
    );
    let seen: Vec<&str> = r["seen"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let (d1, d2) = (one.dir.display().to_string(), two.dir.display().to_string());
    assert_eq!(seen, [&*d1, &*d2, &*d1, &*d2], "{r}");
}

#[test]
fn listen_is_honoured_exactly() {
    let root = root("listen", &[]);
    let mut child = Command::new(COCKPIT)
        .arg("--root")
        .arg(&root.dir)
        .args(["--listen", "127.0.0.2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let _kill = Kill(child);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let rest = line
        .trim()
        .strip_prefix("http://127.0.0.2:")
        .unwrap_or_else(|| panic!("{line:?}"));
    let port: u16 = rest.split_once('/').unwrap().0.parse().unwrap();
    let ask = |ip: &str, host: &str| -> Option<u16> {
        let mut s = TcpStream::connect((ip, port)).ok()?;
        write!(
            s,
            "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b.split(' ').nth(1)?.parse().ok()
    };
    assert_eq!(ask("127.0.0.2", &format!("127.0.0.2:{port}")), Some(200));
    assert_eq!(ask("127.0.0.2", &format!("127.0.0.1:{port}")), Some(403));
    assert_eq!(
        ask("127.0.0.1", &format!("127.0.0.1:{port}")),
        None,
        "bound 127.0.0.1"
    );
}

#[test]
fn a_directory_that_is_not_a_mailbox_root_is_refused_untouched() {
    let dir = std::env::temp_dir().join(format!("lw-cockpit-notroot-{}", base::id::new_id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine\n").unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let list = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = walk(d);
        v.sort();
        v
    };
    let before = list(&dir);
    for d in [&dir, &empty] {
        let o = Command::new(COCKPIT)
            .arg("--root")
            .arg(d)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(66), "{err}");
        assert!(o.stdout.is_empty(), "no URL printed");
        assert!(
            err.contains("is not a mailbox root") && err.contains("lw-mediate --root"),
            "{err}"
        );
    }
    assert_eq!(list(&dir), before, "nothing was made");
}

fn walk(d: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        v.push(p.display().to_string());
        if p.is_dir() {
            v.extend(walk(&p));
        }
    }
    v
}

/// SIGTERM and SIGINT stop lw-cockpit with exit 0, saying so, and its port
/// is free for a cockpit started again on it at once (a killed one can keep
/// it while the kernel closes its directory watchers).
#[test]
fn sigterm_and_sigint_free_the_port_and_exit_0() {
    let root = root("stop", &[("api", None)]);
    for name in ["SIGTERM", "SIGINT"] {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(COCKPIT)
            .arg("--root")
            .arg(&root.dir)
            .args(["--operator", "ada", "--port", &port.to_string()])
            .current_dir(root.dir.parent().unwrap())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut url = String::new();
        out.read_line(&mut url).unwrap();
        assert!(url.contains(&format!(":{port}/")), "{url}");
        // An open event stream, as a page holds.
        let mut page = TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(page, "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let said = Command::new("kill")
            .args([&format!("-{}", &name[3..]), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(said.success());
        let status = child.wait().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(status.code(), Some(0), "{name}: {err}");
        assert!(
            err.contains(&format!("stopped by {name}; its port is free")),
            "{err}"
        );
        TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("after {name} port {port} is not free: {e}"));
    }
}
