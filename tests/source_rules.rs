//! Rules the compiler cannot hold, checked on the sources themselves.

/// The files whose code reads, as root, trees a sandbox writes.  Each
/// resolves beneath a descriptor (crates/mailbox/src/fs/beneath.rs); a path-based call is
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
        "path-based calls in code that reads sandbox trees as root (use lib/fs::open_beneath, or say `// trusted: WHY`): {found:#?}"
    );
}
