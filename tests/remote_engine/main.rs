//! A remote engine over TLS: engine B is a second dockerd (Debian's
//! docker.io) in a privileged container on the shared engine, listening on
//! tcp://IP:2376 with certificates this test makes with openssl, on a
//! network this test creates (the host reaches the container's address
//! directly).  B keeps its own storage, so it does not see this host's files.
//!
//! Asserted: the engine code connects over TLS as the Docker CLI's variables
//! say and runs a plain container there (create, start, exec, remove);
//! `lw doctor` says B does not share the host's filesystem and the local
//! engine does; sandboxes on B work in volume mode (tests/remote_engine/remote_support:
//! create, exec, post -> mediator -> courier -> a waiting lw-inbox, read
//! receipts, push, rm, `--port` on B's host, the courier create starts,
//! B down and wiped, a root with a sandbox on each engine, kill -9 of the
//! courier while it carries: 0 lost, 0 duplicated); a wrong CA, a missing key and a client certificate B does
//! not trust are 69 naming the host and the file; `ssh://` and unverified
//! `DOCKER_TLS` are 78.  Figures: connect+version
//! latency, container create+start time, `lw-sandbox create` time,
//! post->deliver latency and 1,000 messages, B against the local engine,
//! same run.
//!
//! Needs: the shared engine, privileged containers, openssl, and Debian's
//! package archive reachable from a build (the image of B is cached by the
//! hash of its inputs: loopwright/test-dockerd:HASH).  B keeps its storage
//! (overlay2) on an anonymous volume of the shared engine, removed with it.

// The process environment is changed (std::env::set_var, unsafe since
// Rust 2024) while no other thread of this binary reads it.
#![allow(unsafe_code)]

use support::build as build_support;
use support::courier as courier_support;
mod remote_support;
use support::sandbox as sandbox_support;
use support::seeded;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use engine::hostpaths::{Sharing, probe};
use engine::{ContainerSpec, DockerEngine, Engine, ExecRequest, HostPaths};
use support::common::output as text;

