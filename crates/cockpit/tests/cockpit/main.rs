//! lw-cockpit against a real root, a running lw-mediate, and (for the page)
//! headless Chromium driven by playwright-core (crates/cockpit/tests/cockpit):
//! the 403s and the security headers, the main job's story on the page,
//! and a corpus of XSS and terminal payloads that must render inert.
//! Chromium (Debian's `chromium`) and playwright-core come from .ci/run
//! step 5; without them the browser tests fail, naming what is missing.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mailbox::layout::Root;
use mailbox::log::Log;
use mailbox::maildir::{Found, Sub};
use mailbox::message::{Kind, Message};

const COCKPIT: &str = env!("CARGO_BIN_EXE_lw-cockpit");

/// A child killed when the test ends, however it ends.
struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Cockpit {
    child: Kill,
    /// What lw-cockpit prints: one URL a line.
    out: BufReader<std::process::ChildStdout>,
    /// The first URL it printed, not opened yet.
    url: String,
    port: u16,
    /// The ticket in `url`.
    ticket: String,
    /// A tab's secret of the test's own, traded from a second URL (asked
    /// for with SIGUSR1), for requests made here.
    secret: String,
}

/// (port, ticket) of a URL lw-cockpit printed.
fn parse_url(url: &str) -> (u16, String) {
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("lw-cockpit printed {url:?}, not its URL"));
    let (port, ticket) = rest.split_once("/#ticket=").unwrap();
    assert_eq!(ticket.len(), 32, "{url}");
    (port.parse().unwrap(), ticket.to_string())
}

