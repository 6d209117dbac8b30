//! `lw init`: loopwright for a repository it has never seen.
//!
//! It looks at the top of the git checkout for the files that name a stack
//! (`Cargo.toml`, `package.json`, `pyproject.toml`/`requirements*.txt`,
//! `go.mod`, `mise.toml`/`.tool-versions`) and plans `.loopwright/`: the
//! runtime of lw-build(1) with a toolchain layer that fits (the project's
//! own mise tools when it has them, else Debian's packages for the stacks
//! found, which need no download site but Debian's) and a deps layer whose
//! inputs are the lockfiles found; a commented configuration; the built-in
//! policy as a starting point; and the `.gitignore` line for the cache.
//!
//! The plan is made first and written only when nothing would be
//! overwritten (or `--force`), so `--dry-run` prints exactly what a run
//! writes.  Nothing here talks to an engine or a network: the caller picks
//! the base image (lib/init takes it as given) and the host's extra
//! certificate authorities ([`host_authorities`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use base::error::{Error, Exit, Result};
use wall::image::{DEFAULT_RUNTIME, KNOWN_DEPS_FILES, RUNTIME_DIR};

pub mod check;
pub mod devcontainer;
pub mod versions;

/// Where the host keeps certificate authorities it added to the system's
/// (Debian's `update-ca-certificates` input): a TLS-intercepting proxy's,
/// a company's.  `build.ca = host` copies them into every build.
pub const HOST_CA_DIR: &str = "/usr/local/share/ca-certificates";

/// The `.loopwright/config` key: `host` copies [`HOST_CA_DIR`]'s
/// certificates into the base layer's inputs at each `lw-build`.
pub const KEY_CA: &str = "build.ca";

/// Where host certificates are copied, inside the base layer's inputs.
pub const HOST_CA_COPY: &str = ".loopwright/runtime/ca-certificates/host";

/// One stack found, and the file that says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    pub name: &'static str,
    pub evidence: String,
}

const STACKS: &[(&str, &[&str])] = &[
    ("rust", &["Cargo.toml"]),
    ("node", &["package.json"]),
    (
        "python",
        &["pyproject.toml", "requirements.txt", "setup.py"],
    ),
    ("go", &["go.mod"]),
];

/// The toolchain layer's script (lw init's native provider).
pub const TOOLCHAIN_SCRIPT: &str = include_str!("../runtime/toolchain.sh");

/// Lockfiles the deps layer takes as inputs besides lw-build's own list.
const MORE_DEPS_FILES: &[&str] = &[
    "yarn.lock",
    "pnpm-lock.yaml",
    "poetry.lock",
    "uv.lock",
    "pdm.lock",
    "setup.py",
    "setup.cfg",
];

/// The stacks whose files are at `top`, in a fixed order.
pub fn detect(top: &Path) -> Vec<Stack> {
    let mut found = Vec::new();
    for (name, files) in STACKS {
        let evidence = files
            .iter()
            .find(|f| top.join(f).is_file())
            .map(|f| f.to_string())
            .or_else(|| {
                (*name == "python")
                    .then(|| requirements(top).into_iter().next())
                    .flatten()
            });
        if let Some(evidence) = evidence {
            found.push(Stack { name, evidence });
        }
    }
    found
}

/// `requirements*.txt` at `top`, sorted.
fn requirements(top: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(top)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("requirements") && n.ends_with(".txt"))
        .collect();
    v.sort();
    v
}

/// The lockfiles and manifests at `top` the deps layer declares as inputs.
pub fn deps_inputs(top: &Path) -> Vec<String> {
    let mut v: Vec<String> = KNOWN_DEPS_FILES
        .iter()
        .chain(MORE_DEPS_FILES)
        .filter(|f| top.join(f).is_file())
        .map(|f| f.to_string())
        .collect();
    for r in requirements(top)
        .into_iter()
        .chain(members(top, Path::new(""), "Cargo.toml", 3))
    {
        if !v.contains(&r) {
            v.push(r);
        }
    }
    v
}

