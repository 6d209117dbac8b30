//! The operator's side: the human queue and answers, held messages, the
//! log, receipts, the policy rules, watch mode, the lock.

use support::mediate_util;

use std::ffi::OsStr;
use std::process::Command;
use std::time::Duration;

use mailbox::log::Action;
use mailbox::maildir::{Found, Maildir, Sub};
use mailbox::message::Kind;
use mailbox::registry::{Registry, Sandbox};
use mediate_util::*;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn question_goes_to_a_person_and_the_answer_back_to_the_asker() {
    let root = root_with("answer", &["api", "web"]);
    let q = message("api", &["mediator"], Kind::Question, "which database?");
    post(&root, "api", &q);
    once(&root, OPEN_POLICY);

    let list = mediate(&root, &["human", "--json"]);
    let line: serde_json::Value = serde_json::from_str(stdout(&list).trim()).unwrap();
    assert_eq!(
        (
            line["type"].as_str(),
            line["id"].as_str(),
            line["sender"].as_str()
        ),
        (Some("question"), Some(q.id.as_str()), Some("api"))
    );

    let ans = mediate(&root, &["answer", &q.id, "use postgres"]);
    assert!(
        ans.status.success(),
        "{}",
        String::from_utf8_lossy(&ans.stderr)
    );
    let aid = stdout(&ans).trim().to_string();
    once(&root, OPEN_POLICY);
    let inbox = root.sandbox("api").inbox();
    let got = inbox.read(Sub::New, OsStr::new(&aid));
    let Found::Message(a) = got else {
        panic!("{got:?}")
    };
    assert_eq!(
        (
            a.from.as_str(),
            a.kind,
            a.in_reply_to.as_deref(),
            a.body.as_str()
        ),
        ("human", Kind::Answer, Some(q.id.as_str()), "use postgres")
    );
    assert!(
        stdout(&mediate(&root, &["human"])).is_empty(),
        "the answered question left the queue"
    );
    assert_eq!(names(&root.human().sub(Sub::Cur)), vec![q.id.clone()]);

    // Answering something that was never escalated is an error (66).
    let bad = mediate(&root, &["answer", &aid, "x"]);
    assert_eq!(
        bad.status.code(),
        Some(66),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // A sandbox's answer goes to whoever asked, whatever its `to` says.
    let r = message("web", &["api"], Kind::Request, "need a column");
    post(&root, "web", &r);
    once(&root, OPEN_POLICY);
    let mut reply = message("api", &["mediator"], Kind::Answer, "done");
    reply.in_reply_to = Some(r.id.clone());
    post(&root, "api", &reply);
    once(&root, OPEN_POLICY);
    assert!(delivered(&root.sandbox("web").inbox()).contains(&reply.id));
}

#[test]
fn held_messages_are_listed_released_and_dropped() {
    let root = root_with("held", &["a", "b"]);
    let policy = "loopwright-policy 1\nrate 2/1h\nduplicates 1h\nhold sender quiet\n";
    let first = message("a", &["b"], Kind::Request, "one");
    let mut dup = first.clone();
    dup.id = base::id::new_id();
    let third = message("a", &["b"], Kind::Request, "three");
    let fourth = message("a", &["b"], Kind::Request, "four");
    for m in [&first, &dup, &third, &fourth] {
        post(&root, "a", m);
    }
    once(&root, policy);
    let held = stdout(&mediate(&root, &["held"]));
    let lines: Vec<&str> = held.lines().collect();
    assert_eq!(lines.len(), 2, "{held}");
    assert!(
        lines[0].starts_with(&dup.id) && lines[0].contains("exact duplicate"),
        "{held}"
    );
    assert!(
        lines[1].starts_with(&fourth.id) && lines[1].contains("went over 2 messages in 3600s"),
        "{held}"
    );
    assert_eq!(delivered(&root.sandbox("b").inbox()), {
        let mut v = vec![first.id.clone(), third.id.clone()];
        v.sort();
        v
    });

    let rel = mediate(&root, &["release", &fourth.id]);
    assert!(
        rel.status.success(),
        "{}",
        String::from_utf8_lossy(&rel.stderr)
    );
    assert_eq!(stdout(&rel).trim(), format!("{} release b", fourth.id));
    let drop = mediate(&root, &["drop", &dup.id, "--reason", "repeat"]);
    assert!(drop.status.success());
    assert!(stdout(&mediate(&root, &["held"])).is_empty());
    assert!(delivered(&root.sandbox("b").inbox()).contains(&fourth.id));
    assert!(!delivered(&root.sandbox("b").inbox()).contains(&dup.id));
    assert_eq!(
        names(&root.held().sub(Sub::Cur)).len(),
        2,
        "dropped, not deleted"
    );
    // Releasing twice is an error that says so.
    let again = mediate(&root, &["release", &fourth.id]);
    assert_eq!(
        again.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let missing = mediate(&root, &["release", &first.id]);
    assert_eq!(missing.status.code(), Some(66));

    // The log, as JSON Lines with a type field, has the drop and its reason.
    let log = stdout(&mediate(&root, &["log", "--json"]));
    let entries: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(entries.iter().all(|e| e["type"] == "entry"));
    let d = entries
        .iter()
        .find(|e| e["decision"]["action"] == "drop")
        .expect("drop logged");
    assert_eq!(d["message_id"], dup.id.as_str());
    assert!(d["decision"]["reason"].as_str().unwrap().contains("repeat"));
    assert_eq!(
        stdout(&mediate(&root, &["log"])).lines().count(),
        entries.len()
    );

    // A sender held on demand.
    Registry::new(&root)
        .register(&Sandbox::new("quiet", None, vec![]))
        .unwrap();
    let q = message("quiet", &["b"], Kind::Status, "shh");
    post(&root, "quiet", &q);
    once(&root, policy);
    assert!(stdout(&mediate(&root, &["held"])).contains("sender quiet is held"));
}

#[test]
fn contract_changes_go_to_overlapping_scopes() {
    let root = root_with("scope", &[]);
    let reg = Registry::new(&root);
    reg.register(&Sandbox::new("api", None, vec!["src/api/**".into()]))
        .unwrap();
    reg.register(&Sandbox::new(
        "web",
        None,
        vec!["src/web/**".into(), "schema:users".into()],
    ))
    .unwrap();
    reg.register(&Sandbox::new("docs", None, vec![])).unwrap();
    reg.register(&Sandbox::new("ops", None, vec!["deploy/**".into()]))
        .unwrap();
    let mut m = message("api", &["mediator"], Kind::ContractChange, "users v2");
    m.refs = vec!["schema:users".into(), "src/api/users.rs".into()];
    post(&root, "api", &m);
    once(&root, OPEN_POLICY);
    let e = entries(&root);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].decision.to, ["docs", "web"], "{:?}", e[0].decision);
}

