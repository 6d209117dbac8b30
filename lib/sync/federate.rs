//! Hosts that coordinate through the run's issue (lw-sync(1), FEDERATION;
//! mailbox-spec.md, "FEDERATION").
//!
//! Each host keeps its own root, mirror, engine and mediator, and its
//! lw-sync mirrors its log to the same issue as a login of its own
//! (`hosts` in sync.json maps host names to logins).  Three things make
//! that a transport:
//!
//! 1. **Announcement.**  A host posts one comment with a `host` header that
//!    lists its own sandboxes (registry records without `host`) and their
//!    scopes, and edits it when they change (no request when nothing did).
//! 2. **Proxies.**  Every other host's lw-sync keeps a registry record for
//!    each announced sandbox, marked with the announcing host, and so a
//!    mailbox for it.  Its own mediator, unchanged, then routes to a foreign
//!    sandbox like to any other (named, or by scope overlap), and logs the
//!    decision, which the sender's lw-sync mirrors: that comment is the
//!    message in transit.  Names are unique across hosts (a name announced
//!    by two hosts, or by a host and taken here, is refused and both sides
//!    are told), so a foreign sandbox is known here by its bare name and
//!    its record says which host it lives on: `HOST/SANDBOX`.
//! 3. **Taking.**  `pull` reads the entries of other hosts' comments - only
//!    comments whose author login, as the API reports it, is a configured
//!    host's, and only entries whose sender that host announced - and
//!    delivers each message addressed here (a recipient is one of this
//!    host's sandboxes, or a contract-change's refs overlap one's scope)
//!    into the outbox of the sender's proxy, under the message's own id.
//!    The receiving mediator reads that outbox as any other: its policy
//!    decides, and its sender is the proxy.
//!
//! Exactly once: the delivery is deliver-once by the message id (the file
//! in the proxy outbox's `new/` or `cur/` is the durable record, made
//! atomically by the no-replace rename), so a pull killed anywhere and run
//! again finds the file and writes nothing; the mediator itself refuses an
//! id it routed before.  The set of taken comment ids in the sync state,
//! written after the deliveries, only spares a later pull the work.

use std::collections::{BTreeMap, BTreeSet};

use super::format::{HOST_VERSION, HostHead, HostSandbox, header_line, inline};
use super::{Event, FORMAT_VERSION, Head, MAX_UNKNOWN, NoticeHead, Syncer};
use super::{parse_comment, reassemble, sha256_hex};
use crate::error::{Error, Exit, Result};
use crate::github::{Comment, Posted, Target};
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION, Log};
use crate::message::{self, Kind, Message};
use crate::registry::{Registry, Sandbox};

use super::config::Federation;

/// The state key of a host's announcement comment.
pub(super) fn host_key(host: &str) -> String {
    format!("host/{host}")
}

/// The text of an announcement comment.
fn render_host(h: &HostHead) -> String {
    let head = Head::Host(h.clone());
    let mut s = format!(
        "{}\n**lw-sync** host {} has these sandboxes:",
        header_line(&head),
        inline(&h.host)
    );
    if h.sandboxes.is_empty() {
        s.push_str(" none");
    }
    for sb in &h.sandboxes {
        s.push_str(&format!("\n* {}", inline(&sb.name)));
        if !sb.scope.is_empty() {
            let sc: Vec<String> = sb.scope.iter().map(|x| inline(x)).collect();
            s.push_str(&format!(" scope {}", sc.join(" ")));
        }
    }
    s.push('\n');
    s
}

/// Where a message of `kind` goes among `own` on this host: the named
/// recipients, and for a contract-change every sandbox whose scope overlaps
/// its refs or that declared none (as the mediator's scope route).
fn addressed(m: &Message, parties: &[String], own: &[Sandbox]) -> Vec<String> {
    let mut t: BTreeSet<String> = BTreeSet::new();
    for s in own {
        let named = m.to.contains(&s.name) || parties.contains(&s.name);
        let scoped = m.kind == Kind::ContractChange
            && (s.scope.is_empty()
                || m.refs.is_empty()
                || s.scope
                    .iter()
                    .any(|sc| m.refs.iter().any(|r| crate::policy::overlaps(sc, r))));
        if named || scoped {
            t.insert(s.name.clone());
        }
    }
    t.into_iter().collect()
}

