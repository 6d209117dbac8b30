//! The way back: people's `/lw answer ID` comments become answers in
//! `ROOT/human-outbox`, and an answer that cannot be delivered gets a notice
//! on the issue saying why.

use std::collections::HashMap;
use std::time::Duration;

use super::config::Federation;
use super::format::{header_line, inline};
use super::{Event, FORMAT_VERSION, Head, MAX_UNKNOWN, NoticeHead, Syncer, TargetState};
use super::{parse_answers, parse_comment};
use crate::github::{Comment, Listing, Posted, Target};
use base::digest::sha256_hex;
use base::error::{Error, Exit, Result};
use mailbox::log::Log;
use mailbox::message::{self, Kind, Message};

/// Comments listed, and the `since` and ETag of the listing.
type Listed = (Vec<Comment>, Option<(String, String)>);

/// Whose a person's answer is, on an issue hosts share.
enum Owner {
    /// This host delivers it and tells what went wrong.
    Here,
    /// This host delivers it (to a proxy) but another host tells.
    HereQuietly,
    /// Another host's: this one leaves it.
    Host(String),
}

impl Syncer {
    /// The way back: `/lw answer ID` lines in people's comments become
    /// answers in `ROOT/human-outbox`.
    pub fn pull(&mut self) -> Result<()> {
        self.ensure_login()?;
        let log = Log::new(self.root.log_dir());
        let (entries, _) = log.entries()?;
        let mut known: HashMap<String, (String, String)> = HashMap::new();
        for e in &entries {
            if let Some(m) = &e.message {
                known
                    .entry(e.message_id.clone())
                    .or_insert((e.sender.clone(), m.subject.clone()));
            }
        }
        self.announce()?;
        for t in self.cfg.targets()? {
            self.pull_target(&t, &known)?;
        }
        // People's reviews on task branches' pull requests (review.rs).
        self.pull_reviews()
    }

    fn pull_target(&mut self, t: &Target, known: &HashMap<String, (String, String)>) -> Result<()> {
        let key = t.to_string();
        // The ETag is kept only with the cursor, once every comment was
        // handled: a pull killed before must list them again, not get a 304.
        let (ts, (comments, etag)) = self.pull_listing(t)?;
        self.federate(t, &comments)?;
        let fed = self.cfg.federation()?;
        let mut known = known.clone();
        for (_, s) in self.own_sections(t, &comments) {
            if let Head::Entry(h) = s.head
                && let Some(m) = h.msg
            {
                known
                    .entry(h.id.clone())
                    .or_insert((h.sender.clone(), m.subject.clone()));
            }
        }
        let mut newest = ts.pull_since.clone();
        let login = self.own_login();
        let ids = self.recorded_ids();
        for c in &comments {
            if newest.as_deref().is_none_or(|n| c.updated_at.as_str() > n) {
                newest = Some(c.updated_at.clone());
            }
            let a_host = fed.as_ref().is_some_and(|f| f.host_of(c.login()).is_some());
            if ts.answered.contains(&c.id)
                || ((a_host || self.trusted(c, login.as_deref(), &ids))
                    && parse_comment(c.text()).is_some())
            {
                continue;
            }
            let cmds = parse_answers(c.text());
            if cmds.is_empty() {
                continue;
            }
            self.answer_commands(t, c, &cmds, &known)?;
            self.state
                .targets
                .get_mut(&key)
                .expect("target state exists")
                .answered
                .insert(c.id);
            self.save()?;
        }
        let tsm = self
            .state
            .targets
            .get_mut(&key)
            .expect("target state exists");
        tsm.pull_etag = etag;
        tsm.pull_since = newest;
        self.save()
    }

    /// The comments of `t` to look at, and the `since` and ETag of their
    /// listing: after a reconciliation (which must
    /// come before any notice is posted) its whole listing when nothing was
    /// pulled yet, else those updated since the last pull.
    fn pull_listing(&mut self, t: &Target) -> Result<(TargetState, Listed)> {
        let key = t.to_string();
        let ts = self.state.targets.entry(key.clone()).or_default().clone();
        let mut listed = None;
        if ts.pending.is_some() || !ts.reconciled {
            // Notices already on the issue must be known before any is posted.
            listed = Some(self.reconcile_listing(t)?);
        }
        let ts = self.state.targets[&key].clone();
        let comments = match listed {
            Some(all) if ts.pull_since.is_none() => (all, None),
            _ => {
                // A minute of overlap: a comment GitHub indexes late, with an
                // older updated_at, is still seen.  Handled ones are skipped.
                let since = ts
                    .pull_since
                    .as_deref()
                    .and_then(base::time::parse_rfc3339)
                    .map(|d| {
                        let t = base::time::rfc3339(
                            d.saturating_sub(std::time::Duration::from_secs(60)),
                        );
                        format!("{}Z", &t[..19])
                    });
                self.conditional_listing(t, since)?
            }
        };
        Ok((ts, comments))
    }