#[test]
fn receipts_record_what_was_read() {
    let root = root_with("receipts", &["a", "b"]);
    let m1 = message("a", &["b"], Kind::Request, "one");
    let m2 = message("a", &["b"], Kind::Request, "two");
    post(&root, "a", &m1);
    post(&root, "a", &m2);
    once(&root, OPEN_POLICY);
    // b acks one of them, as lw-inbox does.
    assert!(root.sandbox("b").inbox().claim(OsStr::new(&m1.id)).unwrap());
    once(&root, OPEN_POLICY);
    once(&root, OPEN_POLICY);
    let reads: Vec<_> = entries(&root)
        .into_iter()
        .filter(|e| e.decision.action == Action::Read)
        .collect();
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert_eq!(
        (
            reads[0].message_id.as_str(),
            reads[0].sender.as_str(),
            reads[0].decision.to.as_slice()
        ),
        (m1.id.as_str(), "a", &["b".to_string()][..])
    );
}

#[test]
fn a_second_mediator_is_refused_and_watch_keeps_a_good_policy() {
    let root = root_with("watch", &["a", "b"]);
    let p = root.dir.parent().unwrap().join("policy");
    std::fs::write(&p, "loopwright-policy 1\nhold kind status\n").unwrap();
    let held = Maildir::new(root.held().path.clone());
    held.create().unwrap();
    let child = Watcher::start(&root, &p, "60");
    let s1 = message("a", &["b"], Kind::Status, "one");
    post(&root, "a", &s1);
    assert!(
        held.wait_new(Some(Duration::from_secs(30))).unwrap(),
        "held while watching"
    );

    let second = mediate(&root, &["--once"]);
    assert_eq!(second.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&second.stderr).contains("another lw-mediate is running"));

    // A broken policy is reported and the old one stays in force.
    std::fs::write(&p, "loopwright-policy 1\nhold kind gossip\n").unwrap();
    held.claim(OsStr::new(&s1.id)).unwrap();
    let s2 = message("a", &["b"], Kind::Status, "two");
    post(&root, "a", &s2);
    assert!(
        held.wait_new(Some(Duration::from_secs(30))).unwrap(),
        "still held under the old policy"
    );
    assert!(names(&held.sub(Sub::New)).contains(&s2.id));
    let err = child.stop();
    assert!(
        err.contains(":2: unknown kind 'gossip'") && err.contains("keeping the previous policy"),
        "{err}"
    );
}

