//! lw: the front command.  `lw CMD ARGS...` runs `lw-CMD ARGS...`, as git
//! runs git-CMD: first from the directory `lw` itself lives in, then from
//! PATH.  The child replaces this process (exec), so its exit status, signals
//! and terminal pass through untouched.  `lw help` lists the commands found.
//!
//! Exit status: the command's own; 64 for an unknown command; 126 when it was
//! found but could not be run.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: lw <command> [<args>...]\n       lw help        list the commands\n       lw --version\n";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(cmd) = args.next() else {
        eprint!("{USAGE}");
        return ExitCode::from(64);
    };
    let cmd = cmd.to_string_lossy().into_owned();
    match cmd.as_str() {
        "help" | "--help" | "-h" => match args.next() {
            // `lw help post` is `lw-post --help`.
            Some(sub) => run(&sub.to_string_lossy(), vec![OsString::from("--help")]),
            None => {
                print!("{USAGE}\ncommands:\n");
                for (name, path) in commands() {
                    println!("  {:<12} {}", name, summary(&path));
                }
                println!("\nSee `lw help <command>` and man/loopwright.7.");
                ExitCode::SUCCESS
            }
        },
        "--version" | "-V" => {
            println!("lw {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        _ => run(&cmd, args.collect()),
    }
}

fn run(cmd: &str, args: Vec<OsString>) -> ExitCode {
    if cmd.is_empty() || cmd.starts_with('-') || cmd.contains('/') {
        eprintln!("lw: '{cmd}' is not a command; see 'lw help'");
        return ExitCode::from(64);
    }
    let Some(path) = find(&format!("lw-{cmd}")) else {
        eprintln!(
            "lw: '{cmd}' is not a command (no lw-{cmd} next to lw or on PATH); see 'lw help'"
        );
        return ExitCode::from(64);
    };
    let err = Command::new(&path).args(args).exec();
    eprintln!("lw: cannot run '{}': {}", path.display(), err);
    ExitCode::from(126)
}

fn dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        v.push(d);
    }
    if let Some(p) = std::env::var_os("PATH") {
        v.extend(std::env::split_paths(&p));
    }
    v
}

fn find(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    dirs().into_iter().map(|d| d.join(name)).find(|p| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Every `lw-*` executable, first occurrence of each name wins.
fn commands() -> Vec<(String, PathBuf)> {
    let mut seen = std::collections::BTreeMap::new();
    for d in dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(short) = name.strip_prefix("lw-") {
                // Skip build artefacts such as lw-post.d next to the binaries.
                if short.contains('.') || find(&name).is_none() {
                    continue;
                }
                seen.entry(short.to_string()).or_insert_with(|| e.path());
            }
        }
    }
    seen.into_iter().collect()
}

/// The first line of a command's --help: its one-line description.
fn summary(path: &Path) -> String {
    Command::new(path)
        .arg("--help")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default()
}