    /// The comments updated `since`, asked with the ETag of the last pull
    /// when it sent the same `since`: a 304 means nothing new, so no
    /// comment to look at.  Not while comments wait for parts or a copy to
    /// deliver: those are looked at again whatever changed.
    fn conditional_listing(&mut self, t: &Target, since: Option<String>) -> Result<Listed> {
        let key = t.to_string();
        let since_key = since.clone().unwrap_or_default();
        let tag = self.state.targets[&key]
            .pull_etag
            .as_ref()
            .filter(|(s, _)| *s == since_key && self.state.fed.waiting.is_empty())
            .map(|(_, e)| e.clone());
        let listing = self
            .client
            .list_comments_if(t, since.as_deref(), tag.as_deref())?;
        Ok(match listing {
            Listing::NotModified => (vec![], tag.map(|e| (since_key, e))),
            Listing::Comments(all, etag) => (all, etag.map(|e| (since_key, e))),
        })
    }

    /// Delivers each `/lw answer` of comment `c`, or tells its author on the
    /// issue why not.
    fn answer_commands(
        &mut self,
        t: &Target,
        c: &Comment,
        cmds: &[(String, String)],
        known: &HashMap<String, (String, String)>,
    ) -> Result<()> {
        let allowed = if self.cfg.answerers.is_empty() {
            matches!(
                c.author_association.as_str(),
                "OWNER" | "MEMBER" | "COLLABORATOR"
            )
        } else {
            self.cfg.answerers.iter().any(|a| a == c.login())
        };
        let fed = match self.cfg.federation()? {
            Some(f) if *t == self.cfg.default_target()? => Some(f),
            _ => None,
        };
        for (k, (id, text)) in cmds.iter().enumerate() {
            // On an issue hosts share, each answer is one host's to deliver
            // and to tell about: see `answer_owner`.
            let mut tell = true;
            if let Some(fed) = &fed {
                match self.answer_owner(t, fed, known.get(id), id)? {
                    Owner::Here => {}
                    Owner::HereQuietly => tell = false,
                    Owner::Host(host) => {
                        self.events.push(Event::LeftTo {
                            id: id.clone(),
                            comment: c.id,
                            host,
                        });
                        continue;
                    }
                }
            }
            let problem = if !allowed {
                Some(format!(
                    "@{} may not answer for this repository (configure \"answerers\")",
                    c.login()
                ))
            } else if let Some((asker, subject)) = known.get(id) {
                if text.trim().is_empty() {
                    Some(format!(
                        "the answer to {id} is empty: write it on the lines after `/lw answer {id}`"
                    ))
                } else {
                    match self.deliver_answer(t, c, k, id, asker, subject, text) {
                        Ok(()) => None,
                        Err(e) if e.exit == Exit::DataErr => Some(e.msg),
                        Err(e) => return Err(e),
                    }
                }
            } else {
                Some(format!(
                    "no message with id {id} is known to lw-sync; check the id in `/lw answer`"
                ))
            };
            if let Some(p) = problem {
                self.events.push(Event::Rejected {
                    comment: c.id,
                    target: t.to_string(),
                    reason: p.clone(),
                });
                if tell {
                    self.notice(t, c, k, &p)?;
                }
            }
        }
        Ok(())
    }

