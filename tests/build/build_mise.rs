//! The default runtime written by `lw-build init`, built for real on the
//! Debian test image: apt-get in the base layer, mise at its pinned version
//! installing a tool from PyPI through its pipx backend in the toolchain
//! layer, pip installing requirements.txt in the deps layer.
//!
//! The images are tagged by hash under a fixed repository and kept, so a
//! second run of the suite finds them cached (and still runs them).

use support::build as build_support;

use std::process::Command;

use build_support::{Project, stderr, stdout, test_image};

#[test]
fn default_runtime_with_mise_installs_a_tool_from_a_registry() {
    let debian = test_image("debian");
    let mut p = Project::new("mise");
    // The images are a cache for the next run, tagged by hash: keep them.
    p.keep_images = true;
    std::fs::remove_dir_all(p.dir.join(".loopwright")).expect("rm");
    p.write("requirements.txt", "six==1.16.0\n");
    let out = p.lw_build(&["init", "--from", &debian]);
    assert!(out.status.success(), "{}", stderr(&out));

    let conf_path = p.dir.join(".loopwright/runtime/runtime.conf");
    let conf = std::fs::read_to_string(&conf_path).expect("read conf");
    assert!(
        conf.contains("    input requirements.txt\n"),
        "init declared the lockfile: {conf}"
    );
    p.write(
        ".loopwright/runtime/runtime.conf",
        &conf.replacen("\nfrom ", "\nimage loopwright/lw-test-mise\nfrom ", 1),
    );
    let mise = std::fs::read_to_string(p.dir.join(".loopwright/runtime/mise.toml"))
        .expect("read mise.toml");
    p.write(
        ".loopwright/runtime/mise.toml",
        &format!("{mise}\"pipx:cowsay\" = \"6.1\"\n"),
    );
    // Behind a TLS-inspecting proxy the image must trust its CA, as the host does.
    if let Ok(dir) = std::fs::read_dir("/usr/local/share/ca-certificates") {
        for ent in dir.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if name.ends_with(".crt") {
                let pem = std::fs::read_to_string(ent.path()).expect("read CA");
                p.write(&format!(".loopwright/runtime/ca-certificates/{name}"), &pem);
            }
        }
    }

    let start = std::time::Instant::now();
    let out = p.lw_build(&["-v"]);
    assert!(out.status.success(), "lw-build failed: {}", stderr(&out));
    let layers: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    println!(
        "figure: default runtime on debian in {:.1}s: {layers:?}",
        start.elapsed().as_secs_f64()
    );
    let tag = layers[2]
        .split_whitespace()
        .nth(1)
        .expect("LAYER TAG STATE")
        .to_string();

    let run = |cmd: &str| {
        let o = Command::new("docker")
            .args(["run", "--rm", "-u", "1000", &tag, "sh", "-c", cmd])
            .output()
            .expect("docker run");
        assert!(o.status.success(), "{cmd}: {}", stderr(&o));
        stdout(&o)
    };
    assert!(
        run("cowsay -t moo").contains("| moo |"),
        "mise's pipx:cowsay runs as uid 1000"
    );
    assert!(
        run("mise --version").starts_with("2026.9.15 "),
        "the pinned mise"
    );
    assert_eq!(
        run("/opt/loopwright/venv/bin/python -c 'import six; print(six.__version__)'"),
        "1.16.0\n"
    );
    assert_eq!(run("id -u; git --version | cut -d' ' -f1"), "1000\ngit\n");

    let again = p.build_ok();
    assert!(again.iter().all(|(_, _, s)| s == "cached"), "{again:?}");

    // Keep the cache to the current images: drop tags of earlier inputs.
    let current: Vec<&str> = again.iter().map(|(_, t, _)| t.as_str()).collect();
    let listed = Command::new("docker")
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"])
        .output()
        .expect("docker images");
    let stale: Vec<String> = stdout(&listed)
        .lines()
        .filter(|t| t.starts_with("loopwright/lw-test-mise-") && !current.contains(t))
        .map(str::to_string)
        .collect();
    if !stale.is_empty() {
        let _ = Command::new("docker").arg("rmi").args(&stale).output();
    }

    // A changed tool declaration: --explain shows what toolchain and deps would rebuild for.
    p.write(
        ".loopwright/runtime/mise.toml",
        &format!("{mise}\"pipx:cowsay\" = \"6.0\"\n"),
    );
    let ex = stdout(&p.lw_build(&["--explain"]));
    println!("{ex}");
    let blocks: Vec<&str> = ex.split("\ntoolchain ").collect();
    assert!(
        blocks[0].starts_with("base ")
            && blocks[0].lines().next().expect("line").ends_with(" cached"),
        "{ex}"
    );
    assert!(
        blocks[1].contains(" to build\n")
            && blocks[1].contains("changed .loopwright/runtime/mise.toml (content)"),
        "{ex}"
    );
    assert!(
        ex.contains("\ndeps ")
            && ex
                .split("\ndeps ")
                .nth(1)
                .expect("deps")
                .contains("changed parent "),
        "{ex}"
    );
}
