//! Issue 21: the image cache off the machine.  Engine A (the shared dockerd)
//! builds and pushes to a TLS, htpasswd-protected `docker-registry`; engine B
//! (a second dockerd started here) pulls every layer and builds none, runs a
//! container from them, then pulls what it can after an input changed and
//! builds one layer; a tampered tag is refused.  Prints the figures.
//! The second test is the bad input: registry down, wrong credentials, a
//! truncated archive.

use support::build as build_support;
use support::registry as build_cache_support;

use std::process::Output;
use std::time::Instant;

use build_cache_support::*;
use build_support::{Project, image_id, lw_build, stderr, stdout, test_image};
use serde_json::Value;

const BASE: &str = "ARG LW_PARENT\nFROM ${LW_PARENT}\nRUN dd if=/dev/urandom of=/base.bin bs=1024 count=4096 2>/dev/null\n";
const TOOLCHAIN: &str = "ARG LW_PARENT\nFROM ${LW_PARENT}\nRUN echo tool > /tool && dd if=/dev/urandom of=/tool.bin bs=1024 count=2048 2>/dev/null\n";
const DEPS: &str =
    "ARG LW_PARENT\nFROM ${LW_PARENT}\nCOPY deps.lock /deps.lock\nRUN cat /deps.lock > /deps.out\n";

fn project(tag: &str) -> Project {
    let p = Project::new(tag);
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!(
            "image {}\nfrom {}\n\nlayer base\n    dockerfile base.Dockerfile\nlayer toolchain\n    dockerfile toolchain.Dockerfile\nlayer deps\n    dockerfile deps.Dockerfile\n    input deps.lock\n",
            p.repo,
            test_image("busybox")
        ),
    );
    p.write("base.Dockerfile", BASE);
    p.write("toolchain.Dockerfile", TOOLCHAIN);
    p.write("deps.Dockerfile", DEPS);
    p.write("deps.lock", "deps 1\n");
    p
}

/// Runs lw-build with `args` in `p` against engine `host` (None: the shared
/// one) and the Docker configuration `config`.
fn lw(p: &Project, host: Option<&str>, config: &std::path::Path, args: &[&str]) -> Output {
    let mut env: Vec<(&str, &str)> = vec![("DOCKER_CONFIG", config.to_str().expect("utf-8"))];
    if let Some(h) = host {
        env.push(("DOCKER_HOST", h));
    }
    p.lw_build_env(args, &env)
}

fn records(o: &Output) -> Vec<Value> {
    assert!(
        o.status.success(),
        "lw-build failed ({:?}): {}",
        o.status.code(),
        stderr(o)
    );
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("JSON line {l:?}: {e}")))
        .collect()
}

fn states(v: &[Value]) -> Vec<String> {
    v.iter()
        .map(|r| r["state"].as_str().unwrap_or("?").to_string())
        .collect()
}

