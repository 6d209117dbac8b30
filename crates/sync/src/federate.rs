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
//! id it routed before.  The record of taken comments in the sync state
//! (a high-water mark of comment ids plus the ids still waiting for parts,
//! so its size does not grow with the run), written after the deliveries,
//! only spares a later pull the work.  The mark assumes what GitHub's
//! increasing ids promise: a listing that shows a comment shows the older
//! ones of the same period too (a comment listed only after a newer one was
//! taken would be passed over).
//!
//! Proxy records and refused names are kept in `clash`.

use std::collections::BTreeSet;

use super::format::{HOST_VERSION, HostHead, HostSandbox, header_line, inline};
use super::{Event, Head, MAX_UNKNOWN, Syncer};
use super::{parse_comment, reassemble};
use crate::github::{Comment, Posted, Target};
use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use mailbox::log::{Action, Entry, Log};
use mailbox::message::{Kind, Message, split_qualified};
use mailbox::registry::{Registry, Sandbox};

use super::config::Federation;
use super::state::Announced;

/// Whether log entry `e` is another host's to mirror: a message whose
/// sender is another host's sandbox (`HOST/NAME`, or a proxy's bare name in
/// entries logged before senders were qualified), or the receipt of a
/// proxy's reading (the reader's host mirrors its own).  The receipt of a
/// sandbox of this host reading another host's message is this host's news.
pub(super) fn foreign(e: &Entry, proxies: &BTreeSet<String>) -> bool {
    if e.decision.action == Action::Read {
        return e.decision.to.iter().any(|r| proxies.contains(r));
    }
    split_qualified(&e.sender).is_some() || proxies.contains(&e.sender)
}

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
                    .any(|sc| m.refs.iter().any(|r| mailbox::policy::overlaps(sc, r))));
        if named || scoped {
            t.insert(s.name.clone());
        }
    }
    t.into_iter().collect()
}

impl Syncer {
    /// This host's own sandboxes (registry records without `host`) and the
    /// proxies of other hosts' (with).
    pub(super) fn records(&self) -> Result<(Vec<Sandbox>, Vec<Sandbox>)> {
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
        self.read_announcements(&fed, &by_id);
        let refused = self.apply_roster(t, &fed)?;
        self.save()?;
        let mut full: Option<Vec<Comment>> = None;
        // Chosen before any is marked: the mark is one for every host.
        let fresh: Vec<&Comment> = by_id
            .iter()
            .copied()
            .filter(|c| !self.state.fed.is_taken(c.id))
            .collect();
        for (host, login) in &fed.hosts {
            if *host != fed.me {
                self.take_from(t, host, login, &fresh, &mut full, &refused)?;
            }
        }
        Ok(())
    }

