//! lw-post and lw-inbox run inside a busybox-only container on the real
//! Docker engine: no C library, no loader, nothing but busybox.  This is the
//! proof that the binaries need no dynamic library from the image.

use support::build as build_support;
use support::common;

use std::process::Command;

use common::{TempDir, ls, stderr, stdout};

#[test]
fn post_and_inbox_run_in_a_busybox_only_container() {
    let ping = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .expect("docker CLI runs");
    assert!(
        ping.status.success(),
        "the Docker engine is not reachable (.ci/run starts dockerd): {}",
        stderr(&ping)
    );
    let image = build_support::test_image("busybox");
    let t = TempDir::new("ctr");
    let mb = t.join("web");
    std::fs::create_dir_all(&mb).unwrap();
    // The container user owns its mailbox, as lw-sandbox arranges it.
    rustix::fs::chown(
        &mb,
        Some(rustix::process::Uid::from_raw(1000)),
        Some(rustix::process::Gid::from_raw(1000)),
    )
    .unwrap();

    let docker_run = |args: &[&str]| {
        let mut c = Command::new("docker");
        c.args([
            "run",
            "--rm",
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--user",
            "1000:1000",
        ])
        .arg("-v")
        .arg(format!(
            "{}:/lw/bin/lw-post:ro",
            support::bin("lw-post").display()
        ))
        .arg("-v")
        .arg(format!(
            "{}:/lw/bin/lw-inbox:ro",
            support::bin("lw-inbox").display()
        ))
        .arg("-v")
        .arg(format!("{}:/lw/mailbox", mb.display()))
        .args([
            "-e",
            "LW_MAILBOX=/lw/mailbox",
            "-e",
            "LW_SANDBOX=web",
            &image,
        ])
        .args(args);
        c.output().unwrap()
    };
    let o = docker_run(&[
        "/lw/bin/lw-post",
        "-k",
        "status",
        "-s",
        "hello from busybox",
        "-r",
        "api/schema.json",
        "posted inside",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "lw-post in busybox: {}",
        stderr(&o)
    );
    let id = stdout(&o).trim().to_string();
    assert!(base::id::is_valid(&id), "{id}");
    let m =
        mailbox::message::Message::parse(&std::fs::read(mb.join("outbox/new").join(&id)).unwrap())
            .unwrap();
    assert_eq!(
        (m.from.as_str(), m.subject.as_str(), m.body.as_str()),
        ("web", "hello from busybox", "posted inside")
    );

    // Deliver it back into the same sandbox's inbox and read it from inside.
    mailbox::layout::SandboxBox::new(&mb)
        .inbox()
        .deliver_message(&m)
        .unwrap();
    // The mediator runs as root; the sandbox's mailbox belongs to the sandbox's user.
    assert!(
        Command::new("chown")
            .args(["-R", "1000:1000"])
            .arg(&mb)
            .status()
            .unwrap()
            .success()
    );
    let o = docker_run(&["/lw/bin/lw-inbox"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "lw-inbox in busybox: {}",
        stderr(&o)
    );
    assert_eq!(
        stdout(&o),
        format!("{id}\tweb\tstatus\thello from busybox\n")
    );
    let o = docker_run(&["/lw/bin/lw-inbox", "ack", &id]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(ls(&mb.join("inbox/cur")), vec![id.clone()]);
    let o = docker_run(&["/lw/bin/lw-inbox", "--wait", "--timeout", "0.1"]);
    assert_eq!(
        o.status.code(),
        Some(75),
        "inotify works inside the container: {}",
        stderr(&o)
    );
    println!(
        "busybox image {image}: lw-post, lw-inbox list/ack/--wait ran inside, uid 1000, no network, read-only root"
    );
}
