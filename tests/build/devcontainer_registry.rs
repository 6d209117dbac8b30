//! Features from a registry (#44): lw init fetches them from Debian's
//! `docker-registry` on 127.0.0.1 (TLS from a test CA, htpasswd), where the
//! test pushes them over the distribution API; a moved tag is said, a
//! wrong digest, a hostile tar and an unreachable registry are refused
//! naming the feature and how to vendor it, writing nothing.

use support::build as build_support;
use support::registry as build_cache_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use build_cache_support::Registry;
use engine::distribution::OCI_MANIFEST;
use loopwright::init::devcontainer::registry::LAYER_TYPE;

/// A tar of `entries` (name, type, body, link), names written raw.
fn tar_of(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, body, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        b.append(&h, *body).expect("append");
    }
    b.into_inner().expect("tar")
}

fn feature(install: &str, extra: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let f = tar::EntryType::Regular;
    let meta = br#"{"id": "hello", "version": "1.0.0", "options": {"greeting": {"type": "string", "default": "hi"}}, "containerEnv": {"HELLO_HOME": "/opt/hello"}}"#;
    let mut v = vec![
        ("./devcontainer-feature.json", f, &meta[..], ""),
        ("./install.sh", f, install.as_bytes(), ""),
    ];
    v.extend_from_slice(extra);
    tar_of(&v)
}

/// A feature of its own `meta` (devcontainer-feature.json) and install.sh.
fn feature_of(meta: &str, install: &str) -> Vec<u8> {
    let f = tar::EntryType::Regular;
    tar_of(&[
        ("./devcontainer-feature.json", f, meta.as_bytes(), ""),
        ("./install.sh", f, install.as_bytes(), ""),
    ])
}

/// Pushes `layer` as feature `repo:tag`; returns the manifest's digest.
fn push(reg: &Registry, repo: &str, tag: &str, layer: &[u8]) -> String {
    let c = reg.client(repo);
    let dir = reg
        .dir
        .join(format!("push-{}", build_cache_support::nonce()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut descs = Vec::new();
    for (name, bytes) in [("config", &b"{}"[..]), ("layer", layer)] {
        let d = format!("sha256:{}", base::digest::sha256_hex(bytes));
        std::fs::write(dir.join(name), bytes).unwrap();
        c.put_blob(&d, bytes.len() as u64, &dir.join(name))
            .expect("blob pushed");
        descs.push((d, bytes.len()));
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.devcontainers", "digest": descs[0].0, "size": descs[0].1},
        "layers": [{"mediaType": LAYER_TYPE, "digest": descs[1].0, "size": descs[1].1,
                    "annotations": {"org.opencontainers.image.title": "devcontainer-feature-hello.tgz"}}],
    })
    .to_string();
    c.put_manifest_bytes(tag, OCI_MANIFEST, manifest.as_bytes())
        .expect("manifest pushed")
}

/// A git checkout whose devcontainer.json names `features`.
fn checkout(name: &str, reg: &Registry, features: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lw-dcr-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join(".devcontainer")).unwrap();
    std::fs::create_dir_all(d.join(".loopwright")).unwrap();
    std::fs::write(
        d.join(".devcontainer/devcontainer.json"),
        format!("{{\"image\": \"debian:bookworm-slim\", \"features\": {{{features}}}}}"),
    )
    .unwrap();
    std::fs::write(
        d.join(".loopwright/config"),
        format!("devcontainer.feature-ca = {}\n", reg.ca.display()),
    )
    .unwrap();
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&d)
            .status()
            .unwrap()
            .success()
    );
    d
}

fn lw_init(dir: &Path, reg: &Registry) -> Output {
    lw_init_with(dir, &reg.good_config)
}

