//! lw-service against a real PostgreSQL (Debian's `postgresql` package,
//! built through lw-build's layering and cached by its inputs' hash): two
//! sandboxes attached with `--service pg` share one table; a third, on an
//! egress network of its own, gets no DNS answer for `pg`, no TCP
//! connection to the service's address, and sends it no bytes; the data
//! outlives three `down`/`up` cycles.  Figures: `up` cold and warm, the
//! query round trip from a sandbox and from the host through the published
//! port (same run, same client, pgbench), bytes from the unlisted sandbox.
//! Also: bad input (an unknown field, a port taken, a crash at start, an
//! unready service, a missing one, gc) and a service's own egress list.
//!
//! Needs the Docker engine and Debian's package archive (the image's build
//! runs apt-get); `.ci/run` provides both.

use support::build as build_support;
use support::sandbox as sandbox_support;

use std::process::{Command, Output, Stdio};

use sandbox_support::*;

const PASSWORD: &str = "s3rvice-pw";

/// The service's image: Debian's postgresql on the Debian test image, its
/// binaries on PATH, its data directory given to the postgres user.
const DOCKERFILE: &str = "ARG LW_PARENT
FROM ${LW_PARENT}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql postgresql-client && rm -rf /var/lib/apt/lists/* && mkdir -p /var/lib/postgresql/data && chown postgres:postgres /var/lib/postgresql/data && ln -s $(ls -d /usr/lib/postgresql/*/bin) /usr/local/pgbin
ENV PATH=/usr/local/pgbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
";

/// initdb on an empty volume (password from the secret), then postgres.
const COMMAND: &str = "test -s \"$PGDATA/PG_VERSION\" || { initdb -U lw --pwfile=/run/secrets/PG_PASSWORD --auth=scram-sha-256 >/dev/null && echo 'host all all 0.0.0.0/0 scram-sha-256' >> \"$PGDATA/pg_hba.conf\"; }; exec postgres -c listen_addresses='*' -c unix_socket_directories=/tmp -c log_connections=on";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("an address")
        .port()
}

struct Svc<'a> {
    f: &'a Fixture,
}

impl Svc<'_> {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new(bin("lw-service"))
            .args(args)
            .current_dir(&self.f.proj)
            .env("LW_ROOT", &self.f.root)
            .env("PG_PASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .output()
            .expect("lw-service runs")
    }
    fn ok(&self, args: &[&str]) -> String {
        let o = self.cmd(args);
        assert!(
            o.status.success(),
            "lw-service {args:?} exited {:?}: {}",
            o.status.code(),
            err(&o)
        );
        text(&o)
    }
    /// `up NAME --json`: the milliseconds it took and whether it built.
    fn up(&self, name: &str) -> (f64, bool) {
        let j: serde_json::Value =
            serde_json::from_str(self.ok(&["up", name, "--json"]).trim()).expect("JSON");
        (
            j["took_ms"].as_f64().expect("took_ms"),
            j["built"].as_bool().expect("built"),
        )
    }
    fn ls(&self) -> Vec<serde_json::Value> {
        self.ok(&["ls", "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect()
    }
    fn state(&self, name: &str) -> serde_json::Value {
        self.ls()
            .into_iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name} in lw-service ls"))
    }
}

fn declare(f: &Fixture, name: &str, text: &str) {
    let dir = f.proj.join(".loopwright/services");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join(name), text).expect("write");
}

/// `lw-sandbox ARGS` with the password in its environment; must succeed.
fn sb_ok(f: &Fixture, args: &[&str]) {
    let o = f
        .cmd(args)
        .env("PG_PASSWORD", PASSWORD)
        .output()
        .expect("lw-sandbox runs");
    assert!(
        o.status.success(),
        "lw-sandbox {args:?} exited {:?}: {}",
        o.status.code(),
        err(&o)
    );
}

/// psql in a sandbox, as the lw user with the secret's password.
fn psql(f: &Fixture, sb: &str, sql: &str) -> (i32, String, String) {
    f.sh(
        sb,
        &format!(
            "PGPASSWORD=$(cat /run/secrets/PG_PASSWORD) psql -X -q -A -t -v ON_ERROR_STOP=1 -h pg -U lw -d postgres -c \"{sql}\""
        ),
    )
}

