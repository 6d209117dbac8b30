//! Issue 40, items 5 and 6: what the root records for the door.  A door
//! started with another value of a recorded secret refused nothing and
//! masked the wrong value, passing the sandbox's; the door's budgets were
//! read from the working directory's project, so a mediator run from `/`
//! applied the defaults.  lw-mediate and lw-sync as processes, against
//! lw-github-sink's server on 127.0.0.1.

use support::sync as sync_support;

use std::path::Path;
use std::process::{Command, Output};

use mailbox::layout::Root;
use mailbox::log::{Action, Log};
use mailbox::maildir::Sub;
use mailbox::message::Kind;
use support::common::ok;
use sync_support::{Env, text};

const VALUE: &str = "sk-live-7f3a9c2b41";
const WRONG: &str = "sk-live-rotated-0000";

/// `lw-mediate ARGS` in `dir` with `env` (and no token).
fn mediate(root: &Root, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(support::bin("lw-mediate"));
    c.env_remove("GH_TOKEN")
        .env_remove("GITHUB_TOKEN")
        .env_remove("API_KEY")
        .env_remove("LW_ROOT")
        .current_dir(dir)
        .arg("--root")
        .arg(&root.dir)
        .args(args);
    c.envs(env.iter().copied());
    c.output().unwrap()
}

fn in_new(d: mailbox::maildir::Maildir) -> usize {
    std::fs::read_dir(d.sub(Sub::New)).map_or(0, |r| r.count())
}

/// A git checkout whose `.loopwright/config` is `config`.
fn project(dir: &Path, config: &str) -> std::path::PathBuf {
    let p = dir.join("project");
    std::fs::create_dir_all(p.join(".loopwright")).unwrap();
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&p)
            .status()
            .unwrap()
            .success()
    );
    std::fs::write(p.join(".loopwright/config"), config).unwrap();
    p
}

/// The refusal: 78, naming the secret, the record and the fix, never a value.
fn refused(o: &Output, prog: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.starts_with(&format!(
            "{prog}: secret API_KEY in this environment is not the value sandbox 'api' was made with"
        )) && err.contains("state/door/secrets/api.json")
            && err.contains("export API_KEY"),
        "{err}"
    );
    let all = [text(&o.stdout), err].concat();
    assert!(!all.contains(VALUE) && !all.contains(WRONG), "{all}");
}

