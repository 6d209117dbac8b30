//! A message claiming another sender is logged and delivered under the
//! outbox it sat in, every time.  Prints the share.

use support::mediate_util;

use mailbox::log::Action;
use mailbox::message::Kind;
use mediate_util::*;

#[test]
fn spoofed_from_is_logged_under_the_real_outbox() {
    let root = root_with("spoof", &["mallory", "victim", "bob"]);
    let claims = ["victim", "bob", "human", "mediator"];
    let mut spoofed = Vec::new();
    for i in 0..100 {
        let mut m = message(
            claims[i % claims.len()],
            &["bob"],
            Kind::Request,
            &format!("spoof {i}"),
        );
        if i % 10 == 9 {
            // An answer pretending to come from the person.
            m.kind = Kind::Status;
        }
        post(&root, "mallory", &m);
        spoofed.push(m.id);
    }
    // The human's outbox is trusted as `human` only because only the
    // operator can write there; a sandbox posting `from: human` is mallory.
    once(&root, OPEN_POLICY);

    let log = entries(&root);
    let mut under_real = 0;
    for id in &spoofed {
        let e: Vec<_> = log.iter().filter(|e| &e.message_id == id).collect();
        assert_eq!(e.len(), 1, "{id}: {e:?}");
        let e = e[0];
        assert_eq!(e.decision.action, Action::Forward);
        let m = e.message.as_ref().unwrap();
        if e.sender == "mallory"
            && m.from == "mallory"
            && e.decision
                .reason
                .contains("ignored: the sender is the owner of the outbox")
        {
            under_real += 1;
        }
        // The copy bob reads carries the real sender too.
        let copy = std::fs::read(
            root.sandbox("bob")
                .inbox()
                .sub(mailbox::maildir::Sub::New)
                .join(id),
        )
        .unwrap();
        let copy = mailbox::message::Message::parse(&copy).unwrap();
        assert_eq!(copy.from, "mallory");
    }
    println!(
        "spoofing: spoofed={} logged_under_real_outbox={under_real} ({:.0}%)",
        spoofed.len(),
        100.0 * under_real as f64 / spoofed.len() as f64
    );
    assert_eq!(under_real, spoofed.len());
    assert!(
        mailbox::maildir::Maildir::new(root.human().path.clone())
            .scan(mailbox::maildir::Sub::New)
            .unwrap()
            .is_empty()
    );
}
