//! lw-build on a project's own Dockerfile (a devcontainer.json's `build`,
//! #44): the `project` layer is built with its context, arguments and
//! target, from images the engine already has; what it reads outside its
//! context, and a FROM image the engine lacks, are refused naming them.

use support::build as build_support;

use build_support::{Project, image_id, stderr, test_image};
use std::process::Command;

/// The project's Dockerfile in `.devcontainer/` with context `.` (the top),
/// three stages (`prod` fails if built), and a deps layer after it.
fn project(tag: &str) -> Project {
    let p = Project::new(tag);
    let from = test_image("busybox");
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!(
            "image {}\nfrom {from}\n\nlayer project\n    dockerfile .devcontainer/Dockerfile\n    context .\n    arg BASE={from} GREETING=hello\n    target dev\n    input tools/greet.txt\n\
             layer deps\n    dockerfile rt/deps.Dockerfile\n    input app.lock\n",
            p.repo
        ),
    );
    p.write(
        ".devcontainer/Dockerfile",
        "ARG BASE=none\nFROM ${BASE} AS base\nARG GREETING\nCOPY tools/greet.txt /greet.txt\nRUN echo \"$GREETING\" > /greeting\n\
         FROM base AS dev\nRUN echo dev > /stage\nFROM base AS prod\nRUN false\n",
    );
    p.write("tools/greet.txt", "greet-1\n");
    p.write(
        "rt/deps.Dockerfile",
        "ARG LW_PARENT\nFROM ${LW_PARENT}\nCOPY app.lock /app.lock\n",
    );
    p.write("app.lock", "dep-a 1.0\n");
    p.write("README", "not an input\n");
    p
}

fn run_in(tag: &str, cmd: &str) -> String {
    let o = Command::new("docker")
        .args(["run", "--rm", "--entrypoint", "/bin/sh", tag, "-c", cmd])
        .output()
        .expect("docker runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ids(p: &Project) -> Vec<String> {
    p.build_ok()
        .iter()
        .map(|(_, tag, _)| image_id(tag).expect("a built tag exists"))
        .collect()
}

#[test]
fn the_projects_dockerfile_builds_with_its_args_and_target_and_rebuilds_from_it() {
    let p = project("own");
    let first = p.build_ok();
    let states: Vec<&str> = first.iter().map(|(_, _, s)| s.as_str()).collect();
    assert_eq!(states, ["built", "built"]);
    let top = &first[1].1;
    assert_eq!(
        run_in(top, "cat /greeting /greet.txt /stage /app.lock"),
        "hello\ngreet-1\ndev\ndep-a 1.0\n",
        "args, the context's file, the target stage, then the next layer"
    );
    let ids0 = ids(&p);
    // Not an input: nothing rebuilds.
    p.write("README", "changed\n");
    assert_eq!(ids(&p), ids0);
    // The deps layer's input: only it.
    p.write("app.lock", "dep-a 2.0\n");
    let ids1 = ids(&p);
    assert_eq!((ids1[0] == ids0[0], ids1[1] == ids0[1]), (true, false));
    // A file the Dockerfile COPYs, then the Dockerfile: from the project layer.
    p.write("tools/greet.txt", "greet-2\n");
    let ids2 = ids(&p);
    assert_eq!((ids2[0] == ids1[0], ids2[1] == ids1[1]), (false, false));
    let df = std::fs::read_to_string(p.dir.join(".devcontainer/Dockerfile")).unwrap();
    p.write(
        ".devcontainer/Dockerfile",
        &df.replace("echo dev", "echo dev2"),
    );
    let ids3 = ids(&p);
    assert_eq!((ids3[0] == ids2[0], ids3[1] == ids2[1]), (false, false));
    println!(
        "figure: project {} -> {} -> {} -> {}",
        &ids0[0][7..19],
        &ids1[0][7..19],
        &ids2[0][7..19],
        &ids3[0][7..19]
    );
}

#[test]
fn a_from_image_the_engine_lacks_is_named_with_the_fix() {
    let p = project("own-nofrom");
    let conf = std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).unwrap();
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace(
            &format!("arg BASE={}", test_image("busybox")),
            "arg BASE=loopwright/lw-test-no-such-image:1",
        ),
    );
    let o = p.lw_build(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(66), "{err}");
    assert!(
        err.contains("image 'loopwright/lw-test-no-such-image:1' (FROM in .devcontainer/Dockerfile:2) is not in the engine, and lw-build asks no registry")
            && err.contains("docker pull loopwright/lw-test-no-such-image:1"),
        "{err}"
    );
}