#[test]
fn a_mediator_with_another_value_of_a_recorded_secret_exits_78_and_forwards_nothing() {
    let env = Env::new("door-digest");
    let root = Root::new(&env.root);
    let dir = env.dir.as_path();
    // Registered as lw-sandbox create registers: the value in this
    // command's environment.
    ok(&mediate(
        &root,
        dir,
        &[("API_KEY", VALUE)],
        &["register", "api", "--secret", "API_KEY"],
    ));
    ok(&mediate(&root, dir, &[], &["register", "web"]));
    // Nothing of the value in any file the root holds.
    for f in sync_support::files_under(&root.dir) {
        let b = std::fs::read(&f).unwrap_or_default();
        assert!(
            !b.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
            "{}",
            f.display()
        );
    }
    // The key and digests: the owner's alone, in the closed state/, and
    // the digest in no file a sandbox mounts (its mail dir, the registry).
    use std::os::unix::fs::PermissionsExt as _;
    let door = root.dir.join("state/door");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for (p, want) in [
        (root.dir.join("state"), 0o700),
        (door.clone(), 0o700),
        (door.join("key"), 0o600),
        (door.join("secrets/api.json"), 0o600),
    ] {
        assert_eq!(mode(&p), want, "{}", p.display());
    }
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(door.join("secrets/api.json")).unwrap()).unwrap();
    let digest = rec["secrets"]["API_KEY"].as_str().unwrap().to_string();
    assert_eq!(digest.len(), 64, "{rec}");
    for f in sync_support::files_under(&root.dir) {
        if f.starts_with(&door) {
            continue;
        }
        let b = std::fs::read(&f).unwrap_or_default();
        assert!(
            !b.windows(64).any(|w| w == digest.as_bytes()),
            "{}",
            f.display()
        );
    }
    let leak = sync_support::message("api", "web", Kind::Request, "the key", VALUE);
    let plain = sync_support::message("api", "web", Kind::Request, "hello", "no secret");
    for m in [&leak, &plain] {
        root.sandbox("api").outbox().deliver_message(m).unwrap();
    }
    // The old code masked WRONG and forwarded VALUE to web.
    for (cwd, args) in [(dir, &["--once"][..]), (Path::new("/"), &["--once", "-v"])] {
        let o = mediate(&root, cwd, &[("API_KEY", WRONG)], args);
        refused(&o, "lw-mediate");
        assert_eq!(in_new(root.sandbox("web").inbox()), 0, "nothing forwarded");
        assert_eq!(in_new(root.sandbox("api").outbox()), 2, "both wait");
        let (es, _) = Log::new(root.log_dir()).entries().unwrap();
        assert!(es.is_empty(), "nothing logged: {es:?}");
    }
    // Release and drop open the door too.
    let o = mediate(&root, dir, &[("API_KEY", WRONG)], &["release", &leak.id]);
    refused(&o, "lw-mediate");
    // Unset: refused as before (the name must resolve).
    let o = mediate(&root, dir, &[], &["--once"]);
    assert_eq!(o.status.code(), Some(78), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("cannot resolve secret API_KEY"));

    // The value it was made with: the leak is held, the rest forwarded.
    ok(&mediate(
        &root,
        Path::new("/"),
        &[("API_KEY", VALUE)],
        &["--once"],
    ));
    let (es, _) = Log::new(root.log_dir()).entries().unwrap();
    let action = |id: &str| {
        es.iter()
            .find(|e| e.message_id == id)
            .map(|e| e.decision.action)
    };
    assert_eq!(action(&leak.id), Some(Action::Hold));
    assert_eq!(action(&plain.id), Some(Action::Forward));
    assert_eq!(in_new(root.sandbox("web").inbox()), 1);

    // A mediator watching: a sandbox registered meanwhile with another
    // value of the same name (a rotated key) stops it at its next pass;
    // that sandbox's value would pass it unmasked.
    let mut w = Command::new(support::bin("lw-mediate"));
    w.env_remove("GH_TOKEN")
        .env_remove("GITHUB_TOKEN")
        .env("API_KEY", VALUE)
        .current_dir("/")
        .args(["--rescan", "1", "--root"])
        .arg(&root.dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = w.spawn().unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pid = child.id();
    let guard = {
        let done = done.clone();
        // Only a guard: the old mediator watched on forever.
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(120));
            if !done.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        })
    };
    ok(&mediate(
        &root,
        dir,
        &[("API_KEY", WRONG)],
        &["register", "api2", "--secret", "API_KEY"],
    ));
    let o = child.wait_with_output().unwrap();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(guard);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains(
            "secret API_KEY in this environment is not the value sandbox 'api2' was made with"
        ),
        "{err}"
    );
    // Its record removed, its digests go with it, and the door opens.
    ok(&mediate(&root, dir, &[], &["unregister", "api2"]));
    assert!(!root.dir.join("state/door/secrets/api2.json").exists());
    ok(&mediate(&root, dir, &[("API_KEY", VALUE)], &["--once"]));
}

#[test]
fn lw_sync_with_another_value_of_a_recorded_secret_exits_78_and_posts_nothing() {
    let env = Env::new("sync-digest");
    let root = Root::new(&env.root);
    ok(&mediate(
        &root,
        &env.dir,
        &[("API_KEY", VALUE)],
        &["register", "api", "--secret", "API_KEY"],
    ));
    let m = sync_support::message("api", "web", Kind::Status, "key", &format!("k={VALUE}"));
    assert!(
        env.log()
            .append(&sync_support::entry(&m, Action::Forward))
            .unwrap()
    );
    for cwd in [env.dir.as_path(), Path::new("/")] {
        let o = env
            .sync_cmd(&["--once"])
            .current_dir(cwd)
            .env("API_KEY", WRONG)
            .output()
            .unwrap();
        refused(&o, "lw-sync");
        let (reqs, _) = env.requests();
        assert!(reqs.is_empty(), "lw-sync reached GitHub: {reqs:?}");
    }
    let o = env
        .sync_cmd(&["--once"])
        .current_dir("/")
        .env("API_KEY", VALUE)
        .output()
        .unwrap();
    ok(&o);
    let comments = env.comments(1);
    assert!(!comments.is_empty());
    assert!(comments.iter().all(|c| !c.1.contains(VALUE)));
    assert!(comments.iter().any(|c| c.1.contains("[secret API_KEY]")));
}