const DOCKERFILE: &str = "\
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io iptables openssh-server \\
 && rm -rf /var/lib/apt/lists/*
CMD [\"sleep\", \"infinity\"]
";

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().expect("command runs");
    assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    o
}

fn docker(args: &[&str]) -> Output {
    run(Command::new("docker").args(args))
}

/// The image of engine B, built once per recipe (base image + Dockerfile).
fn dockerd_image() -> String {
    let base = build_support::test_image("debian");
    let hash = base::digest::sha256_hex(format!("{base}\n{DOCKERFILE}").as_bytes());
    let tag = format!("loopwright/test-dockerd:{}", &hash[..16]);
    let have = Command::new("docker")
        .args(["image", "inspect", &tag])
        .output()
        .expect("docker runs");
    if !have.status.success() {
        let dir =
            std::env::temp_dir().join(format!("lw-dockerd-build-{}", sandbox_support::nonce()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Dockerfile"), format!("FROM {base}\n{DOCKERFILE}")).unwrap();
        let o = Command::new("docker")
            .args(["build", "-q", "-t", &tag])
            .arg(&dir)
            .env("DOCKER_BUILDKIT", "0")
            .output()
            .expect("docker build runs");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            o.status.success(),
            "cannot build engine B's image (needs Debian's archive): {}",
            text(&o)
        );
    }
    tag
}

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs (apt-get install openssl)");
    assert!(o.status.success(), "openssl {args:?}: {}", text(&o));
}

/// A CA in `dir/NAME-ca.pem` (key `NAME-ca-key.pem`).
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
            "-keyout",
            &format!("{name}-ca-key.pem"),
            "-out",
            &format!("{name}-ca.pem"),
        ],
    );
}

/// A certificate `OUT.pem` (key `OUT-key.pem`) signed by CA `ca`.
fn sign(dir: &Path, ca: &str, out: &str, cn: &str, ext: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{out}-key.pem"),
            "-out",
            &format!("{out}.csr"),
        ],
    );
    std::fs::write(dir.join(format!("{out}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{out}.csr"),
            "-days",
            "2",
            "-CA",
            &format!("{ca}-ca.pem"),
            "-CAkey",
            &format!("{ca}-ca-key.pem"),
            "-CAcreateserial",
            "-extfile",
            &format!("{out}.ext"),
            "-out",
            &format!("{out}.pem"),
        ],
    );
}

/// A DOCKER_CERT_PATH directory with the three files the CLI reads.
fn cert_path(dir: &Path, name: &str, ca: &str, cert: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(dir.join(format!("{ca}-ca.pem")), d.join("ca.pem")).unwrap();
    std::fs::copy(dir.join(format!("{cert}.pem")), d.join("cert.pem")).unwrap();
    std::fs::copy(dir.join(format!("{cert}-key.pem")), d.join("key.pem")).unwrap();
    d
}

/// Engine B and everything made for it, removed on drop.
struct EngineB {
    container: String,
    network: String,
    dir: PathBuf,
    /// B's containers' cgroup parent in the host's hierarchy.
    cgroup: String,
}

impl Drop for EngineB {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v", &self.container])
            .output();
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Ok(ctrls) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in ctrls.flatten() {
                rmdir_cgroup(&c.path().join(&self.cgroup));
            }
        }
    }
}

/// Removes a cgroup directory and the (empty) cgroups under it, deepest
/// first: what B's containers leave when B is killed before removing them.
fn rmdir_cgroup(dir: &Path) {
    if let Ok(subs) = std::fs::read_dir(dir) {
        for s in subs.flatten() {
            if s.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_cgroup(&s.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Points this process's engine variables at `host` with certificates `certs`
/// (None: the local engine).  One test function per binary, so no other
/// thread reads the environment meanwhile.
fn use_engine(host: Option<&str>, certs: Option<&Path>) {
    // SAFETY: this test binary has one test, on one thread.
    unsafe {
        match host {
            Some(h) => std::env::set_var("DOCKER_HOST", h),
            None => std::env::remove_var("DOCKER_HOST"),
        }
        match certs {
            Some(c) => {
                std::env::set_var("DOCKER_TLS_VERIFY", "1");
                std::env::set_var("DOCKER_CERT_PATH", c);
            }
            None => {
                std::env::remove_var("DOCKER_TLS_VERIFY");
                std::env::remove_var("DOCKER_CERT_PATH");
            }
        }
    }
}

fn with_engine<'a>(cmd: &'a mut Command, host: &str, certs: &Path) -> &'a mut Command {
    cmd.env("DOCKER_HOST", host)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", certs)
}

/// Starts B's dockerd in its container and waits until it answers;
/// `data_root` (a fresh directory) makes it an engine whose state was wiped.
fn start_dockerd(container: &str, cgroup: &str, host: &str, certs: &Path, data_root: &str) {
    docker(&[
        "exec",
        "-d",
        container,
        "sh",
        "-c",
        &format!(
            "dockerd --debug --data-root {data_root} --cgroup-parent /{cgroup} --host unix:///var/run/docker.sock --host tcp://0.0.0.0:2376 --tlsverify --tlscacert /certs/b-ca.pem \
         --tlscert /certs/server.pem --tlskey /certs/server-key.pem \
         --iptables=false --ip-masq=false --storage-driver overlay2 >>/var/log/dockerd.log 2>&1"
        ),
    ]);
    // Ready when it answers (a process in another network namespace: no
    // event of ours to wait on; bounded).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = with_engine(&mut Command::new("docker"), host, certs)
            .args(["version", "--format", "{{.Server.Version}}"])
            .output()
            .unwrap();
        if o.status.success() {
            break;
        }
        if Instant::now() > deadline {
            let log = Command::new("docker")
                .args(["exec", container, "cat", "/var/log/dockerd.log"])
                .output()
                .unwrap();
            panic!(
                "engine B did not answer in 120 s: {}\n{}",
                text(&o),
                text(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops B's dockerd (SIGTERM, as a restart does) and waits until it is gone.
fn stop_dockerd(container: &str) {
    docker(&[
        "exec",
        container,
        "sh",
        "-c",
        "kill $(cat /var/run/docker.pid); while [ -e /var/run/docker.pid ]; do sleep 0.1; done",
    ]);
}

/// The data root B's dockerd keeps its state in (on B's volume).
const DATA_ROOT: &str = "/var/lib/docker";

/// `docker save` here, `docker load` on B (whose CLI reads the same
/// variables the engine code does).
fn load_into_b(image: &str, host: &str, certs: &Path) {
    let save = Command::new("docker")
        .args(["save", image])
        .output()
        .expect("docker save");
    assert!(save.status.success(), "docker save: {}", text(&save));
    let mut load = with_engine(&mut Command::new("docker"), host, certs)
        .args(["load", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = load.stdin.take().unwrap();
    let feed = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &save.stdout));
    let loaded = load.wait_with_output().unwrap();
    feed.join().unwrap().unwrap();
    assert!(
        loaded.status.success(),
        "docker load on B: {}",
        text(&loaded)
    );
}

/// sshd in B (root, by the test's key only) and the client's side in
/// `dir`: its key, B's host key as the only known host, a config naming
/// them.  Returns the `LW_SSH_COMMAND` that uses it; `dir/stranger` is the
/// same with an empty known_hosts, `dir/wrong-key` with a key B does not
/// know.
fn start_sshd(container: &str, ip: &str, certs_in: &Path, dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let keygen = |path: &Path| {
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "lw-test", "-f"])
            .arg(path));
    };
    keygen(&dir.join("id"));
    keygen(&dir.join("other-id"));
    keygen(&certs_in.join("ssh_host_key"));
    std::fs::copy(dir.join("id.pub"), certs_in.join("authorized_keys")).unwrap();
    docker(&[
        "exec",
        container,
        "sh",
        "-c",
        "mkdir -p /run/sshd && /usr/sbin/sshd -h /certs/ssh_host_key \
         -o AuthorizedKeysFile=/certs/authorized_keys -o StrictModes=no \
         -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no -E /var/log/sshd.log",
    ]);
    let host_key = std::fs::read_to_string(certs_in.join("ssh_host_key.pub")).unwrap();
    std::fs::write(dir.join("known_hosts"), format!("{ip} {host_key}")).unwrap();
    std::fs::write(dir.join("no_known_hosts"), "").unwrap();
    let config = |name: &str, key: &str, known: &str| {
        let d = dir.display();
        std::fs::write(
            dir.join(name),
            format!(
                "Host {ip}\n  User root\n  IdentityFile {d}/{key}\n  IdentitiesOnly yes\n  \
                 UserKnownHostsFile {d}/{known}\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
            ),
        )
        .unwrap();
        format!("ssh -F {d}/{name}")
    };
    config("stranger", "id", "no_known_hosts");
    config("wrong-key", "other-id", "known_hosts");
    config("config", "id", "known_hosts")
}

/// Whether process `pid` runs (exists, and is not a zombie).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// The `ssh` processes whose command line names `dir` (its config files).
fn ssh_processes(dir: &Path) -> Vec<String> {
    let o = Command::new("pgrep")
        .args(["-a", "-f"])
        .arg(format!("ssh -F {}", dir.display()))
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Connect + version, `n` times: the median.
fn connect_latency(n: usize) -> Duration {
    median(
        (0..n)
            .map(|_| {
                let t = Instant::now();
                let e = engine::connect_docker(None).expect("connects");
                e.version().expect("version");
                t.elapsed()
            })
            .collect(),
    )
}

/// Create + start of a busybox container, exec in it, remove: the median
/// create+start time of `n`.
fn create_start(e: &DockerEngine, image: &str, tag: &str, n: usize) -> Duration {
    median(
        (0..n)
            .map(|i| {
                let name = format!("lw-test-remote-{tag}-{}-{i}", sandbox_support::nonce());
                let spec = ContainerSpec {
                    name: Some(name.clone()),
                    image: image.to_string(),
                    cmd: vec!["sleep".into(), "600".into()],
                    network: Some("none".into()),
                    ..Default::default()
                };
                let t = Instant::now();
                e.create(&spec).expect("create on the engine");
                e.start(&name).expect("start on the engine");
                let took = t.elapsed();
                let req = ExecRequest {
                    cmd: vec!["sh".into(), "-c".into(), "echo from-$(hostname)".into()],
                    ..Default::default()
                };
                let mut out = Vec::new();
                let status = e
                    .exec(&name, &req, &mut |_, b| out.extend_from_slice(b))
                    .expect("exec on the engine");
                assert_eq!(status, 0, "exec status");
                assert!(
                    String::from_utf8_lossy(&out).starts_with("from-"),
                    "exec output: {:?}",
                    String::from_utf8_lossy(&out)
                );
                e.remove(&name, true).expect("remove on the engine");
                took
            })
            .collect(),
    )
}

#[test]
fn remote_engine_over_tls() {
    let ping = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .expect("docker CLI runs");
    assert!(
        ping.status.success(),
        "the Docker engine is not reachable (.ci/run starts dockerd): {}",
        text(&ping)
    );
    let image_b = dockerd_image();
    let busybox = build_support::test_image("busybox");
    let n = sandbox_support::nonce();
    let b = EngineB {
        container: format!("lw-test-engine-b-{n}"),
        network: format!("lw-test-remote-{n}"),
        dir: std::env::temp_dir().join(format!("lw-test-remote-{n}")),
        cgroup: format!("lw-test-engine-b-{n}"),
    };
    let cgroup = b.cgroup.clone();
    std::fs::create_dir_all(&b.dir).unwrap();
    docker(&[
        "network",
        "create",
        "--label",
        "loopwright.test=remote",
        &b.network,
    ]);
    let certs_in = b.dir.join("server");
    std::fs::create_dir_all(&certs_in).unwrap();
    docker(&[
        "run",
        "-d",
        "--name",
        &b.container,
        "--network",
        &b.network,
        "--label",
        "loopwright.test=remote",
        // What --privileged gives, less CAP_SYS_RESOURCE, which the shared
        // engine itself may lack (then --privileged fails to start).
        "--cap-add",
        "ALL",
        "--cap-drop",
        "SYS_RESOURCE",
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "--security-opt",
        "systempaths=unconfined",
        "--tmpfs",
        "/run",
        // B's storage on a volume of the shared engine (ext4 underneath), so
        // overlay2 works there; removed with B (`rm -v`).
        "-v",
        "/var/lib/docker",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "-v",
        &format!("{}:/certs:ro", certs_in.display()),
        &image_b,
    ]);
    let ip = String::from_utf8(
        docker(&[
            "inspect",
            "-f",
            &format!(
                "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
                b.network
            ),
            &b.container,
        ])
        .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    assert!(!ip.is_empty(), "engine B has an address on {}", b.network);

    // Certificates: B's CA signs B's server certificate (its IP in
    // subjectAltName) and the client's; another CA plays the wrong one.
    make_ca(&b.dir, "b");
    make_ca(&b.dir, "other");
    sign(
        &b.dir,
        "b",
        "server",
        &ip,
        &format!("subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n"),
    );
    sign(
        &b.dir,
        "b",
        "client",
        "client",
        "extendedKeyUsage=clientAuth\n",
    );
    sign(
        &b.dir,
        "other",
        "stranger",
        "stranger",
        "extendedKeyUsage=clientAuth\n",
    );
    for f in ["b-ca.pem", "server.pem", "server-key.pem"] {
        std::fs::copy(b.dir.join(f), certs_in.join(f)).unwrap();
    }
    let good = cert_path(&b.dir, "good", "b", "client");
    let wrong_ca = cert_path(&b.dir, "wrong-ca", "other", "client");
    let untrusted = cert_path(&b.dir, "untrusted", "b", "stranger");
    let no_key = cert_path(&b.dir, "no-key", "b", "client");
    std::fs::remove_file(no_key.join("key.pem")).unwrap();

    let host = format!("tcp://{ip}:2376");
    start_dockerd(&b.container, &cgroup, &host, &good, DATA_ROOT);
    // B gets the busybox test image, through the docker CLI with the same
    // variables (the CLI as the witness that they mean what we read).
    load_into_b(&busybox, &host, &good);

    // The engine code over TLS: connect, probe, containers.
    use_engine(Some(&host), Some(&good));
    let eb = engine::connect_docker(None).expect("connects to B over TLS");
    assert_eq!(eb.host(), host);
    let probe_dir = b.dir.join("probe");
    std::fs::create_dir_all(&probe_dir).unwrap();
    let t = Instant::now();
    let sharing_b = probe(&eb, &probe_dir).expect("probe on B");
    let probe_b = t.elapsed();
    assert_eq!(sharing_b, Sharing::Separate, "B keeps its own filesystem");
    let id_b = eb.engine_id().expect("B's id");
    let lat_b = connect_latency(15);
    let cs_b = create_start(&eb, &busybox, "b", 5);

    use_engine(None, None);
    let el = engine::connect_docker(None).expect("connects to the local engine");
    let t = Instant::now();
    let sharing_l = probe(&el, &probe_dir).expect("probe locally");
    let probe_l = t.elapsed();
    assert_eq!(
        sharing_l,
        Sharing::Shared,
        "the local engine sees the host's files"
    );
    assert_ne!(el.engine_id().unwrap(), id_b, "two engines, two ids");
    let lat_l = connect_latency(15);
    let cs_l = create_start(&el, &busybox, "local", 5);

    // lw doctor, on each engine.
    let lw = sandbox_support::bin("lw");
    let doc_b = with_engine(&mut Command::new(&lw), &host, &good)
        .arg("doctor")
        .current_dir(&b.dir)
        .output()
        .unwrap();
    let out_b = text(&doc_b);
    assert!(
        out_b.contains("does not share this host's filesystem") && out_b.contains(&host),
        "lw doctor on B: {out_b}"
    );
    let doc_l = Command::new(&lw)
        .arg("doctor")
        .current_dir(&b.dir)
        .env_remove("DOCKER_HOST")
        .env_remove("DOCKER_TLS_VERIFY")
        .output()
        .unwrap();
    let out_l = text(&doc_l);
    assert!(
        out_l.contains("sees this host's files"),
        "lw doctor locally: {out_l}"
    );

    // Sandboxes on B, in volume mode, beside the same on the local engine
    // (tests/remote_engine/remote_support): the project's image is loaded into B first.
    let fx = sandbox_support::Fixture::new("remote");
    let project = wall::config::project(&fx.proj)
        .unwrap()
        .expect("the fixture is a project");
    let image = loopwright::sandbox::resolve_image(&el, Some(&project), None, false)
        .expect("the fixture's image is built")
        .reference;
    load_into_b(&image, &host, &good);
    let b_docker = |args: &[&str]| {
        with_engine(&mut Command::new("docker"), &host, &good)
            .args(args)
            .output()
            .unwrap()
    };
    let restart_b = || {
        stop_dockerd(&b.container);
        start_dockerd(&b.container, &cgroup, &host, &good, DATA_ROOT);
    };
    let stop_b = || stop_dockerd(&b.container);
    // A new data root on the same volume: B comes back knowing nothing.
    let start_b_wiped =
        || start_dockerd(&b.container, &cgroup, &host, &good, "/var/lib/docker/wiped");
    // What B's dockerd served: its debug log says "Calling METHOD PATH"
    // once a request (read from outside B, through the shared engine).
    let b_requests = || {
        let o = docker(&[
            "exec",
            &b.container,
            "grep",
            "-c",
            "msg=\"Calling ",
            "/var/log/dockerd.log",
        ]);
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let figures = remote_support::volume_mode(
        &fx,
        &host,
        &good,
        &image,
        &remote_support::EngineB {
            docker: &b_docker,
            restart: &restart_b,
            stop: &stop_b,
            start_wiped: &start_b_wiped,
            requests: &b_requests,
        },
    );
    // The probe's answer is kept per engine id under the root.
    let rec = engine::hostpaths::record_path(&mailbox::layout::Root::new(&fx.root), &id_b);
    let kept = std::fs::read_to_string(&rec).unwrap_or_default();
    assert!(
        kept.starts_with("separate\n"),
        "record {}: {kept:?}",
        rec.display()
    );

    // Bad certificates: 69, naming the host and the file.
    let ls = |certs: &Path| {
        with_engine(&mut fx.cmd(&["ls"]), &host, certs)
            .output()
            .unwrap()
    };
    let o = ls(&wrong_ca);
    let m = text(&o);
    let ca = wrong_ca.join("ca.pem").display().to_string();
    assert_eq!(o.status.code(), Some(69), "wrong CA: {m}");
    assert!(
        m.contains(&host) && m.contains(&ca),
        "wrong CA names host and {ca}: {m}"
    );
    let o = ls(&no_key);
    let m = text(&o);
    let key = no_key.join("key.pem").display().to_string();
    assert_eq!(o.status.code(), Some(69), "missing key: {m}");
    assert!(
        m.contains(&host) && m.contains(&key),
        "missing key names host and {key}: {m}"
    );
    let o = ls(&untrusted);
    let m = text(&o);
    let cert = untrusted.join("cert.pem").display().to_string();
    assert_eq!(o.status.code(), Some(69), "untrusted client: {m}");
    assert!(
        m.contains(&host) && m.contains(&cert),
        "untrusted client names host and {cert}: {m}"
    );

    // ssh://: the same engine B through sshd in its container and the
    // system's ssh client (LW_SSH_COMMAND names the test's config).
    let ssh_dir = b.dir.join("ssh");
    let ssh_cmd = start_sshd(&b.container, &ip, &certs_in, &ssh_dir);
    let ssh_host = format!("ssh://root@{ip}");
    // The story ended with B wiped: the project's image goes in again.
    load_into_b(&image, &host, &good);
    use_engine(Some(&ssh_host), None);
    // SAFETY: this test binary has one test, on one thread.
    unsafe { std::env::set_var("LW_SSH_COMMAND", &ssh_cmd) };
    let es = engine::connect_docker(None).expect("connects to B through ssh");
    assert_eq!(es.host(), ssh_host);
    assert_eq!(es.engine_id().unwrap(), id_b, "the same engine as over TLS");
    assert_eq!(
        ssh_processes(&ssh_dir).len(),
        1,
        "one tunnel while connected"
    );
    drop(es);
    assert!(
        ssh_processes(&ssh_dir).is_empty(),
        "the tunnel ends with the client: {:?}",
        ssh_processes(&ssh_dir)
    );
    let lat_ssh = connect_latency(15);
    unsafe { std::env::remove_var("LW_SSH_COMMAND") };
    use_engine(None, None);
    let via_ssh = |cmd: &str, args: &[&str]| {
        fx.cmd(args)
            .env("DOCKER_HOST", &ssh_host)
            .env("LW_SSH_COMMAND", cmd)
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .output()
            .unwrap()
    };
    let ok_ssh = |args: &[&str]| {
        let o = via_ssh(&ssh_cmd, args);
        assert!(
            o.status.success(),
            "lw-sandbox {args:?} through ssh: {}",
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let t = Instant::now();
    ok_ssh(&["create", "viassh", "--branch", "viassh", "--image", &image]);
    let create_ssh = t.elapsed();
    assert_eq!(
        ok_ssh(&[
            "exec",
            "viassh",
            "--",
            "git",
            "rev-parse",
            "--abbrev-ref",
            "HEAD"
        ])
        .trim(),
        "viassh"
    );
    // Mail crosses through the tunnel: the courier (started by create, with
    // the same variables) carries a post into the host's root.
    let id = ok_ssh(&[
        "exec",
        "viassh",
        "--",
        "lw-post",
        "--to",
        "mediator",
        "--kind",
        "status",
        "--subject",
        "through ssh",
        "body",
    ])
    .trim()
    .to_string();
    let outbox = mailbox::maildir::Maildir::new(fx.root.join("sandboxes/viassh/outbox"));
    let arrived = outbox
        .wait_until(Some(Duration::from_secs(60)), || {
            Ok(outbox.sub(mailbox::maildir::Sub::New).join(&id).exists())
        })
        .unwrap();
    assert!(
        arrived,
        "message {id} was carried into the root through ssh"
    );
    let ls = ok_ssh(&["ls"]);
    assert!(
        ls.lines()
            .any(|l| l.starts_with("viassh\t") && l.contains("\trunning\t")),
        "{ls}"
    );
    ok_ssh(&["rm", "--force", "viassh"]);
    ok_ssh(&["courier", "--stop"]);
    assert!(
        ssh_processes(&ssh_dir).is_empty(),
        "no tunnel outlives its commands: {:?}",
        ssh_processes(&ssh_dir)
    );
    // Bad input: an unknown host key and a key B does not know are 69,
    // naming the engine and saying ssh's own words.
    for (cfg, words) in [
        ("stranger", "Host key verification failed"),
        ("wrong-key", "Permission denied"),
    ] {
        let o = via_ssh(&format!("ssh -F {}/{cfg}", ssh_dir.display()), &["ls"]);
        let m = text(&o);
        assert_eq!(o.status.code(), Some(69), "{cfg}: {m}");
        assert!(m.contains(&ssh_host) && m.contains(words), "{cfg}: {m}");
    }
    let o = via_ssh(&ssh_cmd, &["ls"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The courier ended by SIGTERM left its tunnel's directory; the next
    // tunnel swept it: none is left of a process that has ended.
    let stale: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("lw-ssh-")
                .and_then(|r| r.split('-').next())
                .is_some_and(|pid| pid.parse::<u32>().is_ok() && !running(pid))
        })
        .collect();
    assert!(stale.is_empty(), "tunnel directories left: {stale:?}");
    let o = fx
        .cmd(&["ls"])
        .env("DOCKER_HOST", format!("ssh://-oProxyCommand=x@{ip}"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(78),
        "an option as a host: {}",
        text(&o)
    );
    let o = fx
        .cmd(&["ls"])
        .env("DOCKER_HOST", &host)
        .env("DOCKER_TLS", "1")
        .env_remove("DOCKER_TLS_VERIFY")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(78),
        "DOCKER_TLS unverified: {}",
        text(&o)
    );

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "figures: connect+version median of 15: TLS engine B {:.1} ms, local {:.1} ms ({:.2}x); \
         container create+start median of 5: B {:.1} ms, local {:.1} ms ({:.2}x); \
         host-files probe: B {:.0} ms, local {:.0} ms; \
         lw-sandbox create (whole run), first: B {:.0} ms, local {:.0} ms ({:.2}x), second: B {:.0} ms, local {:.0} ms ({:.2}x); \
         post->deliver median of 7: B {:.0} ms, local {:.0} ms ({:.2}x); \
         1,000 messages posted->delivered: B {:.1} s, local {:.1} s ({:.2}x); \
         through ssh: connect+version median of 15 {:.1} ms ({:.2}x TLS), lw-sandbox create {:.0} ms; {}",
        ms(lat_b),
        ms(lat_l),
        ms(lat_b) / ms(lat_l),
        ms(cs_b),
        ms(cs_l),
        ms(cs_b) / ms(cs_l),
        ms(probe_b),
        ms(probe_l),
        ms(figures.create.0),
        ms(figures.create.1),
        ms(figures.create.0) / ms(figures.create.1),
        ms(figures.create2.0),
        ms(figures.create2.1),
        ms(figures.create2.0) / ms(figures.create2.1),
        ms(figures.latency.0),
        ms(figures.latency.1),
        ms(figures.latency.0) / ms(figures.latency.1),
        figures.thousand.0.as_secs_f64(),
        figures.thousand.1.as_secs_f64(),
        figures.thousand.0.as_secs_f64() / figures.thousand.1.as_secs_f64(),
        ms(lat_ssh),
        ms(lat_ssh) / ms(lat_b),
        ms(create_ssh),
        figures.crash,
    );
}
