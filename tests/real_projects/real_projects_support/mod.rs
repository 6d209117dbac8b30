//! The corpus of tests/real_projects/main.rs: which real projects, and how each
//! comes from its registry.  Each is fetched with the ordinary client
//! (`npm pack`, `pip download`, a crate from static.crates.io, `go mod
//! download`), pinned to an exact version, unpacked, given the lockfile its
//! repository would have where the package leaves it out (made by the
//! stack's own tool) and cached under `LW_REAL_CACHE` (default
//! `/var/cache/loopwright-real`), so a second run needs no network.

pub(crate) mod checkout;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::sandbox_support::{err, nonce, text};

/// The pnpm that makes a pnpm project's lockfile: the one deps.sh installs
/// when `packageManager` names none.
pub(crate) const PNPM: &str = "9.15.9";

/// The yarn that makes a yarn project's lockfile: the one deps.sh installs
/// when `packageManager` names none.
pub(crate) const YARN: &str = "1.22.22";

/// How a project comes from its registry.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    /// `npm pack`, with a package-lock.json made by npm.
    Npm,
    /// `npm pack`, with a pnpm-lock.yaml made by pnpm [`PNPM`].
    Pnpm,
    /// `npm pack`, with a yarn.lock (v1) made by yarn [`YARN`].
    Yarn,
    /// `pip download` of the sdist, as published (pyshacl's holds its
    /// poetry.lock).
    Pypi,
    Crate,
    /// A workspace as its repository lays it out: the crate at the top and
    /// each `(crate, directory)` member below it, all of the project's
    /// version, each with its own manifest as written (the package's
    /// `Cargo.toml.orig`, whose `[workspace]` and `path` dependencies
    /// crates.io's normalized copy leaves out).
    Workspace(&'static [(&'static str, &'static str)]),
    Go,
}

pub(crate) struct Project {
    pub stack: &'static str,
    pub source: Source,
    pub name: &'static str,
    pub version: &'static str,
    /// The project's own test command, run in /work/repo.
    pub test: &'static str,
    /// What it covers.
    pub why: &'static str,
}

const fn p(
    stack: &'static str,
    source: Source,
    name: &'static str,
    version: &'static str,
    test: &'static str,
    why: &'static str,
) -> Project {
    Project {
        stack,
        source,
        name,
        version,
        test,
        why,
    }
}

/// The first of each stack is the one `.ci/run` runs.
pub(crate) const CORPUS: &[Project] = &[
    p(
        "node",
        Source::Npm,
        "xtend",
        "4.0.2",
        "npm test",
        "npm, package-lock, a dev dependency (tape)",
    ),
    p(
        "python",
        Source::Pypi,
        "six",
        "1.16.0",
        "python3 -m pytest -q",
        "setup.py only, a flat module",
    ),
    p(
        "rust",
        Source::Crate,
        "itoa",
        "1.0.11",
        "cargo test --offline -q",
        "a crate with no dependency",
    ),
    p(
        "go",
        Source::Go,
        "github.com/google/uuid",
        "v1.6.0",
        "go test ./...",
        "a module with no dependency",
    ),
    p(
        "node",
        Source::Npm,
        "minimist",
        "1.2.8",
        "npm test",
        "nyc and tape: many dev dependencies, .bin tools",
    ),
    p(
        "python",
        Source::Pypi,
        "more-itertools",
        "10.5.0",
        "python3 -m pytest -q",
        "pyproject (flit), tests in the sdist",
    ),
    p(
        "rust",
        Source::Crate,
        "semver",
        "1.0.23",
        "cargo test --offline -q",
        "a build script",
    ),
    p(
        "go",
        Source::Go,
        "github.com/stretchr/testify",
        "v1.9.0",
        // The two skipped look at ../_codegen, a nested module the Go
        // proxy's zip of testify leaves out.
        "go test ./assert/... -skip \"TestDirExists|TestNoDirExists\"",
        "modules downloaded (yaml, difflib)",
    ),
    p(
        "node",
        Source::Pnpm,
        "duplexify",
        "4.1.3",
        "pnpm test",
        "pnpm-lock.yaml: pnpm's symlinked node_modules, dev dependencies (tape, through2)",
    ),
    p(
        "python",
        Source::Pypi,
        "typing-inspection",
        "0.4.0",
        "python3 -m pytest -q",
        "src layout, uv.lock, dependency groups (tests; docs and lint left out)",
    ),
    p(
        "rust",
        Source::Workspace(&[("thiserror-impl", "impl")]),
        "thiserror",
        "1.0.69",
        "cargo test --offline -q",
        "a workspace (a proc-macro member), a build script, dev dependencies, rust-toolchain.toml",
    ),
    p(
        "go",
        Source::Go,
        "github.com/spf13/cobra",
        "v1.8.1",
        "go test ./...",
        "two packages, five modules downloaded (a /v2 path, one only indirect)",
    ),
    p(
        "python",
        Source::Pypi,
        "pyshacl",
        "0.40.1",
        // Left out: the tests that fetch from the web (the network is off)
        // and those of the `js` extra (pyduktape2), which is neither a
        // test nor a dev dependency.
        "python3 -m pytest -q -p no:warnings --ignore=test/test_js --deselect test/issues/test_108.py::test_108 -k \"not web and not jsonld and not owl_imports and not test_154\"",
        "poetry.lock as published in the sdist (Poetry 2.4.1): [project] and a poetry dev group, held to the lock's pins",
    ),
    p(
        "python",
        Source::Pypi,
        "bitarray",
        "3.0.0",
        "python3 setup.py -q build_ext --inplace && python3 -m pytest -q bitarray",
        "a C extension built from source in the sandbox (gcc, Python's headers, setuptools offline)",
    ),
    p(
        "node",
        Source::Yarn,
        "duplexer",
        "0.1.2",
        "yarn test",
        "yarn.lock (v1, yarn 1.22.22), dev dependencies (tape, through)",
    ),
];

