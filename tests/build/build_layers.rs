//! lw-build against the real Docker engine, on the busybox test image: which
//! layers rebuild when which input changes (shown by image ids), and the
//! failures a runtime definition can cause.

use support::build as build_support;

use build_support::{Project, image_id, stderr, stdout, test_image};

/// A three-layer runtime: base, a toolchain by custom script, deps reading app.lock.
fn project(tag: &str) -> Project {
    let p = Project::new(tag);
    let from = test_image("busybox");
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!(
            "image {}\nfrom {from}\n\nlayer base\n    dockerfile rt/base.Dockerfile\n    provider native\n    input rt/entry.sh\n\
             layer toolchain\n    dockerfile rt/toolchain.Dockerfile\n    provider custom rt/tools.sh\n\
             layer deps\n    dockerfile rt/deps.Dockerfile\n    input app.lock\n",
            p.repo
        ),
    );
    p.write(
        "rt/base.Dockerfile",
        &format!("ARG LW_PARENT\nFROM ${{LW_PARENT}}\nCOPY rt/entry.sh /entry.sh\nRUN echo {} > /base-id\n", p.repo),
    );
    p.write("rt/entry.sh", "#!/bin/sh\nexec \"$@\"\n");
    p.write(
        "rt/toolchain.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nARG LW_TOOLCHAIN_SCRIPT\nCOPY ${LW_TOOLCHAIN_SCRIPT} /tmp/tools.sh\nRUN sh /tmp/tools.sh\n",
    );
    p.write("rt/tools.sh", "echo tools-1 > /tools\n");
    p.write(
        "rt/deps.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nCOPY app.lock /app.lock\nRUN cat /app.lock > /deps\n",
    );
    p.write("app.lock", "dep-a 1.0\n");
    p.write("README", "not an input\n");
    p
}

fn ids(layers: &[(String, String, String)]) -> Vec<String> {
    layers
        .iter()
        .map(|(_, tag, _)| image_id(tag).expect("a built tag exists"))
        .collect()
}

fn states(layers: &[(String, String, String)]) -> Vec<&str> {
    layers.iter().map(|(_, _, s)| s.as_str()).collect()
}

fn short(id: &str) -> &str {
    &id[7..19]
}

fn print_figure(what: &str, before: &[String], after: &[String]) -> Vec<bool> {
    let names = ["base", "toolchain", "deps"];
    let rebuilt: Vec<bool> = before.iter().zip(after).map(|(a, b)| a != b).collect();
    let list: Vec<String> = names
        .iter()
        .zip(before.iter().zip(after))
        .map(|(n, (a, b))| {
            if a == b {
                format!("{n} {} kept", short(a))
            } else {
                format!("{n} {} -> {}", short(a), short(b))
            }
        })
        .collect();
    println!("figure: {what}: {}", list.join(", "));
    rebuilt
}

