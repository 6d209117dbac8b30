//! Bad input lw-sandbox must survive: each gets a clear error, its
//! documented exit status, and leaves nothing behind.

use support::sandbox as sandbox_support;

use std::process::Command;

use sandbox_support::*;

fn code(o: &std::process::Output) -> Option<i32> {
    o.status.code()
}

#[test]
fn docker_down_is_69_with_how_to_start_it() {
    let dir = std::env::temp_dir().join(format!("lw-sbt-down-{}", nonce()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    for args in [
        &["ls"][..],
        &["create", "a", "--branch", "a", "--image", "x"],
        &["gc"],
    ] {
        let o = Command::new(bin("lw-sandbox"))
            .args(args)
            .env("LW_ROOT", &dir)
            .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
            .output()
            .expect("runs");
        assert_eq!(code(&o), Some(69), "{args:?}: {}", err(&o));
        assert!(
            err(&o).starts_with("lw-sandbox: cannot reach the Docker engine"),
            "{}",
            err(&o)
        );
        assert!(err(&o).contains("DOCKER_HOST"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_are_64() {
    let o = Command::new(bin("lw-sandbox"))
        .args(["ls"])
        .env_remove("LW_ROOT")
        .output()
        .expect("runs");
    assert_eq!(code(&o), Some(64), "{}", err(&o));
    assert!(err(&o).contains("--root"), "{}", err(&o));
    for args in [
        &["exec", "a"][..],
        &["frobnicate"],
        &["create", "a"],
        &["create", "a", "--branch", "b", "--network", "host"],
    ] {
        let o = Command::new(bin("lw-sandbox"))
            .args(args)
            .env("LW_ROOT", "/tmp")
            .output()
            .expect("runs");
        assert_eq!(code(&o), Some(64), "{args:?}: {}", err(&o));
        assert!(err(&o).starts_with("lw-sandbox: "), "{}", err(&o));
    }
    let o = Command::new(bin("lw-sandbox"))
        .args(["shell", "a"])
        .env("LW_ROOT", "/tmp")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(code(&o), Some(64), "shell without a terminal: {}", err(&o));
    let o = Command::new(bin("lw-sandbox"))
        .arg("--help")
        .output()
        .expect("runs");
    assert!(o.status.success());
    for sub in [
        "create", "push", "exec", "shell", "ls", "port", "stop", "start", "rm", "gc",
    ] {
        assert!(text(&o).contains(&format!("  {sub} ")), "help lists {sub}");
    }
}

#[test]
fn names_branches_images_and_ports() {
    let f = Fixture::with_config("bad", "sandbox.ports = 47600-47600\n");
    // The first create makes the mirror.
    let mirror = f.proj.join(".loopwright/cache/mirror.git");
    assert!(!mirror.exists());
    let o = f.sb(&["create", "a", "--branch", "a", "--no-fetch"]);
    assert_eq!(code(&o), Some(66), "--no-fetch needs a mirror: {}", err(&o));
    f.ok(&[
        "create",
        "a",
        "--branch",
        "a",
        "--port",
        "80",
        "--network",
        "bridge",
    ]);
    assert!(
        mirror.join("lw-mirror.state").is_file(),
        "mirror created by create"
    );

    let cases: &[(&[&str], i32, &str)] = &[
        (&["create", "a", "--branch", "x"], 73, "exists"),
        (
            &["create", "Bad/Name", "--branch", "x"],
            64,
            "not a valid sandbox name",
        ),
        (&["create", "human", "--branch", "x"], 64, "reserved"),
        (
            &["create", "c", "--branch", "a..b"],
            64,
            "not a valid branch name",
        ),
        (
            &["create", "c", "--branch=-x"],
            64,
            "not a valid branch name",
        ),
        (
            &["create", "c", "--branch", "x", "--from", "no-such-ref"],
            64,
            "no-such-ref",
        ),
        (
            &[
                "create",
                "c",
                "--branch",
                "x",
                "--image",
                "loopwright/no-such-image:x",
            ],
            66,
            "not in the engine",
        ),
        (
            &[
                "create",
                "c",
                "--branch",
                "x",
                "--port",
                "80",
                "--network",
                "bridge",
            ],
            75,
            "exhausted",
        ),
        (
            &["create", "c", "--branch", "x", "--port", "http"],
            64,
            "not a container port",
        ),
        (
            &["create", "c", "--branch", "x", "--secret", "TOKEN"],
            78,
            "not allowed",
        ),
        (
            &["create", "c", "--branch", "x", "--cpus", "0"],
            64,
            "--cpus '0' is not valid",
        ),
        (
            &["create", "c", "--branch", "x", "--disk", "lots"],
            64,
            "--disk 'lots' is not valid",
        ),
        (
            &["create", "c", "--branch", "x", "--memory", "0"],
            64,
            "--memory '0' is not valid",
        ),
        (&["rm", "nope"], 66, "no sandbox 'nope'"),
        (&["push", "nope"], 66, "no sandbox 'nope'"),
        (&["exec", "nope", "--", "true"], 66, "no sandbox 'nope'"),
    ];
    for (args, want, says) in cases {
        let o = f.sb(args);
        assert_eq!(code(&o), Some(*want), "{args:?}: {}", err(&o));
        assert!(err(&o).contains(says), "{args:?}: {}", err(&o));
    }
    // None of the refused creates left anything: only sandbox a exists.
    let mut host = f.host_leftovers();
    host.sort();
    assert_eq!(
        host,
        [
            "lease 47600 a 80/tcp",
            "registry/a.json",
            "sandboxes/a",
            "state/sandbox/a.json",
            "state/sandbox/a.lock"
        ]
    );
    assert_eq!(
        f.leftovers().len(),
        1,
        "a's container (its workspace is a disk image, not a volume): {:?}",
        f.leftovers()
    );
    f.ok(&["rm", "a"]);
}

#[test]
fn a_stale_image_is_refused_unless_allowed() {
    let f = Fixture::new("stale");
    // A lockfile change the image was not built from.
    std::fs::write(f.proj.join("deps.lock"), format!("lock {}\n", nonce())).expect("write");
    let o = f.sb(&["create", "s", "--branch", "s"]);
    assert_eq!(code(&o), Some(66), "{}", err(&o));
    assert!(
        err(&o).contains("not built")
            && err(&o).contains("deps")
            && err(&o).contains("--allow-stale"),
        "{}",
        err(&o)
    );
    let o = f.sb(&["create", "s", "--branch", "s", "--allow-stale"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("stale image"), "{}", err(&o));
    f.ok(&["rm", "s"]);
    // No runtime definition at all: says what to run.
    std::fs::remove_file(f.proj.join(".loopwright/runtime/runtime.conf")).expect("rm");
    let o = f.sb(&["create", "t", "--branch", "t"]);
    assert_eq!(code(&o), Some(66), "{}", err(&o));
    assert!(
        err(&o).contains("lw-build init") && err(&o).contains("--image"),
        "{}",
        err(&o)
    );
}

#[test]
fn a_container_removed_behind_our_back_is_shown_and_reclaimed() {
    let f = Fixture::new("gone");
    f.ok(&["create", "g", "--branch", "g"]);
    let rm = docker(&["rm", "-f", &f.container("g")]);
    assert!(rm.status.success());
    let ls = f.ok(&["ls", "--no-header"]);
    assert!(ls.starts_with("g\tg\tlost\t"), "{ls}");
    let o = f.sb(&["exec", "g", "--", "true"]);
    assert_eq!(code(&o), Some(66), "{}", err(&o));
    assert!(err(&o).contains("gc"), "{}", err(&o));
    let gc = f.ok(&["gc"]);
    assert!(
        gc.contains("disk ") && gc.contains("registry g") && gc.contains("record g"),
        "{gc}"
    );
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    assert!(f.host_leftovers().is_empty(), "{:?}", f.host_leftovers());
    assert_eq!(f.ok(&["ls", "--no-header"]), "");
    assert_eq!(f.ok(&["ls"]).lines().count(), 1, "the header alone");
    // A second gc has nothing to do.
    assert_eq!(f.ok(&["gc"]), "");
}

#[test]
fn a_push_the_upstream_moved_under_is_refused_with_what_to_do() {
    let f = Fixture::new("nonff");
    f.ok(&["create", "n", "--branch", "main"]);
    let (c, _, e) = f.sh("n", "echo a > a && git add a && git commit -qm sandbox");
    assert_eq!(c, 0, "{e}");
    // Someone else pushes to main meanwhile.
    std::fs::write(f.proj.join("other"), "x").expect("write");
    git(&f.proj, &["add", "other"]);
    git(&f.proj, &["commit", "-qm", "elsewhere"]);
    git(&f.proj, &["push", "-q", "origin", "main"]);
    let before = git(&f.upstream, &["rev-parse", "main"]);
    let o = f.sb(&["push", "n"]);
    assert_eq!(code(&o), Some(75), "{}", err(&o));
    assert!(
        err(&o).contains("merge") && err(&o).contains("--force"),
        "{}",
        err(&o)
    );
    assert_eq!(
        git(&f.upstream, &["rev-parse", "main"]),
        before,
        "the upstream is unchanged"
    );
    assert!(
        f.host_leftovers()
            .iter()
            .all(|l| !l.starts_with("state/push/")),
        "no quarantine left: {:?}",
        f.host_leftovers()
    );
    f.ok(&["rm", "--force", "n"]);
}

#[test]
fn a_limit_of_zero_or_garbage_in_config_is_78_naming_the_key() {
    let f = Fixture::new("limits");
    for (line, key) in [
        ("sandbox.cpus = 0", "sandbox.cpus"),
        ("sandbox.cpus = fast", "sandbox.cpus"),
        ("sandbox.memory = 0", "sandbox.memory"),
        ("sandbox.pids = -1", "sandbox.pids"),
        ("sandbox.disk = 0", "sandbox.disk"),
        ("sandbox.mail-disk = big", "sandbox.mail-disk"),
        ("sandbox.log-max-size = 0", "sandbox.log-max-size"),
        ("sandbox.log-max-file = 0", "sandbox.log-max-file"),
        ("sandbox.push-max = 0", "sandbox.push-max"),
    ] {
        std::fs::write(f.proj.join(".loopwright/config"), format!("{line}\n")).expect("write");
        let o = f.sb(&["create", "c", "--branch", "c"]);
        assert_eq!(code(&o), Some(78), "{line}: {}", err(&o));
        assert!(err(&o).contains(key), "{line}: {}", err(&o));
    }
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    assert!(f.host_leftovers().is_empty(), "{:?}", f.host_leftovers());
}

#[test]
fn a_disk_quota_that_cannot_be_enforced_is_69_never_unlimited() {
    let f = Fixture::new("noquota");
    // A PATH with git but without mkfs.ext4: the quota cannot be made.
    let bin_dir = f.dir.join("path");
    std::fs::create_dir_all(&bin_dir).expect("mkdir");
    let git = String::from_utf8(
        std::process::Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .expect("sh")
            .stdout,
    )
    .expect("utf-8");
    std::os::unix::fs::symlink(git.trim(), bin_dir.join("git")).expect("symlink");
    let o = f
        .cmd(&["create", "q", "--branch", "q"])
        .env("PATH", &bin_dir)
        .output()
        .expect("runs");
    assert_eq!(code(&o), Some(69), "{}", err(&o));
    assert!(
        err(&o).contains("cannot enforce the disk quota") && err(&o).contains("sandbox.disk = off"),
        "{}",
        err(&o)
    );
    println!("noquota: {}", err(&o).trim());
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    assert!(f.host_leftovers().is_empty(), "{:?}", f.host_leftovers());
    // Saying so runs without a quota, with a warning.
    std::fs::write(f.proj.join(".loopwright/config"), "sandbox.disk = off\n").expect("write");
    let o = f.sb(&["create", "q", "--branch", "q"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("no disk quota"), "{}", err(&o));
    f.ok(&["rm", "q"]);
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
}

#[test]
fn a_failed_first_create_in_volume_mode_takes_the_roots_tools_volume_with_it() {
    // #50: a failed first create (on Kubernetes, an image no node has) left
    // the root's tools volume (a 1 GiB claim there) until gc.
    let f = Fixture::new("badvol");
    // The local engine, taken for one that does not see this host's files.
    let id = text(&docker(&["info", "--format", "{{.ID}}"]))
        .trim()
        .to_string();
    let rec = engine::hostpaths::record_path(&mailbox::layout::Root::new(&f.root), &id);
    std::fs::create_dir_all(rec.parent().unwrap()).unwrap();
    std::fs::write(&rec, "separate\nlocal\n").unwrap();
    // Fails once its volumes are made and filled: where the branch starts.
    let from_nothing = ["create", "c", "--branch", "x", "--from", "no-such-ref"];
    let o = f.sb(&from_nothing);
    assert_eq!(code(&o), Some(64), "{}", err(&o));
    assert_eq!(f.leftovers(), Vec::<String>::new(), "{}", err(&o));
    // With a sandbox of the root left, its tools volume stays.
    f.ok(&["create", "a", "--branch", "a"]);
    let made = f.leftovers();
    assert!(
        made.iter().any(|l| l.contains("-tools-")),
        "a's create made the tools volume: {made:?}"
    );
    let o = f.sb(&from_nothing);
    assert_eq!(code(&o), Some(64), "{}", err(&o));
    assert_eq!(f.leftovers(), made, "a's volumes are a's: {}", err(&o));
    f.ok(&["rm", "--force", "a"]);
    f.ok(&["gc"]);
    assert_eq!(f.leftovers(), Vec::<String>::new());
}