pub(crate) fn cache() -> PathBuf {
    let d = std::env::var_os("LW_REAL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/loopwright-real"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sh(dir: &Path, script: &str) -> Output {
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs")
}

pub(crate) fn ok(dir: &Path, script: &str) -> String {
    let o = sh(dir, script);
    assert!(o.status.success(), "{script}: {}\n{}", text(&o), err(&o));
    text(&o)
}

/// The script that fetches `pr` into `src/` of the current directory.
fn fetch_script(pr: &Project) -> String {
    let (n, v) = (pr.name, pr.version);
    let crate_into = |name: &str, dir: &str| {
        format!(
            "mkdir -p {dir} && curl -fsSL https://static.crates.io/crates/{name}/{name}-{v}.crate | tar -xzf - -C {dir} --strip-components=1"
        )
    };
    let npm = format!(
        "npm pack -q {n}@{v} >/dev/null && tar -xzf *.tgz -C src --strip-components=1 && cd src"
    );
    match pr.source {
        Source::Npm => format!(
            "{npm} && npm install --package-lock-only --ignore-scripts --no-audit --no-fund -q >/dev/null"
        ),
        Source::Pnpm => format!(
            "{npm} && npx -y pnpm@{PNPM} install --lockfile-only --ignore-scripts >/dev/null"
        ),
        Source::Yarn => format!(
            "{npm} && npx -y yarn@{YARN} install --ignore-scripts --no-progress --non-interactive >/dev/null && rm -rf node_modules"
        ),
        Source::Pypi => format!(
            "python3 -m pip download -q --no-binary :all: --no-deps {n}=={v} -d . && tar -xzf *.tar.gz -C src --strip-components=1"
        ),
        Source::Crate => format!(
            "{} && cd src && {{ [ -f Cargo.lock ] || cargo generate-lockfile -q; }}",
            crate_into(n, "src")
        ),
        Source::Workspace(members) => {
            let mut s = crate_into(n, "src");
            for (m, d) in members {
                s += &format!(" && {}", crate_into(m, &format!("src/{d}")));
            }
            s + " && find src -name Cargo.toml.orig | while read -r f; do mv \"$f\" \"${f%.orig}\"; done && cd src && cargo generate-lockfile -q"
        }
        Source::Go => format!(
            "d=$(GOFLAGS=-modcacherw GOMODCACHE=$PWD/mod go mod download -json {n}@{v} | sed -nE 's/^[[:space:]]*\"Dir\": \"(.*)\",?$/\\1/p') && cp -a \"$d\"/. src/ && chmod -R u+w src mod"
        ),
    }
}

/// The project's source tree, fetched once into the cache.
pub(crate) fn fetch(pr: &Project) -> PathBuf {
    let safe = pr.name.replace('/', "_");
    let dir = cache().join(format!("{safe}-{}", pr.version));
    // Tests of this binary run side by side and may want one project at
    // once (six: lw init --check and one per stack): one fetches, the
    // other waits and takes its tree, rather than both fetching and the
    // second rename finding the first's directory.
    let lock = std::fs::File::create(cache().join(format!(".{safe}-{}.lock", pr.version))).unwrap();
    lock.lock().unwrap();
    if dir.join(".lw-fetched").exists() {
        return dir;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let tmp = cache().join(format!(".{safe}-{}.{}", pr.version, nonce()));
    std::fs::create_dir_all(tmp.join("src")).unwrap();
    ok(&tmp, &fetch_script(pr));
    std::fs::write(tmp.join("src/.lw-fetched"), "").unwrap();
    std::fs::rename(tmp.join("src"), &dir).unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    dir
}

/// `LW_REAL_ONLY` (a stack) and `LW_PROJECTS` (comma-separated project
/// names, a Go module's by its last element too): whether `pr` is to run.
pub(crate) fn chosen(pr: &Project) -> bool {
    let only = std::env::var("LW_REAL_ONLY").unwrap_or_default();
    let names = std::env::var("LW_PROJECTS").unwrap_or_default();
    (only.is_empty() || only == pr.stack)
        && (names.is_empty()
            || names.split(',').any(|n| {
                let n = n.trim();
                n == pr.name || pr.name.ends_with(&format!("/{n}"))
            }))
}

/// deps.sh's Python step (the script between `<<'EOF'` and `EOF`), run by
/// the host's python3 (3.11 or later, for tomllib) in `dir`: its status,
/// the requirements it wrote (`project.txt`) and the lock's pins
/// (`lock.pins`).
pub(crate) fn python_step(dir: &std::path::Path) -> (Output, String, String) {
    let script = include_str!("../../../runtime/deps.sh");
    let body = script
        .split_once("<<'EOF'\n")
        .and_then(|(_, rest)| rest.split_once("\nEOF\n"))
        .expect("deps.sh has its Python step between <<'EOF' and EOF")
        .0;
    let req = dir.join("req");
    std::fs::create_dir_all(&req).unwrap();
    let o = Command::new("python3")
        .args(["-c", body, req.to_str().unwrap(), "/nonexistent/uv"])
        .current_dir(dir)
        .env_remove("PIP_INDEX_URL")
        .env_remove("PIP_EXTRA_INDEX_URL")
        .output()
        .expect("python3 runs");
    let read = |f: &str| std::fs::read_to_string(req.join(f)).unwrap_or_default();
    (o.clone(), read("project.txt"), read("lock.pins"))
}
