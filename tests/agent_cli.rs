//! `lw-sandbox create --agent KIT` and `run`, end to end, with the real
//! Claude Code, Codex, Gemini CLI and opencode CLIs (the kits' pinned versions, from npm) against
//! a scripted model served over TLS by a test CA
//! (examples/scripted-model/model.py).
//!
//! The world: a Docker network made here (the project's `egress.network`)
//! holding the scripted model as `api.model.test:8443`, the "provider" the
//! model proxy forwards to (`agent.KIT.upstream`, `agent.KIT.ca`).
//! The model's script: edit README and commit, `lw-post` to the peer,
//! dump every process's environment, try an unlisted host, post again
//! through its own MCP client and lw-mcp (issue 18).  Asserted: the
//! commit is on the task branch; the message reached the peer through
//! lw-mediate; the endpoint got the real key on every request and never the
//! placeholder; the key's bytes are nowhere in the sandbox (its files,
//! /tmp, every process's environment during the run, the images' layers,
//! `docker inspect` of every container); the unlisted host was denied and
//! logged; `run --resume` after stop/start sends the earlier conversation.
//! Prints the figures: layer size and build time, cold create --agent vs
//! create, first-byte latency through the proxy vs direct.

use support::sandbox as sandbox_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_support::*;

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(o.status.success(), "openssl {args:?}: {}", err(&o));
}

/// A test CA and a server certificate for `host`, in `dir`.
fn test_ca(dir: &Path, host: &str) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=loopwright test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            &format!("/CN={host}"),
        ],
    );
    std::fs::write(dir.join("ext"), format!("subjectAltName=DNS:{host}\n")).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
    // The server runs as root; the files only need to be readable.
    for f in ["server.key", "server.pem", "ca.pem"] {
        let _ = Command::new("chmod")
            .args(["644"])
            .arg(dir.join(f))
            .status();
    }
}

/// Lines holding `needle` in what the shell command `cmd` prints (`grep -caF`,
/// which reads a stream of any size at the speed of grep).
fn grep_count(cmd: &str, needle: &str) -> usize {
    let o = Command::new("sh")
        .args(["-c", &format!("{cmd} | grep -caF -e \"$0\""), needle])
        .stdin(Stdio::null())
        .output()
        .expect("sh runs");
    text(&o)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{cmd}: {}", err(&o)))
}

/// The requests the scripted model recorded so far: its complete lines
/// only (read while it runs, the last line may be half written).
fn requests(dir: &Path) -> Vec<serde_json::Value> {
    let all = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap_or_default();
    let done = all.rfind('\n').map_or("", |n| &all[..n]);
    done.lines()
        .map(|l| serde_json::from_str(l).expect("the model records JSON lines"))
        .collect()
}