/// `name` in the directories below `top` (not at its top), `depth` levels
/// down at most, sorted: a workspace's member manifests.  Only when `top`
/// has one itself; build output, dependencies and dot-directories are not
/// looked into, nor are symbolic links followed.
fn members(top: &Path, rel: &Path, name: &str, depth: usize) -> Vec<String> {
    if depth == 0 || (rel.as_os_str().is_empty() && !top.join(name).is_file()) {
        return Vec::new();
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(top.join(rel))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && !matches!(n.as_str(), "target" | "node_modules"))
        .map(|n| rel.join(n))
        .collect();
    dirs.sort();
    let mut v = Vec::new();
    for d in dirs {
        let m = d.join(name);
        if top.join(&m).is_file()
            && let Some(s) = m.to_str()
        {
            v.push(s.to_string());
        }
        v.extend(members(top, &d, name, depth - 1));
    }
    v
}

/// The host's extra certificate authorities: `(file name, PEM)` of each
/// `*.crt` directly in `dir` (normally [`HOST_CA_DIR`]), sorted by name.
pub fn host_authorities(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().into_string().ok()?;
            let is_file = e.file_type().ok()?.is_file();
            (is_file && n.ends_with(".crt"))
                .then(|| std::fs::read(e.path()).ok().map(|b| (n, b)))
                .flatten()
        })
        .collect();
    v.sort();
    v
}

/// Makes `top/HOST_CA_COPY` hold exactly `cas` (files written when their
/// content changed, others removed); returns how many changed.  lw-build
/// calls it for `build.ca = host`: the copies are inputs of the base layer,
/// so a new or changed authority rebuilds it.
pub fn sync_authorities(top: &Path, cas: &[(String, Vec<u8>)]) -> Result<usize> {
    let dir = top.join(HOST_CA_COPY);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io("cannot create", &dir, e))?;
    let mut changed = 0;
    for (name, pem) in cas {
        let p = dir.join(name);
        if std::fs::read(&p).ok().as_deref() != Some(pem.as_slice()) {
            base::fs::write_replace(&p, pem, 0o644, base::fs::Durability::Synced)
                .map_err(|e| Error::io("cannot write", &p, e))?;
            changed += 1;
        }
    }
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if !cas.iter().any(|(c, _)| *c == n) {
            std::fs::remove_file(e.path())
                .map_err(|er| Error::io("cannot remove", &e.path(), er))?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// What `lw init` decides.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The image the base layer starts from.
    pub from: String,
    /// The host's extra authorities, copied in (and `build.ca = host`).
    pub authorities: Vec<(String, Vec<u8>)>,
    /// The devcontainer configuration the runtime comes from, mapped, and
    /// the host variables it was allowed to read.
    pub devcontainer: Option<(devcontainer::Mapping, Vec<String>)>,
    /// More inputs of the deps layer (`--input`).
    pub inputs: Vec<String>,
}

/// One file `lw init` writes: path relative to the checkout's top.
#[derive(Clone, Debug)]
pub struct File {
    pub path: String,
    pub bytes: Vec<u8>,
    pub mode: u32,
}

/// Everything `lw init` writes, and what it found.
#[derive(Clone, Debug)]
pub struct Plan {
    pub top: PathBuf,
    pub stacks: Vec<Stack>,
    pub deps: Vec<String>,
    /// The project's own mise file the toolchain follows, if any.
    pub mise: Option<String>,
    pub files: Vec<File>,
    /// Whether `.gitignore` gains the cache's line.
    pub gitignore: bool,
}

/// The `.gitignore` line that keeps the cache (mirror, mailbox) out of git.
pub const GITIGNORE_LINE: &str = ".loopwright/cache/";

