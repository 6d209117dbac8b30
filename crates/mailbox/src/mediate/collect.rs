//! Taking a batch from the outboxes: each entry is inspected (inspect.rs),
//! what the log says of its id is read, the decision is taken by the pure
//! step (pure/decide.rs) and what it changes is applied to the state.  What
//! comes out is the batch's work: the entries to log and the files to
//! route, claim or quarantine (deliver.rs carries it out).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};

use rustix::fs::{self as rfs, AtFlags};

use super::inspect::{Inspected, inspect, quarantine_id};
use super::pure::decide::{Found, Logged, Outcome, Post, decide};
use super::{BATCH_BYTES, Mediator, cap_notice_id};
use crate::batch::OpenMaildir;
use crate::layout;
use crate::log::{Action, Decision, Entry, LOG_VERSION};
use crate::maildir::escape_name;
use crate::message::{Kind, Message};
use crate::policy::Route;
use crate::quarantine::{Keep, Plan};

/// One message (or non-message) taken from an outbox.
pub(super) enum Work {
    Route {
        name: OsString,
        /// The message as posted (the held queue keeps it whole).
        message: Box<Message>,
        entries: Vec<Entry>,
        claim_question: Option<String>,
    },
    Quarantine {
        name: OsString,
        qid: String,
        /// A directory: one that cannot be taken is left for good.
        dir: bool,
        /// How much of it the quarantine keeps (keep.rs).
        keep: Keep,
    },
}

impl Mediator {
    /// Inspects and decides every entry of a batch.
    pub(super) fn collect(
        &mut self,
        obs: &[(String, OpenMaildir)],
        items: &[(usize, OsString)],
    ) -> Collected {
        let resumed_before = self.stats.resumed;
        // Charged by now, or never logged: nothing is held in reserve.
        self.state.reserved.clear();
        let mut c = Collected::default();
        let mut ids: HashSet<String> = HashSet::new();
        let mut bytes = 0usize;
        for (k, name) in items {
            let (sender, ob) = (obs[*k].0.as_str(), &obs[*k].1);
            // Claimed before a power cut that brought its new/ name back.
            if crate::maildir::settle_claimed(&ob.new, &ob.cur, name) {
                continue;
            }
            match inspect(&ob.new, name, sender == layout::MEDIATOR, Some(&ob.tmp)) {
                Inspected::Gone => {}
                Inspected::Bad(why, st) => {
                    let found = Found::Bad {
                        sender: self.state.qualified(sender),
                        qid: quarantine_id(sender, name, &st),
                        why,
                    };
                    match self.decide_now(&found) {
                        // A planted directory that could not be taken stays, quietly.
                        Outcome::Skip => {}
                        Outcome::Quarantine(why) => {
                            let plan = self.plan_keep(sender, &st);
                            c.quarantine(*k, sender, name, why, &st, plan, &self.state.secrets);
                            self.state.reserve(&c.to_log[c.to_log.len() - 1..]);
                        }
                        _ => self.stats.waiting += 1,
                    }
                }
                // The same id again, or the batch holds enough text: later.
                Inspected::Message(m) if ids.contains(&m.id) || bytes > BATCH_BYTES => {
                    c.later.push((*k, name.clone()))
                }
                Inspected::Message(m) => {
                    bytes += m.body.len() + m.subject.len() + 512;
                    ids.insert(m.id.clone());
                    self.collect_message(&mut c, *k, sender, ob, name, m);
                }
            }
        }
        if self.stats.resumed > resumed_before {
            (self.report)(&format!(
                "carrying out {} decisions that an earlier run had logged",
                self.stats.resumed - resumed_before
            ));
        }
        c
    }

    /// Decides on an outbox entry now ([`decide`]), and applies what the
    /// decision changes in the state.
    fn decide_now(&mut self, found: &Found) -> Outcome {
        let now = base::time::now();
        let v = decide(&self.state, found, &self.policy, now);
        self.state.apply(&v.changes, now);
        v.outcome
    }

    /// Decides one message (or carries out the decision an earlier run
    /// logged), or quarantines it when its id clashes with the log.
    fn collect_message(
        &mut self,
        c: &mut Collected,
        k: usize,
        sender: &str,
        ob: &OpenMaildir,
        name: &OsString,
        mut message: Message,
    ) {
        // Another host's sandbox, by its proxy's outbox, is HOST/NAME.
        let sender = self.state.qualified(sender);
        let claimed = std::mem::replace(&mut message.from, sender.clone());
        let logged = self.logged_of(&message.id);
        let in_cur =
            (logged.main.is_some() || logged.bounce.is_some()) && ob.has_cur(name.as_os_str());
        let asker = self.asker_of(&message);
        let post = Box::new(Post {
            message,
            sender,
            claimed,
            logged,
            in_cur,
            asker,
        });
        let found = Found::Message(post);
        let outcome = self.decide_now(&found);
        let Found::Message(post) = found else {
            unreachable!("decided on a message")
        };
        let Post {
            message, sender, ..
        } = *post;
        let entries = match outcome {
            Outcome::Skip => return,
            Outcome::Wait => {
                // The sender's log budget is used up: it waits.
                self.stats.waiting += 1;
                return;
            }
            Outcome::Quarantine(why) => {
                let st = rfs::statat(&ob.new, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW);
                if let Ok(st) = st {
                    let plan = self.plan_keep(&sender, &st);
                    c.quarantine(k, &sender, name, why, &st, plan, &self.state.secrets);
                }
                return;
            }
            // Refused and counted by a run that did not claim it: claimed
            // now, not counted again.
            Outcome::Claim => vec![],
            Outcome::Resume(entries) => {
                self.stats.resumed += 1;
                entries
            }
            Outcome::Route {
                entries,
                refused,
                resumed,
            } => {
                self.stats.resumed += u64::from(resumed);
                // A new refusal is counted, not logged (budget.rs).
                if let Some(e) = refused {
                    c.refused.push((sender.clone(), message.id.clone(), *e));
                }
                self.state.reserve(&entries);
                entries
            }
        };
        c.route(k, name, message, entries);
    }

