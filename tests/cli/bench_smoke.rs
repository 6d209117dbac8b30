//! Every bench in its smallest setting (`scripts/bench --smoke`), on the
//! binaries under test, the real Docker engine and real git: each must run
//! to its end, print its per-run ratios and load averages, and leave no
//! container, volume, network, mount or loop device behind (issue 49: the
//! sandbox bench's cleanup once left two loop mounts per sandbox).

use std::path::Path;
use std::process::{Command, Stdio};

#[test]
#[ignore = "runs every bench at its smallest setting on the real Docker engine (about ten minutes on two loaded cores); run with --ignored"]
fn every_bench_runs_small_and_leaves_nothing() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lw")).parent().unwrap();
    // The door's commands and lw-mcp are other packages' binaries: the
    // top-level `cargo build` (or `cargo test`) builds them beside these.
    for other in [
        "lw-post",
        "lw-inbox",
        "lw-mediate",
        "lw-mcp",
        "lw-github-sink",
    ] {
        assert!(
            bin_dir.join(other).is_file(),
            "{other} is not in {}: run `cargo build --workspace --bins` first",
            bin_dir.display()
        );
    }
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-smoke");
    std::fs::create_dir_all(&cache).unwrap();
    let o = Command::new("bash")
        .arg(top.join("scripts/bench"))
        .arg("--smoke")
        .env("BENCH_BIN_DIR", bin_dir)
        .env("BENCH_CACHE", &cache)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs scripts/bench");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    println!("{out}\n{err}");
    assert!(
        o.status.success(),
        "scripts/bench --smoke failed ({:?})",
        o.status
    );
    assert!(
        !out.contains("FAILED"),
        "a bench failed or left something:\n{out}"
    );
    // Each bench with a peer printed its per-run ratios and a table row.
    for bench in ["build", "post", "mirror", "mediate", "sandbox", "radar"] {
        let row = format!("bench-{bench} ");
        assert!(
            out.lines().any(|l| l.starts_with(&row)),
            "no table row for bench-{bench}:\n{out}"
        );
        assert!(
            out.contains(&format!("bench-{bench}: load average at start")),
            "bench-{bench} printed no load average:\n{out}"
        );
    }
    assert!(
        out.contains("per-run ratios") && out.contains("per-round ratios"),
        "{out}"
    );
}
