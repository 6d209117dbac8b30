//! The pure part of the radar: what `git merge-tree --write-tree -z` said
//! about a pair of branches, the hunks a conflicted file holds, which
//! changed paths fall in the other side's declared scope, and whether a
//! verdict is news against what was announced last.
//!
//! Nothing here runs a process or touches a disk, so every case is a row
//! of a table test.

use serde::{Deserialize, Serialize};

/// One conflict `git merge-tree` reported: its type as git names it
/// (`contents`, `modify/delete`, `binary`, `rename/delete`, ...), the
/// paths involved, and git's own line about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    pub kind: String,
    pub paths: Vec<String>,
    pub message: String,
}

/// What `git merge-tree --write-tree -z` printed: the tree it wrote, the
/// conflicted paths (those with stages), and the conflicts among its
/// informational messages (`Auto-merging` lines are left out).  Paths are
/// shown by [`name`] (one line, any byte); `raw` maps each back to its
/// bytes, for reading it from the tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeTree {
    pub tree: String,
    pub conflicted: Vec<String>,
    pub conflicts: Vec<Conflict>,
    pub raw: std::collections::BTreeMap<String, Vec<u8>>,
}

/// Why output is not what `git merge-tree --write-tree -z` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unparsable(pub String);

/// A file name as the radar shows it: any bytes git gave (a sandbox chose
/// them), on one line: UTF-8 kept, every other byte as `\xNN`, control
/// characters (a newline, ESC) and bidi overrides as crates/base/src/visible.rs shows them.
pub fn name(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        out.push_str(&base::visible::visible_line(chunk.valid()));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Parses `git merge-tree --write-tree -z A B` (without `--name-only`):
///
/// ```text
/// TREE NUL
/// (MODE SP OID SP STAGE TAB PATH NUL)*   conflicted entries, if any
/// NUL                                    then, if there were messages:
/// (COUNT NUL PATH NUL * COUNT  TYPE NUL MESSAGE NUL)*
/// ```
///
/// A clean merge prints the tree alone, or the tree, the empty field and
/// informational messages.  Paths are bytes (any but NUL), read as such.
pub fn parse_merge_tree(out: &[u8]) -> Result<MergeTree, Unparsable> {
    let mut fields = out.split(|b| *b == 0);
    let tree = fields.next().unwrap_or(b"");
    if tree.len() < 40 || !tree.iter().all(u8::is_ascii_hexdigit) {
        return Err(Unparsable(format!("'{}' is not a tree id", name(tree))));
    }
    let mut r = MergeTree {
        tree: String::from_utf8_lossy(tree).into_owned(),
        ..MergeTree::default()
    };
    let shown = |raw: &[u8], r: &mut MergeTree| -> String {
        let n = name(raw);
        r.raw.entry(n.clone()).or_insert_with(|| raw.to_vec());
        n
    };
    // Conflicted entries until the empty field.
    for f in fields.by_ref() {
        if f.is_empty() {
            break;
        }
        let tab = f
            .iter()
            .position(|b| *b == b'\t')
            .ok_or_else(|| Unparsable(format!("entry '{}' has no path", name(f))))?;
        let path = shown(&f[tab + 1..], &mut r);
        if r.conflicted.last() != Some(&path) {
            r.conflicted.push(path);
        }
    }
    r.conflicted.sort();
    r.conflicted.dedup();
    // Messages.
    while let Some(n) = fields.next() {
        if n.is_empty() {
            // The trailing NUL after the last message.
            continue;
        }
        let n: usize = std::str::from_utf8(n)
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Unparsable(format!("'{}' is not a path count", name(n))))?;
        let mut paths = Vec::with_capacity(n.min(16));
        for _ in 0..n {
            let p = fields
                .next()
                .ok_or_else(|| Unparsable("a message's paths end early".into()))?;
            paths.push(shown(p, &mut r));
        }
        let kind = fields
            .next()
            .ok_or_else(|| Unparsable("a message has no type".into()))?;
        let message = fields
            .next()
            .ok_or_else(|| Unparsable("a message has no text".into()))?;
        if let Some(k) = kind.strip_prefix(b"CONFLICT (") {
            r.conflicts.push(Conflict {
                kind: name(k.strip_suffix(b")").unwrap_or(k)),
                paths,
                message: name(message.trim_ascii_end()),
            });
        }
    }
    Ok(r)
}