/// Plans `.loopwright/` for the checkout at `top`.
pub fn plan(top: &Path, o: &Options) -> Result<Plan> {
    let stacks = detect(top);
    let mut deps = deps_inputs(top);
    for i in &o.inputs {
        if !deps.contains(i) {
            deps.push(i.clone());
        }
    }
    let mise = ["mise.toml", ".mise.toml", ".tool-versions"]
        .into_iter()
        .find(|f| top.join(f).is_file())
        .map(str::to_string);
    let names: Vec<&str> = stacks.iter().map(|s| s.name).collect();
    let toolchain = mise.is_none().then(|| {
        let declared = versions::declared(top, &names);
        versions::render(&declared.iter().map(versions::resolve).collect::<Vec<_>>())
    });
    let mut files = Vec::new();
    if let Some((dc, _)) = &o.devcontainer {
        let digest = devcontainer::digest(top, &dc.source).unwrap_or_default();
        for (path, bytes, mode) in devcontainer::render::files(dc, &o.from, &deps, &digest) {
            files.push(File { path, bytes, mode });
        }
    }
    for (name, text, mode) in DEFAULT_RUNTIME.iter().filter(|_| o.devcontainer.is_none()) {
        let path = format!("{RUNTIME_DIR}/{name}");
        let text = match *name {
            "runtime.conf" => runtime_conf(text, &o.from, &deps, mise.is_none(), &stacks),
            "toolchain.Dockerfile" if mise.is_none() => native_toolchain(&stacks),
            "mise.toml" => match &mise {
                Some(f) => mise_tools(top, f)?,
                None => continue,
            },
            _ => text.to_string(),
        };
        files.push(File {
            path,
            bytes: text.into_bytes(),
            mode: *mode,
        });
        if *name == "toolchain.Dockerfile"
            && let Some(declared) = &toolchain
        {
            files.push(File {
                path: format!("{RUNTIME_DIR}/toolchain.sh"),
                bytes: TOOLCHAIN_SCRIPT.as_bytes().to_vec(),
                mode: 0o755,
            });
            files.push(File {
                path: versions::FILE.to_string(),
                bytes: declared.clone().into_bytes(),
                mode: 0o644,
            });
        }
    }
    for (name, pem) in &o.authorities {
        files.push(File {
            path: format!("{HOST_CA_COPY}/{name}"),
            bytes: pem.clone(),
            mode: 0o644,
        });
    }
    let mut config = config_text(&stacks, !o.authorities.is_empty());
    if let Some((dc, allowed)) = &o.devcontainer {
        config.push_str(&devcontainer::render::config_lines(dc, allowed));
    }
    files.push(File {
        path: base::config::FILE.to_string(),
        bytes: config.into_bytes(),
        mode: 0o644,
    });
    files.push(File {
        path: mailbox::policy::DEFAULT_PATH.to_string(),
        bytes: format!(
            "# The mediator's policy: the built-in one, written out to edit.\n# See mailbox-spec.md, POLICY, and lw-mediate policy check.\n{}",
            mailbox::policy::Policy::default().render()
        )
        .into_bytes(),
        mode: 0o644,
    });
    let ignored = std::fs::read_to_string(top.join(".gitignore")).unwrap_or_default();
    let gitignore = !ignored.lines().any(|l| {
        matches!(
            l.trim(),
            ".loopwright/cache/" | ".loopwright/cache" | "/.loopwright/cache/"
        )
    });
    Ok(Plan {
        top: top.to_path_buf(),
        stacks,
        deps,
        mise,
        files,
        gitignore,
    })
}

fn runtime_conf(
    template: &str,
    from: &str,
    deps: &[String],
    native: bool,
    stacks: &[Stack],
) -> String {
    let mut text = template.replace("@FROM@", from);
    let mut extra = String::new();
    for i in deps {
        let _ = writeln!(extra, "    input {i}");
    }
    text = text.replace("@DEPS_INPUTS@\n", &extra);
    if native {
        let names: Vec<&str> = stacks.iter().map(|s| s.name).collect();
        let layer = format!(
            "# Language toolchains for {}, at the versions the project declares\n# (toolchain.versions, which lw-build rewrites from the project's files;\n# toolchain.sh says where each comes from; see lw-build(1) to switch to\n# mise).\nlayer toolchain\n    dockerfile .loopwright/runtime/toolchain.Dockerfile\n    provider native\n    input .loopwright/runtime/toolchain.sh .loopwright/runtime/toolchain.versions\n",
            if names.is_empty() {
                "no stack found".to_string()
            } else {
                names.join(", ")
            }
        );
        text = text.replace(
            "# Language toolchains, as declared in mise.toml.\nlayer toolchain\n    dockerfile .loopwright/runtime/toolchain.Dockerfile\n    provider mise 2026.9.15\n    input .loopwright/runtime/mise.toml\n",
            &layer,
        );
    }
    text
}

