//! The agent's CLI layer is shared between projects (issue 35): two
//! projects, each its own image name and dependency layer on the Debian
//! test image, build the claude kit's agent image with `lw-build --agent`.
//! The CLI image (`loopwright/agent-claude-cli:HASH`) is one layer, built
//! at most once (the second project finds it cached: no npm install), its
//! install image is gone, and its one diff ID is in both agent images, above
//! dependency layers that differ.  The real CLI is installed from npm the
//! first time this machine sees the kit's versions on this first layer
//! (tests/agent_cli.rs builds the same image); later runs only copy it.
//! Prints the images' sizes and the shared layer's.

use support::sandbox as sandbox_support;

use std::process::Command;
use std::time::Instant;

use sandbox_support::*;

/// A project named `loopwright/lw-layer-NAME` whose deps differ by `lock`,
/// trusting what this machine trusts (as tests/agent_cli.rs's do, so the
/// first layer, hence the CLI image, is theirs).
fn project(name: &str, lock: &str) -> Fixture {
    let f = Fixture::new(&format!("layer-{name}"));
    if let Ok(rd) = std::fs::read_dir("/usr/local/share/ca-certificates") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().ends_with(".crt") {
                let to = f.proj.join(".loopwright/runtime/ca-certificates");
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
    let conf = f.proj.join(".loopwright/runtime/runtime.conf");
    let text = std::fs::read_to_string(&conf).unwrap().replacen(
        "image loopwright/lw-sbtest",
        &format!("image loopwright/lw-layer-{name}"),
        1,
    );
    std::fs::write(&conf, text).unwrap();
    std::fs::write(f.proj.join("deps.lock"), lock).unwrap();
    git(&f.proj, &["add", "-A"]);
    git(
        &f.proj,
        &["commit", "-qm", "own image, own deps, this machine's CAs"],
    );
    f
}

/// `lw-build --agent claude --json` in `f`: (layer, tag, state) per line.
fn build_agent(f: &Fixture) -> Vec<(String, String, String)> {
    let t = Instant::now();
    let o = Command::new(bin("lw-build"))
        .args(["--agent", "claude", "--json"])
        .current_dir(&f.proj)
        .output()
        .expect("lw-build runs");
    assert!(o.status.success(), "lw-build --agent: {}", err(&o));
    println!(
        "figure: lw-build --agent claude in {} took {:.1}s",
        f.proj.display(),
        t.elapsed().as_secs_f64()
    );
    text(&o)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("one JSON object a line");
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (s("layer"), s("tag"), s("state"))
        })
        .collect()
}

fn line<'a>(lines: &'a [(String, String, String)], layer: &str) -> &'a (String, String, String) {
    lines
        .iter()
        .find(|l| l.0 == layer)
        .unwrap_or_else(|| panic!("no line for {layer}: {lines:?}"))
}

fn inspect(tag: &str, format: &str) -> String {
    let o = docker(&["image", "inspect", "--format", format, tag]);
    assert!(
        o.status.success(),
        "docker image inspect {tag}: {}",
        err(&o)
    );
    text(&o).trim().to_string()
}

fn layers(tag: &str) -> Vec<String> {
    serde_json::from_str(&inspect(tag, "{{json .RootFS.Layers}}")).unwrap()
}

fn mb(bytes: &str) -> u64 {
    bytes.parse::<u64>().unwrap_or(0) / 1_000_000
}

#[test]
fn two_projects_share_the_cli_layer() {
    let a = project("a", "lock a\n");
    let b = project("b", "lock b\n");
    let first = build_agent(&a);
    let second = build_agent(&b);
    let (_, cli, state_a) = line(&first, "agent-claude-cli");
    let (_, cli_b, state_b) = line(&second, "agent-claude-cli");
    assert!(cli.starts_with("loopwright/agent-claude-cli:"), "{cli}");
    assert_eq!(cli, cli_b, "both projects name one CLI image");
    println!("figure: the CLI image {cli} was {state_a} for the first project");
    assert_eq!(
        state_b, "cached",
        "the second project reuses the CLI image: no npm install"
    );
    let top_a = &line(&first, "agent-claude").1;
    let top_b = &line(&second, "agent-claude").1;
    assert!(top_a.starts_with("loopwright/lw-layer-a-agent-claude:"));
    assert!(top_b.starts_with("loopwright/lw-layer-b-agent-claude:"));

    // The CLI image is one layer, and the install image is gone.
    let cli_layers = layers(cli);
    assert_eq!(cli_layers.len(), 1, "{cli_layers:?}");
    let stage = cli.replacen("-cli:", "-cli-build:", 1);
    assert!(
        !docker(&["image", "inspect", &stage]).status.success(),
        "the install image {stage} was removed"
    );
    // Its diff ID is in both agent images, above deps layers that differ.
    let (la, lb) = (layers(top_a), layers(top_b));
    let at = |l: &[String]| l.iter().position(|d| *d == cli_layers[0]);
    let (ia, ib) = (at(&la), at(&lb));
    assert!(ia.is_some(), "the CLI layer is in {top_a}: {la:?}");
    assert!(ib.is_some(), "the CLI layer is in {top_b}: {lb:?}");
    let (ia, ib) = (ia.unwrap(), ib.unwrap());
    assert_ne!(la[..ia], lb[..ib], "the projects' layers below differ");

    // The agent images work as before: the program on PATH for the user.
    for top in [top_a, top_b] {
        let o = docker(&[
            "run",
            "--rm",
            "--user",
            "1000",
            "--entrypoint",
            "sh",
            top,
            "-c",
            "command -v claude && claude --version",
        ]);
        assert!(o.status.success(), "claude in {top}: {}", err(&o));
        assert!(
            text(&o).starts_with("/usr/local/bin/claude\n"),
            "{}",
            text(&o)
        );
    }

    let shared = text(&docker(&[
        "history",
        "--no-trunc",
        "--format",
        "{{.Size}}\t{{.CreatedBy}}",
        cli,
    ]));
    let shared = shared
        .lines()
        .find(|l| l.contains("COPY"))
        .and_then(|l| l.split('\t').next())
        .unwrap_or("?")
        .to_string();
    println!(
        "figure: the shared CLI layer {} is {shared}; CLI image {} MB; agent images {} MB ({top_a}) and {} MB ({top_b}); their project images {} MB and {} MB",
        cli_layers[0],
        mb(&inspect(cli, "{{.Size}}")),
        mb(&inspect(top_a, "{{.Size}}")),
        mb(&inspect(top_b, "{{.Size}}")),
        mb(&inspect(&la_parent(top_a), "{{.Size}}")),
        mb(&inspect(&la_parent(top_b), "{{.Size}}")),
    );
}

/// The project image an agent image was built on, from its manifest label.
fn la_parent(top: &str) -> String {
    inspect(top, "{{index .Config.Labels \"org.loopwright.manifest\"}}")
        .lines()
        .find_map(|l| l.strip_prefix("parent "))
        .expect("the agent image names its parent")
        .to_string()
}
