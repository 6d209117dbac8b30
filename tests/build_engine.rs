//! The runtime contract (crates/engine/src/lib.rs) against the real Docker engine, on
//! the busybox test image: images, containers, exec status and output, and
//! the hardening options lw-sandbox relies on.

mod build_support;

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
    assert_eq!(again.exit, mailbox::Exit::CantCreat, "{again}");

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