#[test]
fn only_layers_whose_inputs_changed_rebuild() {
    let p = project("layers");
    let first = p.build_ok();
    assert_eq!(states(&first), ["built", "built", "built"]);
    let ids0 = ids(&first);

    // Run it in a container: the chain really stacks.
    let run = std::process::Command::new("docker")
        .args([
            "run",
            "--rm",
            &first[2].1,
            "sh",
            "-c",
            "cat /base-id /tools /deps",
        ])
        .output()
        .expect("docker run");
    assert_eq!(stdout(&run), format!("{}\ntools-1\ndep-a 1.0\n", p.repo));

    // A file nobody declared: nothing rebuilds.
    p.write("README", "changed, still not an input\n");
    p.write("src/main.c", "int main(void) { return 0; }\n");
    let again = p.build_ok();
    assert_eq!(states(&again), ["cached", "cached", "cached"]);
    let ids1 = ids(&again);
    assert_eq!(
        print_figure("undeclared file changed", &ids0, &ids1),
        [false, false, false]
    );

    // One declared input of deps: --explain names it, then only deps rebuilds.
    p.write("app.lock", "dep-a 1.1\n");
    let ex = p.lw_build(&["--explain"]);
    assert!(ex.status.success(), "{}", stderr(&ex));
    let ex = stdout(&ex);
    println!("{ex}");
    assert!(
        ex.contains(" cached\n") && ex.contains(" to build\n"),
        "{ex}"
    );
    assert!(ex.contains(&format!("  replaces {}", first[2].1)), "{ex}");
    assert!(ex.contains("  changed app.lock (content)"), "{ex}");
    let js = p.lw_build(&["--explain", "--json"]);
    let records: Vec<serde_json::Value> = stdout(&js)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|r| r["type"] == "explain"));
    assert_eq!(records[2]["state"], "to-build");
    assert_eq!(
        records[2]["changes"],
        serde_json::json!(["app.lock (content)"])
    );
    assert_eq!(records[2]["inputs"][0]["path"], "app.lock");
    let deps = p.build_ok();
    assert_eq!(states(&deps), ["cached", "cached", "built"]);
    let js = p.lw_build(&["--json"]);
    let last: serde_json::Value =
        serde_json::from_str(stdout(&js).lines().last().expect("a line")).expect("JSON");
    assert_eq!(
        (&last["type"], &last["layer"], &last["state"]),
        (&"layer".into(), &"deps".into(), &"cached".into())
    );
    assert_eq!(last["id"].as_str(), image_id(&deps[2].1).as_deref());
    let ids2 = ids(&deps);
    assert_eq!(
        print_figure("deps input changed", &ids1, &ids2),
        [false, false, true]
    );

    // Its mode is an input too.
    let lock = p.dir.join("app.lock");
    std::fs::set_permissions(&lock, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let moded = p.build_ok();
    let ids3 = ids(&moded);
    assert_eq!(
        print_figure("deps input mode changed", &ids2, &ids3),
        [false, false, true]
    );

    // The toolchain declaration: toolchain and deps rebuild, base does not.
    p.write("rt/tools.sh", "echo tools-2 > /tools\n");
    let tc = p.build_ok();
    assert_eq!(states(&tc), ["cached", "built", "built"]);
    let ids4 = ids(&tc);
    assert_eq!(
        print_figure("toolchain declaration changed", &ids3, &ids4),
        [false, true, true]
    );

    // --print-tag is the last layer's tag, and the image records its inputs.
    let pt = p.lw_build(&["--print-tag"]);
    assert_eq!(stdout(&pt).trim(), tc[2].1);
    let manifest = std::process::Command::new("docker")
        .args([
            "image",
            "inspect",
            "-f",
            "{{index .Config.Labels \"org.loopwright.manifest\"}}",
            &tc[2].1,
        ])
        .output()
        .expect("docker inspect");
    let manifest = stdout(&manifest);
    assert!(manifest.contains("input app.lock 755 "), "{manifest}");
    // The parent by its hash (the tag's hex is its start), not its
    // repository.
    let parent_hex = tc[1].1.rsplit(':').next().expect("REPO:TAG");
    assert!(
        manifest.contains(&format!("\nparent {parent_hex}")),
        "{manifest}"
    );
}

