//! powercut MOUNTPOINT: mounts the power-cut file system (see the
//! library's docs) and takes commands on standard input, one a line,
//! answering each on standard output:
//!
//!   syncs        the count of durability points so far
//!   arm N        cut right after durability point N
//!   cut          cut now
//!   restore      power back on: serve what survived
//!   sync         make everything durable (not a durability point)
//!   refuse-noreplace on|off   refuse RENAME_NOREPLACE with EINVAL (gVisor's way)
//!
//! End of input unmounts.  Exit codes: 0 done, 64 usage, 69 FUSE unavailable.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mnt] = args.as_slice() else {
        eprintln!(
            "usage: powercut MOUNTPOINT   (commands on stdin: syncs, arm N, cut, restore, sync, refuse-noreplace on|off)"
        );
        return ExitCode::from(64);
    };
    let fs = match powercut::PowerCut::mount(&PathBuf::from(mnt)) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!(
                "powercut: cannot mount {mnt}: {e} (needs /dev/fuse and root or fusermount3)"
            );
            return ExitCode::from(69);
        }
    };
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["syncs"] => println!("{}", fs.syncs()),
            ["arm", n] => match n.parse() {
                Ok(n) => {
                    fs.arm(n);
                    println!("armed {n}");
                }
                Err(_) => println!("error: arm takes a whole number, not {n:?}"),
            },
            ["cut"] => {
                fs.cut();
                println!("cut after {}", fs.cut_at().unwrap_or(0));
            }
            ["restore"] => {
                fs.restore();
                println!("restored");
            }
            ["sync"] => {
                fs.sync_all();
                println!("synced");
            }
            ["refuse-noreplace", v @ ("on" | "off")] => {
                fs.refuse_noreplace(*v == "on");
                println!("refuse-noreplace {v}");
            }
            _ => println!(
                "error: unknown command {line:?} (syncs, arm N, cut, restore, sync, refuse-noreplace on|off)"
            ),
        }
    }
    ExitCode::SUCCESS
}
