//! lw-build's command line: help, usage errors, exit statuses, `init`.
//! None of these needs a working engine except where DOCKER_HOST says so.

use support::build as build_support;

use build_support::{Project, lw_build, stderr, stdout};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

#[test]
fn help_lists_every_flag() {
    let out = Command::new(lw_build())
        .arg("--help")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    for flag in [
        "--explain",
        "--print-tag",
        "--verbose",
        "--directory",
        "init",
    ] {
        assert!(text.contains(flag), "--help mentions {flag}: {text}");
    }
}

#[test]
fn usage_errors_exit_64() {
    let out = Command::new(lw_build())
        .arg("--no-such-flag")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(64));
    assert!(stderr(&out).starts_with("lw-build: "), "{}", stderr(&out));
    let out = Command::new(lw_build())
        .args(["--explain", "--print-tag"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
}

#[test]
fn no_runtime_definition_is_66_and_says_to_init() {
    let p = Project::new("cli-none");
    std::fs::remove_dir_all(p.dir.join(".loopwright")).expect("rm");
    let out = p.lw_build(&[]);
    assert_eq!(out.status.code(), Some(66));
    assert!(
        stderr(&out).contains("run 'lw-build init'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn runtime_file_errors_name_the_line_and_exit_78() {
    let p = Project::new("cli-conf");
    p.write(
        ".loopwright/runtime/runtime.conf",
        "from x\n\nlayer base\n    dockerfile D\n    provider mise latest\n",
    );
    let out = p.lw_build(&["--print-tag"]);
    assert_eq!(out.status.code(), Some(78));
    assert_eq!(
        stderr(&out),
        "lw-build: .loopwright/runtime/runtime.conf:5: mise version 'latest' is not pinned; write one like 'provider mise 2026.9.15'\n"
    );
    p.write(
        ".loopwright/runtime/runtime.conf",
        "from x\nlayer deps\n    dockerfile D\n    input ../../etc/passwd\n",
    );
    let out = p.lw_build(&[]);
    assert_eq!(out.status.code(), Some(78));
    assert!(
        stderr(&out).contains("runtime.conf:4: path '../../etc/passwd' escapes the project"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn docker_not_running_is_69_and_says_how_to_start_it() {
    let p = Project::new("cli-down");
    p.write(
        ".loopwright/runtime/runtime.conf",
        "from x\nlayer a\n    dockerfile D\n",
    );
    p.write("D", "ARG LW_PARENT\nFROM ${LW_PARENT}\n");
    let sock = p.dir.join("no-engine.sock");
    let host = format!("unix://{}", sock.display());
    let out = p.lw_build_env(&[], &[("DOCKER_HOST", &host)]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot reach the Docker engine at {host}")),
        "{err}"
    );
    assert!(
        err.contains("systemctl start docker") && err.contains("DOCKER_HOST"),
        "{err}"
    );
    // A TCP address with nothing listening, on loopback.
    let out = p.lw_build_env(&["--explain"], &[("DOCKER_HOST", "tcp://127.0.0.1:9")]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
}

#[test]
fn init_writes_the_default_runtime_and_refuses_to_overwrite() {
    let p = Project::new("cli-init");
    std::fs::remove_dir_all(p.dir.join(".loopwright")).expect("rm");
    p.write("package-lock.json", "{}\n");
    p.write("Cargo.lock", "# lock\n");
    let out = p.lw_build(&["init", "--from", "loopwright/test-debian:latest"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert!(
        listed.contains(&".loopwright/runtime/runtime.conf".to_string()),
        "{listed:?}"
    );
    for f in &listed {
        assert!(p.dir.join(f).is_file(), "{f} written");
    }
    let conf =
        std::fs::read_to_string(p.dir.join(".loopwright/runtime/runtime.conf")).expect("read");
    assert!(
        conf.contains("\nfrom loopwright/test-debian:latest\n"),
        "{conf}"
    );
    assert!(
        conf.contains("    input package-lock.json\n") && conf.contains("    input Cargo.lock\n"),
        "{conf}"
    );
    assert!(
        !conf.contains("requirements.txt"),
        "only files the project has are declared"
    );
    let mode = std::fs::metadata(p.dir.join(".loopwright/runtime/entry.sh"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);

    let again = p.lw_build(&["init"]);
    assert_eq!(again.status.code(), Some(73), "{}", stderr(&again));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    let forced = p.lw_build(&["init", "--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
}

#[test]
fn the_man_page_documents_every_long_flag_and_exit_status() {
    let man = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/lw-build.1"))
        .expect("man page");
    let help = stdout(
        &Command::new(lw_build())
            .arg("--help")
            .output()
            .expect("runs"),
    ) + &stdout(
        &Command::new(lw_build())
            .args(["init", "--help"])
            .output()
            .expect("runs"),
    );
    for word in help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']') {
        if let Some(flag) = word.strip_prefix("--") {
            let flag = flag.split('=').next().expect("a name");
            assert!(
                man.contains(&format!("\\-\\-{}", flag.replace('-', "\\-"))),
                "man page documents --{flag}"
            );
        }
    }
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "FILES",
        "ENVIRONMENT",
        "EXIT STATUS",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        assert!(
            man.contains(&format!(".SH {section}\n")),
            "section {section}"
        );
    }
    for code in ["0", "64", "65", "66", "69", "73", "74", "78"] {
        assert!(
            man.contains(&format!(".TP\n.B {code}\n")),
            "exit status {code} documented"
        );
    }
}