#[test]
fn a_dockerfile_reading_an_undeclared_file_fails_pointing_at_the_input_list() {
    let p = project("undeclared");
    p.write("secret.txt", "not declared\n");
    p.write(
        "rt/deps.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nCOPY app.lock /app.lock\nCOPY secret.txt /secret\n",
    );
    let out = p.lw_build(&[]);
    let err = stderr(&out);
    println!(
        "figure: undeclared COPY: exit {:?}: {err}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains(
            "rt/deps.Dockerfile:4: COPY reads 'secret.txt', which is not an input of layer 'deps'"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "add 'input secret.txt' under 'layer deps' (.loopwright/runtime/runtime.conf:11)"
        ),
        "{err}"
    );
    let tag = stdout(&p.lw_build(&["--print-tag"])).trim().to_string();
    assert_eq!(image_id(&tag), None, "nothing tagged for the failed layer");

    // A source only the engine can expand still fails with the pointer.
    p.write(
        "rt/deps.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nARG F=secret.txt\nCOPY app.lock /app.lock\nCOPY ${F} /secret\n",
    );
    let out = p.lw_build(&[]);
    let err = stderr(&out);
    println!(
        "figure: undeclared COPY found by the engine: exit {:?}: {err}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("declare the file with 'input PATH' under 'layer deps'"),
        "{err}"
    );

    // Declared, it builds.
    let conf =
        std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).expect("read conf");
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace("input app.lock", "input app.lock secret.txt"),
    );
    assert_eq!(states(&p.build_ok()), ["cached", "cached", "built"]);

    // A declared directory is in the context even when it is empty.
    std::fs::create_dir(p.dir.join("empty")).expect("mkdir");
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace("input app.lock", "input app.lock empty"),
    );
    p.write(
        "rt/deps.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nCOPY empty/ /empty/\nRUN test -d /empty\n",
    );
    assert_eq!(states(&p.build_ok()), ["cached", "cached", "built"]);
}

#[test]
fn a_failing_step_shows_its_output_tags_nothing_and_is_retried() {
    let p = project("failing");
    let marker = format!("marker-{}", p.repo.rsplit('-').next().expect("nonce"));
    p.write(
        "rt/deps.Dockerfile",
        &format!("ARG LW_PARENT\nFROM ${{LW_PARENT}}\nRUN echo {marker}; exit 7\n"),
    );
    let tag = stdout(&p.lw_build(&["--print-tag"])).trim().to_string();
    for attempt in 1..=2 {
        let out = p.lw_build(&[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(65), "attempt {attempt}: {err}");
        assert!(
            err.contains(&marker),
            "attempt {attempt} shows the step's output: {err}"
        );
        assert!(
            err.contains("returned a non-zero code: 7") && err.contains("no tag was applied"),
            "{err}"
        );
        assert_eq!(image_id(&tag), None, "attempt {attempt}: no tag");
    }
    // The first two layers were built and kept; fixing the step builds deps.
    p.write(
        "rt/deps.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nRUN echo fixed\n",
    );
    assert_eq!(states(&p.build_ok()), ["cached", "cached", "built"]);
}

#[test]
fn missing_inputs_and_escapes_are_refused() {
    let p = project("inputs");
    std::fs::remove_file(p.dir.join("app.lock")).expect("rm app.lock");
    let out = p.lw_build(&[]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "input 'app.lock' of layer 'deps' does not exist (.loopwright/runtime/runtime.conf:13)"
        ),
        "{}",
        stderr(&out)
    );

    p.write("app.lock", "x\n");
    std::os::unix::fs::symlink("/etc/hostname", p.dir.join("outside")).expect("symlink");
    let conf =
        std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).expect("read conf");
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace("input app.lock", "input app.lock outside"),
    );
    let out = p.lw_build(&[]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("input 'outside' of layer 'deps'")
            && stderr(&out).contains("outside the project; refused"),
        "{}",
        stderr(&out)
    );

    // The `from` image must be in the engine.
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace(&test_image("busybox"), "loopwright/lw-test-no-such-image:1"),
    );
    let out = p.lw_build(&[]);
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("image 'loopwright/lw-test-no-such-image:1'"),
        "{}",
        stderr(&out)
    );
}

