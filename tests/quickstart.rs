//! Issue 31: the README's quick start on one's own repository ("Your own
//! repository"), extracted from README.md and run verbatim by bash on a
//! fresh repository with an `origin`, against the real engine: `lw init`,
//! the mirror, the image, two sandboxes, a contract change routed by the
//! mediator, the push, the removal.  Each step is checked from outside (git
//! itself for the push, the engine for leftovers); the block's time is
//! printed, with the image built once before it so the figure is the
//! workflow's, not the first build's.

use support::sandbox as sandbox_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use sandbox_support::{bin, docker, err, git, nonce, text, unmount_under};

/// The first ```sh block after the heading `## Your own repository`.
fn quick_start() -> String {
    nth_block(1)
}

/// The `n`th ```sh block after the heading `## Your own repository`.
fn nth_block(n: usize) -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("\n## Your own repository\n")
        .nth(1)
        .expect("README.md has a section 'Your own repository'");
    let block = section
        .split("\n## ")
        .next()
        .unwrap_or(section)
        .split("```sh\n")
        .nth(n)
        .and_then(|b| b.split("\n```").next())
        .expect("the section has a ```sh block");
    block.to_string()
}

struct Cleanup<'a> {
    dir: &'a Path,
    root: std::path::PathBuf,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let label = format!(
            "label=org.loopwright.root={}",
            loopwright::sandbox::root_id(&self.root)
        );
        for what in [
            &["ps", "-aq"][..],
            &["volume", "ls", "-q"][..],
            &["network", "ls", "-q"][..],
        ] {
            let mut args = what.to_vec();
            args.extend(["--filter", &label]);
            let ids: Vec<String> = text(&docker(&args)).lines().map(str::to_string).collect();
            if !ids.is_empty() {
                let rm: &[&str] = match what[0] {
                    "ps" => &["rm", "-fv"],
                    "volume" => &["volume", "rm", "-f"],
                    _ => &["network", "rm"],
                };
                let _ = Command::new("docker").args(rm).args(&ids).output();
            }
        }
        unmount_under(self.dir);
        let _ = std::fs::remove_dir_all(self.dir);
    }
}

#[test]
fn the_readme_quick_start_runs_verbatim_on_a_fresh_repository() {
    let block = quick_start();
    let dir = std::env::temp_dir().join(format!("lw-quickstart-{}", nonce()));
    let (upstream, repo) = (dir.join("up.git"), dir.join("myrepo"));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = Cleanup {
        dir: &dir,
        root: repo.join(".loopwright/cache/mailbox"),
    };
    git(&dir, &["init", "-q", "--bare", "-b", "main", "up.git"]);
    git(&dir, &["init", "-q", "-b", "main", "myrepo"]);
    git(&repo, &["config", "user.name", "A Person"]);
    git(&repo, &["config", "user.email", "person@example.com"]);
    git(
        &repo,
        &["remote", "add", "origin", upstream.to_str().unwrap()],
    );
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/contract"), "v1\n").unwrap();
    std::fs::write(repo.join("README"), "mine\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "mine"]);
    git(&repo, &["push", "-q", "origin", "main"]);

    let bins = bin("lw-init").parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |script: &str| {
        Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(&repo)
            .env("PATH", &path)
            .env_remove("LW_ROOT")
            .env_remove("LW_MIRROR")
            .env_remove("LW_MAILBOX")
            .stdin(Stdio::null())
            .output()
            .expect("bash runs")
    };
    // The image, once: the block's own lw-build then finds it cached (the
    // first build of a machine takes minutes, apt inside included).
    let t = Instant::now();
    let warm = run("lw init >/dev/null && lw-mirror sync >/dev/null && lw-build");
    assert!(warm.status.success(), "warm-up: {}", err(&warm));
    let warm_secs = t.elapsed().as_secs_f64();
    // The block as README.md says it, on the same repository made fresh.
    std::fs::remove_dir_all(repo.join(".loopwright/runtime")).unwrap();
    for f in [".loopwright/config", ".loopwright/policy", ".gitignore"] {
        std::fs::remove_file(repo.join(f)).unwrap();
    }
    let t = Instant::now();
    let o = run(&block);
    let secs = t.elapsed().as_secs_f64();
    let (out, e) = (text(&o), err(&o));
    println!(
        "quick start: warm-up (init, mirror, build) {warm_secs:.1} s; the README block {secs:.1} s"
    );
    assert!(o.status.success(), "the quick start failed:\n{out}\n{e}");

    // lw init wrote the runtime, and lw-build built all three layers.
    assert!(out.contains(".loopwright/runtime/runtime.conf"), "{out}");
    for layer in ["base", "toolchain", "deps"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{layer} "))),
            "{layer}: {out}"
        );
    }
    // web's inbox listed the contract change api posted.
    assert!(
        out.lines()
            .any(|l| l.contains("contract-change") && l.contains("contract v2")),
        "web's inbox: {out}"
    );
    // The push reached origin: task/api holds api's commit.
    let pushed = git(&upstream, &["log", "-1", "--format=%s", "task/api"]);
    assert_eq!(pushed.trim(), "contract v2");
    // Nothing left: no container, no sandbox record.
    let label = format!(
        "label=org.loopwright.root={}",
        loopwright::sandbox::root_id(&repo.join(".loopwright/cache/mailbox"))
    );
    assert!(
        text(&docker(&["ps", "-aq", "--filter", &label]))
            .trim()
            .is_empty()
    );
    assert!(
        !repo
            .join(".loopwright/cache/mailbox/sandboxes/api")
            .exists(),
        "api's mail dir is gone"
    );
}