/// lw init on `dir` with the Docker configuration (credentials) in `docker_config`.
fn lw_init_with(dir: &Path, docker_config: &Path) -> Output {
    // --force: the checkout's .loopwright/config (the CA) is there already.
    Command::new(env!("CARGO_BIN_EXE_lw-init"))
        .args(["--force", "--ca", "none"])
        .arg(dir)
        .env("DOCKER_CONFIG", docker_config)
        .output()
        .expect("lw-init runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read(d: &Path, p: &str) -> String {
    std::fs::read_to_string(d.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn a_registry_feature_is_fetched_pinned_and_a_moved_tag_is_said() {
    let reg = Registry::start("dc-feature");
    let first = push(
        &reg,
        "features/hello",
        "1",
        &feature("#!/bin/sh\necho one\n", &[]),
    );
    let id = format!("{}/features/hello:1", reg.addr);
    let d = checkout(
        "fetch",
        &reg,
        &format!("\"{id}\": {{\"greeting\": \"hey\"}}"),
    );
    let o = lw_init(&d, &reg);
    assert!(o.status.success(), "{}", stderr(&o));
    let dir = ".loopwright/runtime/features/hello";
    assert_eq!(
        read(&d, &format!("{dir}/install.sh")),
        "#!/bin/sh\necho one\n"
    );
    let df = read(&d, ".loopwright/runtime/feature-hello.Dockerfile");
    assert!(
        df.contains(&first),
        "the layer hashes the manifest's digest:\n{df}"
    );
    assert!(df.contains("GREETING='hey'"), "{df}");
    assert!(df.contains("HELLO_HOME="), "{df}");
    let conf = read(&d, ".loopwright/runtime/runtime.conf");
    assert!(conf.contains(&format!("layer feature-hello\n    dockerfile .loopwright/runtime/feature-hello.Dockerfile\n    input {dir}\n")), "{conf}");
    wall::image::parse(&conf, "runtime.conf").expect("lw-build reads it");
    let record = read(&d, ".loopwright/runtime/devcontainer.record");
    assert!(
        record.contains(&format!("feature {id} {first}")),
        "{record}"
    );

    // The tag moves: lw init --force takes the new one and says so.
    let second = push(
        &reg,
        "features/hello",
        "1",
        &feature("#!/bin/sh\necho two\n", &[]),
    );
    assert_ne!(first, second);
    let o = lw_init(&d, &reg);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("moved since the last lw init, from {first}")),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        read(&d, &format!("{dir}/install.sh")),
        "#!/bin/sh\necho two\n"
    );

    // Pinned by digest: the first manifest is still there, by its digest.
    let pinned = format!("{}/features/hello@{first}", reg.addr);
    let p = checkout("pinned", &reg, &format!("\"{pinned}\": {{}}"));
    let o = lw_init(&p, &reg);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        read(&p, &format!("{dir}/install.sh")),
        "#!/bin/sh\necho one\n"
    );
    for d in [d, p] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn hostile_features_and_unreachable_registries_are_refused_writing_nothing() {
    let reg = Registry::start("dc-hostile");
    let climbs = feature(
        "#!/bin/sh\n",
        &[("./../../../etc/x", tar::EntryType::Regular, b"x", "")],
    );
    let link = feature(
        "#!/bin/sh\n",
        &[("./lib", tar::EntryType::Symlink, b"", "/etc")],
    );
    push(&reg, "features/climbs", "1", &climbs);
    push(&reg, "features/link", "1", &link);
    let wrong = format!("sha256:{}", "0".repeat(64));
    let closed = build_cache_support::free_port();
    for (name, id, says) in [
        (
            "climbs",
            format!("{}/features/climbs:1", reg.addr),
            "outside the feature's folder",
        ),
        ("link", format!("{}/features/link:1", reg.addr), "a link"),
        (
            "no-tag",
            format!("{}/features/climbs:2", reg.addr),
            "no such feature",
        ),
        (
            "wrong-digest",
            format!("{}/features/climbs@{wrong}", reg.addr),
            "no such feature",
        ),
        (
            "unreachable",
            format!("127.0.0.1:{closed}/features/x:1"),
            "cannot reach",
        ),
    ] {
        let d = checkout(name, &reg, &format!("\"{id}\": {{}}"));
        let o = lw_init(&d, &reg);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(78), "{name}: {e}");
        assert!(e.contains(&format!("features[{id}]")), "{name}: {e}");
        assert!(e.contains(says), "{name}: {e}");
        assert!(e.contains("vendor it"), "{name}: {e}");
        assert!(
            !d.join(".loopwright/runtime").exists(),
            "{name}: nothing written"
        );
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// The fetched feature is built as a layer of its own by lw-build, its
/// options given; a moved tag rebuilds from that layer, the base stays.
#[test]
fn a_fetched_feature_builds_as_its_own_layer_and_a_moved_tag_rebuilds_it() {
    let reg = Registry::start("dc-build");
    let install = "#!/bin/sh\nset -eu\nprintf '#!/bin/sh\\necho %s %s\\n' \"$GREETING\" \"$1\" > /usr/local/bin/hello\nchmod +x /usr/local/bin/hello\n";
    push(
        &reg,
        "features/hello",
        "1",
        &feature(&install.replace("$1", "one"), &[]),
    );
    let p = build_support::Project::new("dc-feature");
    std::fs::remove_dir_all(p.dir.join(".loopwright")).unwrap();
    let id = format!("{}/features/hello:1", reg.addr);
    p.write(
        ".devcontainer/devcontainer.json",
        &format!(
            "{{\"image\": \"{}\", \"features\": {{\"{id}\": {{\"greeting\": \"hey\"}}}}}}",
            build_support::test_image("debian")
        ),
    );
    p.write(
        ".loopwright/config",
        &format!("devcontainer.feature-ca = {}\n", reg.ca.display()),
    );
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&p.dir)
            .status()
            .unwrap()
            .success()
    );
    let init = |p: &build_support::Project| {
        let o = lw_init(&p.dir, &reg);
        assert!(o.status.success(), "{}", stderr(&o));
        let conf = read(&p.dir, ".loopwright/runtime/runtime.conf");
        p.write(
            ".loopwright/runtime/runtime.conf",
            &format!("image {}\n{conf}", p.repo),
        );
    };
    init(&p);
    let layers = p.build_ok();
    let names: Vec<&str> = layers.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["base", "feature-hello", "devcontainer", "deps"]);
    let run = |tag: &str| {
        let o = Command::new("docker")
            .args(["run", "--rm", "--entrypoint", "hello", tag])
            .output()
            .expect("docker runs");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(run(&layers[3].1), "hey one\n");
    push(
        &reg,
        "features/hello",
        "1",
        &feature(&install.replace("$1", "two"), &[]),
    );
    init(&p);
    let again = p.build_ok();
    let states: Vec<&str> = again.iter().map(|(_, _, s)| s.as_str()).collect();
    assert_eq!(states, ["cached", "built", "built", "built"]);
    assert_eq!(run(&again[3].1), "hey two\n");
}