/// IPv4 bytes the service's network namespace received so far (the
/// kernel's IpExt InOctets; docker CLI, as a witness).  The interfaces' own
/// counters also count the host bridge's IPv6 neighbour chatter, which
/// the service never answers (its IPv6 is off).
fn service_rx(container: &str) -> u64 {
    let o = docker(&[
        "exec",
        container,
        "awk",
        "/^IpExt:/ { n++; if (n == 1) for (i = 1; i <= NF; i++) h[i] = $i; else for (i = 1; i <= NF; i++) if (h[i] == \"InOctets\") print $i }",
        "/proc/net/netstat",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    text(&o).trim().parse().expect("a byte count")
}

/// pgbench's average latency (ms) of `select 1` over one connection.
fn latency(out: &str) -> f64 {
    out.lines()
        .find_map(|l| l.strip_prefix("latency average = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no latency in pgbench's output: {out}"))
}

#[test]
fn postgres_is_shared_by_the_sandboxes_listed_and_no_other() {
    let n = nonce();
    // The egress sandbox's way out: a network of this test's own.
    let world = World::outside(&format!("svc-{n}"), &format!("lw-svc-test-{n}"));
    let f = Fixture::with_config(
        "svc",
        &format!(
            "sandbox.secrets = PG_PASSWORD\negress.proxy-from = {}\negress.network = {}\n",
            debian(),
            world.net
        ),
    );
    let svc = Svc { f: &f };
    std::fs::create_dir_all(f.proj.join("svc/pg")).expect("mkdir");
    std::fs::write(f.proj.join("svc/pg/Dockerfile"), DOCKERFILE).expect("write");
    let host_port = free_port();
    declare(
        &f,
        "pg",
        &format!(
            "build = svc/pg\nfrom = {}\nuser = postgres\nport = {host_port}:5432\n\
             env.PGDATA = /var/lib/postgresql/data/db\nvolume = /var/lib/postgresql/data\n\
             secret = PG_PASSWORD\ncommand = {COMMAND}\nready = pg_isready -q -h 127.0.0.1 -U lw\n",
            debian()
        ),
    );

    // First up: the image (built once per machine, then cached by its hash).
    let (first, built) = svc.up("pg");
    let image = {
        let o = docker(&[
            "inspect",
            "-f",
            "{{.Config.Image}}",
            &format!("lw-svc-{}-pg", f.root_id()),
        ]);
        text(&o).trim().to_string()
    };
    assert!(image.starts_with("loopwright/service-pg-image:"), "{image}");
    // Cold: an empty volume (initdb runs); warm: the data is there.
    svc.ok(&["rm", "pg", "--volumes"]);
    let (cold, _) = svc.up("pg");
    svc.ok(&["down", "pg"]);
    assert_eq!(svc.state("pg")["state"], "down");
    let (warm, rebuilt) = svc.up("pg");
    assert!(!rebuilt, "the image is cached by its inputs' hash");
    let container = format!("lw-svc-{}-pg", f.root_id());
    // Hardened: no capabilities, read-only root, limits, not root.
    let o = docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.CapDrop}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.Config.User}}",
        &container,
    ]);
    assert_eq!(
        text(&o).trim(),
        format!("[ALL] true {} 256 postgres", 1u64 << 30)
    );
    // The secret is nowhere in the container's configuration.
    let o = docker(&["inspect", &container]);
    assert!(
        !text(&o).contains(PASSWORD),
        "the password is in docker inspect"
    );

    for sb in ["a", "b"] {
        sb_ok(
            &f,
            &[
                "create",
                sb,
                "-b",
                &format!("lw/{sb}"),
                "--image",
                &image,
                "--service",
                "pg",
                "--secret",
                "PG_PASSWORD",
            ],
        );
    }
    sb_ok(
        &f,
        &[
            "create",
            "c",
            "-b",
            "lw/c",
            "--image",
            &image,
            "--network",
            "egress",
            "--secret",
            "PG_PASSWORD",
        ],
    );
    let (code, _, e) = psql(
        &f,
        "a",
        "create table shared (who text); insert into shared values ('from-a')",
    );
    assert_eq!(code, 0, "{e}");
    let (code, out, e) = psql(
        &f,
        "b",
        "insert into shared values ('from-b'); select string_agg(who, ',' order by who) from shared",
    );
    assert_eq!((code, out.trim()), (0, "from-a,from-b"), "{e}");
    let (code, out, e) = psql(&f, "a", "select count(*) from shared");
    assert_eq!((code, out.trim()), (0, "2"), "{e}");

    // ls on both sides names who uses what.
    let st = svc.state("pg");
    assert_eq!(st["state"], "ready", "{st}");
    assert_eq!(st["sandboxes"], serde_json::json!(["a", "b"]), "{st}");
    let sbls = f.ok(&["ls", "--json"]);
    for l in sbls.lines() {
        let j: serde_json::Value = serde_json::from_str(l).expect("JSON");
        let want = if j["name"] == "c" {
            serde_json::json!([])
        } else {
            serde_json::json!(["pg"])
        };
        assert_eq!(j["services"], want, "{j}");
    }

    // The unlisted sandbox: no DNS answer, no connection, no bytes.
    let ip = text(&docker(&[
        "inspect",
        "-f",
        &format!(
            "{{{{(index .NetworkSettings.Networks \"lw-svc-{}-pg\").IPAddress}}}}",
            f.root_id()
        ),
        &container,
    ]))
    .trim()
    .to_string();
    assert!(!ip.is_empty(), "the service has an address on its network");
    let conns = |c: &str| {
        let o = docker(&["logs", c]);
        err(&o).matches("connection received").count()
            + text(&o).matches("connection received").count()
    };
    let conns0 = conns(&container);
    let rx0 = service_rx(&container);
    let (code, out, _) = f.sh("c", "getent hosts pg");
    assert_ne!(code, 0, "pg resolved in the unlisted sandbox: {out}");
    let (code, _, e) = f.sh(
        "c",
        &format!("timeout 5 bash -c 'echo x > /dev/tcp/{ip}/5432' && echo connected"),
    );
    assert_ne!(code, 0, "the unlisted sandbox connected to {ip}:5432: {e}");
    let (code, _, _) = f.sh(
        "c",
        &format!("PGPASSWORD=$(cat /run/secrets/PG_PASSWORD) PGCONNECT_TIMEOUT=3 psql -X -h {ip} -U lw -d postgres -c 'select 1'"),
    );
    assert_ne!(
        code, 0,
        "psql from the unlisted sandbox reached the service"
    );
    let rx1 = service_rx(&container);
    let stray = rx1 - rx0;
    assert_eq!(
        conns(&container),
        conns0,
        "postgres logged a connection from the unlisted sandbox"
    );
    assert_eq!(
        stray, 0,
        "bytes reached the service while only the unlisted sandbox spoke"
    );

    // Round trip: the same pgbench, from sandbox a to pg:5432 and from the
    // host's network to 127.0.0.1:PORT.
    let script = "echo 'select 1;' > /work/q.sql && PGPASSWORD=$(cat /run/secrets/PG_PASSWORD) pgbench -n -f /work/q.sql -t 2000 -h pg -U lw postgres";
    let (code, out, e) = f.sh("a", script);
    assert_eq!(code, 0, "{e}");
    let from_sandbox = latency(&out);
    let o = docker(&[
        "run",
        "--rm",
        "--network",
        "host",
        "-e",
        &format!("PGPASSWORD={PASSWORD}"),
        "--entrypoint",
        "sh",
        &image,
        "-c",
        &format!(
            "echo 'select 1;' > /tmp/q.sql && pgbench -n -f /tmp/q.sql -t 2000 -h 127.0.0.1 -p {host_port} -U lw postgres"
        ),
    ]);
    assert!(o.status.success(), "pgbench from the host: {}", err(&o));
    let from_host = latency(&text(&o));

    // Data across 3 down/up cycles, written to in each.
    let mut warm_ups = vec![warm];
    for cycle in 1..=3 {
        svc.ok(&["down", "pg"]);
        let (t, _) = svc.up("pg");
        warm_ups.push(t);
        let (code, out, e) = psql(
            &f,
            "b",
            &format!("insert into shared values ('cycle-{cycle}'); select count(*) from shared"),
        );
        assert_eq!(
            (code, out.trim()),
            (0, format!("{}", 2 + cycle).as_str()),
            "cycle {cycle}: {e}"
        );
    }
    let (code, out, e) = psql(
        &f,
        "a",
        "select count(*) from shared where who like 'from-%'",
    );
    assert_eq!((code, out.trim()), (0, "2"), "{e}");

    warm_ups.sort_by(f64::total_cmp);
    println!(
        "figure: up first {first:.0}ms (image {}), cold {cold:.0}ms (empty volume, initdb), warm median {:.0}ms (of {})",
        if built { "built" } else { "cached" },
        warm_ups[warm_ups.len() / 2],
        warm_ups.len()
    );
    println!(
        "figure: select 1 round trip: sandbox->pg {from_sandbox:.3}ms, host->127.0.0.1:{host_port} {from_host:.3}ms (ratio {:.2}, pgbench, 2000 queries each, same run)",
        from_sandbox / from_host
    );
    println!("figure: bytes reaching the service from the unlisted sandbox: {stray}");
    println!("figure: rows kept across 3 down/up cycles: 5 of 5");

    // rm keeps the data unless --volumes; the sandboxes are detached.
    let o = svc.cmd(&["rm", "pg"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(err(&o).contains("kept volume"), "{}", err(&o));
    let vol = format!("lw-svc-{}-pg-data", f.root_id());
    assert!(docker(&["volume", "inspect", &vol]).status.success());
    let (code, _, _) = f.sh("a", "getent hosts pg");
    assert_ne!(code, 0, "pg still resolves after rm");
    drop(f);
    drop(world);
}

#[test]
fn bad_declarations_crashes_and_missing_services_are_refused_clearly() {
    let f = Fixture::new("svcbad");
    let svc = Svc { f: &f };
    let busybox = build_support::test_image("busybox");

    // An unknown field: 78 naming it.
    declare(&f, "typo", &format!("image = {busybox}\nvolum = /data\n"));
    let o = svc.cmd(&["up", "typo"]);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(err(&o).contains("unknown field 'volum'"), "{}", err(&o));

    // A port already taken: 69 naming it, nothing left running.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    declare(
        &f,
        "web",
        &format!("image = {busybox}\nport = {port}:8080\ncommand = httpd -f -p 8080\n"),
    );
    let o = svc.cmd(&["up", "web"]);
    assert_eq!(o.status.code(), Some(69), "{}", err(&o));
    assert!(
        err(&o).contains(&format!("port 127.0.0.1:{port}")),
        "{}",
        err(&o)
    );
    drop(taken);

    // A service that crashes at start: its log shown, failed in ls, and no
    // sandbox is attached to it.
    declare(
        &f,
        "crash",
        &format!(
            "image = {busybox}\ncommand = echo 'cannot open the data base' >&2; exit 3\nready = true\n"
        ),
    );
    let o = svc.cmd(&["up", "crash"]);
    assert_eq!(o.status.code(), Some(69), "{}", err(&o));
    assert!(err(&o).contains("cannot open the data base"), "{}", err(&o));
    assert!(err(&o).contains("failed at start"), "{}", err(&o));
    assert_eq!(svc.state("crash")["state"], "failed");
    let o = f.sb(&["create", "x", "-b", "lw/x", "--service", "crash"]);
    assert_eq!(o.status.code(), Some(69), "{}", err(&o));
    assert!(
        err(&o).contains("--service 'crash'") && err(&o).contains("failed"),
        "{}",
        err(&o)
    );
    assert!(
        f.ok(&["ls", "--no-header"]).trim().is_empty(),
        "a sandbox was made"
    );

    // A readiness check that fails: unready in ls, create refused.
    declare(
        &f,
        "slow",
        &format!(
            "image = {busybox}\ncommand = exec sleep 600\nready = test -e /tmp/ready\nready-timeout = 1s\n"
        ),
    );
    let o = svc.cmd(&["up", "slow"]);
    assert_eq!(o.status.code(), Some(69), "{}", err(&o));
    assert!(err(&o).contains("not ready"), "{}", err(&o));
    let st = svc.state("slow");
    assert_eq!(st["state"], "unready", "{st}");
    assert!(
        st["detail"]
            .as_str()
            .unwrap_or("")
            .contains("test -e /tmp/ready"),
        "{st}"
    );
    let o = f.sb(&["create", "y", "-b", "lw/y", "--service", "slow"]);
    assert_eq!(o.status.code(), Some(69), "{}", err(&o));
    assert!(err(&o).contains("not ready"), "{}", err(&o));
    // Once the check passes, the same create attaches.
    let c = format!("lw-svc-{}-slow", f.root_id());
    assert!(
        docker(&["exec", &c, "touch", "/tmp/ready"])
            .status
            .success()
    );
    assert_eq!(svc.state("slow")["state"], "ready");
    f.ok(&["create", "y", "-b", "lw/y", "--service", "slow"]);
    assert_eq!(svc.state("slow")["sandboxes"], serde_json::json!(["y"]));
    // lw doctor says which sandboxes use which service.
    let o = Command::new(bin("lw-doctor"))
        .current_dir(&f.proj)
        .env("LW_ROOT", &f.root)
        .output()
        .expect("lw-doctor runs");
    let report = text(&o);
    assert!(
        report.contains("slow ready; used by sandbox(es) y"),
        "{report}"
    );
    assert!(report.contains("crash failed"), "{report}");

    // A service that does not exist: 64.
    let o = f.sb(&["create", "z", "-b", "lw/z", "--service", "nosuch"]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(err(&o).contains("'nosuch'"), "{}", err(&o));

    // gc: a service whose declaration is gone goes, its data kept.
    std::fs::remove_file(f.proj.join(".loopwright/services/crash")).expect("rm");
    assert_eq!(svc.state("crash")["state"], "orphan");
    let out = svc.ok(&["gc"]);
    assert!(
        out.contains(&format!("container lw-svc-{}-crash", f.root_id())),
        "{out}"
    );
    assert!(svc.ls().iter().all(|s| s["name"] != "crash"));
}

#[test]
fn a_service_reaches_its_own_egress_list_and_nothing_else() {
    let n = nonce();
    let world = World::outside(&format!("svceg-{n}"), &format!("lw-svceg-{n}"));
    let f = Fixture::with_config(
        "svceg",
        &format!(
            "egress.proxy-from = {}\negress.network = {}\n",
            debian(),
            world.net
        ),
    );
    let svc = Svc { f: &f };
    declare(
        &f,
        "web",
        &format!(
            "image = {}\nuser = 1000\ncommand = exec sleep 600\negress = allowed.example:80\n",
            debian()
        ),
    );
    svc.ok(&["up", "web"]);
    let c = format!("lw-svc-{}-web", f.root_id());
    // Through its proxy: the listed host:port is let through (the name
    // does not resolve on this machine: 503 from the proxy, not 403), any
    // other refused; no DNS of its own.
    let o = docker(&[
        "exec",
        &c,
        "bash",
        "-c",
        "for h in allowed.example:80 denied.example:80; do exec 3<>/dev/tcp/lw-egress-proxy/3128; \
         printf \"CONNECT $h HTTP/1.1\\r\\nHost: $h\\r\\n\\r\\n\" >&3; head -1 <&3; exec 3<&-; done; \
         getent hosts deb.debian.org || echo no-dns; id -u",
    ]);
    let out = text(&o);
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(lines.len(), 4, "{out}{}", err(&o));
    assert!(
        !lines[0].contains(" 403 "),
        "the listed host was refused: {out}"
    );
    assert!(
        lines[1].contains(" 403 "),
        "an unlisted host was let through: {out}"
    );
    assert_eq!(&lines[2..], ["no-dns", "1000"], "{out}");
    // rm takes the proxy and its network along.
    svc.ok(&["rm", "web"]);
    assert!(
        !docker(&["inspect", &format!("{c}-proxy")]).status.success(),
        "the service's proxy outlived rm"
    );
    drop(f);
    drop(world);
}