impl Cockpit {
    /// A new URL: SIGUSR1, then the line lw-cockpit prints.
    fn new_url(&mut self) -> String {
        let o = Command::new("kill")
            .args(["-USR1", &self.child.0.id().to_string()])
            .output()
            .unwrap();
        assert!(o.status.success());
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

/// Trades `ticket` for a tab's secret: (status, body).
fn trade(port: u16, ticket: &str, extra: &str) -> (u16, String) {
    let body = format!(r#"{{"ticket":"{ticket}"}}"#);
    let (status, _, b) = http(
        port,
        &format!(
            "POST /api/session HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    (status, b)
}

fn secret_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["secret"].as_str().unwrap().to_string()
}

fn root(tag: &str, sandboxes: &[(&str, Option<&str>)]) -> Root {
    let dir = std::env::temp_dir().join(format!("lw-cockpit-{tag}-{}", base::id::new_id()));
    let root = Root::new(dir.join("root"));
    std::fs::create_dir_all(&root.dir).unwrap();
    root.init().unwrap();
    for (name, branch) in sandboxes {
        let mut c = Command::new(support::bin("lw-mediate"));
        c.arg("--root").arg(&root.dir).args(["register", name]);
        if let Some(b) = branch {
            c.args(["--branch", b]);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    root
}

/// lw-mediate watching the root, as in a real run.
fn mediator(root: &Root) -> Kill {
    Kill(
        Command::new(support::bin("lw-mediate"))
            .arg("--root")
            .arg(&root.dir)
            .spawn()
            .unwrap(),
    )
}

fn cockpit(root: &Root, operator: &str) -> Cockpit {
    cockpit_with(root, operator, &[], &[])
}

/// lw-cockpit with more arguments and environment, run in the root's
/// parent directory (so no project's configuration is found but the
/// test's own).
fn cockpit_with(root: &Root, operator: &str, args: &[&str], env: &[(&str, &str)]) -> Cockpit {
    let mut child = Command::new(COCKPIT)
        .arg("--root")
        .arg(&root.dir)
        .args(["--operator", operator])
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root.dir.parent().unwrap())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let url = line.trim().to_string();
    let (port, ticket) = parse_url(&url);
    let mut c = Cockpit {
        child: Kill(child),
        out,
        port,
        ticket,
        url,
        secret: String::new(),
    };
    let (_, mine) = parse_url(&c.new_url());
    let (status, body) = trade(c.port, &mine, "");
    assert_eq!(status, 200, "{body}");
    c.secret = secret_of(&body);
    c
}

/// One HTTP/1.1 request; (status, head, body).
fn http(port: u16, req: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn get(c: &Cockpit, path: &str, extra: &str) -> (u16, String, String) {
    http(
        c.port,
        &format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{extra}Connection: close\r\n\r\n",
            c.port
        ),
    )
}

fn post_json(c: &Cockpit, path: &str, extra: &str, body: &str) -> (u16, String, String) {
    http(
        c.port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
            c.port,
            body.len()
        ),
    )
}

fn post_as(root: &Root, sandbox: &str, kind: &str, subject: &str, body: &str) -> String {
    let o = Command::new(support::bin("lw-post"))
        .arg("-m")
        .arg(root.dir.join("sandboxes").join(sandbox))
        .args(["-k", kind, "-s", subject, body])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

#[test]
fn no_session_cross_origin_and_other_hosts_get_403_no_cookie_counts_and_every_answer_has_the_csp() {
    let root = root("auth", &[("api", None)]);
    let qid = post_as(&root, "api", "question", "which database?", "pg?");
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--once")
        .output()
        .unwrap();
    assert!(o.status.success());
    let c = cockpit(&root, "ada");
    let mine = format!("x-lw-session: {}\r\n", c.secret);
    let csp = "content-security-policy: default-src 'none'; script-src 'self';";
    // Every credential there is, as cookies a page on another port of
    // 127.0.0.1 could plant: none counts.
    let cookie = format!(
        "Cookie: lw-cockpit-token={s}; x-lw-session={s}; lw-cockpit-session={s}; ticket={t}\r\n",
        s = c.secret,
        t = c.ticket
    );

    for (what, (status, head, _)) in [
        ("the log without a session", get(&c, "/api/log", "")),
        (
            "the log with the secret as cookies",
            get(&c, "/api/log", &cookie),
        ),
        (
            "the log with the ticket as the secret",
            get(&c, "/api/log", &format!("x-lw-session: {}\r\n", c.ticket)),
        ),
        (
            "the event stream without a session",
            get(&c, "/api/events", ""),
        ),
        (
            "the event stream with cookies",
            get(&c, "/api/events", &cookie),
        ),
        (
            "the page through another Host",
            http(
                c.port,
                &format!(
                    "GET / HTTP/1.1\r\nHost: rebound.example:{}\r\n{mine}Connection: close\r\n\r\n",
                    c.port
                ),
            ),
        ),
    ] {
        assert_eq!(status, 403, "{what}");
        assert!(head.contains(csp), "{what}: {head}");
        assert!(!head.contains("set-cookie"), "{what}: {head}");
    }
    let body = format!(r#"{{"id":"{qid}","text":"pg"}}"#);
    for (what, extra) in [
        ("an answer without a session", String::new()),
        ("an answer with only cookies", cookie.clone()),
        (
            "an answer from another origin",
            format!("{mine}Origin: http://evil.example\r\n"),
        ),
        (
            "an answer from another port",
            format!("{mine}Origin: http://127.0.0.1:1\r\n"),
        ),
        (
            "an answer from another site",
            format!("{mine}Sec-Fetch-Site: same-site\r\n"),
        ),
    ] {
        let (status, head, _) = post_json(&c, "/api/answer", &extra, &body);
        assert_eq!(status, 403, "{what}");
        assert!(head.contains(csp), "{what}: {head}");
    }
    assert_eq!(
        Log::new(root.log_dir()).entries().unwrap().0.len(),
        1,
        "no refused request reached the mailbox"
    );
    assert!(
        root.human_outbox()
            .names(Sub::New)
            .unwrap_or_default()
            .is_empty()
    );

    // The page is public and holds nothing secret; it sets no cookie.
    let (status, head, page) = get(&c, "/", &cookie);
    assert_eq!(status, 200);
    assert!(
        head.contains(csp)
            && head.contains("x-content-type-options: nosniff")
            && head.contains("referrer-policy: no-referrer"),
        "{head}"
    );
    assert!(!head.contains("set-cookie"), "{head}");
    assert!(!page.contains(&c.ticket) && !page.contains(&c.secret));
    assert!(!page.contains("<script>") && page.contains(r#"<script src="/app.js" defer>"#));

    // The printed ticket: not from another origin (and not spent by that),
    // then once, then never again.
    let (status, _) = trade(c.port, &c.ticket, "Origin: http://127.0.0.1:1\r\n");
    assert_eq!(status, 403, "a ticket traded from another origin");
    let (status, first) = trade(c.port, &c.ticket, "");
    assert_eq!(status, 200, "{first}");
    let tab = secret_of(&first);
    assert!(tab != c.secret && tab.len() == 32);
    let (status, again) = trade(c.port, &c.ticket, "");
    assert_eq!(status, 403, "the printed URL works twice: {again}");
    assert!(again.contains("used already"), "{again}");
    let (status, _) = trade(c.port, &tab, "");
    assert_eq!(status, 403, "a secret is no ticket");

    let (status, _, log) = get(&c, "/api/log", &format!("x-lw-session: {tab}\r\n"));
    assert_eq!(status, 200);
    assert!(log.contains("which database?"), "{log}");
    let origin = format!("{mine}Origin: http://127.0.0.1:{}\r\n", c.port);
    let (status, _, answered) = post_json(&c, "/api/answer", &origin, &body);
    assert_eq!(status, 200, "{answered}");
}

mod access;
mod main_job;
mod panels;
mod person;
use support::sync as sync_support;

// ---------------------------------------------------------------------
// In the browser.

fn tools() -> PathBuf {
    std::env::var_os("LW_TEST_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/loopwright-test"))
}

/// Runs crates/cockpit/tests/cockpit/browser.cjs MODE; its JSON line.
fn browser(mode: &str, c: &Cockpit, root: &Root, env: &[(&str, String)]) -> serde_json::Value {
    browser_at(mode, &c.url, &root.dir, env)
}

/// browser.cjs MODE on the page at `url`, over the root `root`.
fn browser_at(mode: &str, url: &str, root: &Path, env: &[(&str, String)]) -> serde_json::Value {
    let playwright = tools().join("browser/node_modules/playwright-core");
    for (p, how) in [
        (Path::new("/usr/bin/chromium"), "apt-get install chromium"),
        (playwright.as_path(), "npm install playwright-core"),
    ] {
        assert!(
            p.exists(),
            "{} is missing: the cockpit's browser tests need it ({how}; .ci/run step 5 installs it)",
            p.display()
        );
    }
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cockpit");
    std::fs::create_dir_all(&shots).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cockpit/browser.cjs");
    let o = Command::new("node")
        .arg(script)
        .arg(mode)
        .env("PLAYWRIGHT", &playwright)
        .env("COCKPIT_URL", url)
        .env("LW_POST", support::bin("lw-post"))
        .env("LW_ROOT", root)
        .env("SHOT", shots.join(format!("{mode}.png")))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("node runs (.ci/run step 5 installs it)");
    assert!(
        o.status.success(),
        "the browser check failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!(
        "screenshot: {}",
        shots.join(format!("{mode}.png")).display()
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn the_main_job_story_on_the_page_live_and_the_answer_names_the_person() {
    let root = root(
        "story",
        &[
            ("producer", Some("task/producer")),
            ("consumer", Some("task/consumer")),
        ],
    );
    let _m = mediator(&root);
    let c = cockpit(&root, "Ada Lovelace");
    let r = browser("story", &c, &root, &[]);
    eprintln!(
        "contract-change on the page after {} ms, question after {} ms",
        r["contract_ms"], r["question_ms"]
    );
    let qid = r["qid"].as_str().unwrap();
    // The answer is in the asker's inbox, from the person, signed.
    let inbox = root.sandbox("consumer").inbox();
    let mut got = None;
    inbox
        .wait_until(Some(Duration::from_secs(10)), || {
            for n in inbox.names(Sub::New)? {
                if let Found::Message(m) = inbox.read(Sub::New, &n)
                    && m.in_reply_to.as_deref() == Some(qid)
                {
                    got = Some(m);
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .unwrap();
    let a: Message = got.expect("the answer reached the consumer's inbox");
    assert_eq!((a.from.as_str(), a.kind), ("human", Kind::Answer));
    assert!(
        a.body.starts_with("yes: backfill them with a placeholder")
            && a.body.ends_with("-- Ada Lovelace (lw-cockpit)"),
        "{:?}",
        a.body
    );
    let (entries, _) = Log::new(root.log_dir()).entries().unwrap();
    let logged = entries
        .iter()
        .find(|e| e.message_id == a.id)
        .expect("the answer is logged");
    assert!(
        logged
            .message
            .as_ref()
            .unwrap()
            .body
            .contains("Ada Lovelace"),
        "the log names the person"
    );
}

/// Payloads a sandbox can put in what the page shows.  Those with control
/// characters go in bodies only (a subject refuses them).
const CORPUS: &[&str] = &[
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "<svg onload=alert(3)>",
    "<svg><script>alert(4)</script></svg>",
    "javascript:alert(5)",
    "<a href=\"javascript:alert(6)\">click</a>",
    "<iframe src=\"javascript:alert(7)\"></iframe>",
    "\"><script>alert(8)</script>",
    "'><img src=http://evil.example/9.png>",
    "<body onload=alert(10)>",
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(11)>",
    "<details open ontoggle=alert(12)>",
    "<style>body{background:url(http://evil.example/13)}</style>",
    "<link rel=stylesheet href=http://evil.example/14.css>",
    "{{constructor.constructor('alert(15)')()}}",
    "<base href=\"http://evil.example/\">",
    "<meta http-equiv=\"refresh\" content=\"0;url=http://evil.example/17\">",
    "<object data=\"http://evil.example/18\"></object>",
    "&lt;script&gt;alert(19)&lt;/script&gt;",
    "invoice\u{202e}gpj.exe",
    "<form action=http://evil.example/21><button>go</button></form>",
    "<video><source onerror=alert(22)>",
    "data:text/html,<script>alert(23)</script>",
    "<input autofocus onfocus=alert(24)>",
    "\u{1b}[2J\u{1b}]0;pwned\u{7}cleared the screen",
    "\u{1b}]8;;http://evil.example/26\u{1b}\\a link\u{1b}]8;;\u{1b}\\",
];

#[test]
fn a_corpus_of_xss_and_terminal_payloads_renders_inert() {
    let root = root("xss", &[("evil", Some("<img/src=x/onerror=alert(30)>"))]);
    // A scope and a radar verdict of file names from the corpus too.
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .args(["register", "evil2", "--scope", "<script>alert(31)</script>"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let radar = serde_json::json!({"version": 1, "heads": {}, "pairs": {"evil evil2": {
        "input": "", "heads": ["", ""], "base": "", "verdict": {},
        "announced": ["<img src=x onerror=alert(32)>", "\u{202e}txt.exe"]}}});
    std::fs::create_dir_all(root.state_dir()).unwrap();
    std::fs::write(root.state_dir().join("radar.json"), radar.to_string()).unwrap();
    for (i, p) in CORPUS.iter().enumerate() {
        let subject = if p.chars().any(char::is_control) {
            format!("terminal payload {i}")
        } else {
            p.to_string()
        };
        post_as(&root, "evil", "status", &subject, p);
    }
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--once")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let c = cockpit(&root, "ada");
    let r = browser("xss", &c, &root, &[("CORPUS", CORPUS.len().to_string())]);
    let text = r["text"].as_str().unwrap();
    // Shown as the text it is.
    for p in [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(2)>",
        "<img/src=x/onerror=alert(30)>",
        "<script>alert(31)</script>",
        "\\u{202e}",
    ] {
        assert!(text.contains(p), "{p:?} is not shown as text");
    }
}
