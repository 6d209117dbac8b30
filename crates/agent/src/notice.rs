//! Telling the person that a sandbox's model proxy reached a cap.
//!
//! The proxy lists each cap episode (its first refusal after a forward) in
//! its usage file; it has no way into the mailbox, by design.  `lw-sandbox
//! run`, on the host, turns each episode into one `status` message from
//! `mediator` to `human`, the way the mediator tells of a held-queue cap
//! and lw-sync of a name clash (mailbox-spec.md, THE HELD QUEUE): logged as
//! `ID.escalate`, delivered into `human/` under the route lock, mirrored by
//! lw-sync like any escalation.  The id derives from the sandbox and the
//! episode, so telling twice (two runs, a crash between log and delivery)
//! writes the same entry and the same file once; the agent can neither
//! suppress nor forge it, as it would a post from its own outbox.

use super::proxy::{CapEpisode, Usage};
use base::digest::sha256_hex;
use base::error::Result;
use mailbox::layout::{self, Root};
use mailbox::log::{Entry, Log};
use mailbox::message;

/// The message of one episode.
fn entry(sandbox: &str, kit: &str, ep: &CapEpisode) -> Entry {
    let at = std::time::Duration::from_secs(u64::try_from(ep.at).unwrap_or(0));
    let seed = sha256_hex(format!("model-cap/{sandbox}/{}/{}", ep.n, ep.at).as_bytes());
    let rand = u128::from_str_radix(&seed[..32], 16).expect("a hex digest");
    let id = base::id::id_at(at, rand);
    let (what, until) = match ep.cap.as_str() {
        "max-rpm" => (
            format!("{} requests a minute", ep.limit),
            format!("about {} s", ep.retry_after),
        ),
        "max-tokens-hour" => (
            format!("{} tokens an hour", ep.limit),
            format!("about {} s", ep.retry_after),
        ),
        _ => (
            format!("{} tokens in one run", ep.limit),
            "the next lw-sandbox run".to_string(),
        ),
    };
    let mut subject = format!(
        "sandbox {sandbox}: its agent reached agent.{kit}.{} ({what}); the model proxy refuses it",
        ep.cap
    );
    while subject.len() > message::MAX_SUBJECT {
        subject.pop();
    }
    let body = format!(
        "The model proxy of sandbox {sandbox} refused a request of its agent ({kit}) at {}:\n\
         it is over agent.{kit}.{} = {} ({what}).  The agent is answered 429 with\n\
         retry-after until {until}; nothing more reached the provider meanwhile.\n\
         \n\
         See what it does:   lw-sandbox ls --json (tokens), the transcript in ROOT/transcripts/{sandbox}/\n\
         Raise the cap:      agent.{kit}.{} in .loopwright/config (read at the next lw-sandbox run)\n\
         Stop it:            lw-sandbox stop {sandbox}\n\
         \n\
         This is said once for each time the cap is reached after requests went through.\n",
        base::time::rfc3339(at),
        ep.cap,
        ep.limit,
        ep.cap
    );
    mailbox::log::Notice {
        id,
        to: vec![layout::HUMAN.into()],
        subject,
        body,
        at,
        reason: format!(
            "the model proxy of sandbox {sandbox} reached agent.{kit}.{}; said once per episode",
            ep.cap
        ),
    }
    .entry()
}

/// Tells the person of every episode in `usage` not told yet; returns the
/// subjects of those told now.
pub fn tell_caps(root: &Root, sandbox: &str, kit: &str, usage: &Usage) -> Result<Vec<String>> {
    let log = Log::new(root.log_dir());
    let mut told = Vec::new();
    for ep in &usage.caps {
        let e = entry(sandbox, kit, ep);
        if log.has(&e.name) {
            continue;
        }
        let m = e.message.clone().expect("a notice carries its message");
        let _routes = mailbox::mediate::lock_routes(root)?;
        log.append(&e)?;
        root.human().deliver_once(&m.id, &m.to_bytes())?;
        told.push(m.subject);
    }
    Ok(told)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_is_one_status_to_the_person_with_a_stable_id() {
        let ep = CapEpisode {
            cap: "max-rpm".into(),
            limit: 20,
            at: 1_796_000_000,
            retry_after: 42,
            n: 3,
        };
        let a = entry("api", "claude", &ep);
        let b = entry("api", "claude", &ep);
        assert_eq!(a.name, b.name, "the same episode, the same entry");
        let m = a.message.unwrap();
        assert_eq!(m.kind, mailbox::message::Kind::Status);
        assert_eq!(m.to, vec!["human".to_string()]);
        assert!(m.subject.contains("agent.claude.max-rpm"), "{}", m.subject);
        assert!(m.body.contains("about 42 s"), "{}", m.body);
        assert!(message::Message::parse(&m.to_bytes()).is_ok());
        let other = entry("api", "claude", &CapEpisode { n: 4, ..ep });
        assert_ne!(other.name, a.name);
    }
}
