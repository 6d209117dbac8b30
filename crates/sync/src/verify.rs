//! Checking the mirror: the log and the issue compared both ways, and the
//! entries found only on GitHub restored into the log when asked.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Event, Head, Rebuilt, Section, Syncer, reassemble};
use crate::github::Target;
use base::error::Result;
use mailbox::log::{Entry, Log};

/// One target's two sides: the log's entries and what the issue holds.
struct Compared<'a> {
    key: &'a str,
    mine: &'a BTreeMap<String, Entry>,
    remote: &'a Rebuilt,
    broken: &'a BTreeMap<String, String>,
}

impl Syncer {
    /// Compares the log with GitHub both ways; with `restore`, appends the
    /// entries found only on GitHub to the log.  True when both agree.
    pub fn verify(&mut self, restore: bool) -> Result<bool> {
        self.ensure_login()?;
        let log = Log::new(self.root.log_dir());
        let (entries, bad) = log.entries()?;
        self.cfg.learn_pulls(&self.root.state_dir())?;
        for b in bad {
            self.events.push(Event::Bad {
                entry: b.name,
                reason: b.reason,
            });
        }
        let mut local: BTreeMap<Target, BTreeMap<String, Entry>> = BTreeMap::new();
        // Comments of format version 1 carried held bodies and unmasked
        // text: such an entry agrees with the log as it is, not as mirrored now.
        let raw: HashMap<String, Entry> = entries
            .iter()
            .map(|e| (e.name.clone(), e.clone()))
            .collect();
        // A proxy's messages are mirrored by their own host (federate.rs).
        let proxies = self.proxy_names()?;
        for e in entries
            .iter()
            .filter(|e| !e.decision.quiet && !super::federate::foreign(e, &proxies))
        {
            let e = self.outgoing(e);
            local
                .entry(self.target_of(&e)?)
                .or_default()
                .insert(e.name.clone(), e);
        }
        let mut targets: BTreeSet<Target> = self.cfg.targets()?.into_iter().collect();
        targets.extend(local.keys().cloned());
        let mut same = true;
        for t in targets {
            let comments = self.client.list_comments(&t, None)?;
            let sections = self.own_sections(&t, &comments);
            let (remote, broken) = reassemble(&sections);
            let mine = local.remove(&t).unwrap_or_default();
            let key = t.to_string();
            for (name, comments) in duplicates(&sections) {
                same = false;
                self.events.push(Event::Duplicate {
                    entry: name,
                    target: key.clone(),
                    comments,
                });
            }
            let cmp = Compared {
                key: &key,
                mine: &mine,
                remote: &remote,
                broken: &broken,
            };
            same &= self.local_agrees(&cmp, &raw);
            same &= self.remote_agrees(&cmp, restore.then_some(&log))?;
        }
        same &= self.verify_statuses()?;
        let logged = entries.iter().map(|e| e.message_id.clone()).collect();
        same &= self.verify_reviews(&logged)?;
        Ok(same)
    }

    /// Whether every entry of the log is on GitHub, whole and the same.
    fn local_agrees(&mut self, cmp: &Compared<'_>, raw: &HashMap<String, Entry>) -> bool {
        let mut same = true;
        for (name, e) in cmp.mine {
            let event = match cmp.remote.get(name) {
                None if cmp.broken.contains_key(name) => Event::Incomplete {
                    entry: name.clone(),
                    target: cmp.key.to_string(),
                    reason: cmp.broken[name].clone(),
                },
                None => Event::MissingOnGithub {
                    entry: name.clone(),
                    target: cmp.key.to_string(),
                },
                Some((r, _)) if r != e && raw.get(name) != Some(r) => Event::Differs {
                    entry: name.clone(),
                    target: cmp.key.to_string(),
                },
                Some(_) => continue,
            };
            same = false;
            self.events.push(event);
        }
        same
    }

    /// Whether every entry on GitHub is in the log; with `restore` (the
    /// log), one that is not is appended to it when it may be.
    fn remote_agrees(&mut self, cmp: &Compared<'_>, restore: Option<&Log>) -> Result<bool> {
        let mut same = true;
        for (name, (e, _)) in cmp.remote {
            if cmp.mine.contains_key(name) {
                continue;
            }
            same = false;
            self.events.push(Event::MissingLocally {
                entry: name.clone(),
                target: cmp.key.to_string(),
            });
            if let Some(log) = restore {
                match restorable(e) {
                    Ok(()) => {
                        log.append(e)?;
                        self.events.push(Event::Restored {
                            entry: name.clone(),
                        });
                    }
                    Err(why) => self.events.push(Event::Incomplete {
                        entry: name.clone(),
                        target: cmp.key.to_string(),
                        reason: why,
                    }),
                }
            }
        }
        for (name, why) in cmp.broken {
            if !cmp.mine.contains_key(name) {
                same = false;
                self.events.push(Event::Incomplete {
                    entry: name.clone(),
                    target: cmp.key.to_string(),
                    reason: why.clone(),
                });
            }
        }
        Ok(same)
    }
}

/// Entries whose sections (the same part) appear in more than one comment.
fn duplicates(sections: &[(u64, Section)]) -> Vec<(String, Vec<u64>)> {
    let mut seen: BTreeMap<(String, u32), Vec<u64>> = BTreeMap::new();
    for (cid, s) in sections {
        if let Head::Entry(h) = &s.head {
            seen.entry((h.entry.clone(), h.part[0]))
                .or_default()
                .push(*cid);
        }
    }
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for ((name, _), ids) in seen {
        if ids.len() > 1 {
            out.entry(name).or_default().extend(ids);
        }
    }
    out.into_iter().collect()
}

/// Whether an entry rebuilt from GitHub may be written into the log: its
/// name must be `MSGID.ACTION[.PARTY]` (it becomes a file name) and its
/// message must validate.
fn restorable(e: &Entry) -> std::result::Result<(), String> {
    if !base::id::is_valid(&e.message_id) {
        return Err(format!(
            "message id '{}' does not follow the id grammar",
            e.message_id.escape_debug()
        ));
    }
    let base = Entry::name_for(&e.message_id, e.decision.action, None);
    let ok = e.name == base
        || e.name
            .strip_prefix(&format!("{base}."))
            .is_some_and(mailbox::layout::valid_name);
    if !ok {
        return Err(format!(
            "entry name '{}' is not MSGID.ACTION[.PARTY]; not restored",
            e.name.escape_debug()
        ));
    }
    if let Some(m) = &e.message {
        m.validate()
            .map_err(|why| format!("message: {why}; not restored"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailbox::log::Action;

    use crate::format::tests::entry;

    #[test]
    fn only_well_named_entries_are_restored() {
        let mut e = entry("x", Action::Forward);
        assert!(restorable(&e).is_ok());
        e.name = format!("{}.forward.web", e.message_id);
        assert!(restorable(&e).is_ok());
        for bad in [
            "../../etc/x".to_string(),
            format!("{}.forward/../x", e.message_id),
            format!("{}.hold", e.message_id),
        ] {
            e.name = bad.clone();
            assert!(restorable(&e).is_err(), "{bad}");
        }
    }
}