#[test]
fn a_mediator_run_from_the_root_directory_applies_the_projects_door_log_max() {
    let env = Env::new("door-budget");
    let root = Root::new(&env.root);
    // 16 KiB: the first post of an hour is taken; the next one's entry and
    // receipt, with the 8 KiB kept for refusals, do not fit.
    let proj = project(&env.dir, "door.log-max = 16k\ndoor.quarantine-max = 0\n");
    ok(&mediate(&root, &proj, &[], &["register", "flood"]));
    ok(&mediate(&root, &proj, &[], &["register", "web"]));
    const N: usize = 20;
    for i in 0..N {
        let m = sync_support::message("flood", "web", Kind::Request, &format!("post {i}"), "x");
        root.sandbox("flood").outbox().deliver_message(&m).unwrap();
    }
    let policy = env.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nrate off\nduplicates off\n").unwrap();
    // The old code: 8 MiB from `/`, all 20 forwarded, exit 0.
    let o = mediate(
        &root,
        Path::new("/"),
        &[],
        &["--once", "--policy", policy.to_str().unwrap()],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(75), "{err}");
    assert!(
        err.contains("log budget of 16 KiB for the hour (door.log-max)"),
        "{err}"
    );
    let forwarded = in_new(root.sandbox("web").inbox());
    let waiting = in_new(root.sandbox("flood").outbox());
    println!("door.log-max 16k from /: forwarded {forwarded}, waiting {waiting}");
    assert_eq!((forwarded, forwarded + waiting), (1, N));
    let rec = std::fs::read_to_string(root.dir.join("state/door/budgets.json")).unwrap();
    assert!(rec.contains("\"log_max\": 16384"), "{rec}");

    // The project changed since: the root's value applies, with a warning,
    // until lw-sandbox create (or register) records the new one.
    std::fs::write(proj.join(".loopwright/config"), "door.log-max = 8m\n").unwrap();
    let o = mediate(
        &root,
        &proj,
        &[],
        &["--once", "--policy", policy.to_str().unwrap()],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(75), "{err}");
    assert!(
        err.contains("lw-mediate: warning: door.log-max is 8388608 bytes in ")
            && err.contains("but 16384 bytes in the root's"),
        "{err}"
    );
    assert_eq!(in_new(root.sandbox("web").inbox()), 1);
    // --log-max wins over both (the sender stays full for its hour).
    let o = mediate(
        &root,
        Path::new("/"),
        &[],
        &[
            "--once",
            "--log-max",
            "8m",
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(75), "{err}");
    assert!(err.contains("log budget of 8 MiB for the hour"), "{err}");
}

/// Issue 42, item 2: each layer owns its keys.  lw-mediate knows the door's
/// alone: a slip in a sandbox setting is lw-sandbox's to refuse and does not
/// stop the door, while a slip in the door's own keys or namespace is 78
/// naming the key, the line and the closest door key, as before.
#[test]
fn the_door_checks_its_own_keys_and_leaves_the_others_to_their_commands() {
    let env = Env::new("door-keys");
    let root = Root::new(&env.root);
    let proj = project(
        &env.dir,
        "sandbox.memory = 2g\nsandbx.cpus = 2\nkube.storage-class = fast\ndoor.log-max = 8m\n",
    );
    let policy = env.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\n").unwrap();
    let pass = ["--once", "--policy", policy.to_str().unwrap()];
    ok(&mediate(&root, &proj, &[], &["register", "web"]));
    ok(&mediate(&root, &proj, &[], &pass));
    // The product's commands check every layer's keys: the slip is theirs.
    let o = Command::new(support::bin("lw-sandbox"))
        .current_dir(&proj)
        .env("LW_ROOT", &root.dir)
        .args(["ls"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("unknown key 'sandbx.cpus'")
            && text(&o.stderr).contains("did you mean 'sandbox.cpus'?"),
        "{}",
        text(&o.stderr)
    );
    for (config, key, hint) in [
        ("door.log-maxx = 8m\n", "door.log-maxx", "door.log-max"),
        (
            "# two\ndor.secrets = API_KEY\n",
            "dor.secrets",
            "door.secrets",
        ),
    ] {
        std::fs::write(proj.join(".loopwright/config"), config).unwrap();
        let o = mediate(&root, &proj, &[], &pass);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(78), "{config}: {err}");
        assert!(
            err.contains(&format!("unknown key '{key}'"))
                && err.contains(&format!("did you mean '{hint}'?")),
            "{config}: {err}"
        );
    }
}