#[test]
fn layers_travel_between_engines_through_the_registry() {
    let reg = Registry::start("flow");
    let b = EngineB::start();
    let busybox = test_image("busybox");
    b.copy_from_shared(&busybox);
    let p = project("cache");
    let cache = reg.cache("lw/layers");
    let ca = reg.ca.to_str().expect("utf-8").to_string();
    // Subcommands first: the options follow them.
    let with_cache = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        a.extend([
            "--cache".into(),
            cache.clone(),
            "--cache-ca".into(),
            ca.clone(),
        ]);
        a
    };
    let good = reg.good_config.clone();
    let run = |host: Option<&str>, args: Vec<String>| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        lw(&p, host, &good, &a)
    };

    // A cold build on B, with no cache, for the figures; then B forgets it.
    let t = Instant::now();
    let cold = records(&run(
        Some(&b.host),
        vec!["--json".into(), "--cache".into(), String::new()],
    ));
    let cold_b = t.elapsed();
    assert_eq!(states(&cold), ["built", "built", "built"]);
    b.remove_images(&p.repo);

    // A builds (the cache is empty: every layer is built) and pushes.
    let a_built = records(&run(None, with_cache(&["--json"])));
    assert_eq!(states(&a_built), ["built", "built", "built"]);
    let pushed = records(&run(None, with_cache(&["push", "--json"])));
    assert_eq!(states(&pushed), ["pushed", "pushed", "pushed"]);
    assert!(
        pushed.iter().all(|r| r["bytes"].as_u64() > Some(0)),
        "{pushed:?}"
    );
    let again = records(&run(None, with_cache(&["push", "--json"])));
    assert_eq!(states(&again), ["present", "present", "present"]);

    // B: explain says every layer would be pulled; the build pulls them all.
    let ex = records(&run(Some(&b.host), with_cache(&["--explain", "--json"])));
    assert_eq!(states(&ex), ["to-pull", "to-pull", "to-pull"]);
    let t = Instant::now();
    let warm = records(&run(Some(&b.host), with_cache(&["--json"])));
    let warm_b = t.elapsed();
    assert_eq!(
        states(&warm),
        ["pulled", "pulled", "pulled"],
        "B builds none"
    );
    for (w, a) in warm.iter().zip(&a_built) {
        assert_eq!(w["id"], a["id"], "B holds the very image A built");
    }
    let pulled: u64 = warm.iter().map(|r| r["bytes"].as_u64().unwrap_or(0)).sum();
    let final_tag = warm[2]["tag"].as_str().expect("tag").to_string();
    let size: u64 = String::from_utf8_lossy(
        &b.docker(&["image", "inspect", "-f", "{{.Size}}", &final_tag])
            .stdout,
    )
    .trim()
    .parse()
    .expect("image size");
    // A container from the pulled layers.
    let o = b.docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        &final_tag,
        "cat",
        "/tool",
        "/deps.out",
    ]);
    assert!(o.status.success(), "container on B: {}", stderr(&o));
    assert_eq!(stdout(&o), "tool\ndeps 1\n");
    let again = records(&run(Some(&b.host), with_cache(&["--json"])));
    assert_eq!(states(&again), ["cached", "cached", "cached"]);

    // One input changes: B pulls what the cache has and builds one layer.
    p.write("deps.lock", "deps 2\n");
    b.remove_images(&p.repo);
    let changed = records(&run(Some(&b.host), with_cache(&["--json"])));
    assert_eq!(states(&changed), ["pulled", "pulled", "built"]);

    // A tampered tag: the cache's base tag now holds the toolchain image.
    let client = reg.client("lw/layers");
    let rtag =
        |layer: &str, tag: &str| format!("{layer}-{}", tag.rsplit(':').next().expect("hash"));
    let base_remote = rtag("base", warm[0]["tag"].as_str().expect("tag"));
    let tool_remote = rtag("toolchain", warm[1]["tag"].as_str().expect("tag"));
    let (mt, bytes) = client
        .manifest_bytes(&tool_remote)
        .expect("registry answers")
        .expect("toolchain is there");
    client
        .put_manifest_bytes(&base_remote, &mt, &bytes)
        .expect("tamper");
    b.remove_images(&p.repo);
    let out = run(Some(&b.host), with_cache(&["--json"]));
    let tampered = records(&out);
    assert_eq!(states(&tampered), ["built", "pulled", "built"]);
    assert_eq!(
        tampered[0]["state"], "built",
        "the tampered base is refused and built"
    );
    assert!(
        tampered[0]["refused"]
            .as_str()
            .unwrap_or("")
            .contains("label records input hash"),
        "{:?}",
        tampered[0]
    );
    let refused = tampered
        .iter()
        .filter(|r| r.get("refused").is_some())
        .count();
    assert_eq!(refused, 1, "{tampered:?}");
    assert!(
        stderr(&out).contains("warning: refused"),
        "{}",
        stderr(&out)
    );

    let ratio = warm_b.as_secs_f64() / cold_b.as_secs_f64();
    println!(
        "figures: B cold build {:.2}s, B with a warm registry {:.2}s (ratio {ratio:.2}); \
         bytes pulled {pulled} vs image size {size} ({:.0}%); layers built on B with a warm registry: 0; \
         tampered tags refused: {refused} of 1",
        cold_b.as_secs_f64(),
        warm_b.as_secs_f64(),
        100.0 * pulled as f64 / size as f64
    );
    assert!(
        warm_b < cold_b,
        "pulling ({warm_b:?}) is faster than building ({cold_b:?})"
    );
}

fn one_layer(tag: &str) -> Project {
    let p = Project::new(tag);
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!(
            "image {}\nfrom {}\nlayer base\n    dockerfile base.Dockerfile\n    input in.txt\n",
            p.repo,
            test_image("busybox")
        ),
    );
    p.write(
        "base.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nCOPY in.txt /in.txt\n",
    );
    p.write("in.txt", &format!("{}\n", p.repo));
    p
}

