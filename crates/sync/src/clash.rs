//! Federation's names (crates/sync/src/federate.rs): one proxy record per sandbox
//! another host announced, and the refusal of a name two hosts claim - this
//! host and another, or two others - told once to this root (a status
//! message in the human queue, logged as an escalation from the mediator)
//! and once to the issue (a notice keyed `clash/NAME/HOST`).  The other
//! host refuses the same name on reading this host's announcement, so both
//! sides are told.

use std::collections::{BTreeMap, BTreeSet};

use super::config::Federation;
use super::format::{HostSandbox, header_line, inline};
use super::{Event, FORMAT_VERSION, Head, MAX_UNKNOWN, NoticeHead, Syncer};
use crate::github::{Posted, Target};
use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use mailbox::layout;
use mailbox::log::{Action, Decision, Entry, LOG_VERSION, Log};
use mailbox::message::{self, Kind, Message};
use mailbox::registry::{Registry, Sandbox};

impl Syncer {
    /// Keeps one proxy record per sandbox other hosts announced, refusing a
    /// name taken here or announced by two hosts; returns the refused names.
    pub(super) fn apply_roster(
        &mut self,
        t: &Target,
        fed: &Federation,
    ) -> Result<BTreeSet<String>> {
        let reg = Registry::new(&self.root);
        let (own, proxies) = self.records()?;
        let own_names: BTreeSet<&str> = own.iter().map(|s| s.name.as_str()).collect();
        let mut claims: BTreeMap<String, Vec<(String, HostSandbox, u64)>> = BTreeMap::new();
        for (h, a) in &self.state.fed.roster {
            if !fed.hosts.contains_key(h) || *h == fed.me {
                continue;
            }
            for sb in &a.sandboxes {
                claims
                    .entry(sb.name.clone())
                    .or_default()
                    .push((h.clone(), sb.clone(), a.comment));
            }
        }
        let mut refused = BTreeSet::new();
        let mut clashes = Vec::new();
        for (name, cl) in &claims {
            if own_names.contains(name.as_str()) || cl.len() > 1 {
                refused.insert(name.clone());
                for (h, _, cid) in cl {
                    let taken_by = if own_names.contains(name.as_str()) {
                        format!("this host {}", fed.me)
                    } else {
                        let others: Vec<&str> = cl
                            .iter()
                            .map(|(o, _, _)| o.as_str())
                            .filter(|o| o != h)
                            .collect();
                        format!("host {}", others.join(", host "))
                    };
                    clashes.push((name.clone(), h.clone(), *cid, taken_by));
                }
                continue;
            }
            let (h, sb, _) = &cl[0];
            let have = proxies.iter().find(|p| p.name == *name);
            if have.is_none_or(|p| p.host.as_deref() != Some(h) || p.scope != sb.scope) {
                let mut rec = Sandbox::new(name, None, sb.scope.clone());
                rec.host = Some(h.clone());
                reg.register(&rec)?;
            }
        }
        for p in &proxies {
            if !claims.contains_key(&p.name) || refused.contains(&p.name) {
                // No longer announced (or now refused): messages to it bounce;
                // its mailbox stays, as for any unregistered party.
                reg.unregister(&p.name)?;
            }
        }
        for (name, h, cid, by) in clashes {
            let when = self.state.fed.roster[&h].at.clone();
            self.tell_clash(t, fed, &name, &h, cid, &by, &when)?;
        }
        Ok(refused)
    }

    /// Tells this root (an escalation from the mediator in the human queue,
    /// logged) and the issue (a notice, once) that host `host`'s sandbox
    /// `name` was refused.
    #[allow(clippy::too_many_arguments)]
    fn tell_clash(
        &mut self,
        t: &Target,
        fed: &Federation,
        name: &str,
        host: &str,
        cid: u64,
        taken_by: &str,
        when: &str,
    ) -> Result<()> {
        let told = format!("{name}/{host}");
        let problem = format!(
            "sandbox name {name} announced by host {host} is already taken by {taken_by}; \
             host {} refuses it: no message goes to or comes from {host}/{name} here. \
             Rename one of the sandboxes (lw-sandbox rm, then create with another name)",
            fed.me
        );
        if !self.state.fed.told.contains(&told) {
            let at = base::time::parse_rfc3339(when).unwrap_or_default();
            let seed = sha256_hex(format!("clash/{name}/{host}/{cid}/{}", fed.me).as_bytes());
            let rand = u128::from_str_radix(&seed[..32], 16).expect("hex digest");
            let id = base::id::id_at(at, rand);
            let created = base::time::rfc3339(at);
            let mut subject =
                format!("sandbox name {name} of host {host} refused: taken by {taken_by}");
            while subject.len() > message::MAX_SUBJECT {
                subject.pop();
            }
            let m = Message {
                version: message::VERSION,
                id: id.clone(),
                from: layout::MEDIATOR.into(),
                to: vec![layout::HUMAN.into()],
                kind: Kind::Status,
                subject,
                body: format!("{problem}.\n"),
                refs: vec![],
                in_reply_to: None,
                created: created.clone(),
            };
            let e = Entry {
                version: LOG_VERSION,
                name: Entry::name_for(&id, Action::Escalate, None),
                logged: base::time::rfc3339(base::time::now()),
                message_id: id.clone(),
                sender: layout::MEDIATOR.into(),
                message: Some(m.clone()),
                decision: Decision {
                    quiet: false,
                    action: Action::Escalate,
                    to: vec![layout::HUMAN.into()],
                    reason: format!("lw-sync federation: host {host} announced a name taken here"),
                },
            };
            // The human queue's one writer is whoever holds the route lock.
            let _routes = mailbox::mediate::lock_routes(&self.root)?;
            Log::new(self.root.log_dir()).append(&e)?;
            self.root.human().deliver_once(&id, &m.to_bytes())?;
            drop(_routes);
            self.state.fed.told.insert(told);
            self.save()?;
            self.events.push(Event::Refused {
                name: name.into(),
                host: host.into(),
                reason: problem.clone(),
            });
        }
        let key = format!("clash/{name}/{host}");
        let body = format!(
            "{}\n**lw-sync** on host {}: {}\n",
            header_line(&Head::Notice(NoticeHead {
                v: FORMAT_VERSION,
                key: key.clone(),
                about: cid,
            })),
            inline(&fed.me),
            inline(&problem)
        );
        self.post_keyed(t, &key, &body)
    }

    /// Posts `body` under `key` once (intent first, reconciled on an
    /// unknown outcome).
    pub(super) fn post_keyed(&mut self, t: &Target, key: &str, body: &str) -> Result<()> {
        let tkey = t.to_string();
        for _ in 0..MAX_UNKNOWN {
            if self
                .state
                .targets
                .get(&tkey)
                .is_some_and(|ts| ts.synced.contains_key(key))
            {
                return Ok(());
            }
            match self.post_with_intent(t, &tkey, vec![(key.to_string(), 1)], body)? {
                Posted::Created(nc) => {
                    let ts = self.state.targets.get_mut(&tkey).expect("target state");
                    ts.synced.insert(key.to_string(), vec![nc.id]);
                    ts.pending = None;
                    return self.save();
                }
                Posted::Unknown(reason) => {
                    self.events.push(Event::Unknown {
                        target: tkey.clone(),
                        reason,
                    });
                    self.reconcile(t)?;
                }
            }
        }
        Err(Error::new(
            Exit::TempFail,
            format!("the notice {key} on {t} could not be posted; try again later"),
        ))
    }
}
