//! Rules the compiler cannot hold, checked on the sources themselves.

/// The files whose code reads, as root, trees a sandbox writes.  Each
/// resolves beneath a descriptor (crates/base/src/fs/beneath.rs); a path-based call is
/// allowed only on a line that says why it is trusted.
const SANDBOX_TREE_READERS: [&str; 6] = [
    "crates/mailbox/src/maildir/sweep.rs",
    "lib/sandbox/mailbox.rs",
    "crates/mailbox/src/mediate/collect.rs",
    "crates/mailbox/src/mediate/deliver.rs",
    "crates/mailbox/src/mediate/inspect.rs",
    "crates/mailbox/src/batch.rs",
];

#[test]
fn code_that_reads_sandbox_trees_as_root_opens_nothing_by_path() {
    let calls = [
        "fs::read_dir(",
        "fs::read(",
        "fs::read_to_string(",
        "fs::metadata(",
        "fs::symlink_metadata(",
        "fs::remove_file(",
        "fs::remove_dir(",
        "fs::remove_dir_all(",
        "fs::write(",
        "fs::create_dir",
        "fs::set_permissions(",
        "fs::rename(",
        "fs::copy(",
        "File::open(",
        "File::create(",
        "File::options()",
        "OpenOptions::new()",
        "rfs::open(",
        "rfs::stat(",
        "rfs::lstat(",
        ".exists()",
        ".is_dir()",
        ".is_file()",
        "lchown(",
    ];
    let mut found = Vec::new();
    for file in SANDBOX_TREE_READERS {
        let text = std::fs::read_to_string(support::workspace().join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let text = text.as_str();
        let code = text.split("#[cfg(test)]").next().unwrap_or(text);
        for (i, line) in code.lines().enumerate() {
            let l = line.trim_start();
            if l.starts_with("//") || l.contains("// trusted: ") {
                continue;
            }
            if let Some(c) = calls.iter().find(|c| l.contains(**c)) {
                found.push(format!("{file}:{}: {c}", i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "path-based calls in code that reads sandbox trees as root (use base::fs::open_beneath, or say `// trusted: WHY`): {found:#?}"
    );
}

/// The print macros the library never uses: what it has to say goes to the
/// reporter its command passes down (`cli::Report`), and the command prints.
const PRINTS: [&str; 5] = ["println!", "eprintln!", "print!", "eprint!", "dbg!"];

/// The one library file that prints: the commands' own side
/// (`cli::main_with`, `cli::stderr_report`), which the binaries call.
const PRINTS_FOR_COMMANDS: &str = "crates/base/src/cli.rs";

#[test]
fn the_library_never_prints() {
    let ws = support::workspace();
    let mut dirs = vec![ws.join("lib")];
    for c in std::fs::read_dir(ws.join("crates")).unwrap() {
        let c = c.unwrap().path();
        // The tests' own crates print what a test run shows (a seed; the
        // power-cut bed's command answers on stdout).
        if !c.ends_with("test-support") && !c.ends_with("powercut") {
            dirs.push(c.join("src"));
        }
    }
    let mut files = Vec::new();
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 50, "the sources were not found: {files:?}");
    let test_modules: Vec<_> = files.iter().flat_map(|p| test_module_files(p)).collect();
    let mut found = Vec::new();
    for p in files {
        let rel = p.strip_prefix(&ws).unwrap().to_string_lossy().into_owned();
        // A crate's command (src/main.rs, src/bin/) is a command, not library.
        let command = rel.ends_with("/src/main.rs") || rel.contains("/src/bin/");
        if rel == PRINTS_FOR_COMMANDS || command || test_modules.iter().any(|t| p.starts_with(t)) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for (i, line) in without_test_code(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if let Some(m) = PRINTS.iter().find(|m| prints(code, m)) {
                found.push(format!("{rel}:{}: {m}", i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "print macros in the library (pass a cli::Report down from the command instead): {found:#?}"
    );
}

/// The files of the modules `file` declares under `#[cfg(test)]` in a file
/// of their own (`#[cfg(test)] mod tests;` in bell.rs is bell/tests.rs, or
/// bell/tests/): test code, like an inline `mod tests { … }`.
fn test_module_files(file: &std::path::Path) -> Vec<std::path::PathBuf> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let dir = module_dir(file);
    let mut out = Vec::new();
    for (at, _) in text.match_indices("#[cfg(test)]") {
        let next = text[at + "#[cfg(test)]".len()..].trim_start();
        let Some(decl) = next.strip_prefix("mod ").and_then(|r| r.split_once(';')) else {
            continue;
        };
        let m = decl.0.trim();
        if m.chars().all(|c| c.is_alphanumeric() || c == '_') {
            out.push(dir.join(format!("{m}.rs")));
            out.push(dir.join(m));
        }
    }
    out
}

/// Where the modules `file` declares live: beside a crate root or a
/// `mod.rs`, else in the folder named after the file (bell.rs: bell/).
fn module_dir(file: &std::path::Path) -> std::path::PathBuf {
    let name = file.file_name().unwrap_or_default();
    if name == "mod.rs" || name == "lib.rs" || name == "main.rs" {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    }
}

/// Whether `code` calls macro `m` (`print!` is not the end of `eprint!`).
fn prints(code: &str, m: &str) -> bool {
    code.match_indices(m).any(|(i, _)| {
        !code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// `text` with every item under `#[cfg(test)]` blanked (its lines kept
/// empty, so line numbers stay): braces counted, outside strings and
/// character literals.
fn without_test_code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let end = item_end(item);
        out.extend(item[..end].chars().filter(|c| *c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// Where the item that starts `s` ends: after its `;` or its closing brace.
fn item_end(s: &str) -> usize {
    let b = s.as_bytes();
    let (mut depth, mut i) = (0usize, 0usize);
    let ident = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    while i < b.len() {
        match b[i] {
            // A raw string: r"..." or r#"..."#, as many hashes as it opened with.
            b'r' if !ident(i) && matches!(b.get(i + 1), Some(b'"' | b'#')) => {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                if b.get(i + 1 + hashes) == Some(&b'"') {
                    let close = format!("\"{}", "#".repeat(hashes));
                    let from = i + 2 + hashes;
                    i = s[from..]
                        .find(&close)
                        .map_or(b.len(), |k| from + k + close.len());
                    continue;
                }
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime.
            b'\'' if b.get(i + 1) == Some(&b'\\') || b.get(i + 2) == Some(&b'\'') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

#[test]
fn test_code_is_told_apart_from_the_code_beside_it() {
    let text = "fn a() {}\n#[cfg(test)]\nmod t {\n    fn f() { println!(\"{}}\", '}', r#\"}\"#); }\n}\nfn b() { eprintln!(\"x\"); }\n";
    let code = without_test_code(text);
    assert_eq!(code.lines().count(), text.lines().count(), "{code}");
    assert!(!code.contains("fn f"), "{code}");
    assert!(code.contains("fn b() { eprintln!"), "{code}");
    assert!(prints("eprint!(\"x\")", "eprint!") && !prints("eprint!(\"x\")", "print!"));
}

/// The directories of the repository a comment or a document names files in.
const PATH_ROOTS: [&str; 8] = [
    "lib/", "crates/", "bins/", "tests/", "scripts/", "runtime/", "docs/", "man/",
];

/// Every `lib/…`, `crates/…`, `bins/…` (and the other [`PATH_ROOTS`]) path
/// that a comment in a Rust file or Cargo.toml, a Markdown document or a man
/// page names exists, so a reader who greps for it finds the file.  A path
/// may end in `:LINE`, and may leave out a `.rs` (a module or a test target:
/// `tests/kube_fleet`).  Patterns are not paths: a token with `*`, `{` or
/// `<` in it (`tests/*_support`) is skipped.  A path inside another
/// repository is written with that repository in front
/// (`docker-bench-security/tests/…`), which this rule does not read as ours.
#[test]
fn every_path_a_comment_names_exists() {
    let ws = support::workspace();
    let mut found = Vec::new();
    let mut named = 0;
    for p in documented_files(&ws) {
        let rel = p.strip_prefix(&ws).unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for (i, line) in text.lines().enumerate() {
            let prose = prose(&rel, line);
            for path in repo_paths(&prose) {
                named += 1;
                let exists = ws.join(path).exists() || ws.join(format!("{path}.rs")).exists();
                if !exists {
                    found.push(format!("{rel}:{}: {path}", i + 1));
                }
            }
        }
    }
    assert!(
        named > 100,
        "too few paths named to be the sources: {named}"
    );
    assert!(
        found.is_empty(),
        "comments and documents name files that do not exist (find where each moved: git log --follow): {found:#?}"
    );
}

/// The part of `line` that is prose: a Rust file's comment, a Cargo.toml's
/// comment, all of a document or a man page (its font escapes dropped).
fn prose<'a>(rel: &str, line: &'a str) -> std::borrow::Cow<'a, str> {
    let after = |m: &str| line.find(m).map_or("", |i| &line[i..]);
    if rel.ends_with(".rs") {
        after("//").into()
    } else if rel.ends_with(".toml") {
        after("#").into()
    } else if rel.starts_with("man/") {
        ["\\fB", "\\fI", "\\fR", "\\fP"]
            .iter()
            .fold(line.to_owned(), |l, f| l.replace(f, " "))
            .into()
    } else {
        line.into()
    }
}

/// The repository paths `text` names: a token that starts with one of
/// [`PATH_ROOTS`] where no word or path goes on before it, up to the first
/// character a path here never has, its trailing full stops dropped.
fn repo_paths(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let path_char = |c: u8| c.is_ascii_alphanumeric() || b"_./-*{}<>".contains(&c);
    let mut out = Vec::new();
    for root in PATH_ROOTS {
        for (at, _) in text.match_indices(root) {
            let before = at.checked_sub(1).map(|i| b[i]);
            if before.is_some_and(|c| path_char(c) || c == b'~' || c == b'$') {
                continue;
            }
            let len = b[at..].iter().take_while(|c| path_char(**c)).count();
            let path = text[at..at + len].trim_end_matches('.');
            if !path.contains(['*', '{', '}', '<', '>']) {
                out.push(path);
            }
        }
    }
    out
}

/// The files whose prose names paths: Rust sources, Cargo manifests,
/// Markdown documents and man pages, outside `target/` and dot directories.
fn documented_files(ws: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut dirs = vec![ws.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && (d != ws || name != "target") {
                    dirs.push(p);
                }
            } else if name.ends_with(".rs")
                || name.ends_with(".md")
                || name == "Cargo.toml"
                || p.parent().is_some_and(|d| d.ends_with("man"))
            {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn repo_paths_are_told_from_other_words() {
    let text = "see lib/a.rs:12, (crates/x/src/y) and tests/*_support; \
                not /usr/lib/x, a-lib/x, $lib/x or docker-bench/tests/z.sh.";
    assert_eq!(repo_paths(text), vec!["lib/a.rs", "crates/x/src/y"]);
}

/// The `.rs` files under `dirs` (relative to the workspace), recursively.
fn rust_files(dirs: &[&str]) -> Vec<std::path::PathBuf> {
    let ws = support::workspace();
    let mut dirs: Vec<_> = dirs.iter().map(|d| ws.join(d)).collect();
    let mut files = Vec::new();
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let p = e.unwrap().path();
            if p.is_dir() && !p.ends_with("target") {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// `needles` found outside comments in `files`, but in the files allowed.
fn spelled(files: &[std::path::PathBuf], needles: &[&str], allowed: &[&str]) -> Vec<String> {
    let ws = support::workspace();
    let mut found = Vec::new();
    for p in files {
        let rel = p.strip_prefix(&ws).unwrap().to_string_lossy().into_owned();
        if allowed.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{rel}: {e}"));
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if let Some(n) = needles.iter().find(|n| code.contains(**n)) {
                found.push(format!("{rel}:{}: {n}", i + 1));
            }
        }
    }
    found
}

/// One place chooses the Docker engine (crates/engine/src/select.rs:
/// `DOCKER_HOST`, else the project's `engine.host`): no command, library
/// module or test connects around it, so none can pass `engine.host` by.
#[test]
fn only_select_connects_to_a_docker_engine() {
    let files = rust_files(&["lib", "bins", "crates", "tests"]);
    assert!(files.len() > 100, "the sources were not found");
    let found = spelled(
        &files,
        &["DockerEngine::connect"],
        &["crates/engine/src/select.rs", "tests/cli/source_rules.rs"],
    );
    assert!(
        found.is_empty(),
        "connect through engine::connect_docker(config) or Engines::connect (crates/engine/src/select.rs): {found:#?}"
    );
}

/// One way to fetch from a repository a sandbox wrote:
/// `repo::git::fetch_untrusted` (and its `untrusted_config`).  The
/// settings that make it safe are spelled there only, so a setting added
/// once protects every such git.
#[test]
fn fetch_hardening_is_spelled_once() {
    let files: Vec<_> = rust_files(&["lib", "bins", "crates"])
        .into_iter()
        .filter(|p| !p.components().any(|c| c.as_os_str() == "tests"))
        .collect();
    let found = spelled(
        &files,
        &["fsckObjects", "core.hooksPath", "protocol.allow=never"],
        &["crates/repo/src/git/mod.rs"],
    );
    assert!(
        found.is_empty(),
        "use repo::git::fetch_untrusted / untrusted_config / NO_HOOKS instead of spelling the settings: {found:#?}"
    );
}

/// `cargo test` builds a package's commands into target/<profile>/ only
/// when the package has an integration test; the suites that run a command
/// by path (support::bin) find it there.  So every workspace member with a
/// command has a tests/ folder, or a clean clone's `cargo test` fails where
/// a warm target/ passes.
#[test]
fn every_package_with_a_command_has_an_integration_test() {
    let ws = support::workspace();
    let mut missing = Vec::new();
    for m in &members(&ws) {
        let dir = ws.join(m);
        let own = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        let has_command = own.contains("[[bin]]")
            || dir.join("src/bin").is_dir()
            || dir.join("src/main.rs").is_file();
        let has_tests = std::fs::read_dir(dir.join("tests"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if has_command && !has_tests {
            missing.push(m.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "give these packages a tests/ file that runs their command: {missing:?}"
    );
}

/// The workspace's members, as its Cargo.toml lists them.
fn members(ws: &std::path::Path) -> Vec<String> {
    let manifest =
        std::fs::read_to_string(ws.join("Cargo.toml")).expect("the workspace's Cargo.toml");
    let members: Vec<String> = manifest
        .split_once("\nmembers = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| {
            list.lines()
                .filter_map(|l| l.trim().strip_suffix(','))
                .map(|l| l.trim_matches('"').to_string())
                .collect()
        })
        .expect("the workspace lists its members");
    assert!(members.len() > 5, "members not read: {members:?}");
    members
}

/// A command says `test = false` when it has no unit tests (its tests run
/// it from tests/), so `cargo test` links no harness that runs 0 tests.  A
/// unit test added to such a command, or to a module it declares, would
/// never run: this finds one.
#[test]
fn a_command_built_without_a_test_harness_has_no_unit_tests() {
    let ws = support::workspace();
    let mut checked = 0;
    let mut found = Vec::new();
    for m in members(&ws) {
        let dir = ws.join(&m);
        let own = std::fs::read_to_string(dir.join("Cargo.toml")).expect("a member's Cargo.toml");
        for table in own.split("[[bin]]").skip(1) {
            let table = table.split("\n[").next().unwrap_or("");
            if !table.lines().any(|l| l.trim() == "test = false") {
                continue;
            }
            let path = table
                .lines()
                .find_map(|l| l.trim().strip_prefix("path = "))
                .map(|p| p.trim_matches('"'))
                .expect("a [[bin]] with test = false names its path");
            let mut files = vec![dir.join(path)];
            while let Some(f) = files.pop() {
                let text =
                    std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
                checked += 1;
                if text.contains("#[test]") || text.contains("#[cfg(test)]") {
                    found.push(f.strip_prefix(&ws).unwrap_or(&f).display().to_string());
                }
                files.extend(declared_modules(&f, &text));
            }
        }
    }
    assert!(checked >= 17, "commands not found: {checked} files read");
    assert!(
        found.is_empty(),
        "unit tests in a command built with `test = false` never run; \
         drop the `test = false` of its [[bin]] or move them: {found:#?}"
    );
}

/// The files of the modules `file` declares (`mod name;`).
fn declared_modules(file: &std::path::Path, text: &str) -> Vec<std::path::PathBuf> {
    let dir = module_dir(file);
    text.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub ").unwrap_or(l.trim());
            l.strip_prefix("mod ")?.strip_suffix(';')
        })
        .map(|name| {
            let flat = dir.join(format!("{name}.rs"));
            if flat.is_file() {
                flat
            } else {
                dir.join(name).join("mod.rs")
            }
        })
        .collect()
}