#[test]
fn bad_cache_input_is_survived() {
    let reg = Registry::start("bad");
    let p = one_layer("cachebad");
    let ca = reg.ca.to_str().expect("utf-8");

    // Registry down: warn, build locally, exit 0.
    let down = format!("127.0.0.1:{}/lw/layers", free_port());
    let o = lw(
        &p,
        None,
        &reg.good_config,
        &["--cache", &down, "--cache-ca", ca],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).ends_with(" built\n"), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("warning: cannot reach the image cache at 127.0.0.1:"),
        "{}",
        stderr(&o)
    );
    let tag = stdout(&o)
        .split_whitespace()
        .nth(1)
        .expect("tag")
        .to_string();

    // Wrong credentials: 77, naming the registry (pull, build, push).
    let cache = reg.cache("lw/layers");
    let docker_rmi = |t: &str| {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", t])
            .output();
    };
    docker_rmi(&tag);
    for args in [vec![], vec!["push"], vec!["pull"]] {
        let mut a: Vec<&str> = args.clone();
        a.extend(["--cache", &cache, "--cache-ca", ca]);
        let o = lw(&p, None, &reg.bad_config, &a);
        if args == ["push"] {
            // Nothing to push before a build: 66 comes first.
            assert_eq!(o.status.code(), Some(66), "{}", stderr(&o));
            continue;
        }
        assert_eq!(o.status.code(), Some(77), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(&reg.addr), "{}", stderr(&o));
        assert!(stderr(&o).contains("docker login"), "{}", stderr(&o));
    }
    // A CA the registry's certificate is not from: unreachable, build on.
    let o = lw(&p, None, &reg.good_config, &["--cache", &cache]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: cannot reach"),
        "{}",
        stderr(&o)
    );
    let o = lw(
        &p,
        None,
        &reg.bad_config,
        &["push", "--cache", &cache, "--cache-ca", ca],
    );
    assert_eq!(o.status.code(), Some(77), "{}", stderr(&o));

    // save, then a truncated archive: 65 and nothing loaded; the whole one loads.
    let file = p.dir.join("layers.tar");
    let o = lw(
        &p,
        None,
        &reg.good_config,
        &["save", file.to_str().expect("utf-8")],
    );
    assert!(o.status.success(), "save: {}", stderr(&o));
    assert!(stdout(&o).contains(&tag), "{}", stdout(&o));
    let whole = std::fs::read(&file).expect("archive");
    let cut = p.dir.join("cut.tar");
    std::fs::write(&cut, &whole[..whole.len() / 2]).expect("write cut");
    docker_rmi(&tag);
    let o = std::process::Command::new(lw_build())
        .args(["load", cut.to_str().expect("utf-8")])
        .output()
        .expect("lw-build runs");
    assert_eq!(o.status.code(), Some(65), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing was loaded"), "{}", stderr(&o));
    assert_eq!(image_id(&tag), None, "nothing half-loaded");
    let o = std::process::Command::new(lw_build())
        .args(["load", file.to_str().expect("utf-8")])
        .output()
        .expect("lw-build runs");
    assert!(o.status.success(), "load: {}", stderr(&o));
    assert!(image_id(&tag).is_some());
    let o = lw(&p, None, &reg.good_config, &["--cache", ""]);
    assert_eq!(stdout(&o), format!("base {tag} cached\n"));

    // lw doctor: the cache named in .loopwright/config is reachable and the
    // credentials work; wrong ones fail, naming docker login.
    run_ok("git", &["init", "-q"], &p.dir);
    p.write(
        ".loopwright/config",
        &format!("build.cache = {cache}\nbuild.cache-ca = {ca}\n"),
    );
    let doctor = |config: &std::path::Path| -> Value {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_lw-doctor"))
            .args(["--json", "-C", p.dir.to_str().expect("utf-8")])
            .env("DOCKER_CONFIG", config)
            .output()
            .expect("lw-doctor runs");
        stdout(&o)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["check"] == "image-cache")
            .unwrap_or_else(|| panic!("an image-cache finding: {}", stdout(&o)))
    };
    let ok = doctor(&reg.good_config);
    assert_eq!(ok["status"], "ok", "{ok}");
    let bad = doctor(&reg.bad_config);
    assert_eq!(bad["status"], "fail", "{bad}");
    assert!(
        bad["detail"].as_str().unwrap_or("").contains(&reg.addr),
        "{bad}"
    );
    // And lw-build reads the same setting.
    let o = lw(&p, None, &reg.good_config, &["--explain"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("base "), "{}", stdout(&o));

    // A credential helper named in credHelpers answers for the registry.
    let helper_dir = p.dir.join("helper");
    std::fs::create_dir_all(&helper_dir).expect("helper dir");
    let script = helper_dir.join("docker-credential-lwtest");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nread host\n[ \"$host\" = {addr} ] || exit 1\necho '{{\"Username\":\"{user}\",\"Secret\":\"{pw}\"}}'\n",
            addr = reg.addr,
            user = reg.user,
            pw = reg.password
        ),
    )
    .expect("helper");
    run_ok("chmod", &["755", script.to_str().expect("utf-8")], &p.dir);
    std::fs::write(
        helper_dir.join("config.json"),
        format!("{{\"credHelpers\": {{\"{}\": \"lwtest\"}}}}", reg.addr),
    )
    .expect("config.json");
    let path = format!(
        "{}:{}",
        helper_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = p.lw_build_env(
        &["pull"],
        &[
            ("DOCKER_CONFIG", helper_dir.to_str().expect("utf-8")),
            ("PATH", &path),
        ],
    );
    assert!(
        o.status.success(),
        "pull with a credential helper: {}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), format!("base {tag} cached\n"));
}