impl Syncer {
    /// This host's own sandboxes (registry records without `host`) and the
    /// proxies of other hosts' (with).
    fn records(&self) -> Result<(Vec<Sandbox>, Vec<Sandbox>)> {
        let (good, _) = Registry::new(&self.root).list()?;
        Ok(good.into_iter().partition(|s| s.host.is_none()))
    }

    /// The names of the proxies in this root: their senders' entries are
    /// another host's to mirror, not this one's.
    pub(super) fn proxy_names(&self) -> Result<BTreeSet<String>> {
        Ok(self.records()?.1.into_iter().map(|s| s.name).collect())
    }

    /// Checks that the login the token posts as is this host's.
    fn check_login(&self, fed: &Federation) -> Result<()> {
        if let Some(l) = &self.state.login
            && l != fed.my_login()
        {
            return Err(Error::config(format!(
                "the token posts as '{l}', but \"hosts\" maps this host '{}' to '{}'; fix \"hosts\" or the token",
                fed.me,
                fed.my_login()
            )));
        }
        Ok(())
    }

    /// Posts this host's announcement, or edits it, when its sandboxes
    /// changed since it was last written; no request otherwise.
    pub fn announce(&mut self) -> Result<()> {
        let Some(fed) = self.cfg.federation()? else {
            return Ok(());
        };
        let (own, _) = self.records()?;
        let head = HostHead {
            v: HOST_VERSION,
            host: fed.me.clone(),
            sandboxes: own
                .iter()
                .map(|s| HostSandbox {
                    name: s.name.clone(),
                    scope: s.scope.clone(),
                })
                .collect(),
        };
        let body = render_host(&head);
        let digest = sha256_hex(body.as_bytes());
        if self.state.fed.announced.as_deref() == Some(digest.as_str()) {
            return Ok(());
        }
        self.ensure_login()?;
        self.check_login(&fed)?;
        let t = self.cfg.default_target()?;
        let key = t.to_string();
        let hkey = host_key(&fed.me);
        for _ in 0..MAX_UNKNOWN {
            let ts = self.state.targets.entry(key.clone()).or_default();
            if !ts.reconciled || ts.pending.is_some() {
                self.reconcile(&t)?;
            }
            let existing = self.state.targets[&key]
                .synced
                .get(&hkey)
                .and_then(|v| v.first().copied());
            let outcome = match existing {
                // An edit is idempotent: an unknown outcome is simply retried.
                Some(cid) => self
                    .client
                    .edit_comment(&t.repo, cid, &body, &mut |_| Ok(()))?,
                None => self.post_with_intent(&t, &key, vec![(hkey.clone(), 1)], &body)?,
            };
            match outcome {
                Posted::Created(c) => {
                    let ts = self.state.targets.get_mut(&key).expect("target state");
                    ts.synced.insert(hkey.clone(), vec![c.id]);
                    ts.pending = None;
                    self.state.fed.announced = Some(digest);
                    return self.save();
                }
                Posted::Unknown(reason) => {
                    self.events.push(Event::Unknown {
                        target: key.clone(),
                        reason,
                    });
                    if existing.is_none() {
                        self.reconcile(&t)?;
                    }
                }
            }
        }
        Err(Error::new(
            Exit::TempFail,
            format!(
                "the announcement of host {} on {t} could not be written; try again later",
                fed.me
            ),
        ))
    }

