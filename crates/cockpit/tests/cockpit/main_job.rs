//! `scripts/main-job --cockpit` with its page open in Chromium for the
//! whole story (issue 40: it still passes after the access changed): the
//! page opened from the URL the job printed shows the sandboxes, the
//! contract change, the radar's conflict, the question and the person's
//! answer as they happen; the printed URL then does not open the page
//! again, and the file the job kept it in is the user's alone.

use super::*;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::mpsc;

#[test]
fn main_job_with_the_cockpit_open_in_chromium() {
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("main-job-cockpit");
    let bin_dir = Path::new(COCKPIT).parent().unwrap();
    let mut child = Command::new("bash")
        .arg(support::workspace().join("scripts/main-job"))
        .args(["--yes", "--cockpit", "--work"])
        .arg(&work)
        .env("LW_BIN_DIR", bin_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs scripts/main-job");
    let stderr = child.stderr.take().expect("stderr is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut job = Kill(child);
    // The job's standard error, read as it comes: the cockpit's line
    // starts the browser; all of it is kept for a failure's message.
    let (tx, rx) = mpsc::channel();
    let err = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let keep = err.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            keep.lock().unwrap().push_str(&(line.clone() + "\n"));
            let _ = tx.send(line);
        }
    });
    let reading = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = BufReader::new(stdout).read_to_string(&mut out);
        out
    });
    let url = loop {
        match rx.recv_timeout(Duration::from_secs(900)) {
            Ok(line) => {
                if let Some(u) = line.split("the cockpit: ").nth(1) {
                    break u.trim_end_matches("\u{1b}[0m").trim().to_string();
                }
            }
            Err(_) => panic!(
                "the job never printed the cockpit's URL:\n{}",
                err.lock().unwrap()
            ),
        }
    };
    let file = work.join("cockpit.url");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} is mode {mode:o}", file.display());
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), url);
    let r = browser_at(
        "mainjob",
        &url,
        &work.join("mailbox"),
        &[("BROWSER_SECS", "900".into())],
    );
    eprintln!("on the page, ms after it opened: {}", r["at"]);
    let status = job.0.wait().unwrap();
    let out = reading.join().unwrap();
    assert!(
        status.success(),
        "scripts/main-job --cockpit failed ({status:?}):\n{out}\n{}",
        err.lock().unwrap()
    );
    assert!(
        out.contains("merged check:  ok: Hello, Ada Lovelace"),
        "{out}"
    );
}