    /// Which host delivers a person's answer to message `id`, and tells the
    /// person what went wrong, on an issue several hosts share (every host's
    /// pull reads the same comment):
    ///
    /// - a message of this host's own sandbox (`known` here with a bare
    ///   sender): this host;
    /// - one this host took from another host's sandbox (sender
    ///   `HOST/NAME`): that host delivers it to its sandbox; this host
    ///   delivers too, to the proxy (so its human queue is done with the
    ///   question), but tells nothing;
    /// - one unknown here: the host whose entries on the issue name it;
    ///   when no host's do, the first host by name tells the person.
    ///
    /// Looking for another host's entry lists the comments since an hour
    /// before the time in the id (the message cannot have been mirrored
    /// before it was made), once per unknown id.
    fn answer_owner(
        &mut self,
        t: &Target,
        fed: &Federation,
        known: Option<&(String, String)>,
        id: &str,
    ) -> Result<Owner> {
        match known {
            Some((sender, _)) if sender.contains('/') => return Ok(Owner::HereQuietly),
            Some(_) => return Ok(Owner::Here),
            None => {}
        }
        let since = id
            .split('.')
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .map(|secs| base::time::rfc3339(Duration::from_secs(secs.saturating_sub(3600))));
        let comments = self.client.list_comments(t, since.as_deref())?;
        for c in &comments {
            let Some(host) = fed.host_of(c.login()) else {
                continue;
            };
            if host == fed.me {
                continue;
            }
            let Some(Ok(sections)) = parse_comment(c.text()) else {
                continue;
            };
            if sections
                .iter()
                .any(|s| matches!(&s.head, Head::Entry(h) if h.id == id))
            {
                return Ok(Owner::Host(host.to_string()));
            }
        }
        match fed.hosts.keys().next() {
            Some(first) if *first != fed.me => Ok(Owner::Host(first.clone())),
            _ => Ok(Owner::Here),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn deliver_answer(
        &mut self,
        t: &Target,
        c: &Comment,
        k: usize,
        id: &str,
        asker: &str,
        subject: &str,
        text: &str,
    ) -> Result<()> {
        let created = base::time::parse_rfc3339(&c.created_at).unwrap_or_else(base::time::now);
        let seed = sha256_hex(format!("{}#{}/{}/{k}", t.repo, t.issue, c.id).as_bytes());
        let rand = u128::from_str_radix(&seed[..32], 16).expect("a SHA-256 hex digest is hex");
        let mut subj = format!("Re: {subject}");
        while subj.len() > message::MAX_SUBJECT {
            subj.pop();
        }
        let m = Message {
            version: message::VERSION,
            id: base::id::id_at(created, rand),
            from: mailbox::layout::HUMAN.into(),
            to: vec![asker.to_string()],
            kind: Kind::Answer,
            subject: subj,
            body: text.to_string(),
            refs: if c.html_url.is_empty() || c.html_url.len() > message::MAX_REF {
                vec![]
            } else {
                vec![c.html_url.clone()]
            },
            in_reply_to: Some(id.to_string()),
            created: base::time::rfc3339(created),
        };
        m.validate().map_err(|e| {
            Error::data(format!(
                "the answer in comment {} is not a valid message: {e}",
                c.id
            ))
        })?;
        self.root
            .human_outbox()
            .deliver_once(&m.id, &m.to_bytes())?;
        self.events.push(Event::Answer {
            id: m.id.clone(),
            in_reply_to: id.into(),
            to: asker.into(),
            comment: c.id,
        });
        Ok(())
    }

    /// Tells the person on the issue why their answer was not delivered;
    /// once per (comment, answer), with the same intent/reconcile protocol.
    fn notice(&mut self, t: &Target, c: &Comment, k: usize, problem: &str) -> Result<()> {
        let key = t.to_string();
        let nkey = format!("notice/{}/{k}", c.id);
        if self
            .state
            .targets
            .get(&key)
            .is_some_and(|ts| ts.synced.contains_key(&nkey))
        {
            return Ok(());
        }
        let head = Head::Notice(NoticeHead {
            v: FORMAT_VERSION,
            key: nkey.clone(),
            about: c.id,
        });
        let body = format!(
            "{}\n**lw-sync** did not deliver the answer in comment {} ({}): {}\n",
            header_line(&head),
            c.id,
            inline(&format!("@{}", c.login())),
            inline(problem)
        );
        for _ in 0..MAX_UNKNOWN {
            match self.post_with_intent(t, &key, vec![(nkey.clone(), 1)], &body)? {
                Posted::Created(nc) => {
                    let ts = self
                        .state
                        .targets
                        .get_mut(&key)
                        .expect("target state exists");
                    ts.synced.insert(nkey, vec![nc.id]);
                    ts.pending = None;
                    return self.save();
                }
                Posted::Unknown(reason) => {
                    self.events.push(Event::Unknown {
                        target: key.clone(),
                        reason,
                    });
                    self.reconcile(t)?;
                    if self
                        .state
                        .targets
                        .get(&key)
                        .is_some_and(|ts| ts.synced.contains_key(&nkey))
                    {
                        return Ok(());
                    }
                }
            }
        }
        Err(Error::new(
            Exit::TempFail,
            format!(
                "the notice about comment {} on {t} could not be posted; try again later",
                c.id
            ),
        ))
    }
}
