//! Podman as the engine: the sandbox life (create, exec, the door between
//! two sandboxes, push, ls, rm) against Podman's Docker-compatible socket,
//! started by this test on a private path and stopped after it.  Rootful
//! (these machines give an unprivileged user no subordinate ids).  The rest
//! of the sandbox suite runs against Podman with DOCKER_HOST set; the pass
//! counts are in docs/engines.md.
//!
//! Also: a project that names Podman in its `.loopwright/config`
//! (`engine.host`), with DOCKER_HOST unset, gets Podman from all three
//! commands that choose an engine (engine::select): lw-build's image is in
//! Podman's store and not dockerd's, lw-service's container and
//! lw-sandbox's are Podman's, and the sandbox finds the service there.
//!
//! Needs podman (`.ci/run` installs it); without it the test fails saying so.
//! The tests of this binary run one at a time: the first sets DOCKER_HOST
//! for the whole process, the second needs it unset.

// The process environment is changed (std::env::set_var, unsafe since
// Rust 2024) while no other thread of this binary reads it.
#![allow(unsafe_code)]

use support::sandbox as sandbox_support;

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sandbox_support::*;

/// The environment is the process's: one test at a time, each leaving
/// DOCKER_HOST unset (also when it fails).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Alone(#[allow(dead_code, reason = "held for its Drop")] MutexGuard<'static, ()>);

impl Alone {
    fn take() -> Alone {
        let g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the lock is held; no other test of this binary runs.
        unsafe { std::env::remove_var("DOCKER_HOST") };
        Alone(g)
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        // SAFETY: the lock is still held (dropped after this).
        unsafe { std::env::remove_var("DOCKER_HOST") };
    }
}

/// The Debian test image, made in dockerd, copied into Podman's store.
fn load_debian() {
    let tag = debian().to_string();
    let t = Instant::now();
    let mut save = Command::new("docker")
        .args(["save", &tag])
        .env_remove("DOCKER_HOST")
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
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .expect("podman runs")
}

/// Whether podman's store (`podman image|container exists`) and dockerd's
/// (`docker image|container inspect`, DOCKER_HOST unset) hold `what`.
fn held(kind: &str, what: &str) -> (bool, bool) {
    let in_podman = podman(&[kind, "exists", what]).status.success();
    let in_dockerd = Command::new("docker")
        .args([kind, "inspect", what])
        .env_remove("DOCKER_HOST")
        .output()
        .expect("docker runs")
        .status
        .success();
    (in_podman, in_dockerd)
}

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
    let _alone = Alone::take();
    let svc = Service::start();
    load_debian();
    // SAFETY: `_alone` holds the binary's lock: no other test runs.
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

#[test]
fn engine_host_in_the_project_takes_build_service_and_sandbox_to_podman() {
    let _alone = Alone::take();
    let svc = Service::start();
    load_debian();
    // Podman named by the project alone: DOCKER_HOST is unset (Alone).
    let f = Fixture::with_config("podhost", &format!("engine.host = {}\n", svc.host()));

    // lw-build: a layer no other test builds (its input changed by a
    // nonce), so where it lands says which engine built it.
    std::fs::write(f.proj.join("deps.lock"), format!("lock {}\n", nonce())).expect("write");
    git(&f.proj, &["commit", "-qam", "a lock of its own"]);
    f.build();
    let o = Command::new(bin("lw-build"))
        .arg("--print-tag")
        .current_dir(&f.proj)
        .output()
        .expect("lw-build runs");
    assert!(o.status.success(), "lw-build --print-tag: {}", err(&o));
    let tag = text(&o).trim().to_string();
    assert_eq!(
        held("image", &tag),
        (true, false),
        "lw-build's image {tag} (in podman, in dockerd)"
    );

    // lw-service: its container is Podman's.
    let dir = f.proj.join(".loopwright/services");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("web"),
        format!("image = {}\ncommand = exec sleep 600\n", debian()),
    )
    .expect("write");
    let service = |args: &[&str]| {
        let o = Command::new(bin("lw-service"))
            .args(args)
            .current_dir(&f.proj)
            .env("LW_ROOT", &f.root)
            .stdin(Stdio::null())
            .output()
            .expect("lw-service runs");
        assert!(
            o.status.success(),
            "lw-service {args:?} exited {:?}: {}",
            o.status.code(),
            err(&o)
        );
    };
    service(&["up", "web"]);
    let web = format!("lw-svc-{}-web", f.root_id());
    assert_eq!(
        held("container", &web),
        (true, false),
        "lw-service's container {web} (in podman, in dockerd)"
    );

    // lw-sandbox: its container is Podman's, and it finds the service there.
    f.ok(&["create", "a", "--branch", "lw/a", "--service", "web"]);
    assert_eq!(
        held("container", &f.container("a")),
        (true, false),
        "lw-sandbox's container (in podman, in dockerd)"
    );
    let (code, out, e) = f.sh("a", "git rev-parse --abbrev-ref HEAD");
    assert_eq!((code, out.trim()), (0, "lw/a"), "{e}");

    f.ok(&["rm", "--force", "a"]);
    service(&["rm", "web", "--volumes"]);
    let label = format!("label=org.loopwright.root={}", f.root_id());
    let left = text(&podman(&["ps", "-aq", "--filter", &label]));
    assert!(left.trim().is_empty(), "podman containers left: {left}");
    let _ = podman(&["rmi", &tag]);
    drop(f);
}
