//! The cockpit's panels against real parts: held messages released and
//! dropped (through the API and on the page), a task branch pushed to a
//! real mirror (its diff and stat, file names carrying payloads), the
//! engine's view from a real dockerd (and from none), and the sync panel
//! after a real lw-sync run against lw-github-sink.

use super::*;
use serde_json::Value;

/// Reads the page's event stream until it names `topic`; false after `secs`.
fn wait_event(c: &Cockpit, topic: &str, secs: u64) -> bool {
    let mut s = TcpStream::connect(("127.0.0.1", c.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(secs))).unwrap();
    write!(
        s,
        "GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nx-lw-session: {}\r\n\r\n",
        c.port, c.secret
    )
    .unwrap();
    let want = format!("data: {topic}");
    BufReader::new(s)
        .lines()
        .map_while(|l| l.ok())
        .any(|l| l.trim_end() == want)
}

fn api(c: &Cockpit, path: &str) -> Value {
    let (status, _, body) = get(c, path, &format!("x-lw-session: {}\r\n", c.secret));
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// The sandboxes as the API lists them, once a round of the engine's view
/// has been made with a page (this stream) listening.
fn sandboxes_live(c: &Cockpit) -> Value {
    assert!(
        wait_event(c, "sandboxes", 30),
        "no look at the engine within 30 s"
    );
    api(c, "/api/sandboxes")
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {list}"))
}

fn post_to(root: &Root, from: &str, to: &str, subject: &str) -> String {
    let o = Command::new(support::bin("lw-post"))
        .arg("-m")
        .arg(root.dir.join("sandboxes").join(from))
        .args(["-k", "request", "-t", to, "-s", subject, "please"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// A root where api's two requests to web are held; (root, policy, ids).
fn held_root(tag: &str) -> (Root, PathBuf, String, String) {
    let root = root(tag, &[("api", None), ("web", None)]);
    let policy = root.dir.parent().unwrap().join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nhold kind request\n").unwrap();
    let a = post_to(&root, "api", "web", "schema question one");
    let b = post_to(&root, "api", "web", "schema question two");
    let o = Command::new(support::bin("lw-mediate"))
        .arg("--root")
        .arg(&root.dir)
        .arg("--policy")
        .arg(&policy)
        .arg("--once")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(root.held().names(Sub::New).unwrap().len(), 2, "both held");
    (root, policy, a, b)
}

/// `released` is in web's inbox and logged as released; `dropped` is not
/// delivered and its log entry's reason names `reason` and the person.
fn check_release_and_drop(root: &Root, released: &str, dropped: &str, reason: &str) {
    let inbox = root.sandbox("web").inbox();
    let ids: Vec<String> = inbox
        .names(Sub::New)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| match inbox.read(Sub::New, n) {
            Found::Message(m) => Some(m.id),
            _ => None,
        })
        .collect();
    assert!(ids.iter().any(|i| i == released), "released: {ids:?}");
    assert!(!ids.iter().any(|i| i == dropped), "dropped: {ids:?}");
    let (entries, _) = Log::new(root.log_dir()).entries().unwrap();
    let of = |id: &str, action: &str| {
        entries
            .iter()
            .find(|e| e.message_id == id && e.decision.action.as_str() == action)
            .unwrap_or_else(|| {
                let seen: Vec<_> = entries
                    .iter()
                    .map(|e| (&e.message_id, e.decision.action.as_str()))
                    .collect();
                panic!("no {action} of {id} in the log: {seen:?}")
            })
    };
    assert_eq!(of(released, "release").decision.to, vec!["web".to_string()]);
    let why = &of(dropped, "drop").decision.reason;
    assert!(
        why.contains(reason) && why.contains("by Ada Lovelace"),
        "the drop's reason: {why}"
    );
}

#[test]
fn held_messages_released_and_dropped_through_the_api() {
    let (root, policy, a, b) = held_root("held-api");
    let c = cockpit_with(
        &root,
        "Ada Lovelace",
        &["--policy", policy.to_str().unwrap()],
        &[],
    );
    let release = format!(r#"{{"id":"{a}"}}"#);
    let drop = format!(r#"{{"id":"{b}","reason":"asked twice"}}"#);
    for (path, body) in [("/api/release", &release), ("/api/drop", &drop)] {
        let (status, _, _) = post_json(&c, path, "", body);
        assert_eq!(status, 403, "{path} without the token");
    }
    assert_eq!(root.held().names(Sub::New).unwrap().len(), 2);
    let tok = format!(
        "x-lw-session: {}\r\nOrigin: http://127.0.0.1:{}\r\n",
        c.secret, c.port
    );
    let (status, _, r) = post_json(&c, "/api/release", &tok, &release);
    assert_eq!(status, 200, "{r}");
    let (status, _, d) = post_json(&c, "/api/drop", &tok, &drop);
    assert_eq!(status, 200, "{d}");
    assert!(
        d.contains("asked twice (by Ada Lovelace, lw-cockpit)"),
        "{d}"
    );
    check_release_and_drop(&root, &a, &b, "asked twice");
    let q = api(&c, "/api/queues");
    assert_eq!(q["held"].as_array().unwrap().len(), 0, "{q}");
    // Once is once: releasing it again says it is not held.
    let (status, _, again) = post_json(&c, "/api/release", &tok, &release);
    assert_ne!(status, 200, "{again}");
}

#[test]
fn held_messages_released_and_dropped_on_the_page() {
    let (root, policy, a, b) = held_root("held-page");
    let c = cockpit_with(
        &root,
        "Ada Lovelace",
        &["--policy", policy.to_str().unwrap()],
        &[],
    );
    let r = browser(
        "held",
        &c,
        &root,
        &[
            ("RELEASE", a.clone()),
            ("DROP", b.clone()),
            ("REASON", "off topic".into()),
        ],
    );
    assert!(
        r["result"].as_str().unwrap().contains("dropped"),
        "the page says what it did: {r}"
    );
    check_release_and_drop(&root, &a, &b, "off topic");
}

fn git(dir: &Path, args: &[&str]) {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// lw-sandbox's record of `name`, as `create` writes it (fields that
/// matter here; the engine address when given).
fn write_record(root: &Root, name: &str, mirror: &Path, engine: Option<&str>) {
    let rec = serde_json::json!({
        "version": 1, "name": name, "branch": format!("task/{name}"), "scope": [],
        "container": format!("lw-sb-{}-{name}", wall::root_id(&root.dir)),
        "volume": format!("lw-sb-x-{name}-work"), "image": "loopwright/test-busybox:latest",
        "network": "none", "ports": [{"container": "8080/tcp", "host": 18080}],
        "secrets": [], "uid": 1000, "project": "/nonexistent", "mirror": mirror,
        "created": "2026-01-01T00:00:00Z", "ready": true, "engine": engine,
    });
    let dir = root.state_dir().join("sandbox");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), rec.to_string()).unwrap();
}

const EVIL_FILE: &str = "<img src=x onerror=alert(41)>.txt";

/// A bare mirror with `main` and a pushed `task/NAME` one commit ahead:
/// app.txt changed, and two new files whose names carry payloads.
fn mirror_with_branch(top: &Path, name: &str) -> PathBuf {
    let mirror = top.join("mirror.git");
    let work = top.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(top, &["init", "-q", "--bare", "-b", "main", "mirror.git"]);
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["config", "user.email", "t@example.com"]);
    git(&work, &["config", "user.name", "t"]);
    std::fs::write(work.join("app.txt"), "one\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-qm", "base"]);
    git(&work, &["push", "-q", mirror.to_str().unwrap(), "main"]);
    git(&work, &["checkout", "-qb", &format!("task/{name}")]);
    std::fs::write(work.join("app.txt"), "one\ntwo-from-the-branch\n").unwrap();
    std::fs::write(work.join(EVIL_FILE), "x\n").unwrap();
    std::fs::write(work.join("\u{1b}]0;pwned\u{7}title.txt"), "y\n").unwrap();
    git(&work, &["add", "."]);
    git(&work, &["commit", "-qm", "the task"]);
    git(
        &work,
        &[
            "push",
            "-q",
            mirror.to_str().unwrap(),
            &format!("task/{name}"),
        ],
    );
    mirror
}

#[test]
fn a_pushed_branch_shows_its_diff_and_stat_with_no_engine_reachable() {
    let root = root("diff", &[("evil", Some("task/evil"))]);
    let top = root.dir.parent().unwrap();
    let mirror = mirror_with_branch(top, "evil");
    write_record(&root, "evil", &mirror, None);
    let nowhere = format!("unix://{}", top.join("no-engine.sock").display());
    let c = cockpit_with(&root, "ada", &[], &[("DOCKER_HOST", &nowhere)]);

    let (status, _, diff) = get(
        &c,
        "/api/diff?sandbox=evil",
        &format!("x-lw-session: {}\r\n", c.secret),
    );
    assert_eq!(status, 200, "{diff}");
    for want in [
        "branch task/evil at ",
        "diff --git a/app.txt b/app.txt",
        "+two-from-the-branch",
        EVIL_FILE,
        "\\033]0;pwned\\atitle.txt",
    ] {
        assert!(diff.contains(want), "{want:?} not in the diff:\n{diff}");
    }
    assert!(!diff.contains('\u{1b}'), "a raw escape in the diff");

    // No engine: the list still answers, says why, and has the stat.
    let list = sandboxes_live(&c);
    assert_eq!(list["engine"]["state"], "unreachable", "{list}");
    assert!(
        list["engine"]["error"]
            .as_str()
            .unwrap()
            .contains("no-engine.sock"),
        "{list}"
    );
    let s = named(&list, "evil");
    assert_eq!(s["state"], "ready", "{s}");
    assert!(s["listed"].is_null(), "{s}");
    assert_eq!(
        (
            &s["stat"]["ahead"],
            &s["stat"]["files"],
            &s["stat"]["insertions"]
        ),
        (&Value::from(1), &Value::from(3), &Value::from(3)),
        "{s}"
    );
    let (status, _, _) = get(&c, "/api/log", &format!("x-lw-session: {}\r\n", c.secret));
    assert_eq!(status, 200, "the page keeps serving");

    let r = browser("panels", &c, &root, &[("SANDBOX", "evil".into())]);
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains(EVIL_FILE) && detail.contains("+two-from-the-branch"),
        "{detail}"
    );
    assert!(
        r["engine"].as_str().unwrap().contains("engine unreachable"),
        "{r}"
    );
    let rows = r["sandboxes"].as_str().unwrap();
    assert!(
        rows.contains("ready (engine unreachable)") && rows.contains("1 ahead; 3 files +3 −0"),
        "{rows}"
    );
    assert!(
        r["links"]
            .as_array()
            .unwrap()
            .contains(&Value::from("http://127.0.0.1:18080/")),
        "{r}"
    );
}

/// Waits for the engine's oom event of `container` (60 s at most).
fn wait_oom(container: &str) {
    // --until takes a time, not a span: a duration there means "ago".
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 60;
    let mut events = Command::new("docker")
        .args(["events", "--since", "0", "--until", &until.to_string()])
        .args(["--filter", &format!("container={container}")])
        .args(["--filter", "event=oom", "--format", "{{.Action}}"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(events.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = events.kill();
    let _ = events.wait();
    assert_eq!(
        line.trim(),
        "oom",
        "no oom event for {container} within 60 s"
    );
}

/// Containers made for the test, removed when it ends.
struct Containers(Vec<String>);
impl Drop for Containers {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(&self.0)
            .output();
    }
}

fn docker(args: &[&str]) -> String {
    let o = Command::new("docker").args(args).output().unwrap();
    assert!(
        o.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn the_engines_view_running_exited_oom_lost_and_elsewhere() {
    let root = root(
        "engine",
        &[
            ("runner", None),
            ("quitter", None),
            ("oomer", None),
            ("ghost", None),
            ("away", None),
        ],
    );
    let id = wall::root_id(&root.dir);
    let label = format!("{}={id}", wall::LABEL_ROOT);
    let image = "loopwright/test-busybox:latest";
    let mirror = root.dir.parent().unwrap().join("no-mirror.git");
    let mut made = Containers(vec![]);
    for (name, extra, cmd) in [
        ("runner", &[][..], "sleep 300"),
        ("quitter", &[][..], "exit 3"),
        // The hog is a child of the shell, so the container outlives the
        // OOM kill: Docker files OOMKilled only when its oom event comes
        // before the container's exit, and a hog that is PID 1 races them.
        (
            "oomer",
            &["--memory", "8m", "--memory-swap", "8m"][..],
            "tail /dev/zero; exec sleep 300",
        ),
    ] {
        let cname = format!("lw-sb-{id}-{name}");
        let mut args = vec!["run", "-d", "--name", &cname, "--label", &label];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[image, "sh", "-c", cmd]);
        docker(&args);
        made.0.push(cname);
        write_record(&root, name, &mirror, None);
    }
    write_record(&root, "ghost", &mirror, None);
    write_record(&root, "away", &mirror, Some("tcp://elsewhere.example:2376"));
    let oomer = format!("lw-sb-{id}-oomer");
    wait_oom(&oomer);
    docker(&["kill", &oomer]);
    for name in ["quitter", "oomer"] {
        docker(&["wait", &format!("lw-sb-{id}-{name}")]);
    }
    let c = cockpit(&root, "ada");
    let list = sandboxes_live(&c);
    assert_eq!(list["engine"]["state"], "reachable", "{list}");
    let state = |n: &str| named(&list, n)["listed"]["state_text"].clone();
    assert_eq!(state("runner"), "running", "{list}");
    assert_eq!(state("quitter"), "exited (3)", "{list}");
    assert_eq!(state("oomer"), "exited (OOM)", "{list}");
    assert_eq!(state("ghost"), "lost", "{list}");
    assert_eq!(state("away"), "elsewhere", "{list}");
    assert_eq!(
        named(&list, "runner")["listed"]["runtime"],
        "runc",
        "{list}"
    );

    let r = browser("panels", &c, &root, &[]);
    let rows = r["sandboxes"].as_str().unwrap();
    for want in ["running", "exited (3)", "exited (OOM)", "lost", "elsewhere"] {
        assert!(rows.contains(want), "{want} not on the page: {rows}");
    }
}

#[test]
fn the_sync_panel_after_a_real_lw_sync_run() {
    let env = sync_support::Env::new("cockpit");
    sync_support::append_n(&env.log(), 3, "hello");
    let o = env.sync(&["--once"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let root = Root::new(env.root.clone());
    // What lw-mediate's first pass makes of it (the sink's root has a log only).
    root.init().unwrap();
    let c = cockpit(&root, "ada");
    let st = api(&c, "/api/state");
    let sync = &st["sync"];
    let t = &sync["targets"][0];
    assert_eq!(t["target"], "octo/proj#1", "{st}");
    assert_eq!(t["url"], "https://github.com/octo/proj/issues/1", "{st}");
    assert_eq!(
        (&t["synced"], &t["in_flight"]),
        (&Value::from(3), &Value::from(0))
    );
    assert_eq!(sync["not_synced"], 0, "{st}");
    assert!(sync["last_error"].is_null(), "{st}");
    assert!(
        sync["last_error_note"]
            .as_str()
            .unwrap()
            .contains("does not keep its last error"),
        "{st}"
    );

    let r = browser("panels", &c, &root, &[]);
    let text = r["sync"].as_str().unwrap();
    for want in [
        "octo/proj#1: 3 entries synced, 0 in flight",
        "0 log entries on no issue yet",
        "last error: not known: lw-sync does not keep its last error",
    ] {
        assert!(
            text.contains(want),
            "{want:?} not in the sync panel: {text}"
        );
    }
    assert!(
        r["links"]
            .as_array()
            .unwrap()
            .contains(&Value::from("https://github.com/octo/proj/issues/1")),
        "{r}"
    );

    // Entries lw-sync has not run for yet are counted as such.
    sync_support::append_n(&env.log(), 2, "later");
    assert_eq!(api(&c, "/api/state")["sync"]["not_synced"], 2);

    // The link goes where lw-sync run from here posts (issue 40 item 10):
    // an Enterprise server named by the project's api_url; and no link
    // for an API address with no issue pages ($LW_GITHUB_API_URL first).
    let cfg = env.dir.join(".loopwright");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("sync.json"),
        r#"{"api_url": "https://ghe.example.com/api/v3"}"#,
    )
    .unwrap();
    for (extra, want) in [
        (vec![], Some("https://ghe.example.com/octo/proj/issues/1")),
        (vec![("LW_GITHUB_API_URL", env.url.as_str())], None),
    ] {
        let c = cockpit_with(&root, "ada", &[], &extra);
        let r = browser("panels", &c, &root, &[]);
        let links: Vec<&str> = r["links"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(
            links,
            want.into_iter().collect::<Vec<_>>(),
            "{extra:?}: {r}"
        );
        assert!(r["sync"].as_str().unwrap().contains("octo/proj#1"), "{r}");
    }
}
