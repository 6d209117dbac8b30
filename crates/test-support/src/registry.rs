//! The image cache tests' world: Debian's `docker-registry` (the reference
//! registry, "distribution") on 127.0.0.1 with htpasswd (bcrypt) auth and TLS
//! from a test CA, and a second Docker engine with its own data root, exec
//! root, pid file, socket and bridge, so that layers really travel between
//! machines-worth of state.  Both are stopped and removed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// Runs a program that must succeed; returns its stdout.
pub fn run_ok(prog: &str, args: &[&str], dir: &Path) -> String {
    let o = Command::new(prog)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{prog} runs: {e}"));
    assert!(
        o.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Says why a test cannot run when `prog` is missing.
pub fn require(prog: &str, why: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "this test needs '{prog}' ({why}); install it (.ci/run does: apt-get install docker-registry)"
    );
}

/// A free TCP port on 127.0.0.1 (closed again: a server binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local address")
        .port()
}

/// Waits until a line of `child`'s stderr contains `needle`; panics with
/// what it said when it exits or `timeout` passes first.  Every line said
/// after that is kept in the returned log.
fn wait_for_stderr(
    child: &mut Child,
    needle: &str,
    timeout: Duration,
    what: &str,
) -> Arc<Mutex<Vec<String>>> {
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = mpsc::channel();
    let needle = needle.to_string();
    let log = Arc::new(Mutex::new(Vec::new()));
    let kept = log.clone();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent && line.contains(&needle) {
                let _ = tx.send(Ok(()));
                sent = true;
            }
            if !sent {
                seen.push(line);
            } else {
                kept.lock().expect("the log's lock").push(line);
            }
        }
        if !sent {
            let _ = tx.send(Err(seen.join("\n")));
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(())) => log,
        Ok(Err(log)) => panic!("{what} exited before it was ready:\n{log}"),
        Err(_) => panic!("{what} was not ready within {timeout:?}"),
    }
}

pub struct Registry {
    child: Child,
    pub dir: PathBuf,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub ca: PathBuf,
    pub user: String,
    pub password: String,
    /// DOCKER_CONFIG directories: right and wrong credentials.
    pub good_config: PathBuf,
    pub bad_config: PathBuf,
    /// What the registry said once listening (a line per request).
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Registry {
    pub fn start(tag: &str) -> Registry {
        require(
            "docker-registry",
            "the reference registry the cache is tested against",
        );
        require("openssl", "the test CA");
        require("perl", "a bcrypt password hash for htpasswd");
        let dir = std::env::temp_dir().join(format!("lw-registry-{tag}-{}", nonce()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        certificates(&dir);
        let (user, password) = htpasswd(&dir);
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let d = dir.display();
        std::fs::write(
            dir.join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {d}/data\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n  tls:\n    certificate: {d}/server.crt\n    key: {d}/server.key\nauth:\n  htpasswd:\n    realm: lw-test\n    path: {d}/htpasswd\n"
            ),
        )
        .expect("config.yml");
        let mut child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("docker-registry starts");
        let log = wait_for_stderr(
            &mut child,
            "listening on",
            Duration::from_secs(30),
            "docker-registry",
        );
        let write_config = |name: &str, pw: &str| {
            let p = dir.join(name);
            std::fs::create_dir_all(&p).expect("config dir");
            let auth =
                engine::distribution::credentials::base64_encode(format!("{user}:{pw}").as_bytes());
            std::fs::write(
                p.join("config.json"),
                format!("{{\"auths\": {{\"{addr}\": {{\"auth\": \"{auth}\"}}}}}}"),
            )
            .expect("config.json");
            p
        };
        let good_config = write_config("docker-good", &password);
        let bad_config = write_config("docker-bad", "not-the-password");
        Registry {
            child,
            ca: dir.join("ca.crt"),
            dir,
            addr,
            user,
            password,
            good_config,
            bad_config,
            log,
        }
    }

    /// `--cache` for repository `repo`.
    pub fn cache(&self, repo: &str) -> String {
        format!("{}/{repo}", self.addr)
    }

    /// A client of `repo` with the right credentials.
    pub fn client(&self, repo: &str) -> engine::distribution::Client {
        let cache = engine::distribution::CacheRef::parse(&self.cache(repo)).expect("ref");
        let c = engine::distribution::Client::new(
            &cache,
            &engine::distribution::Options {
                ca_file: Some(self.ca.clone()),
                credentials: Some(engine::distribution::Credentials {
                    user: self.user.clone(),
                    secret: self.password.clone(),
                    source: "the test".into(),
                }),
                request_timeout: None,
            },
        )
        .expect("client");
        c.login(true).expect("the test's credentials work");
        c
    }
}

/// A test CA and the registry's certificate for 127.0.0.1, signed by it, in
/// `dir` (ca.crt, server.crt, server.key).
fn certificates(dir: &Path) {
    let ossl = |args: &[&str]| run_ok("openssl", args, dir);
    ossl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=loopwright cache test CA",
    ]);
    ossl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext");
    ossl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "ext",
    ]);
}