/// A registry as ghcr.io answers a public feature: anonymous bearer tokens
/// (a 401 naming its realm, a token for anyone who asks), and one
/// repository whose manifests answer 500.  Python's TLS server with the
/// test CA's certificate.
const FAKE: &str = r#"
import http.server, json, ssl, sys
port, crt, key, manifest, blob = sys.argv[1:6]
M = open(manifest, 'rb').read(); B = open(blob, 'rb').read()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def send(self, code, body=b'', ctype='application/json', extra={}):
        self.send_response(code)
        self.send_header('Content-Type', ctype)
        self.send_header('Content-Length', str(len(body)))
        for k, v in extra.items(): self.send_header(k, v)
        self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        p = self.path.split('?')[0]
        authed = self.headers.get('Authorization') == 'Bearer tok'
        if p == '/token':
            if self.headers.get('Authorization'): return self.send(400, b'asked with credentials')
            return self.send(200, json.dumps({'token': 'tok'}).encode())
        if not authed:
            return self.send(401, b'{}', extra={'WWW-Authenticate': 'Bearer realm="https://127.0.0.1:%s/token",service="fake"' % port})
        if p == '/v2/': return self.send(200, b'{}')
        if p == '/v2/features/broken/manifests/1': return self.send(500, b'server broke')
        if p == '/v2/features/slow/manifests/1':
            # A byte every half second: no read ever waits a minute.
            self.send_response(200)
            self.send_header('Content-Type', 'application/vnd.oci.image.manifest.v1+json')
            self.send_header('Content-Length', '100000')
            self.end_headers()
            import time
            try:
                while True:
                    self.wfile.write(b' '); self.wfile.flush(); time.sleep(0.5)
            except Exception: return
        if p == '/v2/features/anon/manifests/1': return self.send(200, M, 'application/vnd.oci.image.manifest.v1+json')
        if p.startswith('/v2/features/anon/blobs/'): return self.send(200, B, 'application/octet-stream')
        self.send(404, b'{}')