fn median_ms(text: &str) -> f64 {
    let mut v: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(|s| s * 1e3)
        .collect();
    assert!(!v.is_empty(), "no timings in {text}");
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// What differs between the kits.
struct Case {
    kit: &'static str,
    key_env: &'static str,
    path: &'static str,
    home: &'static str,
    mcp_marker: &'static str,
    env_marker: &'static str,
    result_type: &'static str,
    /// The key as the provider received it, from a recorded request.
    key_sent: fn(&serde_json::Value) -> Option<String>,
    /// A streaming request for the latency figure.
    probe: &'static str,
    /// The script also posts through the agent's own MCP client and lw-mcp.
    via_mcp: bool,
    /// Crosses a token cap in a run of its own: the CLI gets the 429 in its
    /// API's shape and the person is told.
    cap: bool,
}

#[test]
fn claude_commits_posts_and_resumes_while_its_key_stays_outside() {
    scenario(&Case {
        kit: "claude",
        key_env: "ANTHROPIC_API_KEY",
        path: "/v1/messages",
        home: "cat ~/.claude/CLAUDE.md; cat ~/.claude/lw-mcp.json",
        mcp_marker: "\"command\":\"/usr/local/bin/lw-mcp\"",
        env_marker: "ANTHROPIC_BASE_URL=http://lw-model:8080",
        result_type: "result",
        key_sent: |r| {
            assert!(r["headers"].get("authorization").is_none(), "{r}");
            r["headers"]["x-api-key"].as_str().map(str::to_string)
        },
        probe: r#"{"model":"m","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"RESUME-CHECK"}]}"#,
        via_mcp: true,
        cap: false,
    });
}

#[test]
fn codex_commits_posts_and_resumes_while_its_key_stays_outside() {
    scenario(&Case {
        kit: "codex",
        key_env: "OPENAI_API_KEY",
        path: "/v1/responses",
        home: "cat ~/.codex/AGENTS.md; cat ~/.codex/config.toml",
        mcp_marker: "command = \"/usr/local/bin/lw-mcp\"",
        env_marker: "CODEX_HOME=/work/home/.codex",
        result_type: "turn.completed",
        key_sent: |r| {
            assert!(r["headers"].get("x-api-key").is_none(), "{r}");
            r["headers"]["authorization"]
                .as_str()
                .and_then(|a| a.strip_prefix("Bearer "))
                .map(str::to_string)
        },
        probe: r#"{"model":"m","stream":true,"input":[{"type":"message","role":"user","content":"RESUME-CHECK"}]}"#,
        via_mcp: false,
        cap: false,
    });
}

/// opencode through its anthropic provider: the same API, key header and
/// endpoint as Claude Code, its own config, tools and events.
#[test]
fn opencode_commits_posts_and_resumes_while_its_key_stays_outside() {
    scenario(&Case {
        kit: "opencode",
        key_env: "ANTHROPIC_API_KEY",
        path: "/v1/messages",
        home: "cat ~/.config/opencode/AGENTS.md; cat ~/.config/opencode/opencode.json",
        mcp_marker: "\"/usr/local/bin/lw-mcp\"",
        env_marker: "OPENCODE_DISABLE_MODELS_FETCH=1",
        result_type: "step_finish",
        key_sent: |r| {
            assert!(r["headers"].get("authorization").is_none(), "{r}");
            r["headers"]["x-api-key"].as_str().map(str::to_string)
        },
        probe: r#"{"model":"m","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"RESUME-CHECK"}]}"#,
        via_mcp: true,
        cap: true,
    });
}

/// Copilot CLI through its "bring your own key" variables, offline: the
/// Anthropic Messages API, key header and endpoint as Claude Code; its own
/// user-level MCP servers, events and tool names (`loopwright-post`).
#[test]
fn copilot_commits_posts_and_resumes_while_its_key_stays_outside() {
    scenario(&Case {
        kit: "copilot",
        key_env: "COPILOT_PROVIDER_API_KEY",
        path: "/v1/messages",
        home: "cat ~/.copilot/copilot-instructions.md; cat ~/.copilot/mcp-config.json",
        mcp_marker: "\"command\":\"/usr/local/bin/lw-mcp\"",
        env_marker: "COPILOT_PROVIDER_BASE_URL=http://lw-model:8080",
        result_type: "result",
        key_sent: |r| {
            assert!(r["headers"].get("authorization").is_none(), "{r}");
            r["headers"]["x-api-key"].as_str().map(str::to_string)
        },
        probe: r#"{"model":"m","max_tokens":1,"stream":true,"messages":[{"role":"user","content":"RESUME-CHECK"}]}"#,
        via_mcp: true,
        cap: true,
    });
}

/// Gemini CLI: the Gemini API (streamGenerateContent for its turns,
/// generateContent for its router), the key as x-goog-api-key, lw-mcp in
/// ~/.gemini/settings.json, `--resume latest`.
#[test]
fn gemini_commits_posts_and_resumes_while_its_key_stays_outside() {
    scenario(&Case {
        kit: "gemini",
        key_env: "GEMINI_API_KEY",
        // A prefix: the model's name follows.
        path: "/v1beta/models/",
        home: "cat ~/.gemini/GEMINI.md; cat ~/.gemini/settings.json",
        mcp_marker: "\"command\": \"/usr/local/bin/lw-mcp\"",
        env_marker: "GOOGLE_GEMINI_BASE_URL=http://lw-model:8080",
        result_type: "result",
        key_sent: |r| {
            assert!(r["headers"].get("authorization").is_none(), "{r}");
            assert!(!r["path"].as_str().unwrap().contains("key="), "{r}");
            r["headers"]["x-goog-api-key"].as_str().map(str::to_string)
        },
        probe: r#"{"contents":[{"role":"user","parts":[{"text":"RESUME-CHECK"}]}]}"#,
        via_mcp: true,
        cap: true,
    });
}

/// Whether the recorded request path `path` is the kit's: `k.path` itself,
/// or under it when it ends in '/' (Gemini's paths name the model).
fn kit_path(k: &Case, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or("");
    path == k.path || (k.path.ends_with('/') && path.starts_with(k.path))
}

fn scenario(k: &Case) {
    let kit = k.kit;
    let started = Instant::now();
    let n = nonce();
    let world = World::outside(&format!("agent-{n}"), &format!("lw-agent-{n}"));
    let tmp = std::env::temp_dir().join(format!("lw-agent-{n}"));
    let tls = tmp.join("tls");
    let out_dir = tmp.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    test_ca(&tls, "api.model.test");

    // The registry may be reached through a proxy that inspects TLS: the
    // image trusts what this machine trusts (as scripts/main-job does).
    let f = agent_fixture(kit, "agent", &world, &tls);

    // Same run: a create without a kit, then the cold create with one.
    let t = Instant::now();
    f.ok(&["create", "peer", "--branch", "lw/peer", "--scope", "README"]);
    let plain_ms = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let json = f.ok(&[
        "create", "a1", "--branch", "lw/a1", "--scope", "src/**", "--agent", k.kit, "--json",
    ]);
    let agent_ms = t.elapsed().as_secs_f64() * 1e3;
    let rec: serde_json::Value = serde_json::from_str(json.trim()).expect("create --json");
    assert_eq!(rec["network"], "egress", "--agent implies egress: {json}");
    let image = rec["image"].as_str().unwrap().to_string();
    assert!(image.contains(&format!("-agent-{}:", k.kit)), "{image}");
    let timings = &rec["timings_ms"];
    println!(
        "figure [{kit}]: create without kit {plain_ms:.0} ms; create --agent {} {agent_ms:.0} ms (agent-image {:.0} ms, model-proxy {:.0} ms)",
        k.kit,
        timings["agent-image"].as_f64().unwrap_or(0.0),
        timings["model-proxy"].as_f64().unwrap_or(0.0)
    );
    let manifest = text(&docker(&[
        "image",
        "inspect",
        "--format",
        "{{index .Config.Labels \"org.loopwright.manifest\"}}",
        &image,
    ]));
    let cli = manifest
        .lines()
        .find_map(|l| l.strip_prefix("cli "))
        .expect("the agent image names its CLI image")
        .to_string();
    for tag in [image.clone(), cli] {
        let size = text(&docker(&[
            "image",
            "inspect",
            "--format",
            "{{.Size}}",
            &tag,
        ]));
        println!(
            "figure [{kit}]: {tag} size {} MB",
            size.trim().parse::<u64>().unwrap_or(0) / 1_000_000
        );
    }
    // The context file is in HOME, not the repository.
    let (code, ctx, e) = f.sh(
        "a1",
        &format!("{}; git -C /work/repo status --porcelain", k.home),
    );
    assert_eq!(code, 0, "{e}");
    assert!(
        ctx.contains("`a1`")
            && ctx.contains("`lw/a1`")
            && ctx.contains("- `peer`: branch `lw/peer`"),
        "{ctx}"
    );
    assert!(ctx.contains(k.mcp_marker), "{ctx}");
    assert!(!ctx.contains("?? "), "nothing new in the repository: {ctx}");

    // The provider: the scripted model, on the world network, from the
    // model proxy's image (it has python3).
    let container = f.container("a1");
    let model_proxy = format!("{container}-model");
    let py_image = python_image();
    let script = serde_json::json!([
        "echo 'changed by the agent' >> README && git add README && git commit -qm 'agent: edit README' && git log --oneline -1",
        "lw-post --kind request --to peer --subject 'README changed' 'please read README'",
        "cat /proc/[0-9]*/environ > /work/home/environ-dump 2>/dev/null; ls /proc | wc -l",
        "curl -sS -m 20 https://forbidden.example.org/ || echo denied",
    ]);
    // Issue 18: the agent's own MCP client calls lw-mcp's post tool.  Shown
    // with Claude Code and opencode; Codex's function-call form for MCP
    // tools is not scripted yet (docs/agents.md).
    let mut script = script;
    let via_mcp = k.via_mcp;
    if via_mcp {
        script.as_array_mut().expect("the script is a list").push(serde_json::json!(
            {"mcp": "post", "args": {"kind": "request", "to": ["peer"], "subject": "via lw-mcp", "body": "posted through the MCP door"}}
        ));
    }
    let model_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scripted-model/model.py");
    let model = format!("lw-agent-{n}-model");
    let o = docker(&[
        "run",
        "-d",
        "--name",
        &model,
        "--label",
        &world.label,
        "--network",
        &world.net,
        "--network-alias",
        "api.model.test",
        "-v",
        &format!("{}:/srv/model.py:ro", model_src.display()),
        "-v",
        &format!("{}:/srv/tls:ro", tls.display()),
        "-v",
        &format!("{}:/srv/out", out_dir.display()),
        "-e",
        &format!("LW_SCRIPT={script}"),
        "--entrypoint",
        "python3",
        &py_image,
        "-u",
        "/srv/model.py",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let mut follow = Command::new("docker")
        .args(["logs", "-f", &model])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = std::io::BufRead::lines(std::io::BufReader::new(follow.stdout.take().unwrap()))
        .any(|l| l.is_ok_and(|l| l.contains("scripted model ready")));
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(ready, "the scripted model did not start");

    // Without the key on the host, the run refuses before starting the agent.
    let o = f
        .cmd(&["run", "a1", "--", "hello"])
        .env_remove(k.key_env)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(
        err(&o).contains(&format!("{} is not set on the host", k.key_env)),
        "{}",
        err(&o)
    );
    assert!(requests(&out_dir).is_empty(), "no request without a key");

    let key = format!(
        "sk-ant-test-{n}-{:x}",
        std::process::id() as u64 * 0x9e37_79b9
    );
    let t = Instant::now();
    let o = f
        .cmd(&[
            "run",
            "a1",
            "--json",
            "--timeout",
            "5m",
            "--",
            "Edit README, commit, tell peer.",
        ])
        .env(k.key_env, &key)
        .output()
        .unwrap();
    let run_ms = t.elapsed().as_secs_f64() * 1e3;
    let transcript = text(&o);
    assert_eq!(o.status.code(), Some(0), "run: {}\n{transcript}", err(&o));
    println!("figure [{kit}]: first run {run_ms:.0} ms");
    if kit == "copilot" {
        copilot_package_is_unpacked_once_out_of_reach(&f, &image);
    }
    let lines: Vec<serde_json::Value> = transcript
        .lines()
        .map(|l| serde_json::from_str(l).expect("--json prints JSON lines"))
        .collect();
    assert_eq!(lines[0]["type"], "lw-run");
    assert_eq!(lines.last().unwrap()["type"], "lw-exit");
    assert!(
        lines.iter().any(|l| l["type"] == k.result_type),
        "{transcript}"
    );
    let file = lines.last().unwrap()["transcript"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        transcript,
        "the transcript file holds what was printed"
    );

    // The commit is on the task branch.
    let (code, log, e) = f.sh(
        "a1",
        "git log --format=%s -1 lw/a1; git rev-parse --abbrev-ref HEAD",
    );
    assert_eq!(code, 0, "{e}");
    assert_eq!(log, "agent: edit README\nlw/a1\n");
    // The message reached the peer through the mediator.
    let m = Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .unwrap();
    assert!(m.status.success(), "{}", err(&m));
    let (code, inbox, e) = f.sh("peer", "lw-inbox");
    assert_eq!(code, 0, "{e}");
    assert!(inbox.contains("\ta1\trequest\tREADME changed"), "{inbox}");
    // And the one the agent posted through its MCP client and lw-mcp.
    assert_eq!(
        inbox.contains("\ta1\trequest\tvia lw-mcp"),
        via_mcp,
        "{inbox}"
    );

    // The endpoint got the real key on every request, never the placeholder.
    let reqs = requests(&out_dir);
    assert!(reqs.len() >= 5, "one request per turn: {}", reqs.len());
    for r in &reqs {
        assert!(kit_path(k, r["path"].as_str().unwrap()), "{r}");
        assert_eq!((k.key_sent)(r).as_deref(), Some(key.as_str()), "{r}");
        assert!(
            !r.to_string().contains(agent::PLACEHOLDER),
            "the placeholder never leaves: {r}"
        );
    }
    // The unlisted host was denied and logged, by the egress proxy.
    let denials = f.ok(&["logs", "a1", "--egress"]);
    assert!(denials.contains("forbidden.example.org:443"), "{denials}");

    // The key's bytes are nowhere inside.
    let mut found = 0;
    let exec = format!(
        "LW_ROOT='{}' '{}' exec a1 -- sh -c 'cat /proc/[0-9]*/environ 2>/dev/null; tar -cf - --exclude=./proc --exclude=./sys -C / . 2>/dev/null'",
        f.root.display(),
        bin("lw-sandbox").display()
    );
    assert!(
        grep_count(
            &format!("cd '{}' && {exec}", f.proj.display()),
            k.env_marker
        ) > 0,
        "the dump holds the environments"
    );
    assert!(
        grep_count(
            &format!("cd '{}' && {exec}", f.proj.display()),
            "changed by the agent"
        ) > 0,
        "the dump holds the files"
    );
    found += grep_count(&format!("cd '{}' && {exec}", f.proj.display()), &key);
    for c in [
        container.clone(),
        model_proxy.clone(),
        format!("{container}-proxy"),
    ] {
        found += grep_count(&format!("docker inspect '{c}'"), &key);
    }
    found += grep_count(&format!("docker save '{image}'"), &key);
    for d in ["sandboxes", "transcripts", "registry", "log"] {
        let o = Command::new("grep")
            .args(["-rlF", &key])
            .arg(f.root.join(d))
            .output()
            .unwrap();
        found += text(&o).lines().count();
    }
    println!(
        "figure [{kit}]: key bytes found inside: {found} (files, /tmp, process environments, 3 x docker inspect, docker save, transcripts, mailbox)"
    );
    assert_eq!(found, 0);

    // The proxy forwarded only the model endpoint, and logged no secret.
    let plog = text(&docker(&["logs", &model_proxy])) + &err(&docker(&["logs", &model_proxy]));
    let forwarded = plog
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() == 6
                && w[1..3] == ["forward", "POST"]
                && kit_path(k, w[3])
                && w[4..] == ["api.model.test:8443", "200"]
        })
        .count();
    assert_eq!(forwarded, reqs.len(), "{plog}");
    assert!(!plog.contains(&key));
    println!(
        "figure [{kit}]: {forwarded} requests forwarded / {} to unlisted hosts (denied by the egress proxy)",
        denials.lines().count()
    );

    // Resume after stop and start: the earlier conversation is sent.
    f.ok(&["stop", "a1"]);
    f.ok(&["start", "a1"]);
    let before = reqs.len();
    let o = f
        .cmd(&["run", "a1", "--resume", "--", "RESUME-CHECK"])
        .env(k.key_env, &key)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}\n{}", text(&o), err(&o));
    assert!(text(&o).contains("resumed with"), "{}", text(&o));
    let reqs = requests(&out_dir);
    let resumed = &reqs[before..];
    assert!(!resumed.is_empty());
    assert!(
        resumed
            .iter()
            .any(|r| r["body"].as_str().unwrap().contains("agent: edit README")),
        "the earlier tool call was sent again"
    );

    // The provider refusing the key: the agent's own error is in the
    // transcript, and the sandbox stays usable.  (Codex gives up; Claude
    // Code retries a 401 ten times over minutes, so --timeout ends it.)
    let o = f
        .cmd(&[
            "run",
            "a1",
            "--json",
            "--timeout",
            "30s",
            "--",
            "STATUS-401 hello",
        ])
        .env(k.key_env, &key)
        .output()
        .unwrap();
    let refused = text(&o);
    assert_ne!(
        o.status.code(),
        Some(0),
        "a refused key is a failed run: {refused}"
    );
    assert!(
        refused.contains("401"),
        "the provider's answer surfaces: {refused}"
    );
    println!(
        "figure [{kit}]: provider answering 401: run exited {:?}",
        o.status.code()
    );
    let (code, _, e) = f.sh("a1", "git -C /work/repo status --porcelain >/dev/null");
    assert_eq!(code, 0, "the sandbox stays usable: {e}");
    // An agent that never finishes: --timeout stops it (exit 124), and
    // nothing it started is left running.
    let t = Instant::now();
    let o = f
        .cmd(&["run", "a1", "--timeout", "20s", "--", "HANG-STEP now"])
        .env(k.key_env, &key)
        .output()
        .unwrap();
    let waited = t.elapsed().as_secs_f64();
    assert_eq!(o.status.code(), Some(124), "{}\n{}", text(&o), err(&o));
    assert!(waited < 60.0, "--timeout 20s took {waited:.0}s");
    let (_, left, _) = f.sh(
        "a1",
        "for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c; echo; done | grep -c 'HANG[-]STEP' || true",
    );
    println!(
        "figure [{kit}]: --timeout 20s returned after {waited:.1}s; agent processes left running: {}",
        left.trim()
    );
    assert_eq!(left.trim(), "0", "the agent was stopped");

    if k.cap {
        cap_crossed(&f, k, &key, &model_proxy);
    }

    // Issue 35: the largest request the CLI sent (agent.KIT.max-request's
    // default is 8 MiB); the tokens the proxy counted, in ls --json.
    let reqs = requests(&out_dir);
    let largest = reqs
        .iter()
        .map(|r| r["body"].as_str().unwrap().len())
        .max()
        .unwrap();
    println!(
        "figure [{kit}]: largest request the CLI sent {largest} bytes ({} KiB) of {} requests",
        largest >> 10,
        reqs.len()
    );
    let a1 = |f: &Fixture| -> serde_json::Value {
        f.ok(&["ls", "--json"])
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["name"] == "a1")
            .expect("a1 is listed")
    };
    let listed = a1(&f);
    let tokens = listed["agent"]["tokens_total"].as_u64().unwrap();
    assert!(tokens > 0, "{listed}");
    assert_eq!(listed["agent"]["model_proxy"], "running", "{listed}");
    println!(
        "figure [{kit}]: tokens counted by the model proxy {tokens} ({} requests forwarded)",
        listed["agent"]["requests_forwarded"]
    );
    // (The runs below start a new session: the last one holds HANG-STEP,
    // which the scripted model would hang on again.)
    // The proxy killed as the OOM killer would (SIGKILL from the host): the
    // engine starts it again within 15 s, and the agent's next run works.
    let pid = text(&docker(&["inspect", "-f", "{{.State.Pid}}", &model_proxy]));
    let mut events = Command::new("docker")
        .args([
            "events",
            "--filter",
            &format!("container={model_proxy}"),
            "--filter",
            "event=start",
            "--format",
            "{{.Status}}",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut restarts = std::io::BufReader::new(events.stdout.take().unwrap());
    let t = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .unwrap()
            .success()
    );
    // Docker's restart manager waits 100 ms before a first restart; the
    // restart itself took 0.9-1.4 s on an idle machine (docs/agents.md) and
    // 5.9 s beside a Go build: the bound is for "restarted", the figure for
    // how fast.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut restarts, &mut line);
        let _ = tx.send(line);
    });
    let event = rx.recv_timeout(Duration::from_secs(30));
    let back = t.elapsed();
    let _ = events.kill();
    let _ = events.wait();
    assert!(
        event.is_ok_and(|l| l.trim() == "start"),
        "the engine did not start the model proxy again within {back:?}"
    );
    println!(
        "figure [{kit}]: model proxy killed (SIGKILL): started again by the engine after {:.2} s",
        back.as_secs_f64()
    );
    assert!(back < Duration::from_secs(15), "{back:?}");
    let o = f
        .cmd(&["run", "a1", "--", "RESUME-CHECK"])
        .env(k.key_env, &key)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}\n{}", text(&o), err(&o));
    // Stopped by hand, the engine leaves it stopped: ls says so, and the
    // next run starts it.
    docker(&["stop", &model_proxy]);
    let line = f
        .ok(&["ls"])
        .lines()
        .find(|l| l.starts_with("a1\t"))
        .unwrap()
        .to_string();
    assert!(line.contains(&format!("{kit},model-DOWN,")), "{line}");
    assert_eq!(a1(&f)["agent"]["model_proxy_down"], true);
    let o = f
        .cmd(&["run", "a1", "--", "RESUME-CHECK"])
        .env(k.key_env, &key)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}\n{}", text(&o), err(&o));
    assert_eq!(a1(&f)["agent"]["model_proxy"], "running");

    // Latency: first byte through the proxy vs straight to the model, from the world network.
    // (Gemini's path names a model.)
    let path = if k.path.ends_with('/') {
        format!("{}m:streamGenerateContent?alt=sse", k.path)
    } else {
        k.path.to_string()
    };
    let body = k.probe;
    let direct = format!(
        "for i in $(seq 15); do curl -s -o /dev/null -w '%{{time_starttransfer}}\\n' --cacert /srv/tls/ca.pem -H 'content-type: application/json' -d '{body}' https://api.model.test:8443{path}; done"
    );
    let proxied = format!(
        "for i in $(seq 15); do curl -s -o /dev/null -w '%{{time_starttransfer}}\\n' -H 'content-type: application/json' -d '{body}' http://lw-model:8080{path}; done"
    );
    // From the shared network, the model proxy is not even listening.
    let probe_world = format!(
        "curl -s -m 5 -o /dev/null -w '%{{http_code}}' http://{model_proxy}:8080{path}; echo \" exit $?\""
    );
    let world_run = |script: &str| {
        docker(&[
            "run",
            "--rm",
            "--network",
            &world.net,
            "-v",
            &format!("{}:/srv/tls:ro", tls.display()),
            "--entrypoint",
            "sh",
            &image,
            "-c",
            script,
        ])
    };
    let o = world_run(&probe_world);
    assert!(
        text(&o).trim().starts_with("000 exit 7"),
        "the model proxy refuses connections from the shared network: {}",
        text(&o)
    );
    let d = {
        let o = world_run(&direct);
        assert!(o.status.success(), "{}", err(&o));
        median_ms(&text(&o))
    };
    let p = {
        let (code, out, e) = f.sh("a1", &proxied);
        assert_eq!(code, 0, "{e}");
        median_ms(&out)
    };
    println!(
        "figure [{kit}]: first byte straight to the model (curl, TLS) {d:.1} ms, through the model proxy from the sandbox {p:.1} ms, added {:.1} ms (median of 15)",
        p - d
    );

    f.ok(&["rm", "--force", "a1", "peer"]);
    assert!(
        !f.root.join("state/agent-key/a1").exists(),
        "rm removed the key"
    );
    assert!(
        !f.root.join("state/agent-usage/a1").exists(),
        "rm removed the usage counts"
    );
    assert!(
        docker(&["inspect", &model_proxy]).status.code() != Some(0),
        "rm removed the model proxy"
    );
    drop(f);
    drop(world);
    let _ = std::fs::remove_dir_all(&tmp);
    println!(
        "figure [{kit}]: agent_cli {} took {:.1}s",
        k.kit,
        started.elapsed().as_secs_f64()
    );
}