/// The sandbox's environment for the stacks' toolchains and dependencies
/// (toolchain.sh and deps.sh put them there): what is under /work (an
/// incremental install's) comes before the image's; every tool trusts the
/// system's authorities (the base layer's, a proxy's among them); temporary
/// files are under /work, as /tmp is mounted noexec (rustdoc runs its
/// doctests from there).
const STACK_ENV: &str = "ENV PATH=/work/.venv/bin:/opt/loopwright/venv/bin:/opt/loopwright/deps/node_modules/.bin:/opt/loopwright/node/bin:/opt/loopwright/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    VIRTUAL_ENV=/opt/loopwright/venv \\
    CARGO_HOME=/work/.cargo \\
    GOMODCACHE=/work/.cache/go-mod \\
    GOCACHE=/work/.cache/go-build \\
    GOPROXY=file:///opt/loopwright/gomod/cache/download \\
    GOSUMDB=off \\
    GOTOOLCHAIN=local \\
    GOFLAGS=-modcacherw \\
    npm_config_cache=/work/.cache/npm \\
    npm_config_update_notifier=false \\
    PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \\
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \\
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \\
    UV_NATIVE_TLS=1 \\
    TMPDIR=/work
";

fn native_toolchain(stacks: &[Stack]) -> String {
    let names: Vec<&str> = stacks.iter().map(|s| s.name).collect();
    let install = if names.is_empty() {
        "# No stack was found: nothing to install yet.\nRUN true\n".to_string()
    } else {
        format!(
            "COPY . /opt/loopwright/toolchain/\nRUN sh /opt/loopwright/toolchain/.loopwright/runtime/toolchain.sh /opt/loopwright/toolchain {}\n",
            names.join(" ")
        )
    };
    format!(
        "# Toolchain layer (written by lw init): toolchain.sh installs each stack's\n# toolchain at the version its declared inputs name, from the sources an\n# image build can reach (Debian's package registry, the npm registry, the Go\n# module proxy); the build log and lw doctor say what it took instead where\n# a declared version cannot be had.\nARG LW_PARENT\nFROM ${{LW_PARENT}}\n{install}{STACK_ENV}"
    )
}

/// The runtime's mise.toml from the project's own mise file: a copy of
/// `mise.toml`, or `.tool-versions` (`TOOL VERSION` lines) as `[tools]`.
fn mise_tools(top: &Path, file: &str) -> Result<String> {
    let p = top.join(file);
    let text = std::fs::read_to_string(&p).map_err(|e| Error::io("cannot read", &p, e))?;
    if file != ".tool-versions" {
        return Ok(format!(
            "# Copied from {file} by lw init: the toolchain layer installs these.\n{text}"
        ));
    }
    let mut out =
        format!("# From {file}, by lw init: the toolchain layer installs these.\n[tools]\n");
    for l in text.lines() {
        let l = l.split('#').next().unwrap_or("").trim();
        let mut it = l.split_whitespace();
        if let (Some(tool), Some(version)) = (it.next(), it.next()) {
            let _ = writeln!(out, "\"{tool}\" = \"{version}\"");
        }
    }
    Ok(out)
}

