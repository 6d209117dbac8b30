//! A foreign sender reads as `HOST/SANDBOX` on the receiving host, replies
//! to that name route back, and read receipts travel back to the sending
//! host's log through the issue, exactly once (issue 22: "as from
//! HOST/SANDBOX"; lw-sync(1), FEDERATION).  Two roots, one lw-github-sink,
//! mailbox-only sandboxes.

use support::federation as federation_support;
use support::sync as sync_support;

use std::process::Command;

use federation_support::*;
use mailbox::log::{Action, Log};
use mailbox::maildir::Sub;
use mailbox::message::{Kind, Message};
use sync_support::text;

fn inbox_list(h: &Host, sandbox: &str) -> String {
    let o = Command::new(support::bin("lw-inbox"))
        .arg("--mailbox")
        .arg(h.root.sandbox(sandbox).inbox().path.parent().unwrap())
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "lw-inbox: {}", text(&o.stderr));
    text(&o.stdout)
}

#[test]
fn a_foreign_sender_is_host_slash_sandbox_and_its_receipt_travels_back() {
    let (env, a, b) = two_hosts("fed-names");
    introduce(&env, &a, &b);
    let m = contract_change("users schema");
    a.root.sandbox("api").outbox().deliver_message(&m).unwrap();
    a.mediate();
    a.sync(&env, &["--once"]);
    b.sync(&env, &["pull"]);
    b.mediate();

    // B's log, B's inbox copy and lw-inbox on B: from hosta/api.
    let blog = Log::new(b.root.log_dir());
    let e = blog
        .read(std::ffi::OsStr::new(&format!("{}.forward", m.id)))
        .unwrap();
    assert_eq!(e.sender, "hosta/api");
    assert_eq!(e.message.as_ref().unwrap().from, "hosta/api");
    assert_eq!(e.decision.to, ["web"]);
    let copy = b.root.sandbox("web").inbox().sub(Sub::New).join(&m.id);
    assert_eq!(
        Message::parse(&std::fs::read(&copy).unwrap()).unwrap().from,
        "hosta/api"
    );
    let listed = inbox_list(&b, "web");
    assert!(listed.contains("\"from\":\"hosta/api\""), "{listed}");

    // web reads it: B's mediator logs the receipt, B mirrors it (its
    // sandbox read), A takes it, and A's mediator logs it as for a local
    // reader.
    assert!(mailbox::inbox::ack(&b.root.sandbox("web").inbox(), &m.id).unwrap());
    b.mediate();
    let rname = format!("{}.read.web", m.id);
    assert!(blog.has(&rname));
    b.sync(&env, &["--once"]);
    let mirrored: Vec<(String, String)> = env
        .comments(1)
        .into_iter()
        .filter(|(_, body, _)| body.contains(&rname))
        .map(|(_, body, login)| (login, body))
        .collect();
    assert_eq!(mirrored.len(), 1, "{mirrored:?}");
    assert_eq!(mirrored[0].0, LOGIN_B);
    assert!(mirrored[0].1.contains("hosta/api"), "{}", mirrored[0].1);
    let o = a.sync(&env, &["pull"]);
    assert!(
        text(&o.stdout).contains(&format!("{} read by hostb/web", m.id)),
        "{}",
        text(&o.stdout)
    );
    a.mediate();
    let alog = Log::new(a.root.log_dir());
    let r = alog.read(std::ffi::OsStr::new(&rname)).unwrap();
    assert_eq!(
        (r.sender.as_str(), r.decision.action),
        ("api", Action::Read)
    );
    assert!(r.decision.reason.contains("hostb/web acked"), "{r:?}");
    // Exactly once: pulled, mediated and mirrored again, nothing new; the
    // receipt is on the issue once, as B's.
    for _ in 0..2 {
        let o = a.sync(&env, &["pull"]);
        assert!(!text(&o.stdout).contains(&m.id), "{}", text(&o.stdout));
        a.mediate();
        a.sync(&env, &["--once"]);
        b.sync(&env, &["pull"]);
    }
    let reads = |l: &Log| {
        l.entries()
            .unwrap()
            .0
            .iter()
            .filter(|e| e.decision.action == Action::Read)
            .count()
    };
    assert_eq!((reads(&alog), reads(&blog)), (1, 1));
    assert_eq!(env.section_counts(1).get(&rname), Some(&1));

    // A request to hosta/api, by that name, routes back to A's api, and
    // reads there as from hostb/web; A's receipt travels to B.
    let mut req = contract_change("please re-run");
    req.from = "web".into();
    req.to = vec!["hosta/api".into()];
    req.kind = Kind::Request;
    req.refs = vec![];
    b.root
        .sandbox("web")
        .outbox()
        .deliver_message(&req)
        .unwrap();
    b.mediate();
    let f = blog
        .read(std::ffi::OsStr::new(&format!("{}.forward", req.id)))
        .unwrap();
    assert_eq!(f.decision.to, ["api"]);
    assert_eq!(f.message.as_ref().unwrap().to, ["hosta/api"]);
    b.sync(&env, &["--once"]);
    a.sync(&env, &["pull"]);
    a.mediate();
    assert_eq!(a.names("sandboxes/api/inbox"), [req.id.as_str()]);
    let listed = inbox_list(&a, "api");
    assert!(listed.contains("\"from\":\"hostb/web\""), "{listed}");
    assert!(mailbox::inbox::ack(&a.root.sandbox("api").inbox(), &req.id).unwrap());
    a.mediate();
    a.sync(&env, &["--once"]);
    let o = b.sync(&env, &["pull"]);
    assert!(
        text(&o.stdout).contains(&format!("{} read by hosta/api", req.id)),
        "{}",
        text(&o.stdout)
    );
    b.mediate();
    assert!(blog.has(&format!("{}.read.api", req.id)));
    assert_eq!((reads(&alog), reads(&blog)), (2, 2));
    assert!(a.names("quarantine").is_empty() && b.names("quarantine").is_empty());
    for h in [&a, &b] {
        h.sync(&env, &["verify"]);
    }
}

#[test]
fn the_receiving_policy_holds_a_foreign_sender_by_its_qualified_name() {
    let (env, a, b) = two_hosts("fed-hold");
    std::fs::write(&b.policy, format!("{POLICY}hold sender hosta/api\n")).unwrap();
    introduce(&env, &a, &b);
    let m = contract_change("held over there");
    a.root.sandbox("api").outbox().deliver_message(&m).unwrap();
    a.mediate();
    a.sync(&env, &["--once"]);
    b.sync(&env, &["pull"]);
    b.mediate();
    assert!(b.names("sandboxes/web/inbox").is_empty());
    assert_eq!(b.names("held"), [m.id.as_str()]);
    let e = Log::new(b.root.log_dir())
        .read(std::ffi::OsStr::new(&format!("{}.hold", m.id)))
        .unwrap();
    assert!(
        e.decision.reason.contains("sender hosta/api is held"),
        "{e:?}"
    );
}
