//! The devcontainer corpus (#44): configurations of real shapes under
//! tests/devcontainer/, each with what lw init takes, refuses and writes
//! (expect.txt), and the reference implementation's reading of it
//! (reference.json, recorded by scripts/devcontainer-reference from
//! @devcontainers/cli).  `LW_BLESS=1 cargo test --test build devcontainer::`
//! rewrites expect.txt after a deliberate change; read the diff.

use std::path::{Path, PathBuf};
use std::process::Command;

use loopwright::init::devcontainer::{self, Mapping, render, vars};
use serde_json::Value;

struct Case {
    name: String,
    dir: PathBuf,
    config: Option<String>,
    allow: Vec<String>,
    env: Vec<(String, String)>,
}

fn cases() -> Vec<Case> {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/devcontainer");
    let mut v: Vec<Case> = std::fs::read_dir(&corpus)
        .expect("the corpus is there")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let dir = e.path();
            let spec = std::fs::read_to_string(dir.join("case")).unwrap_or_default();
            let mut c = Case {
                name: e.file_name().to_string_lossy().into_owned(),
                dir,
                config: None,
                allow: vec![],
                env: vec![],
            };
            for l in spec.lines() {
                match l.split_once(' ') {
                    Some(("config", p)) => c.config = Some(p.to_string()),
                    Some(("allow", names)) => {
                        c.allow.extend(names.split_whitespace().map(str::to_string));
                    }
                    Some(("env", kv)) => {
                        let (k, v) = kv.split_once('=').expect("env NAME=VALUE");
                        c.env.push((k.to_string(), v.to_string()));
                    }
                    _ => panic!("{}: bad case line '{l}'", c.name),
                }
            }
            c
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(v.len() >= 10, "the corpus holds {} cases", v.len());
    v
}

fn lookup(env: &[(String, String)], n: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
}

/// The configuration a case uses, or the error choosing it.
fn chosen(c: &Case) -> Result<String, String> {
    match devcontainer::choose(&c.dir, c.config.as_deref().map(Path::new)) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err("no configuration".into()),
        Err(e) => Err(format!("error {}: {}", e.exit.code(), e.msg)),
    }
}

fn mapping(c: &Case, rel: &str, local: &str, container: &str, allowed: &[String]) -> Mapping {
    let env = |n: &str| lookup(&c.env, n);
    let cx = vars::Context {
        local_folder: local,
        container_folder: container,
        allowed,
        local_env: &env,
    };
    devcontainer::load_with(&c.dir, rel, &cx).expect("the case reads")
}