/// The README's devcontainer path (#44), its second block run verbatim on
/// a fresh repository whose devcontainer.json builds its own Dockerfile
/// (from the local test image: lw-build asks no registry), sets an
/// environment variable, forwards a port and runs a postCreateCommand.
#[test]
fn the_readme_devcontainer_path_runs_verbatim_on_a_fresh_repository() {
    let block = nth_block(2);
    assert!(block.contains("lw init"), "{block}");
    let dir = std::env::temp_dir().join(format!("lw-quickstart-dc-{}", nonce()));
    let (upstream, repo) = (dir.join("up.git"), dir.join("myrepo"));
    std::fs::create_dir_all(repo.join(".devcontainer")).unwrap();
    let _cleanup = Cleanup {
        dir: &dir,
        root: repo.join(".loopwright/cache/mailbox"),
    };
    git(&dir, &["init", "-q", "--bare", "-b", "main", "up.git"]);
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["config", "user.name", "A Person"]);
    git(&repo, &["config", "user.email", "person@example.com"]);
    git(
        &repo,
        &["remote", "add", "origin", upstream.to_str().unwrap()],
    );
    let image = sandbox_support::debian();
    std::fs::write(
        repo.join(".devcontainer/Dockerfile"),
        format!("FROM {image}\nCOPY .devcontainer/motd /etc/motd\n"),
    )
    .unwrap();
    std::fs::write(repo.join(".devcontainer/motd"), "mine\n").unwrap();
    std::fs::write(
        repo.join(".devcontainer/devcontainer.json"),
        r#"{
	"name": "mine",
	"build": { "dockerfile": "Dockerfile", "context": ".." },
	"containerEnv": { "GREETING": "hello from devcontainer.json" },
	"forwardPorts": [8000],
	"remoteUser": "vscode",
	"postCreateCommand": "echo \"set up by uid $(id -u)\" > setup.log",
}
"#,
    )
    .unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "mine"]);
    git(&repo, &["push", "-q", "origin", "main"]);
    let bins = bin("lw-init").parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let t = Instant::now();
    let o = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(&repo)
        .env("PATH", &path)
        .env_remove("LW_ROOT")
        .env_remove("LW_MIRROR")
        .env_remove("LW_MAILBOX")
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let secs = t.elapsed().as_secs_f64();
    let (out, e) = (text(&o), err(&o));
    println!("quick start (devcontainer): the README block {secs:.1} s");
    assert!(o.status.success(), "the block failed:\n{out}\n{e}");
    assert!(
        e.contains("devcontainer: took build: the first layer, 'project'"),
        "{e}"
    );
    for layer in ["project", "base", "devcontainer", "deps"] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{layer} "))),
            "{layer}: {out}"
        );
    }
    assert!(out.contains("set up by uid 100000\n"), "{out}");
    assert!(out.contains("hello from devcontainer.json\n"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("8000/tcp -> 127.0.0.1:")),
        "the forwarded port is published: {out}"
    );

    // Hostile: the only host port the forwarded one could be leased is
    // taken by something else; create fails with 75 (try again), saying
    // the range is in use on the host and how to widen it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let taken = listener.local_addr().unwrap().port();
    let cfg = repo.join(".loopwright/config");
    let mut conf = std::fs::read_to_string(&cfg).unwrap();
    assert!(conf.contains("sandbox.forward-ports = 8000\n"), "{conf}");
    conf.push_str(&format!("sandbox.ports = {taken}\n"));
    std::fs::write(&cfg, conf).unwrap();
    let o = Command::new("bash")
        .args([
            "-c",
            "export LW_ROOT=$PWD/.loopwright/cache/mailbox; lw-sandbox create held --branch task/held --network bridge",
        ])
        .current_dir(&repo)
        .env("PATH", &path)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let e = err(&o);
    assert_eq!(o.status.code(), Some(75), "{e}");
    assert!(
        e.contains(&format!("port range {taken}-{taken} is exhausted"))
            && e.contains("in use on the host; widen 'sandbox.ports'"),
        "{e}"
    );
    drop(listener);
}