fn config_text(stacks: &[Stack], host_ca: bool) -> String {
    let mut s = String::from(
        "# loopwright's settings for this project (written by lw init).\n# Every key is in loopwright(7), CONFIGURATION; an unknown key is refused.\n",
    );
    if host_ca {
        s.push_str(
            "\n# The host's extra certificate authorities (a TLS-intercepting proxy's)\n# are copied into the base layer at each lw-build, so a change rebuilds it.\nbuild.ca = host\n",
        );
    }
    s.push_str("\n# Each sandbox's limits (lw-sandbox(1), LIMITS):\n# sandbox.memory = 2g\n# sandbox.cpus = 1\n# sandbox.disk = 4g\n");
    if !stacks.is_empty() {
        let _ = writeln!(
            s,
            "\n# Stacks found: {}.",
            stacks
                .iter()
                .map(|st| format!("{} ({})", st.name, st.evidence))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    s
}

impl Plan {
    /// The files that exist already (and would be replaced).
    pub fn existing(&self) -> Vec<&File> {
        self.files
            .iter()
            .filter(|f| self.top.join(&f.path).exists())
            .collect()
    }

    /// Writes the plan; refuses (73) when a file exists, unless `force`.
    /// Returns the paths written, `.gitignore` last when it changed.
    pub fn write(&self, force: bool) -> Result<Vec<String>> {
        if !force && let Some(f) = self.existing().first() {
            return Err(Error::new(
                Exit::CantCreat,
                format!(
                    "'{}' exists; not overwriting it (lw init --force replaces what lw init writes, --dry-run shows it)",
                    self.top.join(&f.path).display()
                ),
            ));
        }
        let mut written = Vec::new();
        for f in &self.files {
            let p = self.top.join(&f.path);
            let parent = p.parent().expect("a planned file has a parent");
            std::fs::create_dir_all(parent).map_err(|e| Error::io("cannot create", parent, e))?;
            base::fs::write_replace(&p, &f.bytes, f.mode, base::fs::Durability::Synced)
                .map_err(|e| Error::io("cannot write", &p, e))?;
            written.push(f.path.clone());
        }
        if self.gitignore {
            let p = self.top.join(".gitignore");
            let mut text = std::fs::read_to_string(&p).unwrap_or_default();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(GITIGNORE_LINE);
            text.push('\n');
            base::fs::write_replace(&p, text.as_bytes(), 0o644, base::fs::Durability::Synced)
                .map_err(|e| Error::io("cannot write", &p, e))?;
            written.push(".gitignore".to_string());
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "lw-init-{}-{:x}",
            std::process::id(),
            base::id::random128() as u32
        ));
        std::fs::create_dir_all(&d).unwrap();
        for (n, t) in files {
            std::fs::write(d.join(n), t).unwrap();
        }
        d
    }

    fn file<'a>(p: &'a Plan, path: &str) -> &'a str {
        let f = p.files.iter().find(|f| f.path == path).expect(path);
        std::str::from_utf8(&f.bytes).unwrap()
    }

    #[test]
    fn each_stack_is_found_by_its_file_and_gets_its_packages_and_lockfiles() {
        // (files, stacks found, deps inputs, in the toolchain's Dockerfile)
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            &'a [&'a str],
            &'a [&'a str],
            &'a str,
        );
        let cases: &[Case] = &[
            (
                &[("Cargo.toml", ""), ("Cargo.lock", "")],
                &["rust"],
                &["Cargo.toml", "Cargo.lock"],
                "toolchain rust\n",
            ),
            (
                &[("package.json", "{}"), ("package-lock.json", "{}")],
                &["node"],
                &["package.json", "package-lock.json"],
                "toolchain node\n",
            ),
            (
                &[("pyproject.toml", ""), ("poetry.lock", "")],
                &["python"],
                &["pyproject.toml", "poetry.lock"],
                "toolchain python\n",
            ),
            (
                &[("requirements-dev.txt", "")],
                &["python"],
                &["requirements-dev.txt"],
                "toolchain python\n",
            ),
            (
                &[("go.mod", "module x"), ("go.sum", "")],
                &["go"],
                &["go.mod", "go.sum"],
                "toolchain go\n",
            ),
            (
                &[("Cargo.toml", ""), ("package.json", "{}")],
                &["rust", "node"],
                &["package.json", "Cargo.toml"],
                "toolchain rust node\n",
            ),
            (&[("README", "")], &[], &[], "RUN true"),
        ];
        for (files, stacks, deps, pkgs) in cases {
            let d = dir(files);
            let p = plan(
                &d,
                &Options {
                    from: "debian:bookworm-slim".into(),
                    authorities: vec![],
                    ..Default::default()
                },
            )
            .unwrap();
            let names: Vec<&str> = p.stacks.iter().map(|s| s.name).collect();
            assert_eq!(&names, stacks, "{files:?}");
            assert_eq!(&p.deps, deps, "{files:?}");
            let conf = file(&p, ".loopwright/runtime/runtime.conf");
            for dep in *deps {
                assert!(conf.contains(&format!("    input {dep}\n")), "{conf}");
            }
            assert!(conf.contains("provider native"), "{conf}");
            assert!(conf.contains("from debian:bookworm-slim"));
            assert!(
                file(&p, ".loopwright/runtime/toolchain.Dockerfile").contains(pkgs),
                "{files:?}"
            );
            assert!(!p.files.iter().any(|f| f.path.ends_with("mise.toml")));
            // The toolchain layer's inputs: its script and the declared
            // versions, never a lockfile.
            assert!(
                conf.contains("    input .loopwright/runtime/toolchain.sh .loopwright/runtime/toolchain.versions\n"),
                "{conf}"
            );
            let versions = file(&p, versions::FILE);
            for st in *stacks {
                assert!(versions.contains(&format!("\n{st}\t")), "{versions}");
            }
            // What lw-build reads must parse.
            wall::image::parse(conf, "runtime.conf").expect("lw-build reads it");
            std::fs::remove_dir_all(&d).unwrap();
        }
    }

    #[test]
    fn a_project_with_mise_tools_keeps_them_and_the_mise_provider() {
        let d = dir(&[(".tool-versions", "node 22.11.0 # lts\npython 3.12.7\n")]);
        let p = plan(
            &d,
            &Options {
                from: "img".into(),
                authorities: vec![],
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.mise.as_deref(), Some(".tool-versions"));
        let conf = file(&p, ".loopwright/runtime/runtime.conf");
        assert!(conf.contains("provider mise"), "{conf}");
        let m = file(&p, ".loopwright/runtime/mise.toml");
        assert!(
            m.contains("[tools]\n\"node\" = \"22.11.0\"\n\"python\" = \"3.12.7\"\n"),
            "{m}"
        );
        wall::image::parse(conf, "runtime.conf").expect("lw-build reads it");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn authorities_the_config_policy_and_gitignore() {
        let d = dir(&[(".gitignore", "target/")]);
        let cas = vec![("corp.crt".to_string(), b"PEM".to_vec())];
        let p = plan(
            &d,
            &Options {
                from: "img".into(),
                authorities: cas.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            file(&p, ".loopwright/runtime/ca-certificates/host/corp.crt"),
            "PEM"
        );
        let c = file(&p, ".loopwright/config");
        let cfg = base::config::Config::parse(c, Path::new("config")).unwrap();
        assert_eq!(cfg.get(KEY_CA), Some("host"));
        mailbox::policy::Policy::parse(file(&p, ".loopwright/policy"), None)
            .expect("the policy parses");
        assert!(p.gitignore);
        let w = p.write(false).unwrap();
        assert_eq!(w.last().map(String::as_str), Some(".gitignore"));
        assert_eq!(
            std::fs::read_to_string(d.join(".gitignore")).unwrap(),
            "target/\n.loopwright/cache/\n"
        );
        // A second run refuses, names the file, and --force replaces.
        let again = plan(
            &d,
            &Options {
                from: "img".into(),
                authorities: cas,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(!again.gitignore);
        let e = again.write(false).unwrap_err();
        assert_eq!(e.exit, Exit::CantCreat);
        assert!(again.write(true).is_ok());
        // A changed authority is copied again, a gone one removed.
        assert_eq!(
            sync_authorities(&d, &[("corp.crt".into(), b"PEM".to_vec())]).unwrap(),
            0
        );
        assert_eq!(
            sync_authorities(&d, &[("new.crt".into(), b"NEW".to_vec())]).unwrap(),
            2
        );
        assert!(!d.join(HOST_CA_COPY).join("corp.crt").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
