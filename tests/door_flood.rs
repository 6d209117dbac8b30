//! The door under a flood, with secrets, and with text made of control
//! characters: lw-mediate and lw-sync as processes against lw-github-sink's
//! server on 127.0.0.1.  Prints its figures.

mod sync_support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use loopwright::layout::Root;
use loopwright::log::{Action, Entry, Log};
use loopwright::message::{Kind, Message};
use loopwright::registry::{Registry, Sandbox};
use sync_support::{Env, TOKEN, files_under, text};

const MEDIATE: &str = env!("CARGO_BIN_EXE_lw-mediate");
const INBOX: &str = env!("CARGO_BIN_EXE_lw-inbox");

fn msg(to: &str, kind: Kind, subject: &str, body: &str) -> Message {
    sync_support::message("x", to, kind, subject, body)
}

fn post(root: &Root, sender: &str, m: &Message) {
    root.sandbox(sender).outbox().deliver_message(m).unwrap();
}

/// Posts many at once, for the flood: complete files renamed into `new/`,
/// without lw-post's fsync per message (nothing crashes here).
fn post_fast(root: &Root, sender: &str, ms: &[Message]) {
    let ob = root.sandbox(sender).outbox();
    ob.create().unwrap();
    for m in ms {
        let tmp = ob.sub(loopwright::maildir::Sub::Tmp).join(&m.id);
        std::fs::write(&tmp, m.to_bytes()).unwrap();
        std::fs::rename(&tmp, ob.sub(loopwright::maildir::Sub::New).join(&m.id)).unwrap();
    }
}

fn register(root: &Root, names: &[&str]) {
    let reg = Registry::new(root);
    for n in names {
        reg.register(&Sandbox::new(n, None, vec![])).unwrap();
    }
}

