//! Issue 32, the radar: a scripted corpus of branch pairs in a real git
//! repository, each with its expected verdict, checked against what the
//! radar announces and against what `git merge` itself reports when the
//! pair is merged in a scratch clone: 0 false positives, 0 missed
//! conflicts.  Then the radar's memory (one message, not repeated, cleared
//! once), its caps (`skipped NAME: ...`) and a branch made to run a merge
//! driver from the host's config.  No Docker: branches are read from a
//! repository the test made (`Source::Path`).

use support::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::TempDir;
use loopwright::layout::Root;
use loopwright::message::{Kind, Message};
use loopwright::radar::{Event, Limits, Live, Radar, Source};

fn git(dir: &Path, args: &[&str]) -> String {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .expect("git runs");
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn lines(n: usize) -> String {
    (1..=n).map(|i| format!("line {i}\n")).collect()
}

fn edit_line(path: &Path, n: usize, text: &str) {
    let s = std::fs::read_to_string(path).unwrap();
    let mut v: Vec<String> = s.lines().map(String::from).collect();
    v[n - 1] = text.to_string();
    std::fs::write(path, v.join("\n") + "\n").unwrap();
}

/// One step on a branch: a closure over the work tree.
type Step = Box<dyn Fn(&Path)>;

struct Case {
    name: &'static str,
    a: Step,
    b: Step,
    b_scope: Vec<&'static str>,
    a_scope: Vec<&'static str>,
    /// Files git merge stops on.
    conflicts: Vec<&'static str>,
    /// Paths one side changed in the other's scope.
    scoped: Vec<&'static str>,
}

fn w(p: &'static str, text: &'static str) -> Step {
    Box::new(move |d: &Path| {
        let f = d.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap()
    })
}
fn line(p: &'static str, n: usize, text: &'static str) -> Step {
    Box::new(move |d: &Path| edit_line(&d.join(p), n, text))
}
fn both(x: Step, y: Step) -> Step {
    Box::new(move |d: &Path| {
        x(d);
        y(d)
    })
}
fn gitstep(args: &'static [&'static str]) -> Step {
    Box::new(move |d: &Path| {
        git(d, args);
    })
}

fn corpus() -> Vec<Case> {
    let c = |name, a, b, conflicts: Vec<&'static str>| Case {
        name,
        a,
        b,
        a_scope: vec![],
        b_scope: vec![],
        conflicts,
        scoped: vec![],
    };
    vec![
        c(
            "conflicting edits",
            line("f.txt", 3, "A3"),
            line("f.txt", 3, "B3"),
            vec!["f.txt"],
        ),
        c(
            "two conflicting hunks",
            both(line("f.txt", 3, "A3"), line("f.txt", 17, "A17")),
            both(line("f.txt", 3, "B3"), line("f.txt", 17, "B17")),
            vec!["f.txt"],
        ),
        c(
            "same file, apart",
            line("f.txt", 2, "A2"),
            line("f.txt", 18, "B18"),
            vec![],
        ),
        c(
            "identical edits",
            line("f.txt", 5, "same"),
            line("f.txt", 5, "same"),
            vec![],
        ),
        c(
            "rename vs edit",
            gitstep(&["mv", "g.txt", "h.txt"]),
            line("g.txt", 4, "B4"),
            vec![],
        ),
        c(
            "rename vs delete",
            gitstep(&["mv", "g.txt", "h.txt"]),
            gitstep(&["rm", "-q", "g.txt"]),
            vec!["h.txt"],
        ),
        c(
            "rename vs rename",
            gitstep(&["mv", "g.txt", "x.txt"]),
            gitstep(&["mv", "g.txt", "y.txt"]),
            vec!["g.txt", "x.txt", "y.txt"],
        ),
        c(
            "delete vs edit",
            gitstep(&["rm", "-q", "old.c"]),
            line("old.c", 2, "B2"),
            vec!["old.c"],
        ),
        c(
            "binary, both",
            w("bin.dat", "\0\x01A-binary\0"),
            w("bin.dat", "\0\x02B-binary\0"),
            vec!["bin.dat"],
        ),
        c(
            "binary, one side",
            w("bin.dat", "\0\x01A-binary\0"),
            line("f.txt", 9, "B9"),
            vec![],
        ),
        c(
            "add/add",
            w("new.txt", "from A\n"),
            w("new.txt", "from B\n"),
            vec!["new.txt"],
        ),
        c(
            "file vs directory",
            w("d", "a file\n"),
            w("d/x", "in a dir\n"),
            vec!["d"],
        ),
        c(
            "mode vs edit",
            Box::new(|d: &Path| {
                use std::os::unix::fs::PermissionsExt;
                let p = d.join("mode.sh");
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap()
            }),
            line("mode.sh", 1, "echo B"),
            vec![],
        ),
        Case {
            name: "scope only",
            a: line("src/api/user.rs", 2, "// A"),
            b: line("docs/a.md", 1, "B"),
            a_scope: vec![],
            b_scope: vec!["src/api/**"],
            conflicts: vec![],
            scoped: vec!["src/api/user.rs"],
        },
        Case {
            name: "no overlap",
            a: line("src/web/page.rs", 1, "// A"),
            b: line("docs/a.md", 1, "B"),
            a_scope: vec!["src/web/**"],
            b_scope: vec!["src/api/**"],
            conflicts: vec![],
            scoped: vec![],
        },
        Case {
            name: "conflict and scope",
            a: line("src/api/user.rs", 3, "// A"),
            b: line("src/api/user.rs", 3, "// B"),
            a_scope: vec!["src/api/**"],
            b_scope: vec![],
            conflicts: vec!["src/api/user.rs"],
            scoped: vec!["src/api/user.rs"],
        },
    ]
}

