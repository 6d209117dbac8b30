//! Podman as the engine: the sandbox life (create, exec, the door between
//! two sandboxes, push, ls, rm) against Podman's Docker-compatible socket,
//! started by this test on a private path and stopped after it.  Rootful
//! (these machines give an unprivileged user no subordinate ids).  The rest
//! of the sandbox suite runs against Podman with DOCKER_HOST set; the pass
//! counts are in docs/engines.md.
//!
//! Needs podman (`.ci/run` installs it); without it the test fails saying so.
//! One test in this binary: it sets DOCKER_HOST for the whole process.

mod sandbox_support;

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_support::*;

/// `podman system service` on a private socket; stopped when dropped.
struct Service {
    child: Child,
    dir: PathBuf,
    sock: PathBuf,
}

impl Service {
    fn start() -> Service {
        let ok = Command::new("podman")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            ok,
            "podman is not installed, so the Podman engine cannot be tested: apt-get install podman (.ci/run does)"
        );
        let dir = std::env::temp_dir().join(format!("lw-podman-{}", nonce()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let sock = dir.join("podman.sock");
        // Its log (it complains of no systemd for health checks) goes to a
        // file beside the socket.
        let log = std::fs::File::create(dir.join("service.log")).expect("log");
        let child = Command::new("podman")
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", sock.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("podman system service starts");
        let s = Service { child, dir, sock };
        // The socket appears when the service listens (no event to wait on
        // across processes but the socket itself).
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&s.sock).is_err() {
            assert!(
                Instant::now() < deadline,
                "podman system service did not listen on {} within 30 s",
                s.sock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    fn host(&self) -> String {
        format!("unix://{}", self.sock.display())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_sandbox_life_on_podman() {
    // The Debian test image, made in dockerd, then copied into Podman's store.
    let tag = debian().to_string();
    let svc = Service::start();
    let t = Instant::now();
    let mut save = Command::new("docker")
        .args(["save", &tag])
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker save runs");
    let load = Command::new("podman")
        .args(["load", "-q"])
        .stdin(save.stdout.take().expect("pipe"))
        .output()
        .expect("podman load runs");
    assert!(save.wait().expect("docker save ends").success());
    assert!(load.status.success(), "podman load: {}", err(&load));
    println!(
        "podman: test image loaded in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // SAFETY: this binary holds this one test; no other thread reads the
    // environment while it is set.
    unsafe { std::env::set_var("DOCKER_HOST", svc.host()) };

    // The engine is Podman, and lw doctor says so with its runtimes.
    let d = Command::new(bin("lw-doctor"))
        .output()
        .expect("lw-doctor runs");
    let doc = text(&d);
    let line = doc
        .lines()
        .find(|l| l.contains("runtimes"))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.contains("podman 4") || line.contains("podman "),
        "{doc}"
    );
    assert!(line.contains("runc (default, container)"), "{line}");
    println!("podman: lw doctor: {line}");

    let t = Instant::now();
    let f = Fixture::new("podman");
    println!(
        "podman: project image built in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    f.ok(&["create", "a", "--branch", "lw/a"]);
    let create = t.elapsed();
    f.ok(&["create", "b", "--branch", "lw/b"]);
    // The container is Podman's, with the limits Podman needs.
    let ins = text(&docker(&[
        "inspect",
        "-f",
        "{{json .HostConfig.Ulimits}} {{.HostConfig.ReadonlyRootfs}} {{.Config.User}}",
        &f.container("a"),
    ]));
    let low = ins.to_lowercase();
    assert!(
        low.contains("nofile") && low.contains("nproc") && ins.contains("true 100000:100000"),
        "{ins}"
    );
    let (code, out, e) = f.sh(
        "a",
        "id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\\t '; \
         git rev-parse --abbrev-ref HEAD; touch /probe 2>/dev/null || echo ro",
    );
    assert_eq!(code, 0, "{e}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "100000",
            "CapEff:0000000000000000",
            "NoNewPrivs:1",
            "Seccomp:2",
            "lw/a",
            "ro"
        ]
    );
    let o = f.sb(&["exec", "a", "--", "sh", "-c", "exit 9"]);
    assert_eq!(o.status.code(), Some(9));

    // The door: a to b through the mediator.
    let (code, id, e) = f.sh(
        "a",
        "lw-post --to b --kind request --subject 'on podman' hi",
    );
    assert_eq!(code, 0, "{e}");
    let m = Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .expect("lw-mediate runs");
    assert!(m.status.success(), "{}", err(&m));
    let (code, list, e) = f.sh("b", "lw-inbox --wait --timeout 30");
    assert_eq!(code, 0, "{e}");
    assert!(
        list.starts_with(id.trim()) && list.contains("on podman"),
        "{list}"
    );

    // push, ls, and the runtime check against Podman's list.
    let (code, _, e) = f.sh(
        "a",
        "echo x > p && git add p && git commit -qm 'from podman'",
    );
    assert_eq!(code, 0, "{e}");
    f.ok(&["push", "a"]);
    assert_eq!(
        git(&f.upstream, &["log", "--format=%s", "-1", "lw/a"]),
        "from podman"
    );
    let ls = f.ok(&["ls", "--no-header"]);
    // The isolation column (8th), before services.
    assert!(
        ls.lines()
            .all(|l| l.split('\t').nth(7) == Some("container(runc)")),
        "{ls}"
    );
    let o = f.sb(&["create", "x", "--branch", "x", "--runtime", "nosuch"]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(err(&o).contains("crun"), "{}", err(&o));
    f.ok(&["rm", "--force", "a", "b"]);
    assert!(f.leftovers().is_empty(), "{:?}", f.leftovers());
    println!(
        "podman: create {:.0} ms (rootful, Podman through {})",
        create.as_secs_f64() * 1000.0,
        svc.host()
    );
    drop(f);
}