#[test]
fn reading_outside_the_context_or_the_project_is_refused() {
    // A COPY climbing out of the context `.devcontainer`.
    let p = project("own-escape");
    let conf = std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).unwrap();
    let narrow = conf
        .replace("context .\n", "context .devcontainer\n")
        .replace("    input tools/greet.txt\n", "");
    p.write(".loopwright/runtime/runtime.conf", &narrow);
    let df = std::fs::read_to_string(p.dir.join(".devcontainer/Dockerfile")).unwrap();
    p.write(
        ".devcontainer/Dockerfile",
        &df.replace("COPY tools/greet.txt", "COPY ../app.lock"),
    );
    let o = p.lw_build(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains(".devcontainer/Dockerfile:4: COPY reads '../app.lock', outside the build context '.devcontainer'"),
        "{err}"
    );
    // An input outside the context.
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace("context .\n", "context .devcontainer\n"),
    );
    let o = p.lw_build(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains(
            "input 'tools/greet.txt' of layer 'project' is outside its context '.devcontainer'"
        ),
        "{err}"
    );
    // A context above the project, and a Dockerfile that leads to /etc.
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replace("context .\n", "context ..\n"),
    );
    let o = p.lw_build(&[]);
    assert_eq!(o.status.code(), Some(78), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("path '..' escapes the project"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(p.dir.join(".devcontainer/Dockerfile")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", p.dir.join(".devcontainer/Dockerfile")).unwrap();
    p.write(".loopwright/runtime/runtime.conf", &conf);
    let o = p.lw_build(&[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(err.contains("outside the project; refused"), "{err}");
}

/// From a devcontainer.json to an image, end to end: lw init takes its
/// Dockerfile (args, target, a COPY from the context `..`), lw-build builds
/// it under loopwright's layers, and the lifecycle commands ran as
/// remoteUser 'dev', whose uid in the image (1001) is neither 1000 nor the
/// sandbox's: it becomes the sandbox's (sandbox.uid), what it owned with it
/// (#44), the object's two side by side, in the
/// specification's order.  The Dockerfile ends as `USER dev`: the base
/// layer after it still installs its packages as root.
#[test]
fn a_devcontainer_dockerfile_becomes_the_image_with_its_commands_run_as_the_user() {
    let p = Project::new("dc-build");
    let debian = test_image("debian");
    p.write(
        ".devcontainer/devcontainer.json",
        r#"{
        // The project's own image.
        "build": {"dockerfile": "Dockerfile", "context": "..", "args": {"GREETING": "hi"}, "target": "dev"},
        "remoteUser": "dev",
        "containerEnv": {"FOO": "bar"},
        "onCreateCommand": "id -u > oncreate.uid && id -un > oncreate.user && cat ~/.tool > tool.txt",
        "postCreateCommand": {"a": "cat oncreate.uid > a.txt", "b": ["sh", "-c", "echo b > b.txt"]},
    }"#,
    );
    p.write(
        ".devcontainer/Dockerfile",
        &format!(
            "FROM {debian} AS base\nARG GREETING\nCOPY .devcontainer/hello.txt /hello.txt\nRUN echo \"$GREETING\" > /greeting\nFROM base AS dev\nRUN echo dev > /stage && useradd -m -u 1001 dev && echo mine > /home/dev/.tool && chown dev: /home/dev/.tool && chmod 600 /home/dev/.tool\nUSER dev\nFROM base AS prod\nRUN false\n"
        ),
    );
    p.write(".devcontainer/hello.txt", "hello\n");
    std::fs::remove_dir_all(p.dir.join(".loopwright")).unwrap();
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&p.dir)
            .status()
            .unwrap()
            .success()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_lw-init"))
        .args(["--ca", "none"])
        .arg(&p.dir)
        .output()
        .expect("lw-init runs");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("took build: the first layer, 'project', builds .devcontainer/Dockerfile (context ., target dev, GREETING=hi)"), "{err}");
    let conf = std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).unwrap();
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!("image {}\n{conf}", p.repo),
    );
    let t = std::time::Instant::now();
    let layers = p.build_ok();
    println!("figure: cold lw-build {:.1} s", t.elapsed().as_secs_f64());
    let names: Vec<&str> = layers.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(names, ["project", "base", "devcontainer", "deps"]);
    let top = &layers[3].1;
    assert_eq!(
        run_in(
            top,
            "cd /opt/loopwright/deps && cat oncreate.uid oncreate.user tool.txt a.txt b.txt /greeting /hello.txt /stage && echo $FOO && stat -c %u:%g b.txt /home/dev/.tool"
        ),
        "100000\ndev\nmine\n100000\nb\nhi\nhello\ndev\nbar\n100000:100000\n100000:100000\n",
        "the image's dev (uid 1001) became the sandbox's uid, its files with it"
    );
    // As lw-sandbox runs it: the sandbox's uid, whose files they are.
    let o = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--user",
            "100000:100000",
            "--entrypoint",
            "/bin/sh",
            top,
        ])
        .args([
            "-c",
            "id -un && cat /home/dev/.tool && touch /opt/loopwright/deps/w",
        ])
        .output()
        .expect("docker runs");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "dev\nmine\n",
        "{}",
        stderr(&o)
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // The COPYed file changes: from the project layer; nothing else does.
    let ids0: Vec<String> = layers
        .iter()
        .map(|(_, t, _)| image_id(t).unwrap())
        .collect();
    p.write(".devcontainer/hello.txt", "hello again\n");
    let ids1 = ids(&p);
    assert!(ids0.iter().zip(&ids1).all(|(a, b)| a != b), "all rebuild");
}

