//! The toolchain a project's declarations resolve to, as one small file
//! that is the toolchain layer's input (`.loopwright/runtime/toolchain.versions`).
//!
//! A version is declared in a file of its own (`rust-toolchain.toml`,
//! `.nvmrc`, `.python-version`) or in a manifest that also lists the
//! dependencies (`Cargo.toml`'s `rust-version`, `package.json`'s
//! `engines.node`, `pyproject.toml`'s `requires-python`, `go.mod`'s `go` and
//! `toolchain` lines).  Were the manifests the toolchain layer's inputs, a
//! new dependency would rebuild the toolchain; were the declarations, two
//! projects asking for `>=3.9` and `>=3.10` would each build the same Debian
//! Python.  So the file holds what the declarations resolve to ([`resolve`]:
//! the toolchain toolchain.sh installs, from the sources an image build
//! reaches), one line a stack; lw-build rewrites it before each build
//! ([`sync`]): the toolchain layer rebuilds exactly when what it installs
//! changes, and projects whose declarations resolve alike share it.  Where a
//! declaration cannot be had as asked, [`Resolved::note`] says what is taken
//! instead and why: lw-build prints it, lw doctor repeats it.

use std::path::Path;

use base::error::{Error, Result};

/// The file, relative to the checkout's top.
pub const FILE: &str = ".loopwright/runtime/toolchain.versions";

const HEADER: &str = "# The toolchain this project's declarations resolve to: STACK<tab>TOOLCHAIN.\n# Written by lw init and rewritten by lw-build from the project's files\n# before each build; toolchain.sh installs it (lw-init(1)).\n";

/// Debian trixie-backports' rustc, which follows Rust's stable releases:
/// the newest Rust an image build here can have (trixie's own is 1.85,
/// too old for many current lockfiles' crates).
pub const DEBIAN_RUST: &str = "1.98.1";
/// Debian trixie's Go; a newer declared Go comes from the Go module proxy.
pub const DEBIAN_GO: &str = "1.24.4";
/// The Node major taken when none is named, or a lower bound below it.
pub const NODE_LTS: u32 = 22;

/// One stack's declaration: `version` empty when none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub stack: String,
    pub version: String,
    pub from: String,
}

/// What a declaration resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub stack: String,
    /// What toolchain.sh installs: `debian` (rust, go), `3.11` or `3.13`
    /// (python), a Node version or major, `go1.25.0`.
    pub toolchain: String,
    /// Where the declaration cannot be had as asked: what is taken
    /// instead and why.
    pub note: Option<String>,
}

/// What `top` declares for each of `stacks`.
pub fn declared(top: &Path, stacks: &[&str]) -> Vec<Declared> {
    stacks
        .iter()
        .map(|s| {
            let (version, from) = find(top, s).unwrap_or_default();
            Declared {
                stack: s.to_string(),
                version,
                from,
            }
        })
        .collect()
}

/// The file's text for `r`.
pub fn render(r: &[Resolved]) -> String {
    let mut s = HEADER.to_string();
    for x in r {
        s.push_str(&format!("{}\t{}\n", x.stack, x.toolchain));
    }
    s
}

/// What `top`'s stacks resolve to, the stacks as its [`FILE`] lists them;
/// empty when there is no such file (a mise toolchain, no lw init).
pub fn current(top: &Path) -> Vec<Resolved> {
    let Ok(old) = std::fs::read_to_string(top.join(FILE)) else {
        return Vec::new();
    };
    let stacks: Vec<&str> = old
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split('\t').next())
        .filter(|s| matches!(*s, "rust" | "node" | "python" | "go"))
        .collect();
    declared(top, &stacks).iter().map(resolve).collect()
}

/// Rewrites `top`'s [`FILE`] from the files its stacks' lines name, when
/// it exists and what they resolve to changed.  Returns the resolutions
/// when it wrote.
pub fn sync(top: &Path) -> Result<Option<Vec<Resolved>>> {
    let p = top.join(FILE);
    let Ok(old) = std::fs::read_to_string(&p) else {
        return Ok(None);
    };
    let r = current(top);
    let new = render(&r);
    if new == old {
        return Ok(None);
    }
    base::fs::write_replace(&p, new.as_bytes(), 0o644, base::fs::Durability::Synced)
        .map_err(|e| Error::io("cannot write", &p, e))?;
    Ok(Some(r))
}

/// The toolchain `d` resolves to (what toolchain.sh installs for it).
pub fn resolve(d: &Declared) -> Resolved {
    let (toolchain, note) = match d.stack.as_str() {
        "rust" => ("debian".to_string(), rust_note(d)),
        "python" => python(d),
        "node" => (node(&d.version), None),
        "go" => go(&d.version),
        _ => (String::new(), None),
    };
    Resolved {
        stack: d.stack.clone(),
        toolchain,
        note,
    }
}

