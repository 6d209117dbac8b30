//! What every `lw-*` binary does around its `run` function: print errors as
//! `lw-post: what 'path': cause`, map them to exit statuses, and leave quietly
//! when stdout is a closed pipe (`lw-inbox | head -1`); and the [`Report`]
//! a command passes down, through which the library says what it has to say
//! besides its result (the library itself never prints).

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use crate::error::{Error, Exit};

/// Where a library step sends a diagnostic (a warning, a note of progress,
/// a record skipped): one line, without the command's name, which the
/// command adds when it prints it.  `Sync`, so a step may report from the
/// threads it runs.
pub type Report<'a> = &'a (dyn Fn(&str) + Sync);

/// The reporter of command `prog`: each line as `PROG: LINE` on standard
/// error, in one write(2), so that a kill never leaves half of it.
pub fn stderr_report(prog: &str) -> impl Fn(&str) + Sync + '_ {
    move |line: &str| {
        let text = format!("{prog}: {line}\n");
        let _ = io::stderr().lock().write_all(text.as_bytes());
    }
}

/// Runs `f` and turns its result into the process exit status.
pub fn main_with(prog: &str, f: impl FnOnce(&mut dyn Write) -> Result<Exit, Error>) -> ExitCode {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let res = f(&mut out);
    let flushed = out.flush();
    match res {
        Ok(exit) => match flushed {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::from(0),
            Err(e) => {
                eprintln!(
                    "{prog}: cannot write to standard output: {}",
                    strip_os(&e.to_string())
                );
                ExitCode::from(Exit::IoErr.code())
            }
            Ok(()) => ExitCode::from(exit.code()),
        },
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::from(0);
            }
            eprintln!("{prog}: {err}");
            ExitCode::from(err.exit.code())
        }
    }
}

fn is_broken_pipe(err: &Error) -> bool {
    err.source
        .as_ref()
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

fn strip_os(s: &str) -> &str {
    match s.find(" (os error ") {
        Some(i) => &s[..i],
        None => s,
    }
}

pub use crate::error::out_err;

/// Parses clap arguments, mapping clap's own exit status 2 to 64 (usage).
pub fn parse_args<T: clap::Parser>(prog: &str) -> Result<T, ExitCode> {
    match T::try_parse() {
        Ok(a) => Ok(a),
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    Err(ExitCode::from(0))
                }
                _ => {
                    let text = e.render().to_string();
                    let text = text.strip_prefix("error: ").unwrap_or(&text);
                    eprint!("{prog}: {text}");
                    Err(ExitCode::from(Exit::Usage.code()))
                }
            }
        }
    }
}

/// True when stdin is a terminal (then a command never reads a body from it).
pub fn stdin_is_tty() -> bool {
    io::stdin().is_terminal()
}

/// A command's whole `main`: parse the arguments (usage errors exit 64),
/// then run `run` under [`main_with`].
pub fn run_main<T: clap::Parser>(
    prog: &str,
    run: impl FnOnce(T, &mut dyn Write) -> Result<Exit, Error>,
) -> ExitCode {
    match parse_args::<T>(prog) {
        Ok(args) => main_with(prog, |out| run(args, out)),
        Err(code) => code,
    }
}
