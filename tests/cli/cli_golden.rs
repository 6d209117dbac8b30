//! Golden CLI tests: every command's `--help`, each subcommand's help, an
//! unknown flag (exit 64) and the first errors a user meets, with their exit
//! statuses (tests/cmd; cases written by scripts/goldens, and `.trycmd`
//! sequences written by hand).  A change in
//! what a person sees fails here until the golden files are updated with
//! `TRYCMD=overwrite cargo test --test cli cli_golden` and reviewed.

#[test]
fn cli_goldens() {
    trycmd::TestCases::new()
        .register_bin("lw", std::path::Path::new(env!("CARGO_BIN_EXE_lw")))
        .register_bin(
            "lw-build",
            std::path::Path::new(env!("CARGO_BIN_EXE_lw-build")),
        )
        .register_bin("lw-cockpit", support::bin("lw-cockpit"))
        .register_bin("lw-confine", support::bin("lw-confine"))
        .register_bin(
            "lw-doctor",
            std::path::Path::new(env!("CARGO_BIN_EXE_lw-doctor")),
        )
        .register_bin("lw-github-sink", support::bin("lw-github-sink"))
        .register_bin("lw-inbox", support::bin("lw-inbox"))
        .register_bin("lw-mediate", support::bin("lw-mediate"))
        .register_bin(
            "lw-mirror",
            std::path::Path::new(env!("CARGO_BIN_EXE_lw-mirror")),
        )
        .register_bin("lw-model-proxy", support::bin("lw-model-proxy"))
        .register_bin("lw-post", support::bin("lw-post"))
        .register_bin(
            "lw-sandbox",
            std::path::Path::new(env!("CARGO_BIN_EXE_lw-sandbox")),
        )
        .register_bin(
            "lw-service",
            std::path::Path::new(env!("CARGO_BIN_EXE_lw-service")),
        )
        .register_bin("lw-sync", support::bin("lw-sync"))
        .register_bin("git", on_path("git"))
        .case("tests/cmd/*.toml")
        .case("tests/cmd/*.trycmd");
}

/// `name` as found on PATH (a `.trycmd` case sets up a checkout with git).
fn on_path(name: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| name.into())
}