    /// What the log says of message `id`, for deciding on it: its main
    /// entry, its bounce and, for a refusal, the cap notice it triggered.
    fn logged_of(&self, id: &str) -> Logged {
        let (main, bounce) = self.decision_of(id);
        let notice = match &bounce {
            Some(b) if b.decision.quiet => self.logged(&cap_notice_id(id), Action::Escalate),
            _ => None,
        };
        Logged {
            main,
            bounce,
            notice,
        }
    }

    /// Who sent the message `m` replies to, by the log, when its kind is
    /// routed to the asker.
    pub(super) fn asker_of(&self, m: &Message) -> Option<String> {
        let q = m.in_reply_to.as_deref()?;
        if self.policy.route(m.kind).value != Route::Asker {
            return None;
        }
        let (a, b) = self.decision_of(q);
        a.or(b).map(|e| e.sender)
    }
}

impl OpenMaildir {
    /// Whether `name` is in `cur/`.
    fn has_cur(&self, name: &OsStr) -> bool {
        rfs::statat(&self.cur, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }
}

/// What inspecting and deciding made of a batch.
#[derive(Default)]
pub(super) struct Collected {
    pub(super) work: Vec<(usize, Work)>,
    pub(super) to_log: Vec<Entry>,
    pub(super) later: Vec<(usize, OsString)>,
    /// New refusals: sender, post, the entry they are counted instead of.
    pub(super) refused: Vec<(String, String, Entry)>,
}

impl Collected {
    /// A message to route: its entries logged (where they are not yet) and
    /// carried out, then claimed.
    fn route(&mut self, k: usize, name: &OsString, message: Message, entries: Vec<Entry>) {
        let claim_question = match (message.from.as_str(), message.kind, &message.in_reply_to) {
            (layout::HUMAN, Kind::Answer, Some(q)) => Some(q.clone()),
            _ => None,
        };
        self.to_log.extend(entries.iter().cloned());
        self.work.push((
            k,
            Work::Route {
                name: name.clone(),
                message: Box::new(message),
                entries,
                claim_question,
            },
        ));
    }

    /// A bad entry: logged as `QID.quarantine`, then moved to quarantine.
    /// Its reason is masked like a body: a header field or the file name
    /// may be a secret's value.
    // The stat, the keep plan and the secrets are three views of one bad
    // entry the caller already holds; a struct for one call would only move them.
    #[allow(clippy::too_many_arguments)]
    fn quarantine(
        &mut self,
        k: usize,
        sender: &str,
        name: &OsString,
        why: String,
        st: &rfs::Stat,
        plan: Plan,
        secrets: &crate::redact::Secrets,
    ) {
        let qid = quarantine_id(sender, name, st);
        let regular = rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile;
        let size = st.st_size.max(0) as u64;
        let kept = match plan.keep {
            Keep::Nothing => {
                format!("not kept: {sender} used its quarantine budget (door.quarantine-max)")
            }
            Keep::Up(n) if regular && n < size => format!(
                "{size} bytes, {} allocated: its first {n} kept as quarantine/new/{qid}{}",
                (st.st_blocks.max(0) as u64) * 512,
                if plan.cut {
                    " (the rest of its sender's quarantine budget)"
                } else {
                    ""
                }
            ),
            Keep::Up(_) => format!("kept as quarantine/new/{qid}"),
        };
        let mut reason = format!(
            "'{}' in the outbox of {sender}: {why}; {kept}",
            escape_name(name)
        );
        secrets.mask_in(&mut reason);
        self.to_log.push(Entry {
            version: LOG_VERSION,
            name: Entry::name_for(&qid, Action::Quarantine, None),
            logged: base::time::rfc3339(base::time::now()),
            message_id: qid.clone(),
            sender: sender.to_string(),
            message: None,
            decision: Decision {
                quiet: false,
                action: Action::Quarantine,
                to: vec![],
                reason,
            },
        });
        let dir = rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory;
        self.work.push((
            k,
            Work::Quarantine {
                name: name.clone(),
                qid,
                dir,
                keep: plan.keep,
            },
        ));
    }
}