    /// Takes what other hosts' comments among `comments` (a listing of
    /// `t`, the run's issue) hold for this host.
    pub(super) fn federate(&mut self, t: &Target, comments: &[Comment]) -> Result<()> {
        let Some(fed) = self.cfg.federation()? else {
            return Ok(());
        };
        if *t != self.cfg.default_target()? {
            return Ok(());
        }
        self.check_login(&fed)?;
        let mut by_id: Vec<&Comment> = comments.iter().collect();
        by_id.sort_by_key(|c| c.id);
        // 1. Announcements: the newest of each host, by its own login only.
        for c in &by_id {
            let Some(h) = fed.host_of(c.login()) else {
                continue;
            };
            if h == fed.me {
                continue;
            }
            let Some(Ok(ss)) = parse_comment(c.text()) else {
                continue;
            };
            for s in ss {
                if let Head::Host(a) = s.head
                    && a.host == h
                    && self
                        .state
                        .fed
                        .roster
                        .get(h)
                        .is_none_or(|(cid, _)| *cid <= c.id)
                {
                    let mut list = a.sandboxes;
                    list.retain(|sb| crate::registry::check_name(&sb.name).is_ok());
                    self.state.fed.roster.insert(h.to_string(), (c.id, list));
                }
            }
        }
        let refused = self.apply_roster(t, &fed, &by_id)?;
        self.save()?;
        // 2. Entries, per host (parts are reassembled only from one login's comments).
        let mut full: Option<Vec<Comment>> = None;
        for (host, login) in fed.hosts.clone() {
            if host == fed.me {
                continue;
            }
            let mine: Vec<&Comment> = by_id
                .iter()
                .copied()
                .filter(|c| c.login() == login && !self.state.fed.taken.contains(&c.id))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let mut sections = Vec::new();
            for c in &mine {
                if let Some(Ok(ss)) = parse_comment(c.text()) {
                    sections.extend(
                        ss.into_iter()
                            .filter(|s| matches!(s.head, Head::Entry(_)))
                            .map(|s| (c.id, s)),
                    );
                }
            }
            let (mut done, mut broken) = reassemble(&sections);
            if !broken.is_empty() {
                // A part outside this listing (it lists since the last pull):
                // read the whole issue once and reassemble from it.
                if full.is_none() {
                    full = Some(self.client.list_comments(t, None)?);
                }
                let mut all = Vec::new();
                for c in full.as_deref().unwrap_or_default() {
                    if c.login() == login
                        && let Some(Ok(ss)) = parse_comment(c.text())
                    {
                        all.extend(ss.into_iter().map(|s| (c.id, s)));
                    }
                }
                let (d2, b2) = reassemble(&all);
                for (n, v) in d2 {
                    if broken.remove(&n).is_some() {
                        done.insert(n, v);
                    }
                }
                broken.retain(|n, _| b2.contains_key(n));
            }
            // Comments holding a part still missing wait for a later pull.
            let waiting: BTreeSet<u64> = sections
                .iter()
                .filter_map(|(cid, s)| match &s.head {
                    Head::Entry(h) if broken.contains_key(&h.entry) => Some(*cid),
                    _ => None,
                })
                .collect();
            let mut order: Vec<(Entry, Vec<u64>)> = done.into_values().collect();
            order.sort_by(|a, b| (a.1.first(), &a.0.name).cmp(&(b.1.first(), &b.0.name)));
            for (e, cids) in order {
                self.take_entry(&host, &e, cids.first().copied().unwrap_or(0), &refused)?;
            }
            for c in mine {
                if !waiting.contains(&c.id) {
                    self.state.fed.taken.insert(c.id);
                }
            }
            self.save()?;
        }
        Ok(())
    }

    /// Delivers entry `e` of host `host` into this root when it carries a
    /// message addressed here.
    fn take_entry(
        &mut self,
        host: &str,
        e: &Entry,
        comment: u64,
        refused: &BTreeSet<String>,
    ) -> Result<()> {
        if !matches!(e.decision.action, Action::Forward | Action::Release) {
            return Ok(());
        }
        let Some(m) = &e.message else {
            return Ok(());
        };
        // Only a sandbox its host announced, and not a name refused here.
        let announced = self
            .state
            .fed
            .roster
            .get(host)
            .is_some_and(|(_, l)| l.iter().any(|s| s.name == e.sender));
        if !announced || refused.contains(&e.sender) {
            return Ok(());
        }
        let (own, proxies) = self.records()?;
        if !proxies
            .iter()
            .any(|p| p.name == e.sender && p.host.as_deref() == Some(host))
        {
            return Ok(());
        }
        let log = Log::new(self.root.log_dir());
        let ob = self.root.sandbox(&e.sender).outbox();
        let in_outbox = [crate::maildir::Sub::New, crate::maildir::Sub::Cur]
            .iter()
            .any(|s| ob.sub(*s).join(&m.id).symlink_metadata().is_ok());
        if !in_outbox
            && [
                Action::Forward,
                Action::Escalate,
                Action::Hold,
                Action::Bounce,
            ]
            .iter()
            .any(|a| log.has(&Entry::name_for(&m.id, *a, None)))
        {
            // Decided here already, from another outbox: not this host's to take.
            return Ok(());
        }
        let to = addressed(m, &e.decision.to, &own);
        if to.is_empty() {
            return Ok(());
        }
        let copy = Message {
            from: e.sender.clone(),
            to: to.clone(),
            ..m.clone()
        };
        if let Err(why) = copy.validate() {
            self.events.push(Event::Bad {
                entry: e.name.clone(),
                reason: format!("from host {host}: {why}"),
            });
            return Ok(());
        }
        if let crate::maildir::Delivered::New(_) = ob.deliver_once(&copy.id, &copy.to_bytes())? {
            self.events.push(Event::Federated {
                id: copy.id.clone(),
                from: format!("{host}/{}", e.sender),
                to,
                comment,
            });
        }
        Ok(())
    }