#[test]
fn policy_check_and_show() {
    let dir = tempdir("policy");
    let p = dir.join("policy");
    std::fs::write(&p, "loopwright-policy 1\nroute status hold\n").unwrap();
    let ok = Command::new(lw_mediate())
        .args(["policy", "check"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(ok.status.success());
    let show = Command::new(lw_mediate())
        .args(["policy", "show"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(stdout(&show).contains("route status hold\n"));
    let def = Command::new(lw_mediate())
        .current_dir(&dir)
        .args(["policy", "show"])
        .arg("--policy")
        .arg(dir.join("none"))
        .output()
        .unwrap();
    assert_eq!(
        def.status.code(),
        Some(66),
        "an explicit missing file is an error"
    );
    let def = Command::new(lw_mediate())
        .current_dir(&dir)
        .args(["policy", "show"])
        .output()
        .unwrap();
    assert!(
        stdout(&def).starts_with("loopwright-policy 1\n")
            && stdout(&def).contains("route question human")
    );
    let no_root = Command::new(lw_mediate())
        .env_remove("LW_ROOT")
        .arg("held")
        .output()
        .unwrap();
    assert_eq!(no_root.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&no_root.stderr).contains("LW_ROOT"));
}

/// The names of the functions and data objects an ELF file (64-bit,
/// little-endian, as built here) defines, from its symbol table.
fn defined_symbols(elf: &[u8]) -> Vec<&[u8]> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let header = |i: usize| shoff + i * shentsize;
    // SHT_SYMTAB is 2; its sh_link names the string table.
    let symtab = (0..shnum)
        .map(header)
        .find(|h| u32_at(h + 4) == 2)
        .expect("a symbol table (the binary is not stripped)");
    let strtab = u64_at(header(u32_at(symtab + 0x28)) + 0x18);
    let (off, size) = (u64_at(symtab + 0x18), u64_at(symtab + 0x20));
    (off..off + size)
        .step_by(24)
        .filter(|e| matches!(elf[e + 4] & 0xf, 1 | 2) && u16_at(e + 6) != 0) // OBJECT or FUNC, defined
        .map(|e| elf[strtab + u32_at(e)..].split(|b| *b == 0).next().unwrap())
        .collect()
}

#[test]
fn the_binary_links_no_async_runtime_or_engine_client() {
    // Symbols, not bytes: debug information may still name types of code
    // that the linker dropped.
    let bin = std::fs::read(lw_mediate()).unwrap();
    let symbols = defined_symbols(&bin);
    assert!(
        symbols
            .iter()
            .any(|s| s.windows(7).any(|w| w == b"mailbox")),
        "the symbol table was read (the mailbox crate's symbols are there)"
    );
    for name in [
        &b"tokio"[..],
        b"bollard",
        b"hyper",
        b"kube_client",
        b"k8s_openapi",
        b"rmcp",
        b"ureq",
        b"loopwright",
    ] {
        let linked: Vec<_> = symbols
            .iter()
            .filter(|s| s.windows(name.len()).any(|w| w == name))
            .take(3)
            .collect();
        assert!(
            linked.is_empty(),
            "lw-mediate links {}: {linked:?}",
            String::from_utf8_lossy(name)
        );
    }
}

#[test]
fn an_answer_can_come_from_standard_input() {
    use std::io::Write as _;
    let root = root_with("stdin", &["a"]);
    let q = message("a", &["mediator"], Kind::Question, "why?");
    post(&root, "a", &q);
    once(&root, OPEN_POLICY);
    let mut child = Command::new(lw_mediate())
        .arg("--root")
        .arg(&root.dir)
        .args(["answer", &q.id])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all("because\nof this".as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let id = stdout(&out).trim().to_string();
    once(&root, OPEN_POLICY);
    let Found::Message(a) = root.sandbox("a").inbox().read(Sub::New, OsStr::new(&id)) else {
        panic!("not delivered")
    };
    assert_eq!(a.body, "because\nof this");
}

#[test]
fn usage_errors_exit_64_and_say_what_is_wrong() {
    let root = root_with("usage", &["a"]);
    for (args, want) in [
        (&["--bogus"][..], "unexpected argument '--bogus'"),
        (&["release"][..], "required"),
        (&["--sync", "never"][..], "invalid value 'never'"),
        (&["register", "Bad/Name"][..], "not a valid sandbox name"),
        (&["register", "human"][..], "reserved"),
        (&["release", "../x"][..], "not a message id"),
    ] {
        let out = mediate(&root, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.starts_with("lw-mediate: ") && err.contains(want),
            "{args:?}: {err}"
        );
    }
    let missing = Command::new(lw_mediate())
        .args(["--root", "/nonexistent/lw-root", "--once"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(66));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("'/nonexistent/lw-root' does not exist")
    );
    let unreg = mediate(&root, &["unregister", "zz"]);
    assert_eq!(unreg.status.code(), Some(66));
}