fn rust_note(d: &Declared) -> Option<String> {
    let (want, from) = (&d.version, &d.from);
    let why = "rustup's downloads are not reachable from an image build";
    match want.as_str() {
        "" | "stable" => None,
        w if w.starts_with(|c: char| c.is_ascii_digit()) => {
            let got = DEBIAN_RUST;
            match cmp_version(w, got) {
                std::cmp::Ordering::Greater => Some(format!(
                    "rust: {from} asks for {w}; takes Debian's rustc {got}, the newest Debian has ({why})"
                )),
                // 1.98, 1.98.1 and 1.98.1.0 ask for what Debian has.
                std::cmp::Ordering::Equal => None,
                _ if got.starts_with(&format!("{w}.")) => None,
                _ => Some(format!(
                    "rust: {from} asks for {w}; takes Debian's rustc {got}, newer ({why})"
                )),
            }
        }
        w => Some(format!(
            "rust: {from} asks for '{w}'; takes Debian's stable rustc {DEBIAN_RUST} ({why})"
        )),
    }
}

/// Debian has 3.11 (bookworm) and 3.13 (trixie): 3.13 unless the
/// declaration excludes it and admits 3.11.
fn python(d: &Declared) -> (String, Option<String>) {
    let w = d.version.as_str();
    let (new, old) = (python_admits(w, 13), python_admits(w, 11));
    let take = if !new && old { "3.11" } else { "3.13" };
    let asked = if w.starts_with(|c: char| c.is_ascii_digit()) {
        w.to_string()
    } else {
        format!("'{w}'")
    };
    let note = (!new && !old).then(|| {
        format!(
            "python: {} asks for {asked}; takes Debian's {take} (Debian has 3.11 and 3.13; python.org's builds are not reachable from an image build)",
            d.from
        )
    });
    (take.to_string(), note)
}

/// Whether Python 3.`minor` satisfies `spec`: an exact version (`3.12`,
/// `3.12.4`) or comma-separated PEP 440 clauses (`>=3.9,<3.13`, `~=3.10`,
/// `==3.11.*`, `!=3.12`), compared on major.minor; what is not understood
/// admits it.
fn python_admits(spec: &str, minor: u32) -> bool {
    let have = (3u32, minor);
    let mm = |v: &str| -> Option<(u32, u32)> {
        let mut it = v.trim().trim_end_matches(".*").split('.');
        let a = it.next()?.parse().ok()?;
        let b = it.next().map_or(Some(0), |b| b.parse().ok())?;
        Some((a, b))
    };
    if spec.is_empty() {
        return true;
    }
    if spec.starts_with(|c: char| c.is_ascii_digit()) {
        return mm(spec).is_none_or(|v| v == have);
    }
    spec.split(',').all(|clause| {
        let c = clause.trim();
        let (op, v) = match c.find(|ch: char| ch.is_ascii_digit()) {
            Some(i) => c.split_at(i),
            None => return true,
        };
        let Some(v) = mm(v) else { return true };
        match op.trim() {
            ">=" => have >= v,
            // >3.12 admits 3.12.1.
            ">" => have >= v,
            "<=" => have <= v,
            "<" => have < v,
            "==" | "===" => have == v,
            // !=3.12.4 leaves the rest of 3.12.
            "!=" => have != v || c.matches('.').count() > 1,
            // ~=3.11.2 is 3.11.*, ~=3.11 is 3.*.
            "~=" if c.matches('.').count() > 1 => have == v,
            "~=" => have >= v && have.0 == v.0,
            _ => true,
        }
    })
}

/// An exact `x.y.z` is taken as it is; otherwise the highest major named
/// (`>=18`, `^20.1`, `20.x`, `18 || 20`), [`NODE_LTS`] for a lower bound
/// below it or nothing named.
fn node(w: &str) -> String {
    let parts: Vec<&str> = w.split('.').collect();
    if parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    {
        return w.to_string();
    }
    // The first number of each version named is its major.
    let top = w
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|v| v.split('.').next()?.parse::<u32>().ok())
        .max();
    match top {
        Some(m) if !(w.contains('>') && m < NODE_LTS) => m.to_string(),
        _ => NODE_LTS.to_string(),
    }
}

/// Debian's Go when it is as new as the declaration, else that Go from
/// the Go module proxy.
fn go(w: &str) -> (String, Option<String>) {
    if w.is_empty() || cmp_version(w, DEBIAN_GO) != std::cmp::Ordering::Greater {
        return ("debian".to_string(), None);
    }
    let full = match w.matches('.').count() {
        0 => format!("{w}.0.0"),
        1 if cmp_version(w, "1.21") != std::cmp::Ordering::Less => format!("{w}.0"),
        _ => w.to_string(),
    };
    (format!("go{full}"), None)
}

