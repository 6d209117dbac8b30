//! The door under a flood, with secrets, and with text made of control
//! characters: lw-mediate and lw-sync as processes against lw-github-sink's
//! server on 127.0.0.1.  Prints its figures.

use support::sync as sync_support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use mailbox::layout::Root;
use mailbox::log::{Action, Entry, Log};
use mailbox::message::{Kind, Message};
use mailbox::registry::{Registry, Sandbox};
use support::common::ok;
use support::mediate_util::post;
use sync_support::{Env, TOKEN, files_under, text};

fn msg(to: &str, kind: Kind, subject: &str, body: &str) -> Message {
    sync_support::message("x", to, kind, subject, body)
}

/// Posts many at once, for the flood: complete files renamed into `new/`,
/// without lw-post's fsync per message (nothing crashes here).
fn post_fast(root: &Root, sender: &str, ms: &[Message]) {
    let ob = root.sandbox(sender).outbox();
    ob.create().unwrap();
    for m in ms {
        let tmp = ob.sub(mailbox::maildir::Sub::Tmp).join(&m.id);
        std::fs::write(&tmp, m.to_bytes()).unwrap();
        std::fs::rename(&tmp, ob.sub(mailbox::maildir::Sub::New).join(&m.id)).unwrap();
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
    let mut c = Command::new(support::bin("lw-mediate"));
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

#[test]
fn a_flood_of_10000_posts_makes_at_most_3_comments_and_a_question_goes_first() {
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
    let (fwd, held, quiet) = (
        count(Action::Forward, false),
        count(Action::Hold, false),
        count(Action::Bounce, true),
    );
    // Refusals are counted, one entry a minute (issue 29, item 4): each
    // used to be an entry of its own and a bounce file.
    let counted: Vec<&Entry> = es
        .iter()
        .filter(|e| e.sender == "flood" && e.decision.action == Action::Bounce)
        .collect();
    let refused: usize = counted.iter().map(|e| refusals_in(e)).sum();
    let notices: Vec<&Entry> = es.iter().filter(|e| e.sender == "mediator").collect();
    let log_bytes = du(&root.log_dir());
    println!(
        "flood: {N} posts -> forwarded {fwd} (rate 120/60s), held {held} (cap 20), refused {refused} in {} entries, notices {}; log {} KiB on disk ({} entries); mediator {mediate_s:.1} s",
        counted.len(),
        notices.len(),
        log_bytes >> 10,
        es.len()
    );
    assert_eq!(fwd, 120);
    assert_eq!(held, 20);
    assert_eq!(quiet, 0, "no refusal is logged alone");
    assert!((1..=2).contains(&counted.len()), "{}", counted.len());
    assert_eq!(fwd + held + refused, N);
    assert_eq!(notices.len(), 1, "one status message tells a person");
    assert!(log_bytes < 2 << 20, "{log_bytes}");
    let reason = &counted[0].decision.reason;
    assert!(reason.contains("the most allowed"), "{reason}");
    // The sender is told, once per counted entry, with the reason.
    let bounces = std::fs::read_dir(
        root.sandbox("flood")
            .inbox()
            .sub(mailbox::maildir::Sub::New),
    )
    .unwrap()
    .count();
    assert_eq!(bounces, counted.len());
    // Copies of a flood body the root keeps outside the sender's own mailbox:
    // the 120 forwarded ones (log + web's inbox) and the 20 held ones (held/).
    let mut copies = 0;
    for f in files_under(&root.dir) {
        if f.starts_with(root.sandboxes_dir().join("flood")) {
            continue;
        }
        // Occurrences, not files: the log holds a batch's entries in one file.
        copies += std::fs::read_to_string(&f).map_or(0, |s| s.matches("flood body ").count());
    }
    println!(
        "flood: copies of a flood body outside its sandbox: {copies} ({:.3} per post; before: about 3 per post)",
        copies as f64 / N as f64
    );
    assert_eq!(copies, 120 * 2 + 20);

    // One sync run: the question and the notice are on GitHub, the flood
    // makes at most three comments: held headers, the notice, the count.
    let t = Instant::now();
    let o = env.sync(&["--once", "--json"]);
    ok(&o);
    let sync_s = t.elapsed().as_secs_f64();
    let comments = env.comments(1);
    let mut about_flood = 0;
    let mut question_in = None;
    let mut counted_mirrored = 0;
    for (i, (_, body, _)) in comments.iter().enumerate() {
        let Some(Ok(secs)) = sync::parse_comment(body) else {
            continue;
        };
        let mut flood = false;
        for s in secs {
            if let sync::Head::Entry(h) = s.head {
                if h.id == q.id {
                    question_in = Some(i);
                }
                counted_mirrored += counted.iter().filter(|e| e.name == h.entry).count();
                if h.sender == "mediator" || (h.sender == "flood" && h.action != Action::Forward) {
                    flood = true;
                    if h.sender == "flood" {
                        assert!(
                            !s.chunk.contains("flood body"),
                            "a held body left: {}",
                            s.chunk
                        );
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
    // The held headers, the status message to a person, and the counted
    // refusals, each of these mirrored once.
    assert!(about_flood <= 3, "{about_flood}");
    assert_eq!(
        counted_mirrored,
        counted.len(),
        "what was refused, mirrored once"
    );
    assert_eq!(question_in, Some(0), "the question goes first");
    assert!(!comments.iter().any(|c| c.1.contains("flood body 9999")));
}

/// Issue 29, item 4: every post left a log entry of its own on the root's
/// disk, outside every quota.  A sender's log bytes per hour are capped
/// (`door.log-max`); past the cap its posts wait in its outbox, and a
/// person (and the sender) are told once.
#[test]
fn a_flood_grows_the_log_by_at_most_door_log_max_and_the_rest_waits() {
    let env = Env::new("budget");
    let root = Root::new(&env.root);
    register(&root, &["flood", "web"]);
    let proj = env.dir.join("project");
    std::fs::create_dir_all(proj.join(".loopwright")).unwrap();
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .arg(&proj)
            .status()
            .unwrap()
            .success()
    );
    const CAP: u64 = 1 << 20;
    std::fs::write(proj.join(".loopwright/config"), "door.log-max = 1m\n").unwrap();
    // Nothing held or refused: every post would be forwarded and logged.
    let policy = env.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nrate off\nduplicates off\n").unwrap();
    let policy = policy.to_str().unwrap();
    const N: usize = 10_000;
    let flood: Vec<Message> = (0..N)
        .map(|i| {
            msg(
                "web",
                Kind::Request,
                &format!("flood {i}"),
                &format!("body {i}"),
            )
        })
        .collect();
    post_fast(&root, "flood", &flood);
    let outbox = root
        .sandbox("flood")
        .outbox()
        .sub(mailbox::maildir::Sub::New);
    let before = du(&root.log_dir());

    let t = Instant::now();
    let o = mediate(&root, &proj, &[], &["--once", "--policy", policy]);
    let secs = t.elapsed().as_secs_f64();
    let after = du(&root.log_dir());
    let es = entries(&root);
    let fwd = es
        .iter()
        .filter(|e| e.sender == "flood" && e.decision.action == Action::Forward)
        .count();
    let waiting = std::fs::read_dir(&outbox).unwrap().count();
    let notices: Vec<&Entry> = es.iter().filter(|e| e.sender == "mediator").collect();
    println!(
        "budget: {N} posts, door.log-max {} KiB: log {} KiB before, {} KiB after (+{} KiB on disk, {} entries); forwarded {fwd}, waiting {waiting}; notices {}; mediator {secs:.1} s",
        CAP >> 10,
        before >> 10,
        after >> 10,
        (after - before) >> 10,
        es.len(),
        notices.len()
    );
    assert!(
        after - before <= CAP,
        "the log grew by {} bytes",
        after - before
    );
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("the posts of flood wait in its outbox until")
            && text(&o.stderr).contains("log budget of 1 MiB for the hour (door.log-max)"),
        "{}",
        text(&o.stderr)
    );
    assert!(fwd > 0, "the budget admits posts");
    assert_eq!(fwd + waiting, N, "nothing lost: the rest waits");
    assert_eq!(notices.len(), 1, "a person is told once");
    let n = notices[0];
    assert_eq!(
        n.decision.to,
        vec!["human".to_string(), "flood".to_string()]
    );
    assert!(
        n.decision.reason.contains("door.log-max"),
        "{}",
        n.decision.reason
    );
    let in_queue = |d: mailbox::maildir::Maildir| {
        std::fs::read_dir(d.sub(mailbox::maildir::Sub::New))
            .unwrap()
            .count()
    };
    assert_eq!(in_queue(root.human()), 1);
    assert_eq!(
        in_queue(root.sandbox("flood").inbox()),
        1,
        "the sender is told once"
    );

    // Another run in the same hour: the posts still wait, nobody is told again.
    let o = mediate(&root, &proj, &[], &["--once", "--policy", policy]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert_eq!(entries(&root).len(), es.len(), "nothing more logged");
    assert_eq!(std::fs::read_dir(&outbox).unwrap().count(), waiting);
    assert_eq!(in_queue(root.human()), 1);
    assert_eq!(du(&root.log_dir()), after);
}

/// The posts a counted refusal entry stands for (`N posts refused`).
fn refusals_in(e: &Entry) -> usize {
    let m = e
        .message
        .as_ref()
        .expect("a counted refusal carries its summary");
    m.subject
        .strip_suffix(" posts refused")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a counted refusal: {}", m.subject))
}

/// Bytes the files under `dir` take on disk.
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    files_under(dir)
        .iter()
        .filter_map(|f| f.symlink_metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
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
            .sub(mailbox::maildir::Sub::New)
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
    let shown = Command::new(support::bin("lw-inbox"))
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
    assert!(held.sub(mailbox::maildir::Sub::New).join(&m.id).exists());
    // What lw-sandbox rm does: unregister, remove the mailbox.
    assert!(Registry::new(&root).unregister("gone").unwrap());
    std::fs::remove_dir_all(root.sandboxes_dir().join("gone")).unwrap();
    ok(&mediate(&root, &outside, &[], &["--once", "--policy", p]));
    assert!(!held.sub(mailbox::maildir::Sub::New).join(&m.id).exists());
    assert!(held.sub(mailbox::maildir::Sub::Cur).join(&m.id).exists());
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

#[test]
fn a_door_log_max_that_is_not_a_size_exits_78_naming_the_key() {
    let env = Env::new("logmax");
    let root = Root::new(&env.root);
    register(&root, &["api"]);
    let proj = project(&env.dir);
    for bad in ["lots", "0", "-1m"] {
        std::fs::write(
            proj.join(".loopwright/config"),
            format!("door.log-max = {bad}\n"),
        )
        .unwrap();
        let o = mediate(&root, &proj, &[], &["--once"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(78), "{bad}: {err}");
        assert!(
            err.starts_with(&format!("lw-mediate: 'door.log-max = {bad}' in "))
                && err.contains("expected a size above 0, such as 512k or 8m"),
            "{err}"
        );
    }
}