/// lw-mediate in `dir` (the project, or a directory outside any) with `env`.
fn mediate(root: &Root, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(MEDIATE);
    c.env_remove("GH_TOKEN")
        .env_remove("GITHUB_TOKEN")
        .current_dir(dir)
        .arg("--root")
        .arg(&root.dir)
        .args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn entries(root: &Root) -> Vec<Entry> {
    let (good, bad) = Log::new(root.log_dir()).entries().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    good
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
}

#[test]
fn a_flood_of_10000_posts_makes_at_most_2_comments_and_a_question_goes_first() {
    let env = Env::new("flood");
    let root = Root::new(&env.root);
    register(&root, &["flood", "web", "api"]);
    let outside = env.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    const N: usize = 10_000;
    let flood: Vec<Message> = (0..N)
        .map(|i| {
            msg(
                "web",
                Kind::Request,
                &format!("flood {i}"),
                &format!("flood body {i}"),
            )
        })
        .collect();
    post_fast(&root, "flood", &flood);
    let q = msg("human", Kind::Question, "which schema wins?", "v1 or v2?");
    post(&root, "api", &q);

    let t = Instant::now();
    let o = mediate(&root, &outside, &[], &["--once"]);
    ok(&o);
    let mediate_s = t.elapsed().as_secs_f64();
    let es = entries(&root);
    let count = |a: Action, quiet: bool| {
        es.iter()
            .filter(|e| e.sender == "flood" && e.decision.action == a && e.decision.quiet == quiet)
            .count()
    };
    let (fwd, held, refused) = (
        count(Action::Forward, false),
        count(Action::Hold, false),
        count(Action::Bounce, true),
    );
    let notices: Vec<&Entry> = es.iter().filter(|e| e.sender == "mediator").collect();
    println!(
        "flood: {N} posts -> forwarded {fwd} (rate 120/60s), held {held} (cap 20), refused {refused}, notices {}; mediator {mediate_s:.1} s",
        notices.len()
    );
    assert_eq!(fwd, 120);
    assert_eq!(held, 20);
    assert_eq!(fwd + held + refused, N);
    assert_eq!(notices.len(), 1, "one status message tells a person");
    let reason = &es
        .iter()
        .find(|e| e.decision.quiet)
        .unwrap()
        .decision
        .reason;
    assert!(reason.contains("the most allowed"), "{reason}");
    // The refused posts went back to their sender, with the reason.
    let bounces = std::fs::read_dir(
        root.sandbox("flood")
            .inbox()
            .sub(loopwright::maildir::Sub::New),
    )
    .unwrap()
    .count();
    assert_eq!(bounces, refused);
    // Copies of a flood body the root keeps outside the sender's own mailbox:
    // the 120 forwarded ones (log + web's inbox) and the 20 held ones (held/).
    let mut copies = 0;
    for f in files_under(&root.dir) {
        if f.starts_with(root.sandboxes_dir().join("flood")) {
            continue;
        }
        if std::fs::read_to_string(&f).is_ok_and(|s| s.contains("flood body ")) {
            copies += 1;
        }
    }
    println!(
        "flood: files holding a flood body outside its sandbox: {copies} ({:.3} per post; before: about 3 per post)",
        copies as f64 / N as f64
    );
    assert_eq!(copies, 120 * 2 + 20);

    // One sync run: the question and the notice are on GitHub, the flood
    // makes at most two comments of held headers and the notice.
    let t = Instant::now();
    let o = env.sync(&["--once", "--json"]);
    ok(&o);
    let sync_s = t.elapsed().as_secs_f64();
    let comments = env.comments(1);
    let mut about_flood = 0;
    let mut question_in = None;
    for (i, (_, body, _)) in comments.iter().enumerate() {
        let Some(Ok(secs)) = loopwright::sync::parse_comment(body) else {
            continue;
        };
        let mut flood = false;
        for s in secs {
            if let loopwright::sync::Head::Entry(h) = s.head {
                if h.id == q.id {
                    question_in = Some(i);
                }
                if h.sender == "mediator" || (h.sender == "flood" && h.action != Action::Forward) {
                    flood = true;
                    if h.sender == "flood" {
                        assert!(s.chunk.is_empty(), "a held body left: {}", s.chunk);
                    }
                }
            }
        }
        about_flood += flood as usize;
    }
    println!(
        "flood: {} comments in all ({} carry the 120 admitted requests), {about_flood} about the held flood; the question is in comment {}; sync {sync_s:.1} s",
        comments.len(),
        comments.len() - about_flood,
        question_in.map_or("none".into(), |i| (i + 1).to_string())
    );
    assert!(about_flood <= 2, "{about_flood}");
    assert_eq!(question_in, Some(0), "the question goes first");
    assert!(!comments.iter().any(|c| c.1.contains("flood body 9999")));
}

/// A git checkout with `.loopwright/config` naming secrets.
fn project(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("project");
    std::fs::create_dir_all(p.join(".loopwright")).unwrap();
    let o = Command::new("git")
        .arg("init")
        .arg("-q")
        .arg(&p)
        .output()
        .unwrap();
    assert!(o.status.success());
    std::fs::write(
        p.join(".loopwright/config"),
        "sandbox.secrets = API_KEY SHORT\ndoor.secrets = DEPLOY_KEY\n",
    )
    .unwrap();
    p
}

#[test]
fn a_posted_secret_is_held_masked_and_never_reaches_github_or_a_readable_log() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new("secret");
    let root = Root::new(&env.root);
    register(&root, &["api", "web"]);
    let proj = project(&env.dir);
    const KEY: &str = "sk-live-7f3a9c2b41";
    let senv = [("API_KEY", KEY), ("SHORT", "a"), ("DEPLOY_KEY", "")];
    let in_body = msg(
        "web",
        Kind::Request,
        "use this key",
        &format!("key={KEY}\n"),
    );
    let in_subject = msg("web", Kind::Request, &format!("key {KEY}"), "see subject");
    let plain = msg("web", Kind::Request, "a banana", "aaaa bananas");
    // The sync token, which this mediator does not know: lw-sync masks it.
    let token = msg("web", Kind::Request, "token", &format!("GH {TOKEN}"));
    for m in [&in_body, &in_subject, &plain, &token] {
        post(&root, "api", m);
    }
    let o = mediate(&root, &proj, &senv, &["--once", "-v"]);
    ok(&o);
    assert!(
        text(&o.stderr).contains("secret SHORT is shorter than 6 bytes"),
        "{}",
        text(&o.stderr)
    );
    let es = entries(&root);
    for m in [&in_body, &in_subject] {
        let e = es.iter().find(|e| e.message_id == m.id).expect("logged");
        assert_eq!(e.decision.action, Action::Hold);
        assert!(
            e.decision.reason.contains("contains secret API_KEY"),
            "{}",
            e.decision.reason
        );
    }
    let p = es.iter().find(|e| e.message_id == plain.id).unwrap();
    assert_eq!(
        p.decision.action,
        Action::Forward,
        "a one-byte secret masks nothing"
    );
    assert_eq!(p.message.as_ref().unwrap().body, "aaaa bananas");

    // Release one: the recipient gets it masked.
    let o = mediate(&root, &proj, &senv, &["release", &in_body.id]);
    ok(&o);
    let copy = std::fs::read_to_string(
        root.sandbox("web")
            .inbox()
            .sub(loopwright::maildir::Sub::New)
            .join(&in_body.id),
    )
    .unwrap();
    assert!(
        copy.contains("[secret API_KEY]") && !copy.contains(KEY),
        "{copy}"
    );

    let o = env
        .sync_cmd(&["--once"])
        .current_dir(&proj)
        .envs(senv)
        .output()
        .unwrap();
    ok(&o);
    let comments = env.comments(1);
    let leaked = comments.iter().filter(|c| c.1.contains(KEY)).count();
    let token_leaked = comments.iter().filter(|c| c.1.contains(TOKEN)).count();
    assert!(comments.iter().any(|c| c.1.contains("[secret SYNC_TOKEN]")));
    // Local files: none that is not root-only (0600 in a 0700 tree) holds it,
    // and no log entry does.
    let mut readable = 0;
    let mut in_log = 0;
    let mut held_only = 0;
    for f in files_under(&env.dir) {
        let Ok(s) = std::fs::read(&f) else { continue };
        if !s.windows(KEY.len()).any(|w| w == KEY.as_bytes()) {
            continue;
        }
        if f.starts_with(root.sandboxes_dir().join("api")) {
            continue; // the sender's own outbox: it knew the value
        }
        if f.starts_with(root.log_dir()) {
            in_log += 1;
        }
        if std::fs::metadata(&f).unwrap().permissions().mode() & 0o077 != 0 {
            readable += 1;
        }
        held_only += f.starts_with(root.dir.join("held")) as usize;
    }
    let outputs = [text(&o.stdout), text(&o.stderr)].concat();
    println!(
        "secrets: comments holding the secret {leaked}, the token {token_leaked}; log files holding it {in_log}; files others can read holding it {readable}; held copies {held_only}"
    );
    assert_eq!((leaked, token_leaked, in_log, readable), (0, 0, 0, 0));
    assert!(!outputs.contains(KEY));
    for cmd in ["log", "held"] {
        let o = mediate(&root, &proj, &senv, &[cmd]);
        assert!(!text(&o.stdout).contains(KEY), "{cmd}: {}", text(&o.stdout));
    }
    assert!(text(&mediate(&root, &proj, &senv, &["held"]).stdout).contains("[secret API_KEY]"));
}