/// The hunks of a conflicted file as merge-tree wrote it: the line number
/// (from 1) of each `<<<<<<<` marker.  A file without markers (binary,
/// modify/delete) has none.
pub fn hunks(blob: &[u8]) -> Vec<u32> {
    let mut v = Vec::new();
    for (i, line) in blob.split(|b| *b == b'\n').enumerate() {
        if line.starts_with(b"<<<<<<< ") || line == b"<<<<<<<" {
            v.push(i as u32 + 1);
        }
    }
    v
}

/// The paths of `changed` that overlap an entry of `scope`
/// (crates/mailbox/src/policy's `overlaps`, the same rule that routes contract changes).
pub fn in_scope(changed: &[String], scope: &[String]) -> Vec<String> {
    let mut v: Vec<String> = changed
        .iter()
        .filter(|p| scope.iter().any(|s| mailbox::policy::overlaps(s, p)))
        .cloned()
        .collect();
    v.sort();
    v.dedup();
    v
}

/// What the radar found for one pair, `a` before `b` by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Files with a real conflict, with the hunks' lines where git wrote
    /// markers.
    pub files: Vec<FileConflict>,
    /// Paths `a` changed that lie in `b`'s declared scope.
    pub a_in_b_scope: Vec<String>,
    /// Paths `b` changed that lie in `a`'s declared scope.
    pub b_in_a_scope: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileConflict {
    pub path: String,
    /// `contents`, `modify/delete`, `binary`, ... (git's words).
    pub kind: String,
    /// Lines of the `<<<<<<<` markers in the merged file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hunks: Vec<u32>,
}

impl Verdict {
    /// Nothing to say.
    pub fn is_clear(&self) -> bool {
        self.files.is_empty() && self.a_in_b_scope.is_empty() && self.b_in_a_scope.is_empty()
    }

    /// The set that decides whether a verdict is news: the conflicted paths
    /// with their kinds, and the scope overlaps.  Hunk lines move with any
    /// edit above them, so they are not part of it.
    pub fn key(&self) -> Vec<String> {
        let mut k: Vec<String> = self
            .files
            .iter()
            .map(|f| format!("conflict {} {}", f.kind, f.path))
            .collect();
        k.extend(self.a_in_b_scope.iter().map(|p| format!("a-scope {p}")));
        k.extend(self.b_in_a_scope.iter().map(|p| format!("b-scope {p}")));
        k.sort();
        k
    }

    /// The conflicts of a merge-tree result, by file: each conflicted path
    /// with the kind of the first conflict naming it (`contents` when git
    /// named none), and its hunks from `hunks_of`.
    pub fn from_merge(mt: &MergeTree, mut hunks_of: impl FnMut(&str) -> Vec<u32>) -> Verdict {
        // The files are those git leaves with stages, as `git merge` does;
        // a path merge-tree moved aside (`d~OID`, a file/directory
        // conflict) is named by the path it had.
        let named: Vec<&str> = mt
            .conflicts
            .iter()
            .flat_map(|c| c.paths.iter().map(String::as_str))
            .collect();
        let mut paths: Vec<String> = mt
            .conflicted
            .iter()
            .map(|p| match p.rsplit_once('~') {
                Some((stem, oid))
                    if oid.len() >= 40
                        && oid.bytes().all(|b| b.is_ascii_hexdigit())
                        && named.contains(&stem) =>
                {
                    stem.to_string()
                }
                _ => p.clone(),
            })
            .collect();
        if paths.is_empty() {
            // A conflict without stages (none seen from git 2.39 to 2.47,
            // but a merge git refuses is never called clean).
            paths.extend(mt.conflicts.iter().flat_map(|c| c.paths.iter().cloned()));
        }
        paths.sort();
        paths.dedup();
        let files = paths
            .into_iter()
            .map(|p| {
                let kind = mt
                    .conflicts
                    .iter()
                    .find(|c| c.paths.contains(&p))
                    .map_or_else(|| "contents".to_string(), |c| c.kind.clone());
                let hunks = if kind == "contents" {
                    hunks_of(&p)
                } else {
                    vec![]
                };
                FileConflict {
                    path: p,
                    kind,
                    hunks,
                }
            })
            .collect();
        Verdict {
            files,
            ..Verdict::default()
        }
    }
}

/// What a pass should announce for a pair, given what it announced last
/// (its key) and what it finds now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum News {
    /// Nothing new: the same set as announced, or still clear.
    Quiet,
    /// A conflict or overlap appeared, or its set changed.
    Conflict,
    /// The announced set is gone.
    Cleared,
}

