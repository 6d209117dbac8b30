//! lw-sandbox end to end against the real engine and real git: create, the
//! clone, exec's exit statuses, push of the task branch and only it, ls, rm
//! refusing to lose work, ports, secrets, the incremental install.

use support::sandbox as sandbox_support;

use sandbox_support::*;

#[test]
fn create_clones_onto_the_branch_and_push_sends_only_it() {
    let f = Fixture::new("flow");
    assert_eq!(
        f.ok(&[
            "create",
            "api",
            "--branch",
            "lw/api",
            "--scope",
            "src/api/**"
        ])
        .trim(),
        "api"
    );

    // The clone: its own .git, objects borrowed from the mirror, on the branch, identity set.
    let (code, out, e) = f.sh(
        "api",
        "git rev-parse --abbrev-ref HEAD; cat .git/objects/info/alternates; git config user.email; \
         git log --format=%s -1; test -d /work/repo/.git && echo own-git; echo $LW_MAILBOX $LW_SANDBOX",
    );
    assert_eq!(code, 0, "{e}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "lw/api",
            "/lw/mirror/objects",
            "host@example.com",
            "init",
            "own-git",
            "/lw/mailbox api"
        ]
    );
    // Registered for the mediator, with its mailbox.
    let reg = std::fs::read_to_string(f.root.join("registry/api.json")).expect("registry record");
    assert!(
        reg.contains("\"lw/api\"") && reg.contains("src/api/**"),
        "{reg}"
    );
    assert!(f.root.join("sandboxes/api/outbox/new").is_dir());

    // lw-post works from inside with no flag: LW_MAILBOX is set.
    let (code, id, e) = f.sh("api", "lw-post --kind status --subject ready 'clone ready'");
    assert_eq!(code, 0, "{e}");
    let posted = f.root.join("sandboxes/api/outbox/new").join(id.trim());
    assert!(posted.is_file(), "{posted:?}");

    // Work, then a second branch the sandbox makes on its own.
    let (code, _, e) = f.sh(
        "api",
        "echo '{\"users\": 2}' > src/api/schema.json && git commit -qam 'api: users 2' && \
         git branch sneaky && git checkout -q sneaky && echo x > sneaky && git add sneaky && git commit -qm sneaky && \
         git checkout -q lw/api",
    );
    assert_eq!(code, 0, "{e}");
    let ls = f.ok(&["ls", "--json"]);
    let rec: serde_json::Value =
        serde_json::from_str(ls.lines().next().expect("one sandbox")).expect("json");
    assert_eq!(rec["type"], "sandbox");
    assert_eq!(rec["state"], "running");
    assert_eq!(rec["unpushed"], 1);

    // rm refuses and says what would be lost.
    let o = f.sb(&["rm", "api"]);
    assert_eq!(o.status.code(), Some(75));
    assert!(err(&o).contains("api: users 2"), "{}", err(&o));

    let pushed = f.ok(&["push", "api"]);
    let w: Vec<&str> = pushed.split_whitespace().collect();
    assert_eq!(w[0], "lw/api");
    assert_eq!(w[2], "new");
    assert_eq!(git(&f.upstream, &["rev-parse", "refs/heads/lw/api"]), w[1]);
    assert_eq!(
        git(&f.upstream, &["log", "--format=%s", "-1", "lw/api"]),
        "api: users 2"
    );
    let heads = git(&f.upstream, &["for-each-ref", "--format=%(refname)"]);
    assert_eq!(
        heads, "refs/heads/lw/api\nrefs/heads/main",
        "only the task's branch left the sandbox"
    );
    git(&f.upstream, &["fsck", "--no-progress"]);
    // The host checkout was never touched.
    assert_eq!(
        git(&f.proj, &["status", "--porcelain", "--untracked-files=no"]),
        ""
    );
    assert_eq!(git(&f.proj, &["rev-parse", "--abbrev-ref", "HEAD"]), "main");

    // A header names the columns; --no-header leaves it out for scripts.
    let with_header = f.ok(&["ls"]);
    assert!(
        with_header.starts_with(
            "NAME\tBRANCH\tSTATE\tPORTS\tNETWORK\tAGE\tUNPUSHED\tISOLATION\tSERVICES\tAGENT\n"
        ),
        "{with_header}"
    );
    let ls = f.ok(&["ls", "--no-header"]);
    assert_eq!(with_header.lines().skip(1).count(), ls.lines().count());
    assert!(ls.starts_with("api\tlw/api\trunning\t-\t"), "{ls}");
    assert!(
        // ... the unpushed column (7th), and services (none) last.
        ls.trim_end().split('\t').nth(6) == Some("0") && ls.trim_end().ends_with("\t-"),
        "pushed work counts as pushed: {ls}"
    );
    // A second push is a no-op.
    assert!(f.ok(&["push", "api"]).contains("up-to-date"));

    // Stop keeps the workspace; start brings it back.
    f.ok(&["stop", "api"]);
    assert!(f.ok(&["ls"]).contains("\texited\t"));
    let o = f.sb(&["exec", "api", "--", "true"]);
    assert_eq!(
        o.status.code(),
        Some(69),
        "exec in a stopped sandbox: {}",
        err(&o)
    );
    f.ok(&["start", "api"]);
    assert_eq!(
        f.sh("api", "git log --format=%s -1").1.trim(),
        "api: users 2"
    );

    // The status message posted above was never routed: rm archives it
    // under the root and removes the mail dir, saying so.
    let o = f.sb(&["rm", "api"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("archived mailbox") && err(&o).contains("1 unread"),
        "{}",
        err(&o)
    );
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    assert!(f.host_leftovers().is_empty(), "{:?}", f.host_leftovers());
    let archived: Vec<_> = std::fs::read_dir(f.root.join("archive"))
        .expect("an archive")
        .flatten()
        .flat_map(|d| {
            std::fs::read_dir(d.path().join("unread/outbox"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .collect();
    assert_eq!(archived.len(), 1, "the unread message is archived");
}

#[test]
fn exec_passes_statuses_signals_and_stdin_through() {
    let f = Fixture::new("exec");
    f.ok(&["create", "x", "--branch", "lw/x"]);
    assert_eq!(f.sh("x", "exit 3").0, 3);
    assert_eq!(f.sh("x", "kill -9 $$").0, 128 + 9);
    assert_eq!(f.sh("x", "kill -15 $$").0, 128 + 15);
    let o = f.sb(&["exec", "x", "--", "/nonexistent"]);
    assert!(
        matches!(o.status.code(), Some(126 | 127)),
        "{:?}",
        o.status.code()
    );
    let mut c = f.cmd(&["exec", "x", "--", "sh", "-c", "wc -c; pwd >&2"]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(&vec![b'a'; 200_000])
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    assert_eq!(text(&o).trim(), "200000");
    assert_eq!(err(&o).trim(), "/work/repo");
    // A command that exits without reading all of its input: its status,
    // not "cannot reach the Docker engine" (issue 40).
    let mut c = f.cmd(&[
        "exec",
        "x",
        "--",
        "sh",
        "-c",
        "head -c 10 >/dev/null; exit 3",
    ]);
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    let mut input = child.stdin.take().expect("piped");
    let feeder = std::thread::spawn(move || {
        // 2 MiB, as `head -c 2M /dev/zero |` would: the write fails once
        // lw-sandbox stops reading, which is fine.
        let _ = input.write_all(&vec![0u8; 2 << 20]);
    });
    let o = child.wait_with_output().expect("wait");
    feeder.join().expect("feeder");
    assert_eq!(o.status.code(), Some(3), "{}", err(&o));
    // An existing branch upstream is checked out as it is, tracking it.
    git(&f.proj, &["push", "-q", "origin", "main:feature"]);
    f.ok(&[
        "create",
        "y",
        "--branch",
        "feature",
        "--from",
        "nonexistent-ignored",
    ]);
    assert_eq!(
        f.sh("y", "git rev-parse --abbrev-ref HEAD@{upstream}")
            .1
            .trim(),
        "origin/feature"
    );
    f.ok(&["rm", "x", "y"]);
}

#[test]
fn ports_are_leased_published_on_loopback_and_released() {
    let f = Fixture::with_config("ports", "sandbox.ports = 47300-47309\n");
    let o = f.sb(&["create", "a", "--branch", "a", "--port", "8080"]);
    assert_eq!(
        o.status.code(),
        Some(64),
        "--port without a network: {}",
        err(&o)
    );
    let o = f.sb(&[
        "create",
        "a",
        "--branch",
        "a",
        "--port",
        "8080",
        "--network",
        "bridge",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("bridge network"),
        "bridge is warned: {}",
        err(&o)
    );
    f.ok(&[
        "create",
        "b",
        "--branch",
        "b",
        "--port",
        "8080",
        "--port",
        "9090/tcp",
        "--network",
        "bridge",
    ]);
    let pa = f.ok(&["port", "a"]);
    let pb = f.ok(&["port", "b"]);
    assert_eq!(pa.trim(), "8080/tcp -> 127.0.0.1:47300");
    assert_eq!(
        pb.lines().collect::<Vec<_>>(),
        ["8080/tcp -> 127.0.0.1:47301", "9090/tcp -> 127.0.0.1:47302"]
    );
    // The engine agrees, from outside.
    let d = text(&docker(&["port", &f.container("b"), "8080/tcp"]));
    assert_eq!(d.trim(), "127.0.0.1:47301");
    f.ok(&["rm", "a"]);
    let leases = std::fs::read_to_string(f.root.join("state/ports")).expect("lease file");
    assert!(!leases.contains("47300"), "rm releases: {leases}");
    f.ok(&[
        "create",
        "c",
        "--branch",
        "c",
        "--port",
        "80",
        "--network",
        "bridge",
    ]);
    assert_eq!(
        f.ok(&["port", "c"]).trim(),
        "80/tcp -> 127.0.0.1:47300",
        "a released port is leased again"
    );
    f.ok(&["rm", "b", "c"]);
    assert!(f.host_leftovers().is_empty(), "{:?}", f.host_leftovers());
}

#[test]
fn secrets_reach_only_the_sandbox_tmpfs() {
    let f = Fixture::with_config(
        "secrets",
        "sandbox.secrets = LW_TEST_TOKEN\ndoor.log-max = 64k\n",
    );
    let value = format!("tok-{}", nonce());
    let o = f
        .cmd(&["create", "s", "--branch", "s", "--secret", "HOME"])
        .env("HOME", "/root")
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(78), "not allowed: {}", err(&o));
    let o = f
        .cmd(&["create", "s", "--branch", "s", "--secret", "LW_TEST_TOKEN"])
        .env_remove("LW_TEST_TOKEN")
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(66), "unset: {}", err(&o));
    assert!(err(&o).contains("LW_TEST_TOKEN"));
    let o = f
        .cmd(&["create", "s", "--branch", "s", "--secret", "LW_TEST_TOKEN"])
        .env("LW_TEST_TOKEN", &value)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", err(&o));
    assert!(!err(&o).contains(&value) && !text(&o).contains(&value));
    // The root records the name (never the value), so the door knows it
    // from any directory: from / without the value it refuses (78), with
    // it, it masks it (issue 29).
    let rec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(f.root.join("registry/s.json")).expect("a registry record"),
    )
    .unwrap();
    assert_eq!(
        rec["secrets"],
        serde_json::json!(["LW_TEST_TOKEN"]),
        "{rec}"
    );
    assert_eq!(
        rec["allowed_secrets"],
        serde_json::json!(["LW_TEST_TOKEN"]),
        "{rec}"
    );
    let door = |value: Option<&str>| {
        let mut c = std::process::Command::new(bin("lw-mediate"));
        c.args(["--once", "--root"]).arg(&f.root).current_dir("/");
        match value {
            Some(v) => c.env("LW_TEST_TOKEN", v),
            None => c.env_remove("LW_TEST_TOKEN"),
        };
        c.output().expect("lw-mediate runs")
    };
    let o = door(None);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(
        err(&o).contains("cannot resolve secret LW_TEST_TOKEN"),
        "{}",
        err(&o)
    );
    // Another value: create recorded its keyed digest, and the door
    // refuses one that differs (issue 40, item 5), naming no value.
    let other = format!("other-{}", nonce());
    let o = door(Some(&other));
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(
        err(&o).contains(
            "secret LW_TEST_TOKEN in this environment is not the value sandbox 's' was made with"
        ) && !err(&o).contains(&other),
        "{}",
        err(&o)
    );
    assert!(f.root.join("state/door/secrets/s.json").is_file());
    // And the project's door budget, which a mediator from / applies.
    let budgets = std::fs::read_to_string(f.root.join("state/door/budgets.json")).unwrap();
    assert!(budgets.contains("\"log_max\": 65536"), "{budgets}");
    let (code, _, e) = f.sh(
        "s",
        "lw-post --to human --kind question --subject q \"$(base64 /run/secrets/LW_TEST_TOKEN)\"",
    );
    assert_eq!(code, 0, "{e}");
    let o = door(Some(&value));
    assert!(o.status.success(), "{}", err(&o));
    let log = std::process::Command::new(bin("lw-mediate"))
        .args(["log", "--root"])
        .arg(&f.root)
        .current_dir("/")
        .env("LW_TEST_TOKEN", &value)
        .output()
        .expect("lw-mediate runs");
    assert!(
        text(&log).contains("contains secret LW_TEST_TOKEN"),
        "{}",
        text(&log)
    );
    let (code, out, e) = f.sh("s", "cat /run/secrets/LW_TEST_TOKEN; echo; stat -c '%a %u' /run/secrets/LW_TEST_TOKEN; grep -c LW_TEST_TOKEN /proc/1/environ || true");
    assert_eq!(code, 0, "{e}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, [value.as_str(), "400 100000", "0"]);
    // Not in the engine's view of the container, not on disk in the root or the project.
    let inspect = text(&docker(&["inspect", &f.container("s")]));
    assert!(!inspect.contains(&value), "docker inspect shows no secret");
    for dir in [&f.root, &f.proj] {
        let hit = std::process::Command::new("grep")
            .args(["-r", "-l", &value])
            .arg(dir)
            .output()
            .expect("grep");
        assert!(
            text(&hit).is_empty(),
            "secret found on disk: {}",
            text(&hit)
        );
    }
    // Gone when stopped; written again by start, from start's environment,
    // which must hold the value the door knows (issue 40, item 5).
    f.ok(&["stop", "s"]);
    let o = f
        .cmd(&["start", "s"])
        .env("LW_TEST_TOKEN", "second")
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(err(&o).contains("secret LW_TEST_TOKEN in this environment is not the value"));
    let o = f
        .cmd(&["start", "s"])
        .env("LW_TEST_TOKEN", &value)
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(f.sh("s", "cat /run/secrets/LW_TEST_TOKEN").1, value);
    // A stopped sandbox pushes without its secrets in the environment, and stays stopped.
    f.ok(&["stop", "s"]);
    let o = f
        .cmd(&["push", "s"])
        .env_remove("LW_TEST_TOKEN")
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", err(&o));
    assert!(f.ok(&["ls"]).contains("\texited\t"));
    let o = f
        .cmd(&["rm", "s"])
        .env_remove("LW_TEST_TOKEN")
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        !f.root.join("state/door/secrets/s.json").exists(),
        "its digests go with its record"
    );
}

#[test]
fn a_branch_whose_lockfile_differs_gets_an_incremental_install() {
    let f = Fixture::with_config(
        "install",
        "sandbox.install = echo \"installed $(cat deps.lock)\" | tee /work/home/installed\n",
    );
    // The branch changes the lockfile the image's deps layer was built from.
    git(&f.proj, &["checkout", "-q", "-b", "newdeps"]);
    std::fs::write(f.proj.join("deps.lock"), "lock v2\n").expect("write");
    git(&f.proj, &["commit", "-qam", "deps v2"]);
    git(&f.proj, &["push", "-q", "origin", "newdeps"]);
    git(&f.proj, &["checkout", "-q", "main"]);
    let o = f.sb(&["create", "d", "--branch", "newdeps"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("deps.lock differ"), "{}", err(&o));
    // Its output goes through lw-sandbox's report, a line at a time.
    assert!(
        err(&o)
            .lines()
            .any(|l| l.starts_with("lw-sandbox: ") && l.ends_with(" installed lock v2")),
        "{}",
        err(&o)
    );
    assert_eq!(
        f.sh("d", "cat /work/home/installed").1.trim(),
        "installed lock v2"
    );
    // The same lockfile as the image: no install.
    let o = f.sb(&["create", "e", "--branch", "e"]);
    assert!(
        o.status.success() && !err(&o).contains("differ"),
        "{}",
        err(&o)
    );
    assert_eq!(f.sh("e", "test -e /work/home/installed").0, 1);
    f.ok(&["rm", "d", "e"]);
    assert!(
        f.leftovers().is_empty(),
        "the install container is gone too: {:?}",
        f.leftovers()
    );
}

#[test]
fn shell_gives_a_terminal_on_the_branch_and_passes_the_status() {
    let f = Fixture::new("shell");
    f.ok(&["create", "t", "--branch", "lw/t"]);
    // script(1) gives lw-sandbox a terminal, as a person's would be.
    let cmd = format!(
        "{} --root {} shell t",
        bin("lw-sandbox").display(),
        f.root.display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .current_dir(&f.proj)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script(1) from util-linux runs");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(b"echo \"in:$(pwd):$(git rev-parse --abbrev-ref HEAD):$(tty)\"\nexit 7\n")
        .expect("write");
    let o = child.wait_with_output().expect("wait");
    let out = text(&o).replace('\r', "");
    assert!(out.contains("in:/work/repo:lw/t:/dev/pts/"), "{out}");
    assert_eq!(o.status.code(), Some(7), "{out}");
    f.ok(&["rm", "t"]);
}

#[test]
fn a_message_posted_in_one_sandbox_is_read_in_another_through_the_mediator() {
    let f = Fixture::new("door");
    f.ok(&["create", "a", "--branch", "lw/a", "--scope", "src/api/**"]);
    f.ok(&["create", "b", "--branch", "lw/b", "--scope", "src/api/**"]);
    let (code, id, e) = f.sh("a", "lw-post --kind contract-change --ref src/api/schema.json --subject 'users: 2' 'schema changed'");
    assert_eq!(code, 0, "{e}");
    let m = std::process::Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .expect("lw-mediate runs");
    assert!(m.status.success(), "{}", err(&m));
    let (code, list, e) = f.sh("b", "lw-inbox");
    assert_eq!(code, 0, "{e}");
    assert!(
        list.starts_with(&format!("{}\ta\tcontract-change\tusers: 2", id.trim())),
        "{list}"
    );
    let (code, _, e) = f.sh("b", &format!("lw-inbox ack {}", id.trim()));
    assert_eq!(code, 0, "{e}");
    assert_eq!(f.sh("b", "lw-inbox").1, "");
    f.ok(&["rm", "a", "b"]);
}

/// Issue 29, item 7: `create` on a new root made the root, `sandboxes/`,
/// `state/` 0755 and the records 0644, and `lw doctor` passed a root open to
/// everyone.  Now they are 0700/0600, the registry stays readable by the
/// sandbox through its mount, and doctor fails a wider root with the fix.
#[test]
fn a_new_root_is_closed_and_the_sandbox_still_reads_the_registry() {
    use std::os::unix::fs::PermissionsExt as _;
    let f = Fixture::new("modes");
    std::fs::remove_dir(&f.root).expect("the fixture's root is empty");
    f.ok(&[
        "create",
        "api",
        "--branch",
        "lw/api",
        "--scope",
        "src/api/**",
    ]);
    let mode = |p: &str| {
        std::fs::metadata(f.root.join(p))
            .unwrap_or_else(|e| panic!("{p}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    for (p, want) in [
        ("", 0o700),
        ("sandboxes", 0o700),
        ("state", 0o700),
        ("state/sandbox", 0o700),
        ("state/sandbox/api.json", 0o600),
        ("registry", 0o755),
        ("registry/api.json", 0o644),
    ] {
        assert_eq!(mode(p), want, "{p} is {:o}", mode(p));
    }
    // The sandbox's user reads its peers through its read-only mount.
    let (code, out, e) = f.sh("api", "cat $LW_REGISTRY/api.json");
    assert_eq!(code, 0, "{e}");
    assert!(out.contains("src/api/**"), "{out}");

    let doctor = |f: &Fixture| {
        let o = std::process::Command::new(bin("lw-doctor"))
            .args(["--json", "--root"])
            .arg(&f.root)
            .current_dir(&f.proj)
            .output()
            .expect("lw doctor runs");
        text(&o)
            .lines()
            .filter(|l| l.contains(r#""check":"mailbox""#) && l.contains(r#""status":"fail""#))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(doctor(&f), Vec::<String>::new());
    // A root an older version made: open to others, doctor fails it with the fix.
    std::fs::set_permissions(&f.root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let fails = doctor(&f);
    assert_eq!(fails.len(), 1, "{fails:?}");
    assert!(
        fails[0].contains(&format!("chmod 700 {}", f.root.display())),
        "{fails:?}"
    );
    std::fs::set_permissions(&f.root, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    f.ok(&["rm", "api", "--force"]);
}

/// Issue 32: lw-radar reads two real sandboxes' task branches (through
/// push's transport: upload-pack inside, never git in their clone on the
/// host), both get one `conflict` through the mediator, nothing more on
/// further passes, and one `conflict-cleared` once one side resolves it.
#[test]
fn radar_tells_both_sandboxes_of_a_conflict_once_and_of_its_end() {
    let f = Fixture::new("radar");
    f.ok(&[
        "create",
        "api",
        "--branch",
        "lw/api",
        "--scope",
        "src/api/**",
    ]);
    f.ok(&["create", "web", "--branch", "lw/web"]);
    for (n, users) in [("api", 2), ("web", 3)] {
        let (code, _, e) = f.sh(
            n,
            &format!("echo '{{\"users\": {users}}}' > src/api/schema.json && git commit -qam '{n}: users {users}'"),
        );
        assert_eq!(code, 0, "{e}");
    }
    let radar = || {
        let o = std::process::Command::new(bin("lw-radar"))
            .arg("--root")
            .arg(&f.root)
            .output()
            .expect("lw-radar runs");
        assert!(o.status.success(), "lw-radar: {}", err(&o));
        text(&o)
    };
    let mediate = || {
        let o = std::process::Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&f.root)
            .arg("--once")
            .output()
            .expect("lw-mediate runs");
        assert!(o.status.success(), "lw-mediate: {}", err(&o));
    };
    let kinds = |n: &str| -> Vec<String> {
        let dir = f.root.join("sandboxes").join(n).join("inbox/new");
        let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.map(|e| {
                    let m = mailbox::message::Message::parse(
                        &std::fs::read(e.expect("entry").path()).expect("read"),
                    )
                    .expect("a message");
                    (m.id, m.kind.to_string())
                })
                .collect()
            })
            .unwrap_or_default();
        v.sort();
        v.into_iter().map(|(_, k)| k).collect()
    };
    let t = std::time::Instant::now();
    let out = radar();
    assert!(
        out.starts_with("conflict ") && out.contains("src/api/schema.json"),
        "{out}"
    );
    mediate();
    println!(
        "radar: 2 sandboxes -> conflict in both inboxes in {:.2}s",
        t.elapsed().as_secs_f32()
    );
    for n in ["api", "web"] {
        assert_eq!(kinds(n), ["conflict"], "{n}");
    }
    let body = std::fs::read_dir(f.root.join("sandboxes/web/inbox/new"))
        .expect("inbox")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read"))
        .next()
        .expect("one message");
    assert!(
        body.contains("lw/api") && body.contains("lw/web") && body.contains("contents, 1 hunk"),
        "{body}"
    );
    assert!(
        body.contains("web changed paths in the scope api declared"),
        "{body}"
    );

    assert_eq!(radar(), "");
    mediate();
    assert_eq!(kinds("api"), ["conflict"]);

    // web leaves the schema to api: the branches merge cleanly, and web
    // no longer changes api's scope.
    let (code, _, e) = f.sh(
        "web",
        "git checkout -q HEAD~1 -- src/api/schema.json && git commit -qm 'web: leave the schema to api'",
    );
    assert_eq!(code, 0, "{e}");
    let out = radar();
    assert!(out.starts_with("conflict-cleared "), "{out}");
    mediate();
    assert_eq!(radar(), "");
    mediate();
    for n in ["api", "web"] {
        assert_eq!(kinds(n), ["conflict", "conflict-cleared"], "{n}");
    }
    println!(
        "radar: 1 conflict and 1 conflict-cleared in each inbox, 0 repeats over 2 more passes"
    );
}