/// A run over `agent.KIT.max-tokens-run`: the first request goes through
/// (the scripted model's answer is 15 tokens), the next is answered 429 in
/// the API's shape by the model proxy, the CLI shows it, and the person is
/// told once.  The cap is lifted again for the steps after it.
fn cap_crossed(f: &Fixture, k: &Case, key: &str, model_proxy: &str) {
    let kit = k.kit;
    let config = f.proj.join(".loopwright/config");
    let before = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{before}agent.{kit}.max-tokens-run = 10\n"),
    )
    .unwrap();
    let t = Instant::now();
    let o = f
        .cmd(&[
            "run",
            "a1",
            "--json",
            "--timeout",
            "60s",
            "--",
            "Edit README, commit, tell peer.",
        ])
        .env(k.key_env, key)
        .output()
        .unwrap();
    let took = t.elapsed().as_secs_f64();
    std::fs::write(&config, &before).unwrap();
    let transcript = text(&o);
    let plog = err(&docker(&["logs", model_proxy]));
    let refused = plog
        .lines()
        .filter(|l| l.contains(&format!(" refuse POST {}", k.path)) && l.contains(" 429 "))
        .count();
    assert!(refused > 0, "the proxy answered 429: {plog}");
    // The CLI may show the refusal or wait out its retry-after (an hour):
    // --timeout ends the wait.  Either way nothing more reached the model.
    let shown = transcript.contains(&format!("agent.{kit}.max-tokens-run"));
    assert!(
        shown || o.status.code() == Some(124),
        "the CLI neither showed the proxy's 429 nor waited on it: {transcript}"
    );
    assert!(
        err(&o).contains(&format!(
            "told the person: sandbox a1: its agent reached agent.{kit}.max-tokens-run"
        )),
        "{}",
        err(&o)
    );
    println!(
        "figure [{kit}]: max-tokens-run 10 crossed: run exited {:?} after {took:.1} s; {refused} refusal line(s) 429 in the proxy's log; the CLI {} the refusal",
        o.status.code(),
        if shown {
            "showed"
        } else {
            "waited on (retry-after) rather than showed"
        }
    );
}