    /// Keeps one proxy record per sandbox other hosts announced, refusing a
    /// name taken here or announced by two hosts; returns the refused names.
    fn apply_roster(
        &mut self,
        t: &Target,
        fed: &Federation,
        comments: &[&Comment],
    ) -> Result<BTreeSet<String>> {
        let reg = Registry::new(&self.root);
        let (own, proxies) = self.records()?;
        let own_names: BTreeSet<&str> = own.iter().map(|s| s.name.as_str()).collect();
        let mut claims: BTreeMap<String, Vec<(String, HostSandbox, u64)>> = BTreeMap::new();
        for (h, (cid, list)) in &self.state.fed.roster {
            if !fed.hosts.contains_key(h) || *h == fed.me {
                continue;
            }
            for sb in list {
                claims
                    .entry(sb.name.clone())
                    .or_default()
                    .push((h.clone(), sb.clone(), *cid));
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
            let when = comments
                .iter()
                .find(|c| c.id == cid)
                .map(|c| c.created_at.clone())
                .unwrap_or_default();
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
            let at = crate::time::parse_rfc3339(when).unwrap_or_default();
            let seed = sha256_hex(format!("clash/{name}/{host}/{cid}/{}", fed.me).as_bytes());
            let rand = u128::from_str_radix(&seed[..32], 16).expect("hex digest");
            let id = crate::id::id_at(at, rand);
            let created = crate::time::rfc3339(at);
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
                logged: crate::time::rfc3339(crate::time::now()),
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
            let _routes = crate::mediate::lock_routes(&self.root)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(name: &str, scope: &[&str]) -> Sandbox {
        Sandbox::new(name, None, scope.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn addressed_by_name_or_scope() {
        let own = [sb("web", &["schema/**"]), sb("db", &["sql/**"])];
        let mut m = crate::message::Message {
            version: 1,
            id: crate::id::new_id(),
            from: "api".into(),
            to: vec!["mediator".into()],
            kind: Kind::ContractChange,
            subject: "s".into(),
            body: String::new(),
            refs: vec!["schema/users.json".into()],
            in_reply_to: None,
            created: crate::time::rfc3339(crate::time::now()),
        };
        assert_eq!(addressed(&m, &[], &own), ["web"]);
        m.kind = Kind::Request;
        assert!(addressed(&m, &[], &own).is_empty());
        m.to = vec!["db".into()];
        assert_eq!(addressed(&m, &[], &own), ["db"]);
        assert_eq!(addressed(&m, &["web".into()], &own), ["db", "web"]);
    }

    #[test]
    fn announcements_parse_back() {
        let h = HostHead {
            v: HOST_VERSION,
            host: "hosta".into(),
            sandboxes: vec![HostSandbox {
                name: "api".into(),
                scope: vec!["schema/** <!-- -->".into()],
            }],
        };
        let text = render_host(&h);
        let ss = parse_comment(&text).unwrap().unwrap();
        assert_eq!(ss.len(), 1);
        assert_eq!(ss[0].head, Head::Host(h));
    }
}