/// A repository with the base commit every case branches from.
fn base_repo(dir: &Path) {
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("f.txt"), lines(20)).unwrap();
    std::fs::write(dir.join("g.txt"), lines(8)).unwrap();
    std::fs::write(dir.join("old.c"), lines(4)).unwrap();
    std::fs::write(dir.join("bin.dat"), b"\0\0base-binary\0").unwrap();
    std::fs::write(dir.join("mode.sh"), "echo base\n").unwrap();
    for p in ["src/api/user.rs", "src/web/page.rs", "docs/a.md"] {
        let f = dir.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, lines(5)).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "base"]);
}

fn branch(dir: &Path, name: &str, step: &Step) {
    git(dir, &["checkout", "-q", "-b", name, "main"]);
    step(dir);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", name]);
    git(dir, &["checkout", "-q", "main"]);
}

/// What `git merge` says: the files it stops on (none: merged cleanly).
fn git_merge(repo: &Path, scratch: &Path, a: &str, b: &str) -> BTreeSet<String> {
    let _ = std::fs::remove_dir_all(scratch);
    git(
        Path::new("."),
        &[
            "clone",
            "-q",
            "--shared",
            &repo.display().to_string(),
            &scratch.display().to_string(),
        ],
    );
    git(
        scratch,
        &["checkout", "-q", "-b", "merge", &format!("origin/{a}")],
    );
    let o = Command::new("git")
        .arg("-C")
        .arg(scratch)
        .args([
            "merge",
            "-q",
            "--no-edit",
            "--no-ff",
            &format!("origin/{b}"),
        ])
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .unwrap();
    if o.status.success() {
        return BTreeSet::new();
    }
    // A file moved aside (file/directory) is `d~HEAD` here, `d~OID` in
    // merge-tree: both are named by the path it had.
    git(scratch, &["diff", "--name-only", "--diff-filter=U"])
        .lines()
        .map(|p| p.split('~').next().unwrap().to_string())
        .collect()
}

fn live(name: &str, repo: &Path, branch: &str, scope: &[&str]) -> Live {
    Live {
        name: name.into(),
        branch: branch.into(),
        scope: scope.iter().map(|s| s.to_string()).collect(),
        source: Source::Path(repo.to_path_buf()),
    }
}