/// `lw init` on a python project in `p` (a git checkout) with `files`.
fn python_project(p: &Project, files: &[(&str, &str)]) {
    let git = |args: &[&str]| {
        let o = std::process::Command::new("git")
            .args(args)
            .current_dir(&p.dir)
            .output()
            .expect("git runs");
        assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    };
    git(&["init", "-q"]);
    for (f, t) in files {
        p.write(f, t);
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_lw-init"))
        .args(["--from", &test_image("busybox"), "--ca", "none"])
        .current_dir(&p.dir)
        .output()
        .expect("lw-init runs");
    assert!(o.status.success(), "lw init: {}", stderr(&o));
}

/// The planned tag of each layer (`lw-build --explain --json`), without
/// its repository, and lw-build's standard error.
fn planned(p: &Project) -> (std::collections::BTreeMap<String, String>, String) {
    let o = p.lw_build(&["--explain", "--json"]);
    assert!(o.status.success(), "lw-build --explain: {}", stderr(&o));
    let tags = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "explain")
        .map(|v| {
            let tag = v["tag"].as_str().expect("a tag");
            (
                v["layer"].as_str().expect("a layer").to_string(),
                tag.rsplit(':').next().expect("REPO:TAG").to_string(),
            )
        })
        .collect();
    (tags, stderr(&o))
}

/// Issue 39: the toolchain layer is keyed on what the declarations resolve
/// to.  `>=3.9` and `>=3.10` (and another project's `.python-version 3.13`)
/// are the same Debian Python, one toolchain layer; `3.11` is another; a new
/// dependency changes only the deps layer.  A declaration that cannot be had
/// (`3.12`) is said by lw-build and repeated by lw doctor.
#[test]
fn the_toolchain_tag_is_what_the_declarations_resolve_to() {
    let p = Project::new("resolve");
    python_project(
        &p,
        &[
            (
                "pyproject.toml",
                "[project]\nname = \"x\"\nrequires-python = \">=3.9\"\n",
            ),
            ("requirements.txt", "attrs==24.2.0\n"),
        ],
    );
    let (first, _) = planned(&p);
    let tc = |m: &std::collections::BTreeMap<String, String>| m["toolchain"].clone();
    p.write(
        "pyproject.toml",
        "[project]\nname = \"x\"\nrequires-python = \">=3.10\"\n",
    );
    let (again, _) = planned(&p);
    assert_eq!(tc(&again), tc(&first), ">=3.10 is the Python >=3.9 took");
    p.write("requirements.txt", "attrs==24.2.0\niniconfig==2.0.0\n");
    let (dep, _) = planned(&p);
    assert_eq!(tc(&dep), tc(&first), "a dependency is not the toolchain's");
    assert_ne!(
        dep["deps"], again["deps"],
        "a dependency is the deps layer's"
    );

    let other = Project::new("resolve-other");
    python_project(
        &other,
        &[
            ("pyproject.toml", "[project]\nname = \"y\"\n"),
            (".python-version", "3.13\n"),
        ],
    );
    let (theirs, _) = planned(&other);
    assert_eq!(
        tc(&theirs),
        tc(&first),
        "another project's 3.13 shares the layer"
    );

    p.write(".python-version", "3.11\n");
    let (old, e) = planned(&p);
    assert_ne!(tc(&old), tc(&first), "3.11 is another toolchain");
    assert!(!e.contains("toolchain: python"), "3.11 is had: {e}");

    p.write(".python-version", "3.12\n");
    let (twelve, e) = planned(&p);
    assert_eq!(tc(&twelve), tc(&first), "3.12 cannot be had: 3.13 is taken");
    let note = "python: .python-version asks for 3.12; takes Debian's 3.13";
    assert!(e.contains(&format!("lw-build: toolchain: {note}")), "{e}");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_lw-doctor"))
        .args(["--json", "-C", p.dir.to_str().expect("utf-8")])
        .output()
        .expect("lw-doctor runs");
    let found: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["check"] == "toolchain")
        .collect();
    assert_eq!(found.len(), 1, "{}", stdout(&o));
    assert_eq!(found[0]["status"], "warn", "{}", found[0]);
    assert!(
        found[0]["detail"].as_str().unwrap_or("").starts_with(note),
        "{}",
        found[0]
    );
}
