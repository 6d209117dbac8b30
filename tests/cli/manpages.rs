//! Flags and man pages stay in step: every long flag a command's help shows
//! (for the command and each subcommand) appears in its man page, and every
//! page has the sections the project promises, and loopwright(7) lists every
//! key .loopwright/config may hold.

use std::path::Path;
use std::process::Command;

fn bins() -> Vec<String> {
    let toml =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    toml.lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("name = \"lw-")
                .map(|r| format!("lw-{}", r.trim_end_matches('"')))
        })
        .collect()
}

fn bin_path(name: &str) -> std::path::PathBuf {
    // Integration tests sit in target/<triple>/<profile>/deps; binaries one up.
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join(name)
}

fn help(bin: &Path, sub: &[&str]) -> String {
    let o = Command::new(bin).args(sub).arg("--help").output().unwrap();
    assert!(
        o.status.success(),
        "{} {sub:?} --help failed",
        bin.display()
    );
    String::from_utf8(o.stdout).unwrap()
}

fn long_flags(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for (i, _) in text.match_indices("--") {
        let rest = &text[i + 2..];
        let flag: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let before = text[..i].chars().last();
        if !flag.is_empty()
            && flag.chars().next().unwrap().is_ascii_alphabetic()
            && before.is_none_or(|c| c.is_whitespace() || c == '[' || c == ',')
        {
            v.push(flag);
        }
    }
    v.sort();
    v.dedup();
    v
}

fn subcommands(text: &str) -> Vec<String> {
    let Some(start) = text.find("Commands:") else {
        return vec![];
    };
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|s| s != "help")
        .collect()
}

#[test]
fn every_flag_is_in_the_man_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let names = bins();
    assert!(names.len() >= 2, "Cargo.toml lists the commands: {names:?}");
    for name in &names {
        let page = root.join("man").join(format!("{name}.1"));
        let man = std::fs::read_to_string(&page)
            .unwrap_or_else(|_| panic!("{name} has no man page at {}", page.display()));
        let man = man.replace("\\-", "-");
        for section in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH DESCRIPTION",
            ".SH EXIT STATUS",
            ".SH SEE ALSO",
        ] {
            if !man.contains(section) {
                missing.push(format!("{name}.1: no {section} section"));
            }
        }
        let bin = bin_path(name);
        let top = help(&bin, &[]);
        let mut texts = vec![(String::new(), top.clone())];
        for sub in subcommands(&top) {
            let h = help(&bin, &[&sub]);
            for sub2 in subcommands(&h) {
                texts.push((format!("{sub} {sub2}"), help(&bin, &[&sub, &sub2])));
            }
            texts.push((sub.clone(), h));
            if !man.contains(&sub) {
                missing.push(format!("{name}.1: subcommand '{sub}' is not described"));
            }
        }
        for (sub, text) in texts {
            // --help and --version are every command's; the overview page says so.
            for flag in long_flags(&text)
                .into_iter()
                .filter(|f| f != "help" && f != "version")
            {
                if !man.contains(&format!("--{flag}")) {
                    missing.push(format!(
                        "{name}.1: --{flag} (from `{name} {sub} --help`) is not documented"
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "man pages out of step with the commands:\n{}",
        missing.join("\n")
    );
}

#[test]
fn overview_page_names_every_command() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("man/loopwright.7")).unwrap();
    assert!(page.contains(".SH EXIT STATUS"));
    for name in bins() {
        assert!(
            page.contains(&format!(".BR {name} (1)")),
            "loopwright.7 does not mention {name}"
        );
    }
}

/// The man page's EXIT STATUS section of `bin` (to the next `.SH`).
fn exit_status_section(bin: &str) -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("man/{bin}.1"));
    let text = std::fs::read_to_string(&page).unwrap_or_default();
    text.split("\n.SH ")
        .find(|s| s.starts_with("EXIT STATUS"))
        .unwrap_or_default()
        .to_string()
}

/// Every exit status a golden case pins (tests/cmd: what a command really
/// exits for that input) is one its man page documents under EXIT STATUS.
#[test]
fn every_exit_status_the_goldens_pin_is_in_the_man_page() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cmd");
    let mut missing = Vec::new();
    let mut checked = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let case = std::fs::read_to_string(&p).unwrap();
        let field = |k: &str| {
            case.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        let (Some(bin), Some(code)) = (field("bin.name = "), field("status.code = ")) else {
            continue;
        };
        let section = exit_status_section(&bin);
        // Each status is the tag of a `.TP` paragraph: `64`, `.B 64`, or
        // several at once, `.B 126, 127`.
        let lines: Vec<&str> = section.lines().collect();
        let documented = lines.windows(2).any(|w| {
            w[0] == ".TP"
                && w[1]
                    .trim_start_matches(".BR ")
                    .trim_start_matches(".B ")
                    .split([' ', ','])
                    .any(|t| t.trim_matches('"') == code)
        });
        checked += 1;
        if !documented {
            missing.push(format!(
                "{}: {bin} exits {code}, which man/{bin}.1 EXIT STATUS does not document",
                p.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    println!("exit statuses checked against man pages: {checked}");
    assert!(checked > 20, "only {checked} golden cases with a status");
    assert!(missing.is_empty(), "{missing:#?}");
}

#[test]
fn every_configuration_key_is_in_loopwright_7() {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("man/loopwright.7"))
            .unwrap()
            .replace("\\-", "-");
    let section = page
        .split(".SH CONFIGURATION")
        .nth(1)
        .and_then(|s| s.split("\n.SH ").next())
        .expect("loopwright.7 has a CONFIGURATION section");
    for key in wall::config::ALL.iter().flat_map(|k| k.iter()) {
        assert!(
            section.contains(key),
            "loopwright.7 CONFIGURATION does not list {key}"
        );
    }
}
