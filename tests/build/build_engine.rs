//! The runtime contract (crates/engine/src/lib.rs) against the real Docker engine, on
//! the busybox test image: images, containers, exec status and output, and
//! the hardening options lw-sandbox relies on.

use support::build as build_support;

use std::collections::BTreeMap;
use std::time::Duration;

use build_support::{nonce, test_image};
use engine::{ContainerSpec, DockerEngine, Engine, ExecRequest, ImageBuilder, Images, OutStream};

struct Cleanup<'a>(&'a DockerEngine, String);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.remove(&self.1, true);
    }
}

fn exec(e: &DockerEngine, c: &str, cmd: &[&str]) -> (i64, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let req = ExecRequest {
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let status = e
        .exec(c, &req, &mut |s, b| match s {
            OutStream::Stdout => out.extend_from_slice(b),
            OutStream::Stderr => err.extend_from_slice(b),
        })
        .expect("exec runs");
    (
        status,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

#[test]
fn images_tag_list_and_remove() {
    let e = engine::connect_docker(None).expect("engine reachable");
    let v = e.version().expect("version");
    assert!(!v.version.is_empty() && v.api.starts_with("1."), "{v:?}");
    let base = test_image("busybox");
    let img = e.image(&base).expect("inspect").expect("test image exists");
    assert!(img.id.starts_with("sha256:"));
    assert!(
        e.image("loopwright/lw-test-none:nope")
            .expect("inspect")
            .is_none()
    );

    let repo = format!("loopwright/lw-test-engine-{}", nonce());
    e.tag(&base, &repo, "t1").expect("tag");
    assert!(e.image_exists(&format!("{repo}:t1")).expect("exists"));
    e.remove_image(&format!("{repo}:t1"), false).expect("untag");
    assert!(!e.image_exists(&format!("{repo}:t1")).expect("exists"));
    e.remove_image(&format!("{repo}:t1"), false)
        .expect("removing a missing tag is fine");
}

#[test]
fn containers_run_exec_with_status_and_stop() {
    let e = engine::connect_docker(None).expect("engine reachable");
    let name = format!("lw-test-engine-{}", nonce());
    let spec = ContainerSpec {
        name: Some(name.clone()),
        image: test_image("busybox"),
        cmd: vec!["sleep".into(), "300".into()],
        user: Some("1000:1000".into()),
        labels: BTreeMap::from([("org.loopwright.test".into(), "1".into())]),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: vec!["no-new-privileges".into()],
        pids_limit: Some(64),
        memory_bytes: Some(64 << 20),
        tmpfs: BTreeMap::from([("/tmp".into(), "rw,noexec,nosuid,size=16m".into())]),
        network: Some("none".into()),
        ..Default::default()
    };
    let id = e.create(&spec).expect("create");
    let _cleanup = Cleanup(&e, id.clone());
    let again = e.create(&spec).expect_err("the name is taken");
    assert_eq!(again.exit, base::Exit::CantCreat, "{again}");

    e.start(&id).expect("start");
    let c = e.inspect(&name).expect("inspect").expect("exists");
    assert!(c.running && c.id == id && c.name == name, "{c:?}");
    assert_eq!(
        c.labels.get("org.loopwright.test").map(String::as_str),
        Some("1")
    );

    let (status, out, err) = exec(&e, &id, &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!((status, out.as_str(), err.as_str()), (3, "out\n", "err\n"));
    let (status, out, _) = exec(
        &e,
        &id,
        &[
            "sh",
            "-c",
            "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status",
        ],
    );
    assert_eq!(status, 0);
    assert_eq!(out, "1000\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\n");
    let (status, _, err) = exec(&e, &id, &["sh", "-c", "echo x > /x"]);
    assert_ne!(status, 0, "the root is read-only: {err}");
    let (status, out, _) = exec(&e, &id, &["sh", "-c", "ls /sys/class/net"]);
    assert_eq!((status, out.as_str()), (0, "lo\n"));

    e.stop(&id, Duration::from_secs(1)).expect("stop");
    e.stop(&id, Duration::from_secs(1))
        .expect("stopping a stopped container is fine");
    let c = e.inspect(&id).expect("inspect").expect("exists");
    assert!(!c.running, "{c:?}");
    e.remove(&id, false).expect("remove");
    assert!(e.inspect(&id).expect("inspect").is_none());
    e.remove(&id, false)
        .expect("removing a missing container is fine");
}

#[test]
fn published_ports_bind_where_asked_and_are_reported() {
    let e = engine::connect_docker(None).expect("engine reachable");
    let spec = ContainerSpec {
        name: Some(format!("lw-test-engine-ports-{}", nonce())),
        image: test_image("busybox"),
        cmd: vec!["sleep".into(), "300".into()],
        ports: vec![engine::PortMap {
            container: "8080/tcp".into(),
            host_ip: "127.0.0.1".into(),
            host_port: 0,
        }],
        ..Default::default()
    };
    let id = e.create(&spec).expect("create");
    let _cleanup = Cleanup(&e, id.clone());
    e.start(&id).expect("start");
    let c = e.inspect(&id).expect("inspect").expect("exists");
    let p: Vec<_> = c
        .ports
        .iter()
        .filter(|p| p.container == "8080/tcp")
        .collect();
    assert_eq!(p.len(), 1, "{:?}", c.ports);
    assert_eq!(p[0].host_ip, "127.0.0.1");
    assert_ne!(p[0].host_port, 0, "the engine picked a port");
    e.remove(&id, true)
        .expect("remove a running container with force");
    assert!(e.inspect(&id).expect("inspect").is_none());
}

/// A relay to the engine's socket that cuts the answer to the first `cuts`
/// build requests a little after it began (past the headers and the first
/// JSON messages), as dockerd did under load ("bytes remaining on
/// stream"); every other request passes through whole.
fn cutting_relay(dir: &std::path::Path, cuts: usize) -> String {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let path = dir.join("engine.sock");
    let listener = UnixListener::bind(&path).expect("bind the relay");
    let left = Arc::new(AtomicUsize::new(cuts));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let left = left.clone();
            std::thread::spawn(move || {
                let mut up = UnixStream::connect("/var/run/docker.sock").expect("the engine");
                let mut first = vec![0u8; 65536];
                let n = client.read(&mut first).unwrap_or(0);
                let cut = first[..n].windows(6).any(|w| w == b"/build")
                    && left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                        .is_ok();
                up.write_all(&first[..n]).unwrap();
                let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c2, &mut u2);
                });
                let mut sent = 0usize;
                let mut buf = [0u8; 256];
                loop {
                    let n = match up.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if client.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    sent += n;
                    if cut && sent > 1500 {
                        break;
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = up.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    format!("unix://{}", path.display())
}

/// The engine through `host` (a project's `engine.host`; DOCKER_HOST, if
/// set, would win, and the relay would not be in the way: the test says so).
fn through(host: &str) -> DockerEngine {
    assert!(
        std::env::var_os("DOCKER_HOST").is_none_or(|h| h.is_empty()),
        "unset DOCKER_HOST: this test puts a relay in front of the local engine"
    );
    let config = base::config::Config::parse_project(
        &format!("engine.host = {host}\n"),
        std::path::Path::new("config"),
        wall::config::CHECK,
    )
    .expect("a project config");
    engine::connect_docker(Some(&config)).expect("the relay answers")
}

fn chatty_build(tag: &str) -> engine::BuildRequest {
    let dockerfile = format!(
        "FROM {}\nRUN i=0; while [ $i -lt 200 ]; do echo line $i of the build output; i=$((i+1)); done\n",
        test_image("busybox")
    );
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(dockerfile.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append_data(&mut h, "Dockerfile", dockerfile.as_bytes())
        .unwrap();
    engine::BuildRequest {
        context: tar.into_inner().unwrap(),
        dockerfile: "Dockerfile".into(),
        tag: tag.into(),
        labels: BTreeMap::new(),
        args: BTreeMap::new(),
    }
}

/// The engine's answer to a build broken off midway (the connection, not
/// the build): the build is asked once more and its image made; broken off
/// twice, exit 75 naming the build and that the steps done are cached.
/// (Before, the first cut was "cannot reach the Docker engine", 69.)
#[test]
fn a_build_whose_answer_is_cut_midway_is_asked_once_more() {
    let dir = support::tempdir("cut-build");
    let once = through(&cutting_relay(&dir, 1));
    let tag = format!("loopwright/lw-test-cut:{}", nonce());
    let e = engine::connect_docker(None).expect("engine reachable");
    let mut told = Vec::new();
    let out = once
        .build(&chatty_build(&tag), &mut |ev| {
            if let engine::BuildEvent::Status(s) = ev {
                told.push(s)
            }
        })
        .expect("asked once more");
    assert!(matches!(out, engine::BuildOutcome::Built(_)), "{out:?}");
    assert!(
        told.iter()
            .any(|s| s.contains("broke off") && s.contains("once more")),
        "{told:?}"
    );
    assert!(e.image_exists(&tag).unwrap());
    e.remove_image(&tag, true).unwrap();

    let dir2 = support::tempdir("cut-build-twice");
    let twice = through(&cutting_relay(&dir2, 2));
    let err = twice
        .build(&chatty_build(&tag), &mut |_| {})
        .expect_err("cut twice");
    assert_eq!(err.exit as i32, 75, "{err}");
    assert!(
        err.to_string().contains("broke off the build of") && err.to_string().contains(&tag),
        "{err}"
    );
    let _ = e.remove_image(&tag, true);
}