s = http.server.ThreadingHTTPServer(('127.0.0.1', int(port)), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain(crt, key)
s.socket = c.wrap_socket(s.socket, server_side=True)
print('listening', flush=True)
s.serve_forever()
"#;

#[test]
fn an_anonymous_bearer_registry_serves_a_feature_and_a_500_is_refused() {
    build_cache_support::require("python3", "a fake registry with anonymous tokens");
    let reg = Registry::start("dc-anon");
    let layer = feature("#!/bin/sh\necho anon\n", &[]);
    let ld = format!("sha256:{}", base::digest::sha256_hex(&layer));
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.devcontainers", "digest": format!("sha256:{}", base::digest::sha256_hex(b"{}")), "size": 2},
        "layers": [{"mediaType": LAYER_TYPE, "digest": ld, "size": layer.len()}],
    })
    .to_string();
    std::fs::write(reg.dir.join("fake-manifest"), &manifest).unwrap();
    std::fs::write(reg.dir.join("fake-blob"), &layer).unwrap();
    let port = build_cache_support::free_port();
    let mut fake = Fake(
        Command::new("python3")
            .arg("-c")
            .arg(FAKE)
            .arg(port.to_string())
            .arg(reg.dir.join("server.crt"))
            .arg(reg.dir.join("server.key"))
            .arg(reg.dir.join("fake-manifest"))
            .arg(reg.dir.join("fake-blob"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 runs"),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(fake.0.stdout.take().expect("piped")),
        &mut line,
    )
    .expect("the fake registry says it listens");
    assert_eq!(line.trim(), "listening");
    // No credentials anywhere: an empty Docker configuration.
    let empty = reg.dir.join("docker-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let run = |id: &str| {
        let d = checkout(
            &format!("anon-{}", id.len()),
            &reg,
            &format!("\"{id}\": {{}}"),
        );
        let o = lw_init_with(&d, &empty);
        (d, o)
    };
    let (d, o) = run(&format!("127.0.0.1:{port}/features/anon:1"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        read(&d, ".loopwright/runtime/features/anon/install.sh"),
        "#!/bin/sh\necho anon\n"
    );
    std::fs::remove_dir_all(&d).unwrap();
    let id = format!("127.0.0.1:{port}/features/broken:1");
    let (d, o) = run(&id);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(
        e.contains(&format!("features[{id}]: cannot fetch it:"))
            && e.contains("HTTP 500")
            && e.contains("server broke"),
        "{e}"
    );
    assert!(!d.join(".loopwright/runtime").exists());
    std::fs::remove_dir_all(&d).unwrap();

    // A registry that trickles its answer a byte every half second never
    // lets a read wait; devcontainer.fetch-timeout bounds the request.
    let id = format!("127.0.0.1:{port}/features/slow:1");
    let d = checkout("slow", &reg, &format!("\"{id}\": {{}}"));
    let conf = d.join(".loopwright/config");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}devcontainer.fetch-timeout = 2s\n")).unwrap();
    let t = std::time::Instant::now();
    let o = lw_init_with(&d, &empty);
    let took = t.elapsed();
    let e = stderr(&o);
    println!("a trickling registry: lw init ended in {took:.1?} with a 2 s fetch-timeout");
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(
        e.contains(&format!("features[{id}]")) && e.contains("vendor it"),
        "{e}"
    );
    assert!(took < std::time::Duration::from_secs(20), "{took:?}: {e}");
    assert!(!d.join(".loopwright/runtime").exists());
    // A bad value is named.
    std::fs::write(&conf, format!("{text}devcontainer.fetch-timeout = soon\n")).unwrap();
    let o = lw_init(&d, &reg);
    assert_eq!(o.status.code(), Some(78), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("devcontainer.fetch-timeout = soon"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A feature's `dependsOn` that the configuration does not list is fetched
/// (the reference's rule) with the options it gives, and installs first; a
/// chain longer than the bound, a circle and a missing one are refused,
/// writing nothing.
#[test]
fn a_depends_on_not_listed_is_fetched_with_its_options_and_installs_first() {
    let reg = Registry::start("dc-depends");
    let base_meta = r#"{"id": "base", "version": "1.0.0", "options": {"flavor": {"type": "string", "default": "plain"}}}"#;
    let base_digest = push(
        &reg,
        "features/base",
        "1",
        &feature_of(base_meta, "#!/bin/sh\necho base\n"),
    );
    let base_id = format!("{}/features/base:1", reg.addr);
    let app_meta = format!(
        r#"{{"id": "app", "version": "1.0.0", "dependsOn": {{"{base_id}": {{"flavor": "spicy"}}}}}}"#
    );
    push(
        &reg,
        "features/app",
        "1",
        &feature_of(&app_meta, "#!/bin/sh\necho app\n"),
    );
    let app_id = format!("{}/features/app:1", reg.addr);
    let d = checkout("depends", &reg, &format!("\"{app_id}\": {{}}"));
    let o = lw_init(&d, &reg);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(&format!("added as a dependsOn of {app_id}")),
        "{e}"
    );
    let df = read(&d, ".loopwright/runtime/feature-base.Dockerfile");
    assert!(
        df.contains("FLAVOR='spicy'") && df.contains(&base_digest),
        "{df}"
    );
    let conf = read(&d, ".loopwright/runtime/runtime.conf");
    let (b, a) = (
        conf.find("layer feature-base"),
        conf.find("layer feature-app"),
    );
    assert!(
        b.is_some() && a.is_some() && b < a,
        "base before app:\n{conf}"
    );
    wall::image::parse(&conf, "runtime.conf").expect("lw-build reads it");
    let record = read(&d, ".loopwright/runtime/devcontainer.record");
    assert!(
        record.contains(&format!("feature {base_id} {base_digest}")),
        "{record}"
    );
    std::fs::remove_dir_all(&d).unwrap();

    // A chain: each link depends on the next, past the bound.
    let links = loopwright::init::devcontainer::MAX_FEATURES + 8;
    for i in 0..links {
        let next = format!("{}/features/chain-{}:1", reg.addr, i + 1);
        let meta = format!(
            r#"{{"id": "chain-{i}", "version": "1.0.0", "dependsOn": {{"{next}": {{}}}}}}"#
        );
        push(
            &reg,
            &format!("features/chain-{i}"),
            "1",
            &feature_of(&meta, "#!/bin/sh\n"),
        );
    }
    // A circle of two, and a dependsOn of a feature the registry lacks.
    for (me, other) in [
        ("ring-a", "ring-b"),
        ("ring-b", "ring-a"),
        ("lonely", "nowhere"),
    ] {
        let meta = format!(
            r#"{{"id": "{me}", "version": "1.0.0", "dependsOn": {{"{}/features/{other}:1": {{}}}}}}"#,
            reg.addr
        );
        push(
            &reg,
            &format!("features/{me}"),
            "1",
            &feature_of(&meta, "#!/bin/sh\n"),
        );
    }
    for (name, first, says) in [
        (
            "chain",
            "chain-0",
            format!("more than {}", loopwright::init::devcontainer::MAX_FEATURES),
        ),
        ("ring", "ring-a", "form a circle".to_string()),
        (
            "lonely",
            "lonely",
            format!("features[{}/features/nowhere:1]", reg.addr),
        ),
    ] {
        let id = format!("{}/features/{first}:1", reg.addr);
        let d = checkout(name, &reg, &format!("\"{id}\": {{}}"));
        let o = lw_init(&d, &reg);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(78), "{name}: {e}");
        assert!(e.contains(&says), "{name}: {e}");
        assert!(
            !d.join(".loopwright/runtime").exists(),
            "{name}: nothing written"
        );
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// The fake registry, stopped on drop (a failed test's too).
struct Fake(std::process::Child);

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