/// No remoteUser: the lifecycle commands run as the image's user, root, as
/// the reference implementation runs them (its scripts write to /opt).
#[test]
fn with_no_remote_user_the_commands_run_as_root_like_the_reference() {
    let p = Project::new("dc-root");
    p.write(
        ".devcontainer/devcontainer.json",
        &format!(
            r#"{{"image": "{}", "onCreateCommand": "mkdir -p /opt/tools && id -u > /opt/tools/uid"}}"#,
            test_image("debian")
        ),
    );
    std::fs::remove_dir_all(p.dir.join(".loopwright")).unwrap();
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&p.dir)
            .status()
            .unwrap()
            .success()
    );
    let o = Command::new(env!("CARGO_BIN_EXE_lw-init"))
        .args(["--ca", "none"])
        .arg(&p.dir)
        .output()
        .expect("lw-init runs");
    assert!(o.status.success(), "{}", stderr(&o));
    let conf = std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).unwrap();
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!("image {}\n{conf}", p.repo),
    );
    let layers = p.build_ok();
    let top = &layers.last().expect("layers").1;
    assert_eq!(run_in(top, "cat /opt/tools/uid"), "0\n");
}

/// `.dockerignore` (#44): what it excludes is neither hashed nor sent, with
/// Docker's patterns (`!`, `**`); an ignored file's change rebuilds
/// nothing, a kept one's rebuilds; one that excludes the Dockerfile itself
/// still builds.  `Dockerfile.dockerignore` beside the Dockerfile wins.
#[test]
fn dockerignore_leaves_files_out_of_the_context_and_the_hash() {
    let p = Project::new("own-ignore");
    let from = test_image("busybox");
    p.write(
        ".loopwright/runtime/runtime.conf",
        &format!(
            "image {}\nfrom {from}\n\nlayer project\n    dockerfile app/Dockerfile\n    context app\n    input app\n",
            p.repo
        ),
    );
    p.write("app/Dockerfile", &format!("FROM {from}\nCOPY . /src\n"));
    p.write(
        "app/.dockerignore",
        "# what the build does not see\n*.log\nnode_modules\n!node_modules/keep\n**/secret*\nDockerfile\n",
    );
    for (f, t) in [
        ("app/main.txt", "main\n"),
        ("app/debug.log", "noise 1\n"),
        ("app/node_modules/big", "big\n"),
        ("app/node_modules/keep", "keep\n"),
        ("app/deep/er/secret.key", "k\n"),
        ("app/deep/er/ok.txt", "ok\n"),
    ] {
        p.write(f, t);
    }
    let tag = p.build_ok()[0].1.clone();
    let seen = run_in(&tag, "cd /src && find . -type f | sort");
    println!("figure: the image's /src:\n{seen}");
    for kept in ["./main.txt", "./node_modules/keep", "./deep/er/ok.txt"] {
        assert!(seen.contains(kept), "{kept} kept: {seen}");
    }
    for left in ["debug.log", "node_modules/big", "secret.key"] {
        assert!(!seen.contains(left), "{left} left out: {seen}");
    }
    let id0 = ids(&p);
    p.write("app/debug.log", "noise 2\n");
    p.write("app/node_modules/big", "bigger\n");
    assert_eq!(ids(&p), id0, "an ignored file's change rebuilds nothing");
    p.write("app/node_modules/keep", "kept, changed\n");
    let id1 = ids(&p);
    assert_ne!(id1, id0, "a taken-back file's change rebuilds");
    // Beside the Dockerfile, its own ignore file wins over the context's.
    p.write("app/Dockerfile.dockerignore", "main.txt\n");
    let tag = p.build_ok()[0].1.clone();
    let seen = run_in(&tag, "cd /src && find . -type f | sort");
    assert!(
        !seen.contains("main.txt") && seen.contains("debug.log"),
        "{seen}"
    );
}
