//! The toolchain versions a project declares, as one small file that is the
//! toolchain layer's input (`.loopwright/runtime/toolchain.versions`).
//!
//! A version is declared in a file of its own (`rust-toolchain.toml`,
//! `.nvmrc`, `.python-version`) or in a manifest that also lists the
//! dependencies (`Cargo.toml`'s `rust-version`, `package.json`'s
//! `engines.node`, `pyproject.toml`'s `requires-python`, `go.mod`'s `go` and
//! `toolchain` lines).  Were the manifests the toolchain layer's inputs, a
//! new dependency would rebuild the toolchain; so `lw init` writes what they
//! declare, one line a stack, and lw-build rewrites the file from them
//! before each build ([`sync`]): the toolchain layer rebuilds exactly when a
//! declared version changes, and two projects that declare the same
//! versions share it.

use std::path::Path;

use crate::error::{Error, Result};

/// The file, relative to the checkout's top.
pub const FILE: &str = ".loopwright/runtime/toolchain.versions";

const HEADER: &str = "# The toolchain versions this project declares: STACK<tab>VERSION<tab>WHERE\n# (no VERSION: none declared).  Written by lw init and rewritten by lw-build\n# from the files named, before each build; toolchain.sh reads it.\n";

/// One stack's declaration: `version` empty when none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub stack: String,
    pub version: String,
    pub from: String,
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

/// The file's text for `d`.
pub fn render(d: &[Declared]) -> String {
    let mut s = HEADER.to_string();
    for x in d {
        s.push_str(&format!("{}\t{}\t{}\n", x.stack, x.version, x.from));
    }
    s
}

/// Rewrites `top`'s [`FILE`] from the files its stacks' lines name, when
/// it exists and what they declare changed.  Returns the new declarations
/// when it wrote.
pub fn sync(top: &Path) -> Result<Option<Vec<Declared>>> {
    let p = top.join(FILE);
    let Ok(old) = std::fs::read_to_string(&p) else {
        return Ok(None);
    };
    let stacks: Vec<&str> = old
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split('\t').next())
        .filter(|s| matches!(*s, "rust" | "node" | "python" | "go"))
        .collect();
    let d = declared(top, &stacks);
    let new = render(&d);
    if new == old {
        return Ok(None);
    }
    crate::fs::write_replace(&p, new.as_bytes(), 0o644, crate::fs::Durability::Synced)
        .map_err(|e| Error::io("cannot write", &p, e))?;
    Ok(Some(d))
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
            crate::id::random128() as u32
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
        // sync rewrites the file only when a declaration changed.
        std::fs::write(d.join(FILE), render(&declared(&d, &["node"]))).unwrap();
        assert_eq!(sync(&d).unwrap(), None);
        w(".nvmrc", "22\n");
        let new = sync(&d).unwrap().expect("rewritten");
        assert_eq!(new[0].version, "22");
        assert!(
            std::fs::read_to_string(d.join(FILE))
                .unwrap()
                .contains("node\t22\t.nvmrc\n")
        );
        assert_eq!(sync(&d).unwrap(), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
