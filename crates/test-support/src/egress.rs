//! Shared by the egress tests: servers that count the connections reaching
//! them, so a test can show that nothing got through to a forbidden host.

use std::process::{Command, Stdio};

fn docker(args: &[&str]) -> String {
    let o = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the docker CLI runs");
    assert!(
        o.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A connection counter for `nc -ll -e`: counts the connection, records the
/// request head, answers.
pub fn counter_script(dir: &str, name: &str) -> String {
    format!(
        "#!/bin/sh\necho c >> {dir}/{name}.conn\nwhile IFS= read -r l; do printf '%s\\n' \"$l\" >> {dir}/{name}.bytes; \
         l=$(printf '%s' \"$l\" | tr -d '\\r'); [ -z \"$l\" ] && break; done\n\
         printf 'HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\nreached {name}\\n'\n"
    )
}

/// Connections and bytes a counter file pair in `container` recorded.
pub fn counted(container: &str, dir: &str, name: &str) -> (u64, u64) {
    let o = docker(&[
        "exec",
        container,
        "sh",
        "-c",
        &format!(
            "cat {dir}/{name}.conn 2>/dev/null | wc -l; cat {dir}/{name}.bytes 2>/dev/null | wc -c"
        ),
    ]);
    let mut it = o
        .split_whitespace()
        .map(|n| n.parse::<u64>().expect("wc prints numbers"));
    (it.next().unwrap(), it.next().unwrap())
}

/// Runs `container` from a busybox `image` on `network`, known there by
/// `aliases`, answering on each of `ports` with the counter `name` (files in
/// /srv); returns once every port listens.
pub fn counter_server(
    container: &str,
    image: &str,
    label: &str,
    network: &str,
    aliases: &[&str],
    ports: &[u16],
    name: &str,
) {
    let ports_list = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        "mkdir -p /srv && printf '%s' \"$LW_COUNTER\" >/srv/{name} && chmod +x /srv/{name} \
         && for p in {ports_list}; do (nc -ll -p $p -e /srv/{name} &); done \
         && until [ $(netstat -ltn | grep -c -E ':({}) ') = {} ]; do sleep 0.05; done && echo ready && exec sleep 999999",
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join("|"),
        ports.len()
    );
    let counter = format!("LW_COUNTER={}", counter_script("/srv", name));
    let mut args = vec![
        "run",
        "-d",
        "--name",
        container,
        "--label",
        label,
        "--network",
        network,
    ];
    for a in aliases {
        args.extend(["--network-alias", a]);
    }
    args.extend(["-e", &counter, image, "sh", "-c", &script]);
    docker(&args);
    let mut follow = Command::new("docker")
        .args(["logs", "-f", container])
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker logs runs");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        follow.stdout.take().expect("piped"),
    ));
    let ready = lines.any(|l| l.is_ok_and(|l| l == "ready"));
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(ready, "{container} did not get ready");
}