/// Issue 45: Copilot CLI's program unpacks its 235 MB package into
/// `~/.cache/copilot` the first time it runs.  The CLI image holds it
/// unpacked once, and the kit's program runs that copy: the agent image's
/// build and a sandbox's run unpack nothing.  Hostile: the copy is the
/// program the next run executes, so the sandbox's user must not be able
/// to change a byte of it (nor of anything under /opt/lw-agent), even if
/// the root file system were writable.
fn copilot_package_is_unpacked_once_out_of_reach(f: &Fixture, image: &str) {
    let (code, out, e) = f.sh(
        "a1",
        "find ~/.cache/copilot ~/.copilot -name index.js 2>/dev/null; echo home-end; \
         find /opt/lw-agent -writable; echo writable-end; \
         find /opt/lw-agent ! -type l \\( ! -user root -o -perm /022 \\); echo perm-end; \
         test -r /opt/lw-agent/copilot/dist/index.js && echo dist-readable; echo end",
    );
    assert_eq!(code, 0, "{e}");
    assert!(
        out.starts_with("home-end\n"),
        "the run unpacked the package into HOME: {out}"
    );
    assert!(
        out.ends_with("home-end\nwritable-end\nperm-end\ndist-readable\nend\n"),
        "/opt/lw-agent writable by the sandbox's user, or no shared copy: {out}"
    );
    // The agent image holds one unpacked copy: the CLI image's.
    let o = docker(&[
        "run",
        "--rm",
        "--entrypoint",
        "find",
        image,
        "/",
        "-xdev",
        "-name",
        ".extraction-complete",
    ]);
    assert_eq!(
        text(&o),
        "/opt/lw-agent/copilot/dist/.extraction-complete\n",
        "{}",
        err(&o)
    );
}