/// The registry's one user and a fresh password, its bcrypt hash in
/// `dir`/htpasswd.
fn htpasswd(dir: &Path) -> (String, String) {
    let (user, password) = ("lw".to_string(), format!("pw-{}", nonce()));
    // libxcrypt's bcrypt, through perl's crypt(): the registry takes bcrypt only.
    let hash = run_ok(
        "perl",
        &[
            "-e",
            "print crypt($ARGV[0], '$2b$05$' . $ARGV[1])",
            &password,
            "loopwrightcachetestsalt",
        ],
        dir,
    );
    assert!(
        hash.starts_with("$2b$"),
        "perl crypt made a bcrypt hash: {hash}"
    );
    std::fs::write(dir.join("htpasswd"), format!("{user}:{hash}\n")).expect("htpasswd");
    (user, password)
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub use crate::nonce;

/// A second Docker engine.  `--bridge=none` would make dockerd delete the
/// host's `docker0` (the shared engine's default bridge) as it starts, so it
/// gets a bridge of its own instead, with `--iptables=false` so it leaves the
/// shared engine's rules alone.
pub struct EngineB {
    child: Child,
    pub dir: PathBuf,
    /// `unix:///.../sock`, for DOCKER_HOST.
    pub host: String,
    bridge: String,
}

impl EngineB {
    pub fn start() -> EngineB {
        require("dockerd", "the second engine");
        let n = nonce();
        let dir = PathBuf::from(format!("/tmp/lwb-{n}"));
        std::fs::create_dir_all(&dir).expect("engine dir");
        let bridge: String = format!("lwb{}", &n[n.len().saturating_sub(8)..]);
        let octet = (std::process::id() % 200) + 20;
        let ip = |args: &[&str]| run_ok("ip", args, &dir);
        ip(&["link", "add", &bridge, "type", "bridge"]);
        let addr = format!("10.254.{octet}.1/24");
        ip(&["addr", "add", &addr, "dev", &bridge]);
        let sock = dir.join("sock");
        let d = |s: &str| dir.join(s).display().to_string();
        let child = Command::new("dockerd")
            .args(["--data-root", &d("data"), "--exec-root", &d("exec")])
            .args([
                "--pidfile",
                &d("pid"),
                "-H",
                &format!("unix://{}", sock.display()),
            ])
            .args([
                &format!("--bridge={bridge}"),
                "--iptables=false",
                "--ip6tables=false",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("dockerd starts");
        let host = format!("unix://{}", sock.display());
        // Built before waiting, so that a failed start is cleaned up too.
        let mut e = EngineB {
            child,
            dir,
            host,
            bridge,
        };
        let _ = wait_for_stderr(
            &mut e.child,
            "API listen on",
            Duration::from_secs(60),
            "the second dockerd",
        );
        e
    }

    /// The docker CLI against this engine.
    pub fn docker(&self, args: &[&str]) -> Output {
        Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .output()
            .expect("docker runs")
    }

    /// Copies image `tag` from the shared engine into this one.
    pub fn copy_from_shared(&self, tag: &str) {
        let o = Command::new("sh")
            .args([
                "-c",
                &format!("docker save '{tag}' | docker -H '{}' load -q", self.host),
            ])
            .output()
            .expect("sh runs");
        assert!(
            o.status.success(),
            "copy {tag}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// Removes every image whose reference starts with `prefix`.
    pub fn remove_images(&self, prefix: &str) {
        let o = self.docker(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
        let tags: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect();
        if !tags.is_empty() {
            let mut args = vec!["rmi", "-f"];
            args.extend(tags.iter().map(String::as_str));
            let o = self.docker(&args);
            assert!(
                o.status.success(),
                "rmi: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

impl Drop for EngineB {
    fn drop(&mut self) {
        // SIGTERM: dockerd stops its containerd and unmounts its layers.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.join("exec"))
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