/// Dotted versions compared number by number (a missing one is 0).
fn cmp_version(a: &str, b: &str) -> std::cmp::Ordering {
    let n = |s: &str| -> Vec<u64> {
        s.split('.')
            .map(|p| {
                p.chars()
                    .take_while(char::is_ascii_digit)
                    .collect::<String>()
                    .parse()
                    .unwrap_or(0)
            })
            .collect()
    };
    let (a, b) = (n(a), n(b));
    for i in 0..a.len().max(b.len()) {
        let o = a.get(i).unwrap_or(&0).cmp(b.get(i).unwrap_or(&0));
        if o != std::cmp::Ordering::Equal {
            return o;
        }
    }
    std::cmp::Ordering::Equal
}

/// A version as a declaration may spell it: digits, letters, dots and the
/// range operators, short; anything else (a tab, a newline, a shell
/// character) is not a version and is ignored.
fn clean(v: &str) -> Option<String> {
    let v = v.trim().trim_start_matches('v');
    (!v.is_empty()
        && v.len() <= 64
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || " .^~<>=|*,-_/".contains(c)))
    .then(|| v.to_string())
}

fn read(top: &Path, file: &str) -> Option<String> {
    let p = top.join(file);
    // A declaration file is small: a huge one is not read.
    let m = std::fs::symlink_metadata(&p).ok()?;
    (m.is_file() && m.len() <= 1 << 20)
        .then(|| std::fs::read_to_string(&p).ok())
        .flatten()
}

/// The value of `key = "..."` on a line of TOML text.
fn toml_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
    })
}

fn first_line(top: &Path, file: &str) -> Option<(String, String)> {
    let t = read(top, file)?;
    let l = t
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))?;
    Some((clean(l)?, file.to_string()))
}