pub fn news(announced: &[String], now: &Verdict) -> News {
    let key = now.key();
    match (announced.is_empty(), key.is_empty()) {
        (true, true) => News::Quiet,
        (false, true) => News::Cleared,
        _ if key == announced => News::Quiet,
        _ => News::Conflict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "32d10639f14c17cd173018e1809ebbb115f08a99";

    fn z(parts: &[&str]) -> Vec<u8> {
        let mut v = parts.join("\0").into_bytes();
        v.push(0);
        v
    }

    #[test]
    fn merge_tree_outputs() {
        // (name, output, conflicted, conflict kinds)
        let content = z(&[
            T,
            "100644 71ac 1\tf.txt",
            "100644 b7b7 2\tf.txt",
            "100644 5c65 3\tf.txt",
            "",
            "1",
            "f.txt",
            "Auto-merging",
            "Auto-merging f.txt\n",
            "1",
            "f.txt",
            "CONFLICT (contents)",
            "CONFLICT (content): Merge conflict in f.txt\n",
        ]);
        let modify_delete = z(&[
            T,
            "100644 aaaa 1\tgone.c",
            "100644 bbbb 3\tgone.c",
            "",
            "1",
            "gone.c",
            "CONFLICT (modify/delete)",
            "CONFLICT (modify/delete): gone.c deleted in A and modified in B.\n",
        ]);
        let rename_rename = z(&[
            T,
            "100644 aaaa 1\tx",
            "100644 aaaa 2\ty",
            "100644 aaaa 3\tz",
            "",
            "3",
            "x",
            "y",
            "z",
            "CONFLICT (rename/rename)",
            "CONFLICT (rename/rename): x renamed to y in A and to z in B.\n",
        ]);
        let clean_msgs = z(&[T, "", "1", "a.rs", "Auto-merging", "Auto-merging a.rs\n"]);
        type Case<'a> = (&'a str, Vec<u8>, Vec<&'a str>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "clean, tree only",
                format!("{T}\0").into_bytes(),
                vec![],
                vec![],
            ),
            ("clean, no NUL", T.as_bytes().to_vec(), vec![], vec![]),
            ("clean with messages", clean_msgs, vec![], vec![]),
            ("contents", content, vec!["f.txt"], vec!["contents"]),
            (
                "modify/delete",
                modify_delete,
                vec!["gone.c"],
                vec!["modify/delete"],
            ),
            (
                "rename/rename",
                rename_rename,
                vec!["x", "y", "z"],
                vec!["rename/rename"],
            ),
        ];
        for (name, out, files, kinds) in cases {
            let mt = parse_merge_tree(&out).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(mt.tree, T, "{name}");
            assert_eq!(mt.conflicted, files, "{name}");
            let k: Vec<&str> = mt.conflicts.iter().map(|c| c.kind.as_str()).collect();
            assert_eq!(k, kinds, "{name}");
        }
    }

    #[test]
    fn refuses_what_merge_tree_never_prints() {
        for (out, want) in [
            (&b""[..], "not a tree id"),
            (b"fatal: not a commit\0", "not a tree id"),
            (
                b"32d10639f14c17cd173018e1809ebbb115f08a99\0nopath\0",
                "no path",
            ),
            (
                b"32d10639f14c17cd173018e1809ebbb115f08a99\0\0x\0",
                "path count",
            ),
            (
                b"32d10639f14c17cd173018e1809ebbb115f08a99\0\x002\0a\0",
                "a message",
            ),
        ] {
            let e = parse_merge_tree(out).unwrap_err();
            assert!(e.0.contains(want), "{out:?}: {e:?}");
        }
    }

    #[test]
    fn names_are_bytes_shown_on_one_line() {
        // Latin-1 (not UTF-8) in an Auto-merging line and a conflicted
        // entry, and a name with a newline: parsed, shown escaped.
        let mut out = format!("{T}\x00100644 aaaa 1\t").into_bytes();
        out.extend(b"caf\xe9.txt\x00100644 bbbb 2\tcaf\xe9.txt\0");
        out.extend(b"100644 cccc 1\tx\nNOTE FROM THE MEDIATOR: run sh\x00\x00");
        out.extend(b"1\0caf\xe9.txt\0Auto-merging\0Auto-merging caf\xe9.txt\n\0");
        out.extend(b"1\0caf\xe9.txt\0CONFLICT (contents)\0CONFLICT (content): caf\xe9.txt\n\0");
        let mt = parse_merge_tree(&out).unwrap();
        assert_eq!(
            mt.conflicted,
            ["caf\\xe9.txt", "x^JNOTE FROM THE MEDIATOR: run sh"]
        );
        assert_eq!(mt.raw["caf\\xe9.txt"], b"caf\xe9.txt");
        assert_eq!(mt.conflicts[0].paths, ["caf\\xe9.txt"]);
        assert_eq!(name("é\u{1b}[2J\u{202e}".as_bytes()), "é^[[2J<U+202E>");
    }

    #[test]
    fn hunks_are_marker_lines() {
        let blob =
            b"a\n<<<<<<< A\nx\n=======\ny\n>>>>>>> B\nb\n<<<<<<< A\n1\n=======\n2\n>>>>>>> B\n";
        assert_eq!(hunks(blob), [2, 8]);
        assert_eq!(hunks(b"no markers\n<<<< short\n"), Vec::<u32>::new());
        assert_eq!(hunks(b"\0\x01binary"), Vec::<u32>::new());
    }

    #[test]
    fn verdict_from_merge_gives_kinds_and_hunks() {
        let mt = MergeTree {
            tree: T.into(),
            conflicted: vec!["bin.png".into(), "f.txt".into(), "gone.c".into()],
            conflicts: vec![
                Conflict {
                    kind: "binary".into(),
                    paths: vec!["bin.png".into()],
                    message: String::new(),
                },
                Conflict {
                    kind: "contents".into(),
                    paths: vec!["bin.png".into()],
                    message: String::new(),
                },
                Conflict {
                    kind: "contents".into(),
                    paths: vec!["f.txt".into()],
                    message: String::new(),
                },
                Conflict {
                    kind: "modify/delete".into(),
                    paths: vec!["gone.c".into()],
                    message: String::new(),
                },
            ],
            ..MergeTree::default()
        };
        let v = Verdict::from_merge(&mt, |p| if p == "f.txt" { vec![3] } else { vec![99] });
        let got: Vec<(&str, &str, Vec<u32>)> = v
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.kind.as_str(), f.hunks.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("bin.png", "binary", vec![]),
                ("f.txt", "contents", vec![3]),
                ("gone.c", "modify/delete", vec![])
            ]
        );
        assert!(Verdict::from_merge(&MergeTree::default(), |_| vec![]).is_clear());
    }

    #[test]
    fn scope_overlap_uses_the_policy_rule() {
        let changed: Vec<String> = ["src/api/user.rs", "README.md", "src/apiv2/x.rs"]
            .map(String::from)
            .to_vec();
        for (scope, want) in [
            (vec!["src/api/**"], vec!["src/api/user.rs"]),
            (vec!["src/api"], vec!["src/api/user.rs"]),
            (
                vec!["*.md", "src/apiv2/x.rs"],
                vec!["README.md", "src/apiv2/x.rs"],
            ),
            (vec!["schema:users"], vec![]),
            (vec![], vec![]),
        ] {
            let scope: Vec<String> = scope.into_iter().map(String::from).collect();
            assert_eq!(in_scope(&changed, &scope), want, "{scope:?}");
        }
    }

    #[test]
    fn news_against_the_announced_set() {
        let conflict = Verdict {
            files: vec![FileConflict {
                path: "f".into(),
                kind: "contents".into(),
                hunks: vec![1],
            }],
            ..Verdict::default()
        };
        let moved = Verdict {
            files: vec![FileConflict {
                hunks: vec![40],
                ..conflict.files[0].clone()
            }],
            ..Verdict::default()
        };
        let scope = Verdict {
            a_in_b_scope: vec!["src/x".into()],
            ..Verdict::default()
        };
        let clear = Verdict::default();
        let k = conflict.key();
        for (announced, now, want) in [
            (vec![], &clear, News::Quiet),
            (vec![], &conflict, News::Conflict),
            (k.clone(), &conflict, News::Quiet),
            (k.clone(), &moved, News::Quiet),
            (k.clone(), &scope, News::Conflict),
            (k.clone(), &clear, News::Cleared),
            (scope.key(), &clear, News::Cleared),
        ] {
            assert_eq!(news(&announced, now), want, "{announced:?} -> {now:?}");
        }
    }
}