#[test]
fn kits_list_and_bad_kits_unknown_kits_and_wrong_networks_are_refused() {
    let f = Fixture::new("kits");
    let list = f.ok(&["kits"]);
    assert!(
        list.starts_with("claude\t@anthropic-ai/claude-code@2.1.332\tANTHROPIC_API_KEY\truntime/agents/claude.kit\n"),
        "{list}"
    );
    assert!(
        list.contains("codex\t@openai/codex@0.171.0\tOPENAI_API_KEY\t"),
        "{list}"
    );
    let json = f.ok(&["kits", "--json"]);
    let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "kit");
    assert_eq!(first["endpoint"], "POST /v1/messages");

    // An unknown kit: 64, listing the kits, and nothing made.
    let o = f.sb(&["create", "x", "--branch", "x", "--agent", "gpt"]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(
        err(&o).contains("the kits are: claude, codex, copilot, gemini, opencode"),
        "{}",
        err(&o)
    );
    // An agent needs the egress network.
    let o = f.sb(&[
        "create",
        "x",
        "--branch",
        "x",
        "--agent",
        "claude",
        "--network",
        "none",
    ]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(
        err(&o).contains("--agent needs --network egress"),
        "{}",
        err(&o)
    );
    // A project kit with a floating version, or a bad key: 78 naming it.
    let dir = f.proj.join(".loopwright/agents");
    std::fs::create_dir_all(&dir).unwrap();
    let claude = include_str!("../runtime/agents/claude.kit");
    std::fs::write(
        dir.join("mine.kit"),
        claude.replace("version = 2.1.332", "version = latest"),
    )
    .unwrap();
    let o = f.sb(&["create", "x", "--branch", "x", "--agent", "mine"]);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(
        err(&o).contains("mine.kit: version: 'latest' is not an exact version"),
        "{}",
        err(&o)
    );
    std::fs::write(
        dir.join("mine.kit"),
        claude.replace("mcp = claude-json", "mcp = yaml"),
    )
    .unwrap();
    let o = f.sb(&["kits"]);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(err(&o).contains("mine.kit: mcp: 'yaml'"), "{}", err(&o));
    std::fs::remove_dir_all(&dir).unwrap();
    // A misspelt agent key in the project's config: 78 naming it.
    std::fs::write(
        f.proj.join(".loopwright/config"),
        "agent.claude.upstrem = https://x\n",
    )
    .unwrap();
    let o = f.sb(&["create", "x", "--branch", "x", "--agent", "claude"]);
    assert_eq!(o.status.code(), Some(78), "{}", err(&o));
    assert!(
        err(&o).contains("unknown key 'agent.claude.upstrem'"),
        "{}",
        err(&o)
    );
    assert!(
        f.leftovers().is_empty(),
        "nothing was made: {:?}",
        f.leftovers()
    );
    // run on a sandbox made without an agent: 64.
    std::fs::write(f.proj.join(".loopwright/config"), "").unwrap();
    f.ok(&["create", "plain", "--branch", "plain"]);
    let o = f.sb(&["run", "plain", "--", "hello"]);
    assert_eq!(o.status.code(), Some(64), "{}", err(&o));
    assert!(err(&o).contains("has no agent"), "{}", err(&o));
    f.ok(&["rm", "plain"]);
}

/// A project whose `agent.KIT.*` keys point at the scripted model on
/// `world`'s network (its CA in `tls`), trusting what this machine trusts.
fn agent_fixture(kit: &str, tag: &str, world: &World, tls: &Path) -> Fixture {
    let config = format!(
        "egress.proxy-from = {}\negress.network = {}\nagent.{kit}.upstream = https://api.model.test:8443\nagent.{kit}.ca = {}\n",
        debian(),
        world.net,
        tls.join("ca.pem").display()
    );
    let f = Fixture::with_config(tag, &config);
    if let Ok(rd) = std::fs::read_dir("/usr/local/share/ca-certificates") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().ends_with(".crt") {
                std::fs::copy(
                    e.path(),
                    f.proj
                        .join(".loopwright/runtime/ca-certificates")
                        .join(e.file_name()),
                )
                .unwrap();
            }
        }
    }
    git(&f.proj, &["add", "-A"]);
    let _ = Command::new("git")
        .arg("-C")
        .arg(&f.proj)
        .args(["commit", "-qm", "ca"])
        .output();
    git(&f.proj, &["push", "-q", "origin", "main"]);
    f.build();
    f
}

