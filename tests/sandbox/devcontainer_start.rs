//! A devcontainer.json's postStartCommand end to end (#44): lw init puts it
//! in the image's label, lw-sandbox create and each start run it in the
//! clone as the sandbox's user; what the sandbox writes into its clone
//! changes nothing that runs at the next start; a failure is 65 naming the
//! command, the sandbox started all the same.  The configuration's image
//! ends as `USER dev`: the base layer still installs its packages as root.

use support::sandbox as sandbox_support;

use sandbox_support::*;
use std::process::Command;

/// The image a devcontainer.json names, whose last USER is not root (as
/// mcr.microsoft.com/devcontainers images are: vscode, node).
fn non_root_image(repo: &str) -> String {
    let tag = format!("{repo}-nonroot:1");
    let mut c = Command::new("docker")
        .args(["build", "-q", "-t", &tag, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("docker runs");
    std::io::Write::write_all(
        &mut c.stdin.take().expect("piped"),
        format!(
            "FROM {}\nRUN useradd -m -u 1000 -s /bin/sh dev\nUSER dev\n",
            debian()
        )
        .as_bytes(),
    )
    .expect("write the Dockerfile");
    let o = c.wait_with_output().expect("docker build ends");
    assert!(o.status.success(), "docker build: {}", err(&o));
    tag
}

/// Removes the images of its repository on drop (lw-build's layers and
/// the non-root base), a failed test's too.
struct Images(String);

impl Drop for Images {
    fn drop(&mut self) {
        remove_images(&self.0);
    }
}

fn remove_images(repo: &str) {
    let all = text(&docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]));
    let mine: Vec<&str> = all.lines().filter(|l| l.starts_with(repo)).collect();
    if !mine.is_empty() {
        let _ = Command::new("docker")
            .args(["rmi", "-f"])
            .args(&mine)
            .output();
    }
}

#[test]
fn post_start_runs_at_create_and_each_start_from_the_image_not_the_clone() {
    let f = Fixture::new("poststart");
    let repo = format!("loopwright/lw-sbtest-ps-{}", nonce());
    let _images = Images(repo.clone());
    let image = non_root_image(&repo);
    std::fs::create_dir_all(f.proj.join(".devcontainer")).expect("mkdir");
    std::fs::write(
        f.proj.join(".devcontainer/devcontainer.json"),
        format!(
            r#"{{
            "image": "{image}",
            "remoteUser": "dev",
            // Counts the starts; fails while /work/home/fail exists, and
            // on the branch 'doomed'.
            "postStartCommand": "echo \"start $(id -u) $(pwd)\" >> /work/home/starts; echo said to the terminal; test ! -e /work/home/fail && test $(git branch --show-current) != doomed",
        }}"#
        ),
    )
    .expect("write");
    std::fs::remove_dir_all(f.proj.join(".loopwright")).expect("rm");
    let o = Command::new(bin("lw-init"))
        .args(["--ca", "none"])
        .arg(&f.proj)
        .output()
        .expect("lw-init runs");
    assert!(o.status.success(), "lw init: {}", err(&o));
    assert!(
        err(&o)
            .contains("took postStartCommand: run by lw-sandbox create and each lw-sandbox start"),
        "{}",
        err(&o)
    );
    let conf_path = f.proj.join(".loopwright/runtime/runtime.conf");
    let conf = std::fs::read_to_string(&conf_path).expect("runtime.conf");
    std::fs::write(&conf_path, format!("image {repo}\n{conf}")).expect("write");
    git(&f.proj, &["add", "-A"]);
    git(&f.proj, &["commit", "-qm", "devcontainer"]);
    git(&f.proj, &["push", "-q", "origin", "main"]);
    // Before the fix of the base layer, this failed: apt-get as 'dev'.
    let t = std::time::Instant::now();
    f.build();
    println!("figure: lw-build {:.1} s", t.elapsed().as_secs_f64());

    let o = f.sb(&["create", "a", "--branch", "a"]);
    assert!(o.status.success(), "create: {}", err(&o));
    assert!(
        err(&o).contains("lw-sandbox: warning: said to the terminal"),
        "{}",
        err(&o)
    );
    // As the sandbox's user (sandbox.uid), as exec runs.
    let uid = f.sh("a", "id -u").1;
    let line = format!("start {} /work/repo\n", uid.trim());
    assert_eq!(f.sh("a", "cat /work/home/starts").1, line);

    // The hostile case: the sandbox rewrites every file that said what
    // runs at start (its clone's devcontainer.json and runtime), then is
    // stopped and started: the image's command runs, not the clone's.
    let (code, _, e) = f.sh(
        "a",
        r#"cd /work/repo && printf '{"image": "x", "postStartCommand": "touch /work/home/pwned"}' > .devcontainer/devcontainer.json && printf 'ARG LW_PARENT\nFROM ${LW_PARENT}\nLABEL org.loopwright.post-start="\\"touch /work/home/pwned\\""\n' > .loopwright/runtime/devcontainer.Dockerfile && git commit -qam hostile && grep -c pwned .loopwright/runtime/devcontainer.Dockerfile"#,
    );
    assert_eq!(code, 0, "the clone is the sandbox's to write: {e}");
    f.ok(&["stop", "a"]);
    let o = f.sb(&["start", "a"]);
    assert!(o.status.success(), "start: {}", err(&o));
    assert_eq!(text(&o), "a\n");
    assert_eq!(f.sh("a", "cat /work/home/starts").1, line.repeat(2));
    // Started while running: not a start, the command does not run.
    f.ok(&["start", "a"]);
    assert_eq!(f.sh("a", "cat /work/home/starts").1, line.repeat(2));
    assert_eq!(f.sh("a", "test -e /work/home/pwned").0, 1, "pwned ran");

    // A failing command: 65 naming it, the sandbox started all the same.
    f.sh("a", "touch /work/home/fail");
    f.ok(&["stop", "a"]);
    let o = f.sb(&["start", "a"]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(65), "{e}");
    assert!(
        e.contains("sandbox 'a': postStartCommand 'echo \"start $(id -u) $(pwd)\" >> /work/home/starts; echo said to the terminal; test ! -e /work/home/fail && test $(git branch --show-current) != doomed' failed (exit 1)"),
        "{e}"
    );
    assert!(e.contains("it is started all the same"), "{e}");
    assert_eq!(f.sh("a", "wc -l < /work/home/starts").1.trim(), "3");
    f.ok(&["rm", "--force", "a"]);

    // At create, a failure undoes the sandbox, as a failed install does.
    let o = f.sb(&["create", "d", "--branch", "doomed"]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(65), "{e}");
    assert!(e.contains("sandbox 'd': postStartCommand '"), "{e}");
    assert!(!e.contains("started all the same"), "{e}");
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    assert_eq!(f.sb(&["ls", "--no-header"]).stdout, b"");
}