fn messages(root: &Root) -> Vec<Message> {
    let dir = root.mediator_outbox().sub(loopwright::maildir::Sub::New);
    let mut v: Vec<Message> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| Message::parse(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .collect();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}

fn new_root(t: &TempDir, n: &str) -> Root {
    let d = t.join(n);
    std::fs::create_dir_all(&d).unwrap();
    Root::new(d)
}

#[test]
fn corpus_matches_git_merge_and_the_radar_speaks_once() {
    let t = TempDir::new("radar-corpus");
    // A merge driver and a hook in the host's own config, named by a
    // branch's .gitattributes: the radar must run neither.
    let home = t.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let canary = t.join("canary");
    std::fs::write(
        home.join(".gitconfig"),
        format!(
            "[merge \"evil\"]\n\tdriver = touch {0}\n[diff \"evil\"]\n\ttextconv = touch {0}\n",
            canary.display()
        ),
    )
    .unwrap();
    // SAFETY: this test binary has one test, so no other thread reads the environment.
    unsafe { std::env::set_var("HOME", &home) };

    let repo = t.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    base_repo(&repo);
    let cases = corpus();
    for (i, c) in cases.iter().enumerate() {
        branch(&repo, &format!("c{i}-a"), &c.a);
        branch(&repo, &format!("c{i}-b"), &c.b);
    }
    // The evil attributes ride along on one more conflicting pair.
    branch(
        &repo,
        "evil-a",
        &both(
            w(".gitattributes", "* merge=evil diff=evil\n"),
            line("f.txt", 6, "A6"),
        ),
    );
    branch(&repo, "evil-b", &line("f.txt", 6, "B6"));

    println!(
        "{:<24} {:<34} {:<34} {:<34}",
        "pair", "expected", "radar", "git merge"
    );
    let (mut false_pos, mut missed, mut disagree) = (0, 0, 0);
    for (i, c) in cases.iter().enumerate() {
        let root = new_root(&t, &format!("root{i}"));
        let mut radar = Radar::open(root.clone(), vec![]).unwrap();
        let (a, b) = (format!("c{i}-a"), format!("c{i}-b"));
        let lives = [
            live("a", &repo, &a, &c.a_scope),
            live("b", &repo, &b, &c.b_scope),
        ];
        let r = radar.pass(&lives).unwrap();
        assert_eq!((r.pairs, r.pairs_computed), (1, 1), "{}", c.name);
        let ms = messages(&root);
        let expected: BTreeSet<String> = c.conflicts.iter().map(|s| s.to_string()).collect();
        let expected_scope: BTreeSet<String> = c.scoped.iter().map(|s| s.to_string()).collect();
        let (got, got_scope): (BTreeSet<String>, BTreeSet<String>) = match ms.as_slice() {
            [] => Default::default(),
            [m] => {
                assert_eq!(m.kind, Kind::Conflict, "{}", c.name);
                assert_eq!(
                    (m.from.as_str(), m.to.clone()),
                    ("mediator", vec!["a".into(), "b".into()])
                );
                assert!(
                    m.body
                        .contains(&git(&repo, &["rev-parse", &a]).trim().to_string())
                );
                let files: BTreeSet<String> = m
                    .body
                    .split("Real conflicts")
                    .nth(1)
                    .unwrap_or("")
                    .split("\n\n")
                    .next()
                    .unwrap()
                    .lines()
                    .filter_map(|l| l.strip_prefix("  "))
                    .map(|l| l.split(" (").next().unwrap().to_string())
                    .collect();
                let scoped: BTreeSet<String> = m
                    .body
                    .split("in the scope")
                    .skip(1)
                    .flat_map(|s| {
                        s.split("\n\n")
                            .next()
                            .unwrap()
                            .lines()
                            .skip(1)
                            .filter_map(|l| l.strip_prefix("  "))
                            .map(String::from)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                (files, scoped)
            }
            more => panic!("{}: {} messages", c.name, more.len()),
        };
        let merged = git_merge(&repo, &t.join("scratch"), &a, &b);
        let show = |s: &BTreeSet<String>, sc: &BTreeSet<String>| {
            let mut x = if s.is_empty() {
                "clean".to_string()
            } else {
                format!(
                    "conflict {}",
                    s.iter().cloned().collect::<Vec<_>>().join(",")
                )
            };
            if !sc.is_empty() {
                x += &format!(
                    " +scope {}",
                    sc.iter().cloned().collect::<Vec<_>>().join(",")
                );
            }
            x
        };
        println!(
            "{:<24} {:<34} {:<34} {:<34}",
            c.name,
            show(&expected, &expected_scope),
            show(&got, &got_scope),
            show(&merged, &BTreeSet::new())
        );
        false_pos += usize::from(!got.is_empty() && merged.is_empty());
        missed += usize::from(got.is_empty() && !merged.is_empty());
        disagree += usize::from(got != merged || got != expected || got_scope != expected_scope);
    }
    println!(
        "radar corpus: {} pairs, {false_pos} false positives, {missed} missed, {disagree} differing",
        cases.len()
    );
    assert_eq!((false_pos, missed, disagree), (0, 0, 0));

    // The evil pair: a conflict like any other, and nothing run.
    let root = new_root(&t, "evil");
    let mut radar = Radar::open(root.clone(), vec![]).unwrap();
    radar
        .pass(&[
            live("a", &repo, "evil-a", &[]),
            live("b", &repo, "evil-b", &[]),
        ])
        .unwrap();
    assert_eq!(messages(&root).len(), 1);
    assert!(
        !canary.exists(),
        "the radar ran a driver from the host's config"
    );

    memory_and_clearing(&t, &repo);
    caps(&t, &repo);
}

/// One conflict message; nothing on the next passes; a rebase that resolves
/// it gives one conflict-cleared; only pairs with a changed head are
/// recomputed.
fn memory_and_clearing(t: &TempDir, repo: &Path) {
    branch(repo, "m-a", &line("f.txt", 10, "A10"));
    branch(repo, "m-b", &line("f.txt", 10, "B10"));
    branch(repo, "m-c", &line("docs/a.md", 2, "C"));
    let root = new_root(t, "memory");
    let lives = [
        live("a", repo, "m-a", &[]),
        live("b", repo, "m-b", &[]),
        live("c", repo, "m-c", &[]),
    ];
    let mut radar = Radar::open(root.clone(), vec![]).unwrap();
    let r = radar.pass(&lives).unwrap();
    assert_eq!((r.pairs, r.pairs_computed, r.conflicts), (3, 3, 1));
    drop(radar);
    // A new process: the state is on disk.
    let mut radar = Radar::open(root.clone(), vec![]).unwrap();
    let r = radar.pass(&lives).unwrap();
    assert_eq!((r.pairs_computed, r.conflicts, r.cleared), (0, 0, 0));
    // b resolves: takes a's line.
    git(repo, &["checkout", "-q", "m-b"]);
    edit_line(&repo.join("f.txt"), 10, "A10");
    git(repo, &["commit", "-qam", "take A's line"]);
    git(repo, &["checkout", "-q", "main"]);
    let r = radar.pass(&lives).unwrap();
    assert_eq!(
        (r.heads_changed, r.pairs_computed, r.conflicts, r.cleared),
        (1, 2, 0, 1)
    );
    let r = radar.pass(&lives).unwrap();
    assert_eq!((r.pairs_computed, r.conflicts, r.cleared), (0, 0, 0));
    let ms = messages(&root);
    let kinds: Vec<Kind> = ms.iter().map(|m| m.kind).collect();
    assert_eq!(kinds, [Kind::Conflict, Kind::ConflictCleared]);
    assert_eq!(ms[1].refs, ["f.txt"]);
    println!(
        "radar memory: 1 conflict, 0 repeats over 2 passes, 1 cleared after b changed (2 of 3 pairs recomputed)"
    );
}

/// A branch too big for the size cap, and a pass under a time cap no git
/// meets: `skipped NAME: why`, and the pass goes on.
fn caps(t: &TempDir, repo: &Path) {
    // 3 MB that zlib cannot shrink (a 64-bit LCG's high bits).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut big = Vec::with_capacity(3_000_000);
    for _ in 0..3_000_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        big.push((x >> 56) as u8);
    }
    git(repo, &["checkout", "-q", "-b", "huge", "main"]);
    std::fs::write(repo.join("huge.bin"), &big).unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-qm", "huge"]);
    git(repo, &["checkout", "-q", "main"]);
    let root = new_root(t, "caps");
    let mut radar = Radar::open(root.clone(), vec![]).unwrap();
    radar.limits = Limits {
        fetch: 1 << 20,
        ..Limits::default()
    };
    let r = radar
        .pass(&[live("big", repo, "huge", &[]), live("a", repo, "m-a", &[])])
        .unwrap();
    let skipped: Vec<String> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Skipped { name, why } => Some(format!("radar: skipped {name}: {why}")),
            _ => None,
        })
        .collect();
    println!("{}", skipped.join("\n"));
    assert_eq!(skipped.len(), 1, "{skipped:?} {r:?}");
    assert!(
        skipped[0].starts_with("radar: skipped big: branch 'huge' brought"),
        "{skipped:?}"
    );
    assert!(!root.state_dir().join("radar/sandboxes/big.git").exists());
    assert_eq!(r.pairs_computed, 0);

    let root = new_root(t, "slow");
    let mut radar = Radar::open(root, vec![]).unwrap();
    radar.limits.time = Duration::from_millis(1);
    let r = radar
        .pass(&[live("a", repo, "m-a", &[]), live("b", repo, "m-b", &[])])
        .unwrap();
    let n = r
        .events
        .iter()
        .filter(|e| matches!(e, Event::Skipped { why, .. } if why.contains("longer than")))
        .count();
    println!("radar time cap: {n} of 2 sandboxes skipped under a 1 ms cap");
    assert!(n >= 1);
}