#[test]
fn control_characters_are_shown_not_sent_to_the_operator() {
    let env = Env::new("controls");
    let root = Root::new(&env.root);
    register(&root, &["api", "web"]);
    let outside = env.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // A body made entirely of control characters (no NUL), and a spoofed
    // 'from' whose reason used to print as \'from\'.
    let body: String = (1u8..0x20).chain([0x7f]).map(char::from).collect();
    let mut m = msg("web", Kind::Request, "controls", &body);
    m.from = "mallory".into();
    post(&root, "api", &m);
    let held = msg("human", Kind::Request, "tab\there", "x");
    let policy = env.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nhold kind handoff\n").unwrap();
    let mut h = held.clone();
    h.kind = Kind::Handoff;
    h.to = vec!["web".into()];
    h.subject = "plain subject".into();
    post(&root, "api", &h);
    let p = policy.to_str().unwrap();
    ok(&mediate(&root, &outside, &[], &["--once", "--policy", p]));
    let shown = Command::new(INBOX)
        .env("LW_MAILBOX", root.sandbox("web").dir.as_os_str())
        .args(["show", &m.id])
        .output()
        .unwrap();
    ok(&shown);
    let log = mediate(&root, &outside, &[], &["log"]);
    let heldq = mediate(&root, &outside, &[], &["held"]);
    for (what, o) in [("lw-inbox show", &shown), ("log", &log), ("held", &heldq)] {
        let s = text(&o.stdout);
        let raw = s
            .chars()
            .filter(|c| c.is_control() && !matches!(c, '\n' | '\t'))
            .count();
        println!(
            "controls: {what}: {raw} raw control characters in {} bytes",
            s.len()
        );
        assert_eq!(raw, 0, "{what}: {s:?}");
    }
    assert!(
        text(&shown.stdout).contains("^A^B^C"),
        "{}",
        text(&shown.stdout)
    );
    assert!(text(&shown.stdout).contains("^["));
    let l = text(&log.stdout);
    assert!(l.contains("'from' in the file said 'mallory'"), "{l}");
    assert!(!l.contains("\\'"), "{l}");
    // One space between columns of held, no tabs.
    let line = text(&heldq.stdout);
    assert!(
        line.starts_with(&format!("{} api handoff \"plain subject\" (", h.id)),
        "{line}"
    );
}

#[test]
fn the_held_messages_of_a_removed_sandbox_are_archived() {
    let env = Env::new("removed");
    let root = Root::new(&env.root);
    register(&root, &["gone", "web"]);
    let outside = env.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let policy = env.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nhold sender gone\n").unwrap();
    let p = policy.to_str().unwrap();
    let m = msg("web", Kind::Request, "held, then orphaned", "body");
    post(&root, "gone", &m);
    ok(&mediate(&root, &outside, &[], &["--once", "--policy", p]));
    let held = root.held();
    assert!(held.sub(loopwright::maildir::Sub::New).join(&m.id).exists());
    // What lw-sandbox rm does: unregister, remove the mailbox.
    assert!(Registry::new(&root).unregister("gone").unwrap());
    std::fs::remove_dir_all(root.sandboxes_dir().join("gone")).unwrap();
    ok(&mediate(&root, &outside, &[], &["--once", "--policy", p]));
    assert!(!held.sub(loopwright::maildir::Sub::New).join(&m.id).exists());
    assert!(held.sub(loopwright::maildir::Sub::Cur).join(&m.id).exists());
    let drop = entries(&root)
        .into_iter()
        .find(|e| e.message_id == m.id && e.decision.action == Action::Drop)
        .expect("a drop entry");
    assert!(
        drop.decision.reason.contains("sender gone was removed"),
        "{}",
        drop.decision.reason
    );
    assert_eq!(drop.message.unwrap().body, "", "a drop entry keeps no body");
}