fn find(top: &Path, stack: &str) -> Option<(String, String)> {
    match stack {
        "rust" => read(top, "rust-toolchain.toml")
            .and_then(|t| toml_value(&t, "channel"))
            .and_then(|v| clean(&v))
            .map(|v| (v, "rust-toolchain.toml".into()))
            .or_else(|| first_line(top, "rust-toolchain"))
            .or_else(|| {
                let v = toml_value(&read(top, "Cargo.toml")?, "rust-version")?;
                Some((clean(&v)?, "Cargo.toml rust-version".into()))
            }),
        "node" => first_line(top, ".nvmrc")
            .or_else(|| first_line(top, ".node-version"))
            .or_else(|| {
                let j: serde_json::Value =
                    serde_json::from_str(&read(top, "package.json")?).ok()?;
                let v = j.get("engines")?.get("node")?.as_str()?;
                Some((clean(v)?, "package.json engines.node".into()))
            }),
        "python" => first_line(top, ".python-version").or_else(|| {
            let v = toml_value(&read(top, "pyproject.toml")?, "requires-python")?;
            Some((clean(&v)?, "pyproject.toml requires-python".into()))
        }),
        "go" => {
            let t = read(top, "go.mod")?;
            let line = |word: &str| {
                t.lines().find_map(|l| {
                    let v = l.trim().strip_prefix(word)?.trim();
                    let v = v.strip_prefix("go").unwrap_or(v);
                    (!v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
                        .then(|| v.to_string())
                })
            };
            line("toolchain ")
                .map(|v| (v, "go.mod toolchain".to_string()))
                .or_else(|| line("go ").map(|v| (v, "go.mod go".to_string())))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stack_s_declaration_is_found_and_odd_ones_are_ignored() {
        let d = std::env::temp_dir().join(format!(
            "lw-versions-{}-{:x}",
            std::process::id(),
            base::id::random128() as u32
        ));
        std::fs::create_dir_all(d.join(".loopwright/runtime")).unwrap();
        let w = |n: &str, t: &str| std::fs::write(d.join(n), t).unwrap();
        w(
            "Cargo.toml",
            "[package]\nname = \"x\"\nrust-version = \"1.70\"\n",
        );
        w("package.json", r#"{"engines": {"node": ">=18"}}"#);
        w("pyproject.toml", "[project]\nrequires-python = \">=3.9\"\n");
        w("go.mod", "module x\n\ngo 1.22\n");
        let all = ["rust", "node", "python", "go"];
        let got: Vec<(String, String)> = declared(&d, &all)
            .into_iter()
            .map(|x| (x.version, x.from))
            .collect();
        assert_eq!(
            got,
            [
                ("1.70", "Cargo.toml rust-version"),
                (">=18", "package.json engines.node"),
                (">=3.9", "pyproject.toml requires-python"),
                ("1.22", "go.mod go"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        // The dedicated files win; a toolchain line wins over go.
        w("rust-toolchain.toml", "[toolchain]\nchannel = \"1.82.0\"\n");
        w(".nvmrc", "v20.11.1\n");
        w(".python-version", "3.12\n");
        w("go.mod", "module x\n\ngo 1.22\ntoolchain go1.23.4\n");
        let v: Vec<String> = declared(&d, &all).into_iter().map(|x| x.version).collect();
        assert_eq!(v, ["1.82.0", "20.11.1", "3.12", "1.23.4"]);
        // What a shell must not see is not a version: none declared.
        w(".nvmrc", "20\t$(reboot)\n");
        w(".python-version", "3.12; rm -rf /\n");
        w("go.mod", "module x\ngo 1.22 `x`\n");
        let v: Vec<String> = declared(&d, &all).into_iter().map(|x| x.version).collect();
        assert_eq!(v, ["1.82.0", ">=18", ">=3.9", ""]);
        // sync rewrites the file only when what the declarations resolve
        // to changed: 22 and >=18 are both Node 22, 20 is not.
        w(".nvmrc", "22\n");
        std::fs::write(
            d.join(FILE),
            render(&[resolve(&declared(&d, &["node"])[0])]),
        )
        .unwrap();
        assert_eq!(sync(&d).unwrap(), None);
        w(".nvmrc", "");
        assert_eq!(declared(&d, &["node"])[0].version, ">=18");
        assert_eq!(sync(&d).unwrap(), None, ">=18 resolves as 22 does");
        w(".nvmrc", "20\n");
        let new = sync(&d).unwrap().expect("rewritten");
        assert_eq!(new[0].toolchain, "20");
        assert!(
            std::fs::read_to_string(d.join(FILE))
                .unwrap()
                .ends_with("\nnode\t20\n")
        );
        assert_eq!(sync(&d).unwrap(), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn resolved(stack: &str, version: &str) -> (String, Option<String>) {
        let r = resolve(&Declared {
            stack: stack.into(),
            version: version.into(),
            from: "F".into(),
        });
        (r.toolchain, r.note)
    }

    #[test]
    fn declarations_resolve_to_what_toolchain_sh_installs_with_a_note_where_not_had() {
        // (stack, declared, toolchain, note)
        let cases: &[(&str, &str, &str, Option<&str>)] = &[
            ("rust", "", "debian", None),
            ("rust", "stable", "debian", None),
            ("rust", "1.98", "debian", None),
            ("rust", "1.98.1", "debian", None),
            (
                "rust",
                "1.70",
                "debian",
                Some(
                    "rust: F asks for 1.70; takes Debian's rustc 1.98.1, newer (rustup's downloads are not reachable from an image build)",
                ),
            ),
            (
                "rust",
                "1.99.0",
                "debian",
                Some(
                    "rust: F asks for 1.99.0; takes Debian's rustc 1.98.1, the newest Debian has (rustup's downloads are not reachable from an image build)",
                ),
            ),
            (
                "rust",
                "nightly",
                "debian",
                Some(
                    "rust: F asks for 'nightly'; takes Debian's stable rustc 1.98.1 (rustup's downloads are not reachable from an image build)",
                ),
            ),
            ("python", "", "3.13", None),
            ("python", ">=3.8", "3.13", None),
            ("python", ">=3.9,<4", "3.13", None),
            ("python", "3.13.1", "3.13", None),
            ("python", "3.11", "3.11", None),
            ("python", ">=3.8, <3.12", "3.11", None),
            ("python", "~=3.11.2", "3.11", None),
            (
                "python",
                "3.12",
                "3.13",
                Some(
                    "python: F asks for 3.12; takes Debian's 3.13 (Debian has 3.11 and 3.13; python.org's builds are not reachable from an image build)",
                ),
            ),
            (
                "python",
                "==3.10.*",
                "3.13",
                Some(
                    "python: F asks for '==3.10.*'; takes Debian's 3.13 (Debian has 3.11 and 3.13; python.org's builds are not reachable from an image build)",
                ),
            ),
            ("node", "", "22", None),
            ("node", ">=18", "22", None),
            ("node", ">=24", "24", None),
            ("node", "^20.1", "20", None),
            ("node", "18 || 20", "20", None),
            ("node", "20.x", "20", None),
            ("node", "20.11.1", "20.11.1", None),
            ("go", "", "debian", None),
            ("go", "1.22", "debian", None),
            ("go", "1.24.4", "debian", None),
            ("go", "1.24.6", "go1.24.6", None),
            ("go", "1.25", "go1.25.0", None),
        ];
        for (stack, v, t, n) in cases {
            assert_eq!(
                resolved(stack, v),
                (t.to_string(), n.map(str::to_string)),
                "{stack} {v}"
            );
        }
    }
}
