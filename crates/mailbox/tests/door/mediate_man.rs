//! The man page names every long flag of every subcommand (as `\-\-flag`)
//! and has the sections every loopwright page has.

use support::mediate_util;

use std::process::Command;

use mediate_util::lw_mediate;

fn help(args: &[&str]) -> String {
    let out = Command::new(lw_mediate())
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn long_flags(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w[2..].to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn man_page_lists_every_flag_and_section() {
    let man = std::fs::read_to_string(support::workspace().join("man/lw-mediate.1")).unwrap();
    let mut cmds: Vec<Vec<&str>> = vec![vec![]];
    for c in [
        "held",
        "human",
        "release",
        "drop",
        "answer",
        "log",
        "register",
        "unregister",
        "sandboxes",
    ] {
        cmds.push(vec![c]);
    }
    cmds.push(vec!["policy", "check"]);
    cmds.push(vec!["policy", "show"]);
    let mut checked = 0;
    for c in &cmds {
        let h = help(c);
        for flag in long_flags(&h) {
            assert!(
                man.contains(&format!("\\-\\-{flag}")),
                "man/lw-mediate.1 lacks \\-\\-{flag} (from {c:?})"
            );
            checked += 1;
        }
        if let Some(sub) = c.first() {
            assert!(
                man.contains(&format!("lw-mediate {sub}")) || man.contains(&format!(".B {sub}")),
                "{sub} undocumented"
            );
        }
    }
    assert!(checked > 10);
    for s in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "FILES",
        "EXIT STATUS",
        "EXAMPLES",
        "SEE ALSO",
    ] {
        assert!(man.contains(&format!(".SH {s}\n")), "section {s} missing");
    }
    for code in ["64", "65", "66", "73", "74", "75", "78"] {
        assert!(
            man.contains(&format!(".B {code}\n")),
            "exit status {code} undocumented"
        );
    }
}