    /// The newest announcement of each other host, by that host's own login
    /// only, into the roster.
    fn read_announcements(&mut self, fed: &Federation, by_id: &[&Comment]) {
        for c in by_id {
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
                        .is_none_or(|a| a.comment <= c.id)
                {
                    let mut list = a.sandboxes;
                    list.retain(|sb| mailbox::registry::check_name(&sb.name).is_ok());
                    let seen = Announced {
                        comment: c.id,
                        at: c.created_at.clone(),
                        sandboxes: list,
                    };
                    self.state.fed.roster.insert(h.to_string(), seen);
                }
            }
        }
    }

    /// The entries in `host`'s comments (by `login`) among `fresh` (those
    /// not taken yet): parts
    /// are reassembled from that login's comments only; an entry with a part
    /// outside this listing (it lists since the last pull) is looked for in
    /// the whole issue, read at most once a pull (`full`), and its comments
    /// wait for a later pull while a part is still missing.
    fn take_from(
        &mut self,
        t: &Target,
        host: &str,
        login: &str,
        fresh: &[&Comment],
        full: &mut Option<Vec<Comment>>,
        refused: &BTreeSet<String>,
    ) -> Result<()> {
        let entry_sections = |cs: &mut dyn Iterator<Item = &Comment>| {
            let mut v = Vec::new();
            for c in cs {
                if c.login() == login
                    && let Some(Ok(ss)) = parse_comment(c.text())
                {
                    v.extend(
                        ss.into_iter()
                            .filter(|s| matches!(s.head, Head::Entry(_)))
                            .map(|s| (c.id, s)),
                    );
                }
            }
            v
        };
        let mine: Vec<&Comment> = fresh
            .iter()
            .copied()
            .filter(|c| c.login() == login)
            .collect();
        if mine.is_empty() {
            return Ok(());
        }
        let sections = entry_sections(&mut mine.iter().copied());
        let (mut done, broken) = reassemble(&sections);
        // Edited entries (digest mismatch) are never taken; missing parts wait.
        let mut missing: BTreeSet<String> = broken
            .into_iter()
            .filter(|(_, why)| why.ends_with("parts on GitHub"))
            .map(|(n, _)| n)
            .collect();
        if !missing.is_empty() {
            if full.is_none() {
                *full = Some(self.client.list_comments(t, None)?);
            }
            let all = entry_sections(&mut full.iter().flatten());
            for (n, v) in reassemble(&all).0 {
                if missing.remove(&n) {
                    done.insert(n, v);
                }
            }
        }
        let mut waiting: BTreeSet<u64> = sections
            .iter()
            .filter_map(|(cid, s)| match &s.head {
                Head::Entry(h) if missing.contains(&h.entry) => Some(*cid),
                _ => None,
            })
            .collect();
        let mut order: Vec<(Entry, Vec<u64>)> = done.into_values().collect();
        order.sort_by(|a, b| (a.1.first(), &a.0.name).cmp(&(b.1.first(), &b.0.name)));
        let mut finished = Vec::new();
        for (e, cids) in order {
            if self.take_entry(host, &e, cids.first().copied().unwrap_or(0), refused)? {
                waiting.extend(cids);
            } else {
                finished.extend(cids);
            }
        }
        for c in mine {
            self.state.fed.mark(c.id, !waiting.contains(&c.id));
        }
        // Parts read from the whole issue, older than this listing, wait no more.
        for cid in finished {
            if !waiting.contains(&cid) {
                self.state.fed.waiting.remove(&cid);
            }
        }
        self.save()
    }

    /// Whether `name` is a sandbox `host` announced, not refused here, and
    /// so a proxy here marked with that host.
    fn proxy_of(&self, host: &str, name: &str, refused: &BTreeSet<String>) -> Result<bool> {
        let announced = self
            .state
            .fed
            .roster
            .get(host)
            .is_some_and(|a| a.sandboxes.iter().any(|s| s.name == name));
        if !announced || refused.contains(name) {
            return Ok(false);
        }
        let (_, proxies) = self.records()?;
        Ok(proxies
            .iter()
            .any(|p| p.name == name && p.host.as_deref() == Some(host)))
    }

    /// Delivers entry `e` of host `host` into this root when it carries a
    /// message addressed here, or takes its receipt; true when it must wait
    /// for a later pull.
    fn take_entry(
        &mut self,
        host: &str,
        e: &Entry,
        comment: u64,
        refused: &BTreeSet<String>,
    ) -> Result<bool> {
        if e.decision.action == Action::Read {
            return self.take_receipt(host, e, comment, refused);
        }
        if !matches!(e.decision.action, Action::Forward | Action::Release) {
            return Ok(false);
        }
        let Some(m) = &e.message else {
            return Ok(false);
        };
        // Only a sandbox its host announced, and not a name refused here.
        if !self.proxy_of(host, &e.sender, refused)? {
            return Ok(false);
        }
        let (own, _) = self.records()?;
        let log = Log::new(self.root.log_dir());
        let ob = self.root.sandbox(&e.sender).outbox();
        let in_outbox = [mailbox::maildir::Sub::New, mailbox::maildir::Sub::Cur]
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
            return Ok(false);
        }
        let to = addressed(m, &e.decision.to, &own);
        if to.is_empty() {
            return Ok(false);
        }
        let copy = Message {
            from: format!("{host}/{}", e.sender),
            to: to.clone(),
            ..m.clone()
        };
        if let Err(why) = copy.validate() {
            self.events.push(Event::Bad {
                entry: e.name.clone(),
                reason: format!("from host {host}: {why}"),
            });
            return Ok(false);
        }
        if let mailbox::maildir::Delivered::New(_) = ob.deliver_once(&copy.id, &copy.to_bytes())? {
            self.events.push(Event::Federated {
                id: copy.id.clone(),
                from: format!("{host}/{}", e.sender),
                to,
                comment,
            });
        }
        Ok(false)
    }

    /// Takes the receipt `e` of `host`: its sandbox READER (a proxy here)
    /// read a message this host routed to that proxy.  The copy in the
    /// proxy's inbox is acked (`new/` to `cur/`, the no-replace rename
    /// lw-inbox uses), so this host's mediator logs `ID.read.READER` as for
    /// a reader of its own, once (it writes a name only when it is not
    /// logged).  True (wait) while the decision is logged but the copy not
    /// delivered yet.
    fn take_receipt(
        &mut self,
        host: &str,
        e: &Entry,
        comment: u64,
        refused: &BTreeSet<String>,
    ) -> Result<bool> {
        let [reader] = e.decision.to.as_slice() else {
            return Ok(false);
        };
        if !self.proxy_of(host, reader, refused)? || !base::id::is_valid(&e.message_id) {
            return Ok(false);
        }
        let log = Log::new(self.root.log_dir());
        let routed = [Action::Forward, Action::Release].iter().any(|a| {
            let n = Entry::name_for(&e.message_id, *a, None);
            log.has(&n)
                && log
                    .read(std::ffi::OsStr::new(&n))
                    .is_ok_and(|f| f.decision.to.contains(reader))
        });
        if !routed {
            return Ok(false);
        }
        match mailbox::inbox::ack(&self.root.sandbox(reader).inbox(), &e.message_id) {
            Ok(moved) => {
                if moved {
                    self.events.push(Event::Receipt {
                        id: e.message_id.clone(),
                        reader: format!("{host}/{reader}"),
                        comment,
                    });
                }
                Ok(false)
            }
            Err(err) if err.exit == Exit::NoInput => Ok(true),
            Err(err) => Err(err),
        }
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
        let mut m = mailbox::message::Message {
            version: 1,
            id: base::id::new_id(),
            from: "api".into(),
            to: vec!["mediator".into()],
            kind: Kind::ContractChange,
            subject: "s".into(),
            body: String::new(),
            refs: vec!["schema/users.json".into()],
            in_reply_to: None,
            created: base::time::rfc3339(base::time::now()),
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