/// What lw init says and writes for a case, as expect.txt holds it.
fn plan_text(c: &Case) -> String {
    let rel = match chosen(c) {
        Ok(r) => r,
        Err(e) => return format!("{e}\n"),
    };
    let local = format!("/home/me/src/{}", c.name);
    let m = mapping(c, &rel, &local, "/work/repo", &c.allow);
    let mut out = devcontainer::report(&m).join("\n") + "\n";
    if let Some(e) = devcontainer::refusal_error(&m) {
        out.push_str(&format!("error {}: {}\n", e.exit.code(), e.msg));
        return out;
    }
    let from = m
        .base_image()
        .expect("a mapping without a fatal refusal has an image");
    out.push_str(
        render::config_lines(&m, &[])
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| format!("config: {l}\n"))
            .collect::<String>()
            .as_str(),
    );
    let deps = loopwright::init::deps_inputs(&c.dir);
    for (path, bytes, mode) in render::files(&m, &from, &deps, "DIGEST") {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if path.ends_with("runtime.conf") {
            wall::image::parse(&text, &path).expect("lw-build reads the runtime.conf");
        }
        let kept = [
            "runtime.conf",
            "devcontainer.Dockerfile",
            "deps.sh",
            "deps.Dockerfile",
        ];
        if !(kept.iter().any(|k| path.ends_with(k)) || path.contains("/feature-")) {
            continue;
        }
        out.push_str(&format!("== {path} ({mode:o})\n"));
        for l in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

#[test]
fn each_configuration_gets_its_expected_plan_or_refusal() {
    let bless = std::env::var_os("LW_BLESS").is_some();
    let mut wrong = Vec::new();
    for c in cases() {
        let got = plan_text(&c);
        let file = c.dir.join("expect.txt");
        if bless {
            std::fs::write(&file, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&file).unwrap_or_default();
        if got != want {
            eprintln!("--- {}: expected\n{want}--- got\n{got}", c.name);
            wrong.push(c.name);
        }
    }
    assert!(wrong.is_empty(), "plans differ from expect.txt: {wrong:?}");
}

/// A value of ours written as the reference writes it (with
/// `${containerEnv:…}` left for the container).
fn spelled(pieces: &[vars::Piece]) -> String {
    pieces
        .iter()
        .map(|p| match p {
            vars::Piece::Text(t) => t.clone(),
            vars::Piece::ContainerEnv {
                name,
                default: None,
            } => format!("${{containerEnv:{name}}}"),
            vars::Piece::ContainerEnv {
                name,
                default: Some(d),
            } => format!("${{containerEnv:{name}:{d}}}"),
        })
        .collect()
}

fn commands_of(m: &Mapping, hook: &str) -> Option<Value> {
    let steps: Vec<_> = m.steps.iter().filter(|s| s.hook == hook).collect();
    let one = |c: &devcontainer::Command| match c {
        devcontainer::Command::Shell(s) => Value::String(s.clone()),
        devcontainer::Command::Exec(a) => a.iter().cloned().map(Value::String).collect(),
    };
    match steps.as_slice() {
        [] => None,
        [s] if s.name.is_none() => Some(one(&s.command)),
        many => Some(Value::Object(
            many.iter()
                .map(|s| (s.name.clone().unwrap_or_default(), one(&s.command)))
                .collect(),
        )),
    }
}

/// With every host variable allowed, loopwright reads each configuration
/// as the reference does: the image, both environments, the user, the
/// ports and the lifecycle commands.  (By default it refuses host
/// variables, which the reference substitutes: the plans above.)
#[test]
fn the_reading_matches_the_reference_implementation() {
    let mut compared = 0;
    for c in cases() {
        let Ok(text) = std::fs::read_to_string(c.dir.join("reference.json")) else {
            continue;
        };
        let r: Value = serde_json::from_str(&text).unwrap();
        let conf = &r["configuration"];
        let ws = r["workspace"]["workspaceFolder"].as_str().unwrap();
        let rel = chosen(&c).expect("the reference read it");
        let mut env = c.env.clone();
        env.push(("HOME".into(), "/home/ref".into()));
        let all: Vec<String> = env
            .iter()
            .map(|(k, _)| k.clone())
            .chain(c.allow.clone())
            .collect();
        let c2 = Case { env, ..c };
        let local = format!("/tmp/lw-dc-ref/{}", c2.name);
        let m = mapping(&c2, &rel, &local, ws, &all);
        let name = &c2.name;
        assert_eq!(m.image.as_deref(), conf["image"].as_str(), "{name}: image");
        for (key, remote) in [("containerEnv", false), ("remoteEnv", true)] {
            let theirs = conf[key].as_object().cloned().unwrap_or_default();
            for (k, v) in &theirs {
                match m.env.iter().find(|e| e.remote == remote && &e.name == k) {
                    Some(e) => assert_eq!(
                        Some(spelled(&e.value).as_str()),
                        v.as_str(),
                        "{name}: {key}.{k}"
                    ),
                    None => assert!(
                        m.refused.iter().any(|f| f.key == format!("{key}.{k}")),
                        "{name}: {key}.{k} neither taken nor refused"
                    ),
                }
            }
            let ours = m.env.iter().filter(|e| e.remote == remote).count();
            assert!(
                ours <= theirs.len(),
                "{name}: {key} has more than the reference's"
            );
        }
        let user = conf["remoteUser"]
            .as_str()
            .or(conf["containerUser"].as_str());
        assert_eq!(m.user.as_deref(), user, "{name}: user");
        let mut ports: Vec<u16> = conf["forwardPorts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_u64().or_else(|| p.as_str()?.parse().ok()))
            .map(|p| p as u16)
            .collect();
        ports.dedup();
        ports.sort();
        ports.dedup();
        let mut mine: Vec<u16> = m.ports.iter().map(|p| p.port).collect();
        mine.sort();
        assert_eq!(mine, ports, "{name}: ports");
        for hook in devcontainer::HOOKS {
            assert_eq!(
                commands_of(&m, hook),
                conf.get(*hook).cloned(),
                "{name}: {hook}"
            );
        }
        compared += 1;
    }
    eprintln!("compared {compared} configurations with the reference's reading");
    assert!(compared >= 10, "only {compared} reference recordings");
}

fn lw_init(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lw-init"))
        .args(args)
        .arg("--ca")
        .arg("none")
        .arg("--from")
        .arg("debian:bookworm-slim")
        .arg(dir)
        .env(
            "AWS_SECRET_ACCESS_KEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        )
        .output()
        .expect("lw-init runs")
}

/// A case copied into a fresh git repository.
fn repo(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lw-dc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/devcontainer")
        .join(name);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&d)
        .status()
        .unwrap()
        .success()
        && Command::new("git")
            .arg("init")
            .arg("-q")
            .arg(&d)
            .status()
            .unwrap()
            .success();
    assert!(ok, "copy {name}");
    d
}

#[test]
fn lw_init_refuses_a_hostile_secret_and_a_guess_writing_nothing() {
    let d = repo("hostile-secret");
    let o = lw_init(&d, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains("${localEnv:AWS_SECRET_ACCESS_KEY} is not substituted"),
        "{err}"
    );
    assert!(
        err.contains("devcontainer.local-env = AWS_SECRET_ACCESS_KEY"),
        "{err}"
    );
    assert!(
        !err.contains("wJalrXUtnFEMI"),
        "the secret is never printed: {err}"
    );
    assert!(!d.join(".loopwright").exists(), "nothing written");
    std::fs::remove_dir_all(&d).unwrap();

    let d = repo("several");
    let o = lw_init(&d, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.contains(
            ".devcontainer/node/devcontainer.json, .devcontainer/python/devcontainer.json"
        ),
        "{err}"
    );
    assert!(!d.join(".loopwright").exists(), "nothing written");
    let o = lw_init(
        &d,
        &["--devcontainer", ".devcontainer/python/devcontainer.json"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let deps = std::fs::read_to_string(d.join(".loopwright/runtime/deps.sh")).unwrap();
    assert!(deps.contains("/bin/sh -c 'pip install -e .'"), "{deps}");
    let rec = std::fs::read_to_string(d.join(devcontainer::RECORD)).unwrap();
    assert!(
        rec.contains("source .devcontainer/python/devcontainer.json\n"),
        "{rec}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn lw_init_takes_a_wide_configuration_narrowed_and_says_what_it_refused() {
    let d = repo("privileged");
    let o = lw_init(&d, &["--input", "README"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(66),
        "an --input that is not there: {err}"
    );
    assert!(err.contains("--input 'README'"), "{err}");
    let o = lw_init(&d, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    for refused in [
        "refused privileged: the wall",
        "refused capAdd: the wall",
        "refused securityOpt: the wall",
        "refused mounts[0] (bind): the wall",
        "refused runArgs --network=host: the wall",
        "refused initializeCommand: it runs on the host",
    ] {
        assert!(err.contains(refused), "{refused}: {err}");
    }
    let conf = std::fs::read_to_string(d.join(".loopwright/runtime/runtime.conf")).unwrap();
    assert!(
        conf.contains("\nfrom debian:bookworm-slim\n"),
        "--from wins: {conf}"
    );
    // lw doctor names the configuration and what of it was ignored, then
    // that it changed since lw init.
    let doctor = |d: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_lw-doctor"))
            .args(["--json", "-C"])
            .arg(d)
            .env_remove("LW_ROOT")
            .output()
            .expect("lw-doctor runs");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|f| f["check"] == "devcontainer")
            .expect("a devcontainer finding")
    };
    let f = doctor(&d);
    assert_eq!(f["status"], "ok", "{f}");
    let detail = f["detail"].as_str().unwrap();
    assert!(
        detail.contains("the runtime comes from .devcontainer/devcontainer.json; ignored: capAdd, initializeCommand, mounts[0] (bind)"),
        "{detail}"
    );
    let p = d.join(".devcontainer/devcontainer.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replace("docker:27-dind", "docker:28-dind")).unwrap();
    let f = doctor(&d);
    assert_eq!(f["status"], "warn", "{f}");
    assert!(
        f["detail"].as_str().unwrap().contains("which changed"),
        "{f}"
    );
    assert!(
        f["fix"].as_str().unwrap().contains("lw init --force"),
        "{f}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A scratch checkout holding one devcontainer.json.
fn scratch(name: &str, config: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lw-dc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join(".devcontainer")).unwrap();
    std::fs::write(d.join(".devcontainer/devcontainer.json"), config).unwrap();
    d
}

/// deps.sh for the configuration in `d`, run on this host in `d`.
fn run_deps(d: &Path) -> std::process::Output {
    let c = Case {
        name: "scratch".into(),
        dir: d.to_path_buf(),
        config: None,
        allow: vec![],
        env: vec![],
    };
    let m = mapping(
        &c,
        ".devcontainer/devcontainer.json",
        "/x",
        "/work/repo",
        &[],
    );
    std::fs::write(d.join("deps.sh"), render::deps_script(&m)).unwrap();
    Command::new("sh")
        .arg(d.join("deps.sh"))
        .arg(d)
        .output()
        .expect("sh runs")
}

/// The object form's commands run in parallel, as the specification runs
/// them: each of 50 waits until all 50 have started (run one after
/// another, the first would wait for ever and fail), every output is
/// shown, and the failures are named together with their status.
#[test]
fn fifty_object_form_commands_run_in_parallel_and_failures_are_named() {
    let n = 50;
    let mut cmds = serde_json::Map::new();
    for i in 0..n {
        let fail = if i % 17 == 3 {
            format!(" && exit {}", 10 + i)
        } else {
            String::new()
        };
        cmds.insert(
            format!("c{i:02}"),
            Value::String(format!(
                "mkdir -p started && touch started/{i}; t=0; while [ $(ls started | wc -l) -lt {n} ] && [ $t -lt 600 ]; do sleep 0.05; t=$((t+1)); done; [ $(ls started | wc -l) -ge {n} ] || {{ echo alone; exit 99; }}; echo out-{i}{fail}"
            )),
        );
    }
    let conf = serde_json::json!({"image": "debian:bookworm-slim", "postCreateCommand": cmds, "onCreateCommand": "echo first > order"});
    let d = scratch("fifty", &conf.to_string());
    let t = std::time::Instant::now();
    let o = run_deps(&d);
    let err = String::from_utf8_lossy(&o.stderr);
    println!(
        "figure: {n} parallel commands ran in {:.2} s, exit {:?}",
        t.elapsed().as_secs_f64(),
        o.status.code()
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("alone"), "a command ran alone: {err}");
    for i in 0..n {
        assert!(
            err.contains(&format!("out-{i}\n")),
            "output of c{i:02}: {err}"
        );
    }
    assert!(
        err.contains("deps.sh: failed: postCreateCommand (c03) (exit 13), postCreateCommand (c20) (exit 30), postCreateCommand (c37) (exit 47)"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(d.join("order")).unwrap(), "first\n");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A failing command stops the script, named with its status; the hooks
/// after it do not run.
#[test]
fn a_failing_lifecycle_command_is_named_and_stops_the_rest() {
    let d = scratch(
        "fails",
        r#"{"image": "x", "onCreateCommand": ["sh", "-c", "exit 7"], "postCreateCommand": "touch ran"}"#,
    );
    let o = run_deps(&d);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(
        err.contains("deps.sh: onCreateCommand failed (exit 7)"),
        "{err}"
    );
    assert!(!d.join("ran").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// postStartCommand is not the deps layer's: deps.sh does not run it; its
/// script is the devcontainer layer's label, a JSON string the Dockerfile's
/// quoting keeps whole ($, quotes, backslashes, lines); the object form
/// runs its commands side by side and names the one that failed.
#[test]
fn post_start_is_a_label_not_a_deps_step_and_names_its_failure() {
    let d = scratch(
        "poststart",
        r#"{"image": "x", "postCreateCommand": "touch created",
            "postStartCommand": {"ok": "echo \"$HOME\" \\ 'q' > ok", "bad": ["sh", "-c", "exit 4"]}}"#,
    );
    let o = run_deps(&d);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(d.join("created").exists() && !d.join("ok").exists());
    let c = Case {
        name: "scratch".into(),
        dir: d.clone(),
        config: None,
        allow: vec![],
        env: vec![],
    };
    let m = mapping(
        &c,
        ".devcontainer/devcontainer.json",
        "/x",
        "/work/repo",
        &[],
    );
    let df = render::devcontainer_dockerfile(&m);
    let label = df
        .lines()
        .find_map(|l| l.strip_prefix("LABEL org.loopwright.post-start="))
        .expect("the layer labels the image");
    // The Dockerfile's double-quoted word, as the engine reads it.
    let inner = label
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .unwrap();
    let mut word = String::new();
    let mut chars = inner.chars();
    while let Some(ch) = chars.next() {
        word.push(if ch == '\\' {
            chars.next().unwrap()
        } else {
            ch
        });
    }
    let script: String = serde_json::from_str(&word).expect("a JSON string");
    assert_eq!(Some(script.clone()), render::post_start_script(&m));
    let o = Command::new("sh")
        .args(["-c", &script])
        .current_dir(&d)
        .env("HOME", "/h")
        .output()
        .expect("sh runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("failed: postStartCommand (bad) (exit 4)"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(d.join("ok")).unwrap(),
        "/h  q\n",
        "sh read the backslash: an escaped space"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// A 10 MB devcontainer.json is refused before it is read whole: 65,
/// naming it and the way around it, nothing written.
#[test]
fn a_ten_megabyte_configuration_is_refused_unread() {
    let pad = "x".repeat(10 << 20);
    let d = scratch(
        "huge",
        &format!("{{\"image\": \"x\", \"name\": \"{pad}\"}}"),
    );
    assert!(
        Command::new("git")
            .arg("init")
            .arg("-q")
            .arg(&d)
            .status()
            .unwrap()
            .success()
    );
    let t = std::time::Instant::now();
    let o = lw_init(&d, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("figure: refused in {:.3} s", t.elapsed().as_secs_f64());
    assert_eq!(o.status.code(), Some(65), "{err}");
    assert!(
        err.contains("'.devcontainer/devcontainer.json': larger than 1024 KiB")
            && err.contains("--no-devcontainer"),
        "{err}"
    );
    assert!(!d.join(".loopwright").exists(), "nothing written");
    std::fs::remove_dir_all(&d).unwrap();
}

/// remoteUser is given the sandbox's uid in the image (#44); a sandbox.uid
/// changed since lw init is the doctor's warning, and lw init --force
/// gives the new one.
#[test]
fn remote_user_takes_the_sandbox_uid_and_the_doctor_notices_a_change() {
    let d = repo("ports-user");
    let o = lw_init(&d, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let df = d.join(".loopwright/runtime/devcontainer.Dockerfile");
    assert!(
        std::fs::read_to_string(&df)
            .unwrap()
            .contains("u='vscode'; id=100000;")
    );
    let doctor = || {
        let o = Command::new(env!("CARGO_BIN_EXE_lw-doctor"))
            .args(["--json", "-C"])
            .arg(&d)
            .env_remove("LW_ROOT")
            .output()
            .expect("lw-doctor runs");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|f| f["check"] == "devcontainer")
            .expect("a devcontainer finding")
    };
    assert_eq!(doctor()["status"], "ok", "{}", doctor());
    let conf = d.join(".loopwright/config");
    let text = std::fs::read_to_string(&conf).unwrap();
    std::fs::write(&conf, format!("{text}sandbox.uid = 4242\n")).unwrap();
    let f = doctor();
    assert_eq!(f["status"], "warn", "{f}");
    assert!(
        f["detail"]
            .as_str()
            .unwrap()
            .contains("gave remoteUser uid 100000, but sandbox.uid is 4242"),
        "{f}"
    );
    let o = lw_init(&d, &["--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(&df).unwrap().contains("id=4242;"));
    assert_eq!(
        doctor()["status"],
        "ok",
        "the config keeps it: {}",
        doctor()
    );
    std::fs::remove_dir_all(&d).unwrap();
}