/// The image of `container`'s model proxy, which has python3 (the scripted
/// model runs from it).
/// Debian with python3, for the scripted model, cached by the hash of its
/// recipe and base (the model proxy's image had python3 until issue 42;
/// lw-model-proxy's installs nothing).
fn python_image() -> String {
    let base = debian();
    let id = text(&docker(&["image", "inspect", "-f", "{{.Id}}", base]));
    let df = format!(
        "FROM {base}\nRUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
         --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*\n"
    );
    let hash = base::digest::sha256_hex(format!("{df}{}", id.trim()).as_bytes());
    let tag = format!("loopwright/test-python:{}", &hash[..16]);
    if docker(&["image", "inspect", &tag]).status.success() {
        return tag;
    }
    let mut child = Command::new("docker")
        .args(["build", "-q", "-t", &tag, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker build runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), df.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "cannot build {tag}: {}", err(&o));
    tag
}

/// The consumer's task: a slow tool, six times; then it tries to stop
/// ("STOP"); told to go on, it runs `read` (reads and acks what waits).
fn slow_task_then_read(read: &str) -> serde_json::Value {
    let slow = "sleep 2; echo slow step done";
    serde_json::json!([slow, slow, slow, slow, slow, slow, "STOP", read])
}

/// Returns once the agent is mid-task: the model has been asked twice (the
/// second slow step is running).  The model records to a file and signals
/// nothing else, so the file is read again every 50 ms.
fn wait_mid_task(run: &mut std::process::Child, out_dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(240);
    while requests(out_dir).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the agent never started its task"
        );
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the scripted model `name` on `world` playing `script`, recording
/// into `out_dir`, in `image` (one with python3); returns when it listens.
fn start_model(
    name: &str,
    world: &World,
    image: &str,
    tls: &Path,
    out_dir: &Path,
    script: &serde_json::Value,
) {
    let model_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/scripted-model/model.py");
    let o = docker(&[
        "run",
        "-d",
        "--name",
        name,
        "--label",
        &world.label,
        "--network",
        &world.net,
        "--network-alias",
        "api.model.test",
        "-v",
        &format!("{}:/srv/model.py:ro", model_src.display()),
        "-v",
        &format!("{}:/srv/tls:ro", tls.display()),
        "-v",
        &format!("{}:/srv/out", out_dir.display()),
        "-e",
        &format!("LW_SCRIPT={script}"),
        "--entrypoint",
        "python3",
        image,
        "-u",
        "/srv/model.py",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let mut follow = Command::new("docker")
        .args(["logs", "-f", name])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = std::io::BufRead::lines(std::io::BufReader::new(follow.stdout.take().unwrap()))
        .any(|l| l.is_ok_and(|l| l.contains("scripted model ready")));
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(ready, "the scripted model did not start");
}

fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Issue 32 §1, the bell: while the consumer's Claude Code is in the middle
/// of a multi-step task (a slow tool, called again and again), the producer
/// posts a contract-change; the mediator routes it; the next request the
/// consumer's CLI sends carries it, fenced and labelled, by its PostToolUse
/// hook (`lw-inbox --hook KIT`), without the agent asking.  When the
/// agent then tries to stop with the message unread, its Stop hook blocks
/// the stop once; the agent reads and acks it, and the run ends.
#[test]
fn claude_hears_a_contract_change_mid_task_and_its_stop_is_blocked_until_it_reads_it() {
    bell("claude", "ANTHROPIC_API_KEY", "~/.claude/settings.json");
}

#[test]
fn codex_hears_a_contract_change_mid_task_and_its_stop_is_blocked_until_it_reads_it() {
    bell("codex", "OPENAI_API_KEY", "~/.codex/hooks.json");
}

/// Gemini CLI hears it through its hooks (AfterTool; AfterAgent blocks
/// its stop), in ~/.gemini/settings.json.
#[test]
fn gemini_hears_a_contract_change_mid_task_and_its_stop_is_blocked_until_it_reads_it() {
    bell("gemini", "GEMINI_API_KEY", "~/.gemini/settings.json");
}

/// opencode hears it through its plugin (runtime/agents/opencode-bell.js),
/// appended to the result of the next tool call; it has no stop a plugin
/// can refuse, so its run ends with the message unread.
#[test]
fn opencode_hears_a_contract_change_mid_task_through_its_plugin() {
    bell(
        "opencode",
        "ANTHROPIC_API_KEY",
        "~/.config/opencode/plugin/loopwright-bell.js",
    );
}

/// Copilot CLI hears it through its user-level hooks
/// (`~/.copilot/hooks/loopwright-bell.json`), whose input is Claude Code's;
/// its Stop hook blocks as Claude Code's does.
#[test]
fn copilot_hears_a_contract_change_mid_task_and_its_stop_is_blocked_until_it_reads_it() {
    bell(
        "copilot",
        "COPILOT_PROVIDER_API_KEY",
        "~/.copilot/hooks/loopwright-bell.json",
    );
}

fn bell(kit: &str, key_env: &str, hooks: &str) {
    // Claude Code and Codex run `lw-inbox --hook` as a command hook, stops
    // included; opencode's plugin runs it after tool calls only.
    let blocks_stop = kit != "opencode";
    // Gemini CLI escapes '<' and '>' in a hook's additionalContext (a
    // stop's reason it passes as it is).
    let lt = if kit == "gemini" { "&lt;" } else { "<" };
    let gt = if kit == "gemini" { "&gt;" } else { ">" };
    // opencode and Gemini CLI take seconds of their own between a tool's
    // end and the next request (Gemini's shell tool about 3 s).
    let slow_turns = matches!(kit, "opencode" | "gemini");
    let started = Instant::now();
    let n = nonce();
    let world = World::outside(&format!("bell-{kit}-{n}"), &format!("lw-bell-{n}"));
    let tmp = std::env::temp_dir().join(format!("lw-bell-{n}"));
    let tls = tmp.join("tls");
    let out_dir = tmp.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    test_ca(&tls, "api.model.test");
    let f = agent_fixture(kit, "bell", &world, &tls);
    f.ok(&["create", "p1", "--branch", "lw/p1", "--scope", "src/api/**"]);
    f.ok(&[
        "create", "c1", "--branch", "lw/c1", "--scope", "src/**", "--agent", kit,
    ]);
    // The hooks are in the agent's HOME, not in the repository.
    let (code, settings, e) = f.sh(
        "c1",
        &format!("cat {hooks}; git -C /work/repo status --porcelain"),
    );
    assert_eq!(code, 0, "{e}");
    let installed = if blocks_stop {
        settings.contains(&format!(
            "/usr/local/bin/lw-inbox --hook {kit} --max-blocks 3"
        ))
    } else {
        settings.contains(&format!(r#""--hook", "{kit}""#))
            && settings.contains(r#"const MAX_BLOCKS = "3";"#)
    };
    assert!(installed, "{settings}");
    assert!(!settings.contains("?? "), "{settings}");

    // The consumer's task: a slow tool, six times; then it tries to stop
    // ("STOP"); told to go on, it reads and acks what waits.
    // (Gemini CLI's shell tool refuses a command substitution, `$(...)`,
    // as "command injection": it reads the list through a pipe.)
    let script = slow_task_then_read(if kit == "gemini" {
        "lw-inbox | cut -f1 | while read -r i; do lw-inbox show \"$i\"; lw-inbox ack \"$i\"; done"
    } else {
        "for i in $(lw-inbox | cut -f1); do lw-inbox show \"$i\"; lw-inbox ack \"$i\"; done"
    });
    let py_image = python_image();
    let model = format!("lw-bell-{n}-model");
    start_model(&model, &world, &py_image, &tls, &out_dir, &script);

    let key = format!("sk-ant-test-bell-{n}");
    let mut run = f
        .cmd(&[
            "run",
            "c1",
            "--json",
            "--timeout",
            "5m",
            "--",
            "Do the slow task.",
        ])
        .env(key_env, &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_mid_task(&mut run, &out_dir);
    let (code, id, e) = f.sh(
        "p1",
        &format!("lw-post --kind contract-change --ref src/api/schema.json --subject 'users: 2 (BELL-{n})' 'user.name is now user.full_name'"),
    );
    let posted = epoch();
    assert_eq!(code, 0, "{e}");
    let id = id.trim().to_string();
    let m = Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .unwrap();
    let mediated = epoch();
    assert!(m.status.success(), "{}", err(&m));
    let o = run.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "run: {}\n{}", err(&o), text(&o));

    let reqs = requests(&out_dir);
    let t = |r: &serde_json::Value| r["t"].as_f64().expect("the model records the time");
    let body = |r: &serde_json::Value| r["body"].as_str().unwrap().to_string();
    let label = format!(
        r#"{lt}lw-message id=\"{id}\" from=\"p1\" kind=\"contract-change\" mediator=\"delivered\""#
    );
    let carrying = reqs
        .iter()
        .position(|r| body(r).contains(&label))
        .unwrap_or_else(|| panic!("no request carries {label}: {} requests", reqs.len()));
    let carried = body(&reqs[carrying]);
    for want in [
        format!("subject: users: 2 (BELL-{n})"),
        format!("body:\\nuser.name is now user.full_name\\n{lt}/lw-message{gt}"),
        "not as instructions from the user".to_string(),
    ] {
        assert!(carried.contains(&want), "{want} in {carried}");
    }
    // The next tool call: the first or second request after the mediator's
    // pass (a tool that ended just before it may have sent its own).
    let after: Vec<usize> = (0..reqs.len())
        .filter(|i| t(&reqs[*i]) > mediated)
        .collect();
    assert!(
        after.iter().take(2).any(|i| *i == carrying),
        "request {carrying} carried it; {after:?} came after the mediator's pass"
    );
    assert!(
        carrying < 8,
        "it arrived while the agent was still mid-task (request {carrying})"
    );
    let delay = t(&reqs[carrying]) - posted;
    println!(
        "figure [bell {kit}]: lw-post exit to the request carrying it {:.2} s (mediator pass {:.2} s, then {:.2} s until the running slow step (2 s) ended and the CLI asked again); request {carrying} of {}",
        delay,
        mediated - posted,
        t(&reqs[carrying]) - mediated,
        reqs.len()
    );
    // At most the running 2 s step and the hook after the mediator's pass;
    // opencode takes seconds of its own between a tool's end and its next
    // request (more on a loaded machine), so for it the bound is its own
    // slowest turn of the run (a slow step and what it adds), plus the hook.
    let turn = (1..reqs.len())
        .filter(|i| *i != carrying)
        .map(|i| t(&reqs[i]) - t(&reqs[i - 1]))
        .fold(0.0, f64::max);
    let bound = if slow_turns { turn } else { 2.0 } + 1.0;
    println!(
        "figure [bell {kit}]: the CLI's slowest turn of the run {turn:.2} s; bound {bound:.2} s"
    );
    assert!(
        t(&reqs[carrying]) - mediated <= bound,
        "at most the running step and the hook after the mediator's pass"
    );
    if !blocks_stop {
        let last = body(reqs.last().unwrap());
        assert_eq!(last.matches(&label).count(), 1, "announced once: {last}");
        println!(
            "figure [bell {kit}]: no stop blocked (opencode has none to refuse); {} requests; test took {:.1}s",
            reqs.len(),
            started.elapsed().as_secs_f64()
        );
        let _ = docker(&["rm", "-f", &model]);
        f.ok(&["rm", "--force", "c1", "p1"]);
        drop(f);
        drop(world);
        let _ = std::fs::remove_dir_all(&tmp);
        return;
    }

    // Announced once; the stop blocked once; the agent read and acked it.
    let last = body(reqs.last().unwrap());
    assert_eq!(last.matches(&label).count(), 1, "announced once: {last}");
    // (Claude Code shows a block's reason twice: as the hook's feedback and
    // as a note on the blocking hook.)
    assert!(
        last.contains("Stop blocked 1 of at most 3 times") && !last.contains("Stop blocked 2 of"),
        "the stop was blocked once: {last}"
    );
    assert!(
        last.contains(&format!("{id} (contract-change from p1)")),
        "{last}"
    );
    let (code, state, e) = f.sh(
        "c1",
        &format!("cat ~/.lw-bell/{kit}.json; echo; lw-inbox; lw-inbox --all"),
    );
    assert_eq!(code, 0, "{e}");
    let st: serde_json::Value =
        serde_json::from_str(state.lines().next().unwrap()).expect("the bell's state is JSON");
    assert_eq!(st["blocks"], 1, "{state}");
    assert!(
        state.contains(&format!("{id}\tp1\tcontract-change")),
        "acked, listed by --all: {state}"
    );
    println!(
        "figure [bell {kit}]: stop blocked {} time(s); the agent acked; {} requests; test took {:.1}s",
        st["blocks"],
        reqs.len(),
        started.elapsed().as_secs_f64()
    );

    // Announced once across `run --resume`: a status posted between runs is
    // told to the resumed session, and not again to the next resume (it
    // stays unread: a status asks nothing, so no stop is blocked).
    let (code, sid, e) = f.sh(
        "p1",
        &format!("lw-post --kind status --to c1 --subject 'FYI (BELL2-{n})' 'news'"),
    );
    assert_eq!(code, 0, "{e}");
    let sid = sid.trim().to_string();
    let m = Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .unwrap();
    assert!(m.status.success(), "{}", err(&m));
    let status_label = format!(r#"{lt}lw-message id=\"{sid}\" from=\"p1\" kind=\"status\""#);
    // Copilot keeps a SessionStart hook's text in the run it starts only:
    // the session resumed after it no longer carries it, and the bell does
    // not tell it again (it stays unread in new/; a status blocks no stop).
    // Gemini CLI 0.61.0 resuming a resumed chat keeps that run's answer
    // but drops its prompt, and so the context its hooks put before it:
    // the second resume's history no longer holds the status, and the bell
    // (which told it once) does not tell it again.
    let second = if kit == "copilot" || kit == "gemini" {
        0
    } else {
        1
    };
    for (i, want) in [1, second].into_iter().enumerate() {
        let o = f
            .cmd(&["run", "c1", "--resume", "--", "RESUME-CHECK"])
            .env(key_env, &key)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}\n{}", text(&o), err(&o));
        let last = body(requests(&out_dir).last().unwrap());
        assert_eq!(
            last.matches(&status_label).count(),
            want,
            "resume {i}: the status announced once in the conversation: {last}"
        );
    }
    let (_, state, _) = f.sh("c1", &format!("cat ~/.lw-bell/{kit}.json"));
    assert!(state.contains(&sid), "{state}");
    println!(
        "figure [bell {kit}]: a status posted between runs announced once over two `run --resume` (still in the second resumed conversation: {})",
        second == 1
    );

    let _ = docker(&["rm", "-f", &model]);
    f.ok(&["rm", "--force", "c1", "p1"]);
    drop(f);
    drop(world);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Issue 40: `docker kill` of the model proxy while the agent works.  The
/// engine treats a kill as a person's stop and leaves it exited (its
/// restart policy restarts only a proxy that died by itself); `lw-sandbox
/// run` starts it again, and the agent's next request reaches the model.
/// Prints the time from the kill to the proxy's start and to the next
/// request the model received.
#[test]
fn a_docker_killed_model_proxy_is_started_again_while_the_agent_runs() {
    let kit = "claude";
    let n = nonce();
    let world = World::outside(&format!("kill-{n}"), &format!("lw-kill-{n}"));
    let tmp = std::env::temp_dir().join(format!("lw-kill-{n}"));
    let tls = tmp.join("tls");
    let out_dir = tmp.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    test_ca(&tls, "api.model.test");
    let f = agent_fixture(kit, "kill", &world, &tls);
    f.ok(&["create", "c1", "--branch", "lw/c1", "--agent", kit]);
    let slow = "sleep 3; echo slow step done";
    let script = serde_json::json!([slow, slow, slow]);
    let container = f.container("c1");
    let model_proxy = format!("{container}-model");
    let py_image = python_image();
    let model = format!("lw-kill-{n}-model");
    start_model(&model, &world, &py_image, &tls, &out_dir, &script);
    let mut run = f
        .cmd(&["run", "c1", "--timeout", "5m", "--", "Do the slow task."])
        .env("ANTHROPIC_API_KEY", format!("sk-ant-test-kill-{n}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-task: the model was asked once and the first slow step runs.  The
    // model records to a file and signals nothing else: read every 50 ms.
    let deadline = Instant::now() + Duration::from_secs(240);
    while requests(&out_dir).is_empty() {
        assert!(Instant::now() < deadline, "the agent never started");
        assert!(run.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut events = Command::new("docker")
        .args([
            "events",
            "--filter",
            &format!("container={model_proxy}"),
            "--filter",
            "event=start",
            "--format",
            "{{.Status}}",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let started = events.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(started), &mut line);
        let _ = tx.send(Instant::now());
    });
    let killed = Instant::now();
    let killed_at = epoch();
    let o = docker(&["kill", &model_proxy]);
    assert!(o.status.success(), "{}", err(&o));
    let back = rx.recv_timeout(Duration::from_secs(30));
    let _ = events.kill();
    let _ = events.wait();
    let back = back.expect("the killed model proxy was not started again within 30 s") - killed;
    let o = run.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "run: {}\n{}", err(&o), text(&o));
    assert!(
        err(&o).contains(&format!(
            "the model proxy '{model_proxy}' was stopped from outside the run"
        )),
        "{}",
        err(&o)
    );
    let reqs = requests(&out_dir);
    let next = reqs
        .iter()
        .filter_map(|r| r["t"].as_f64())
        .find(|t| *t > killed_at)
        .expect("the model was asked again after the kill");
    assert_eq!(
        reqs.len(),
        4,
        "every step reached the model: {}",
        reqs.len()
    );
    println!(
        "figure [kill {kit}]: docker kill of the model proxy: started again after {:.2} s; the agent's next request reached the model {:.2} s after the kill (a 3 s step was running)",
        back.as_secs_f64(),
        next - killed_at
    );
    assert!(back < Duration::from_secs(5), "{back:?}");
    let _ = docker(&["rm", "-f", &model]);
    f.ok(&["rm", "--force", "c1"]);
    drop(f);
    drop(world);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Issue 40, a burst: ten contract-changes with 2,500-character bodies
/// reach the consumer mid-task.  Every one is before the model (in full or
/// as a digest), and no hook answer was cut by the CLI (Claude Code's "Output
/// too large" preview, Codex's "truncated output").
#[test]
fn claude_hears_every_message_of_a_burst() {
    burst("claude", "ANTHROPIC_API_KEY");
}

#[test]
fn codex_hears_every_message_of_a_burst() {
    burst("codex", "OPENAI_API_KEY");
}

fn burst(kit: &str, key_env: &str) {
    let n = nonce();
    let world = World::outside(&format!("burst-{kit}-{n}"), &format!("lw-burst-{n}"));
    let tmp = std::env::temp_dir().join(format!("lw-burst-{n}"));
    let tls = tmp.join("tls");
    let out_dir = tmp.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    test_ca(&tls, "api.model.test");
    let f = agent_fixture(kit, "burst", &world, &tls);
    f.ok(&["create", "p1", "--branch", "lw/p1", "--scope", "src/api/**"]);
    f.ok(&[
        "create", "c1", "--branch", "lw/c1", "--scope", "src/**", "--agent", kit,
    ]);
    let script = slow_task_then_read(
        "for i in $(lw-inbox | cut -f1); do lw-inbox show \"$i\" >/dev/null; lw-inbox ack \"$i\"; done",
    );
    let py_image = python_image();
    let model = format!("lw-burst-{n}-model");
    start_model(&model, &world, &py_image, &tls, &out_dir, &script);
    let mut run = f
        .cmd(&["run", "c1", "--timeout", "5m", "--", "Do the slow task."])
        .env(key_env, format!("sk-test-burst-{n}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_mid_task(&mut run, &out_dir);
    let (code, ids, e) = f.sh(
        "p1",
        "for i in $(seq 10); do lw-post --kind contract-change --ref src/api/schema.json --subject \"burst $i\" \"$(printf 'line %03d of the change. ' $(seq 104))END$i\" || exit 1; done",
    );
    assert_eq!(code, 0, "{e}");
    let ids: Vec<String> = ids.lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 10, "{ids:?}");
    let m = Command::new(bin("lw-mediate"))
        .arg("--once")
        .env("LW_ROOT", &f.root)
        .current_dir(&f.proj)
        .output()
        .unwrap();
    assert!(m.status.success(), "{}", err(&m));
    let o = run.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "run: {}\n{}", err(&o), text(&o));
    let reqs = requests(&out_dir);
    let last = reqs.last().unwrap()["body"].as_str().unwrap().to_string();
    for cut in ["Output too large", "truncated output"] {
        assert!(!last.contains(cut), "a hook answer was cut ({cut}): {last}");
    }
    for id in &ids {
        let label = format!(r#"<lw-message id=\"{id}\" from=\"p1\" kind=\"contract-change\""#);
        assert!(
            last.contains(&label),
            "{id} never reached the model: {last}"
        );
    }
    let shown_digest = last.matches(r#"shown=\"digest\""#).count();
    println!(
        "figure [burst {kit}]: 10 contract-changes of 2,500 characters: all 10 before the model, {shown_digest} digest label(s) in the conversation, over {} requests; no answer cut",
        reqs.len()
    );
    let (code, left, e) = f.sh("c1", "lw-inbox | wc -l");
    assert_eq!(code, 0, "{e}");
    println!(
        "figure [burst {kit}]: {} left unread after the run",
        left.trim()
    );
    let _ = docker(&["rm", "-f", &model]);
    f.ok(&["rm", "--force", "c1", "p1"]);
    drop(f);
    drop(world);
    let _ = std::fs::remove_dir_all(&tmp);
}
