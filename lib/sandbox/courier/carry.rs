//! The mail of volume-mode sandboxes carried, pass by pass, between their
//! mail volumes and the root (the module documentation, "out" and "in").

use std::collections::{HashMap, HashSet};
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::time::{Duration, Instant};

use super::outbox::{End, PASS_MAX, Read1, read_outbox};
use crate::sandbox::{MAILBOX, Record, Sandboxes};
use base::error::{Error, Exit, Result};
use mailbox::maildir::{Maildir, Sub};
use mailbox::message;

/// What one pass carried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// Messages delivered into the root's outboxes.
    pub out: usize,
    /// Messages delivered into the engine's inboxes.
    pub into: usize,
    /// Host inbox copies claimed because the sandbox acked them.
    pub read: usize,
    /// Entries of the engine's outboxes moved aside as junk.
    pub junk: usize,
}

impl std::ops::AddAssign for Carried {
    fn add_assign(&mut self, o: Carried) {
        self.out += o.out;
        self.into += o.into;
        self.read += o.read;
        self.junk += o.junk;
    }
}

/// Acknowledges carried messages inside the sandbox: linked into `cur/`
/// (a name already there is left), removed from `new/`.  Names are of the
/// id grammar, so they are plain words.
const ACK: &str = "cd /lw/mailbox/outbox/new || exit 3
ln -- \"$@\" ../cur/ 2>/dev/null
rm -f -- \"$@\"";

/// Moves junk out of `outbox/new/`.
const JUNK: &str = "cd /lw/mailbox/outbox || exit 3
mkdir -p junk && cd new && mv -f -- \"$@\" ../junk/";

/// Moves every entry of `outbox/new/` that is not a regular file, or is
/// over `$1` bytes (the message-file limit; a sparse file by its apparent
/// size), to `outbox/junk/`, and says how many went: an archive cut at
/// such an entry (outbox.rs) is read again without it, whatever their
/// number.
const SWEEP: &str = "cd /lw/mailbox/outbox || exit 3
mkdir -p junk || exit 3
find new -mindepth 1 -maxdepth 1 \\( ! -type f -o -size +\"$1\"c \\) -exec sh -c '
mv -f -- \"$@\" junk/ 2>/dev/null
n=0; for f; do [ -e \"$f\" ] || [ -L \"$f\" ] || n=$((n+1)); done; echo $n' sh {} +";

/// Entries of one sandbox's outbox that are not messages named in the
/// courier's warnings; past them, one warning says further ones go unnamed.
const NAMED: usize = 20;

/// Says which of the names are in the volume's `inbox/cur/` or `inbox/new/`.
const STATUS: &str = "cd /lw/mailbox/inbox || exit 3
for n; do if [ -e \"cur/$n\" ]; then echo \"cur $n\"; elif [ -e \"new/$n\" ]; then echo \"new $n\"; fi; done";

/// Delivers the files just copied into `inbox/tmp/` as `NAME.TAG` (`$1`
/// is TAG, unique to the copy; the names follow): a name already in `cur/`
/// (said) or `new/` is dropped from `tmp/`; the others are fsynced, linked
/// into `new/` as NAME (never replacing: a name another delivery linked
/// meanwhile is delivered), removed from `tmp/`, and `new/` is fsynced.
/// The tag keeps each copy's files its own: the script of a courier
/// killed mid-pass may still be running in the sandbox, and must not remove
/// or link what the next courier is copying.  Files a killed pass left in
/// `tmp/` are removed after an hour.  An old `sync` that takes no file
/// names syncs everything, which is more.  Names are of the id grammar,
/// tags digits: plain words.
const DELIVER: &str = "cd /lw/mailbox/inbox/tmp || exit 3
tag=$1; shift
find . -maxdepth 1 -type f -mmin +60 -exec rm -f -- {} + 2>/dev/null
go=
for n; do
    if [ -e \"../cur/$n\" ]; then echo \"cur $n\"; rm -f -- \"$n.$tag\"
    elif [ -e \"../new/$n\" ]; then rm -f -- \"$n.$tag\"
    else go=\"$go $n\"; fi
done
[ -n \"$go\" ] || exit 0
t=
for n in $go; do t=\"$t $n.$tag\"; done
sync -- $t 2>/dev/null || sync
st=0
for n in $go; do ln -- \"$n.$tag\" \"../new/$n\" || [ -e \"../new/$n\" ] || st=1; done
rm -f -- $t
sync -- ../new 2>/dev/null || sync
exit $st";

/// A tag for one copy into an inbox's `tmp/` (DELIVER): this process and
/// the time, digits only.
fn copy_tag() -> String {
    let now = base::time::now();
    format!(
        "{}{:09}{}",
        now.as_secs(),
        now.subsec_nanos(),
        std::process::id()
    )
}

/// How often the names delivered into a volume and not acked yet are
/// looked up again (for the read receipts).
const RECHECK: Duration = Duration::from_secs(1);

/// How many names one exec carries.
const BATCH: usize = 400;

/// What a pass does for one sandbox (serve.rs decides it, from the
/// sandbox's ring).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Due {
    /// Read the engine's outbox (its archive is one exec).
    pub out: bool,
    /// When the names delivered and not acked yet are looked up again.
    pub status: Status,
    /// The container is known to run (its ring is live): not inspected.
    pub running: bool,
}

impl Due {
    /// Everything, as a courier without rings does each pass.
    pub const POLL: Due = Due {
        out: true,
        status: Status::Timed,
        running: false,
    };
}

/// When a pass looks up the names delivered into a volume and not acked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Now (the ring rang: something was acked, or a sweep).
    Now,
    /// Once each [`RECHECK`] (no ring to say).
    Timed,
    /// Not in this pass (the ring will ring).
    Later,
}

/// The courier of one root.
pub struct Courier<'s, 'a> {
    sb: &'s Sandboxes<'a>,
    /// Junk already reported, per sandbox: reported once.
    reported: HashSet<(String, String)>,
    /// Per sandbox: junk warnings said (at most [`NAMED`] and one more).
    said: HashMap<String, usize>,
    /// Sandboxes whose outbox was not read to its end in the last pass (it
    /// held more than a pass may carry): read again in the next.
    behind: HashSet<String>,
    /// Per sandbox: names delivered into its volume and not seen acked, and
    /// when they were last looked up.
    inside: HashMap<String, (HashSet<String>, Instant)>,
}

impl<'s, 'a> Courier<'s, 'a> {
    pub fn new(sb: &'s Sandboxes<'a>) -> Courier<'s, 'a> {
        Courier {
            sb,
            reported: HashSet::new(),
            said: HashMap::new(),
            behind: HashSet::new(),
            inside: HashMap::new(),
        }
    }

    /// Whether an outbox was left behind (more than a pass may carry).
    pub fn behind(&self) -> bool {
        !self.behind.is_empty()
    }

    /// The ready volume-mode sandboxes of the root.
    pub fn sandboxes(&self) -> Result<Vec<Record>> {
        Ok(self.sandboxes_of_all()?.0)
    }

    /// [`Courier::sandboxes`], and how many records the root has in all
    /// (one being created is not ready yet), from one read of them.
    pub fn sandboxes_of_all(&self) -> Result<(Vec<Record>, usize)> {
        let all = self.sb.records()?;
        let n = all.len();
        let ready = all
            .into_iter()
            .filter(|r| r.ready && r.volume_mode && !self.sb.elsewhere(r))
            .collect();
        Ok((ready, n))
    }

    /// One pass over the volume-mode sandboxes `due` names (with what to
    /// do for each); a sandbox whose carry fails is reported through `warn`
    /// and the others go on.  Deliveries go first, so a message the
    /// mediator just routed waits for no outbox.
    pub fn pass(
        &mut self,
        due: &dyn Fn(&Record) -> Option<Due>,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Carried> {
        let mut total = Carried::default();
        let recs: Vec<(Record, Due)> = self
            .sandboxes()?
            .into_iter()
            .filter_map(|r| {
                let d = due(&r);
                // An outbox left behind is read again, ring or not.
                if self.behind.contains(&r.name) {
                    let d = d.unwrap_or(Due::POLL);
                    return Some((r, Due { out: true, ..d }));
                }
                d.map(|d| (r, d))
            })
            .collect();
        let mut running = HashMap::new();
        for (rec, d) in &recs {
            let r = self.with_lock(rec, &mut |me, r| {
                // A live ring is a running container: no request to ask.
                let run = if d.running {
                    true
                } else {
                    match me.sb.engine.inspect(&r.container)? {
                        Some(c) => c.running,
                        None => return Ok(Carried::default()),
                    }
                };
                running.insert(r.name.clone(), run);
                if run {
                    me.carry_in(r, d.status)
                } else {
                    Ok(Carried::default())
                }
            });
            match r {
                Ok(c) => total += c,
                Err(e) => warn(&format!("sandbox '{}': {e}", rec.name)),
            }
        }
        for (rec, d) in &recs {
            let Some(&run) = running.get(&rec.name) else {
                continue;
            };
            if !d.out {
                continue;
            }
            match self.with_lock(rec, &mut |me, r| me.carry_out(r, run, warn)) {
                Ok(c) => total += c,
                Err(e) => warn(&format!("sandbox '{}': {e}", rec.name)),
            }
        }
        Ok(total)
    }

    /// Runs `script` with `args` in the sandbox as its user: its output,
    /// or 69 saying it cannot `what` the mail volume, and why.
    fn script(&self, rec: &Record, script: &str, args: &[String], what: &str) -> Result<String> {
        let (code, out, err) = self
            .sb
            .exec_args(&rec.container, &Self::user(rec), script, args)?;
        if code != 0 {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot {what} the mail volume (exit {code}): {}",
                    base::visible::visible(err.trim())
                ),
            ));
        }
        Ok(out)
    }

    /// Runs `f` on the current record of `rec`'s sandbox under its lock; a
    /// sandbox being created or removed (or gone) is skipped.
    fn with_lock(
        &mut self,
        rec: &Record,
        f: &mut dyn FnMut(&mut Self, &Record) -> Result<Carried>,
    ) -> Result<Carried> {
        let Some(lock) = self.sb.lock(&rec.name, false)? else {
            return Ok(Carried::default());
        };
        match self.sb.record(&rec.name) {
            Ok(Some(r)) if r.ready => f(self, &r),
            _ => {
                // Removed meanwhile: the lock file is a leftover of ours.
                lock.remove();
                Ok(Carried::default())
            }
        }
    }

    /// Carries one sandbox's mail both ways, under its name's lock (so a
    /// `rm`'s last carry and this one are never two writers of one
    /// outbox); a sandbox being created or removed is skipped.
    pub fn carry(&mut self, rec: &Record, warn: &mut dyn FnMut(&str)) -> Result<Carried> {
        self.with_lock(rec, &mut |me, r| me.carry_locked(r, warn))
    }

    /// [`Courier::carry`] for a caller that holds the name's lock (`rm`).
    pub(in crate::sandbox) fn carry_locked(
        &mut self,
        rec: &Record,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Carried> {
        let Some(c) = self.sb.engine.inspect(&rec.container)? else {
            return Ok(Carried::default());
        };
        let mut done = self.carry_out(rec, c.running, warn)?;
        if c.running {
            done += self.carry_in(rec, Status::Now)?;
        }
        Ok(done)
    }

    fn user(rec: &Record) -> String {
        format!("{0}:{0}", rec.uid)
    }

    fn carry_out(
        &mut self,
        rec: &Record,
        running: bool,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Carried> {
        let outbox = self.sb.root.sandbox(&rec.name).outbox();
        // What still waits in the root for the mediator counts against the
        // pass: the root holds at most a pass's worth of one sandbox's
        // posts, whatever the sandbox plants.
        let room = PASS_MAX.saturating_sub(waiting(&outbox));
        // Behind until this pass read it to its end (an error on the way
        // leaves it so: read again next interval).
        self.behind.insert(rec.name.clone());
        if room < mailbox::message::MAX_FILE {
            return Ok(Carried::default());
        }
        let mut read = self.archive(rec, &outbox, room)?;
        let mut done = Carried::default();
        if read.end == End::Over && running {
            // Moved aside inside, all at once; then read once more.
            let out = self.script(
                rec,
                SWEEP,
                &[mailbox::message::MAX_FILE.to_string()],
                "move junk aside in",
            )?;
            let n: usize = out
                .lines()
                .filter_map(|l| l.trim().parse::<usize>().ok())
                .sum();
            done.junk += n;
            let over: Vec<(String, String)> = std::mem::take(&mut read.junk);
            for (name, why) in &over {
                self.report(rec, name, why, warn);
            }
            if n > over.len() {
                let line = format!(
                    "sandbox '{}': {} more entries of outbox/new over {} bytes or not regular files; moved to outbox/junk/ in its mail volume",
                    rec.name,
                    n - over.len(),
                    mailbox::message::MAX_FILE
                );
                self.say(rec, &line, line.clone(), warn);
            }
            let again = self.archive(rec, &outbox, room.saturating_sub(read.bytes))?;
            read.carried.extend(again.carried);
            read.junk = again.junk;
            read.end = again.end;
        }
        let mut whole = read.end == End::Whole;
        done.out = read.carried.iter().filter(|(_, new)| *new).count();
        let mut moved = Vec::new();
        for (name, why) in &read.junk {
            self.report(rec, name, why, warn);
            // Names that a shell word cannot hold are left and reported once.
            let word = !name.is_empty() && !name.contains('/') && !name.starts_with('-');
            // Over the limit: the sweep of the next pass takes it.
            if word && read.end != End::Over && moved.len() < BATCH {
                moved.push(name.clone());
            }
        }
        if !running {
            // Carried all the same (idempotent); acknowledged once it runs.
            if whole {
                self.behind.remove(&rec.name);
            }
            return Ok(done);
        }
        let names: Vec<String> = read.carried.into_iter().map(|(n, _)| n).collect();
        for chunk in names.chunks(BATCH) {
            self.script(rec, ACK, chunk, "acknowledge carried messages in")?;
        }
        if !moved.is_empty() {
            let (code, _, _) = self
                .sb
                .exec_args(&rec.container, &Self::user(rec), JUNK, &moved)?;
            if code == 0 {
                done.junk += moved.len();
            }
            // More than one exec's worth: the rest next pass.
            whole &= moved.len() < BATCH;
        }
        if whole {
            self.behind.remove(&rec.name);
        }
        Ok(done)
    }

    /// Reads the archive of the volume's `outbox/new/`, carrying at most
    /// `room` bytes of it (outbox.rs).
    fn archive(&self, rec: &Record, outbox: &Maildir, room: u64) -> Result<Read1> {
        // The archive is read as it streams, by a thread: an outbox of any
        // size never sits in memory, only each message in turn.
        let (reader, mut writer) = std::io::pipe()
            .map_err(|e| Error::new(Exit::IoErr, format!("cannot make a pipe: {e}")))?;
        let target = outbox.clone();
        let parser = std::thread::spawn(move || read_outbox(reader, &target, room));
        let copied = self.sb.engine.copy_out(
            &rec.container,
            &format!("{MAILBOX}/outbox/new"),
            &mut writer,
        );
        drop(writer);
        let read = parser
            .join()
            .map_err(|_| Error::new(Exit::Software, "the outbox reader panicked"))??;
        // A read ended early broke the pipe on purpose.
        if read.end == End::Whole {
            copied?;
        }
        Ok(read)
    }

    /// Says once that `name` in the sandbox's `outbox/new/` is not a
    /// message; past [`NAMED`] names, says once that further ones go
    /// unnamed.
    fn report(&mut self, rec: &Record, name: &str, why: &str, warn: &mut dyn FnMut(&str)) {
        let line = format!(
            "sandbox '{}': outbox/new/{} is not a message ({why}); moved to outbox/junk/ in its mail volume",
            rec.name,
            base::visible::visible_line(name)
        );
        self.say(rec, name, line, warn);
    }

    /// Says `line` once per `key` of the sandbox, at most [`NAMED`] lines
    /// of it, then once that further junk goes unnamed: a sandbox that
    /// plants without end costs the courier's log a bounded number of lines.
    fn say(&mut self, rec: &Record, key: &str, line: String, warn: &mut dyn FnMut(&str)) {
        let said = self.said.entry(rec.name.clone()).or_default();
        if *said > NAMED || self.reported.contains(&(rec.name.clone(), key.to_string())) {
            return;
        }
        *said += 1;
        if *said > NAMED {
            warn(&format!(
                "sandbox '{}': more entries of outbox/new are not messages; they are moved to outbox/junk/ in its mail volume, no longer named here",
                rec.name
            ));
            return;
        }
        self.reported.insert((rec.name.clone(), key.to_string()));
        warn(&line);
    }

    fn carry_in(&mut self, rec: &Record, status: Status) -> Result<Carried> {
        let inbox = self.sb.root.sandbox(&rec.name).inbox();
        let pending = pending(&inbox);
        let mut done = Carried::default();
        let (mut known, mut looked) = self
            .inside
            .remove(&rec.name)
            .unwrap_or_else(|| (HashSet::new(), Instant::now()));
        // Claimed, or gone from the root: nothing to remember.
        let now: HashSet<&String> = pending.iter().collect();
        known.retain(|n| now.contains(n));
        let fresh: Vec<String> = pending
            .iter()
            .filter(|n| !known.contains(*n))
            .cloned()
            .collect();
        let res = (|| -> Result<()> {
            for chunk in fresh.chunks(BATCH) {
                let mut t = crate::sandbox::volume::TarBuf::new();
                let tag = copy_tag();
                let mut sent = Vec::new();
                for n in chunk {
                    // Claimed or removed meanwhile: the next pass says.
                    if let Some(bytes) = read_message_file(&inbox.sub(Sub::New).join(n)) {
                        t.file(&format!("{n}.{tag}"), &bytes, 0o600, rec.uid);
                        sent.push(n.clone());
                    }
                }
                if sent.is_empty() {
                    continue;
                }
                self.sb.engine.copy_in(
                    &rec.container,
                    &format!("{MAILBOX}/inbox/tmp"),
                    Box::new(t.finish()),
                )?;
                let mut args = vec![tag];
                args.extend(sent.iter().cloned());
                let out = self.script(rec, DELIVER, &args, "deliver into the inbox of")?;
                let acked = self.claim_acked(&inbox, &out, &mut done)?;
                for n in sent {
                    if !acked.contains(&n) {
                        done.into += 1;
                        known.insert(n);
                    }
                }
            }
            // The ones inside and not acked yet: looked up now and then.
            let old: Vec<String> = known
                .iter()
                .filter(|n| !fresh.contains(*n))
                .cloned()
                .collect();
            let now = match status {
                Status::Now => true,
                Status::Timed => looked.elapsed() >= RECHECK,
                Status::Later => false,
            };
            if old.is_empty() || !now {
                return Ok(());
            }
            looked = Instant::now();
            self.recheck(rec, &inbox, &old, &mut known, &mut done)
        })();
        self.inside.insert(rec.name.clone(), (known, looked));
        res.map(|()| done)
    }

    /// Looks up `old` (delivered into the volume, not acked when last
    /// seen): claims the acked ones' root copies, and forgets those acked
    /// or gone from the volume (removed inside: sent again).
    fn recheck(
        &self,
        rec: &Record,
        inbox: &Maildir,
        old: &[String],
        known: &mut HashSet<String>,
        done: &mut Carried,
    ) -> Result<()> {
        for chunk in old.chunks(BATCH) {
            let out = self.script(rec, STATUS, chunk, "read the inbox of")?;
            let acked = self.claim_acked(inbox, &out, done)?;
            let there: HashSet<&str> = out.lines().filter_map(|l| l.strip_prefix("new ")).collect();
            for n in chunk {
                if acked.contains(n) || !there.contains(n.as_str()) {
                    known.remove(n);
                }
            }
        }
        Ok(())
    }

    /// Claims the root's copy of each `cur NAME` line (acked inside): the
    /// names claimed.
    fn claim_acked(
        &self,
        inbox: &Maildir,
        out: &str,
        done: &mut Carried,
    ) -> Result<HashSet<String>> {
        let mut acked = HashSet::new();
        for n in out.lines().filter_map(|l| l.strip_prefix("cur ")) {
            if inbox.claim(std::ffi::OsStr::new(n))? {
                done.read += 1;
            }
            acked.insert(n.to_string());
        }
        Ok(acked)
    }
}

/// The names in the host inbox's `new/` that are messages to carry:
/// regular files named by the id grammar (the mediator writes nothing else).
fn pending(inbox: &Maildir) -> Vec<String> {
    let Ok(names) = inbox.names(Sub::New) else {
        return vec![];
    };
    names
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| base::id::is_valid(n))
        .filter(|n| {
            std::fs::symlink_metadata(inbox.sub(Sub::New).join(n))
                .is_ok_and(|m| m.file_type().is_file() && m.nlink() == 1)
        })
        .collect()
}

/// A message file of the host's inbox, read without following links, at
/// most the message-file limit.
fn read_message_file(p: &std::path::Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = std::fs::File::options()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(p)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut b = Vec::new();
    f.take(message::MAX_FILE + 1).read_to_end(&mut b).ok()?;
    (b.len() as u64 <= message::MAX_FILE).then_some(b)
}

/// Bytes of the root's copy of a sandbox's outbox waiting for the mediator.
fn waiting(outbox: &Maildir) -> u64 {
    let Ok(names) = outbox.names(Sub::New) else {
        return 0;
    };
    let new = outbox.sub(Sub::New);
    names
        .iter()
        .filter_map(|n| std::fs::symlink_metadata(new.join(n)).ok())
        .map(|m| m.len())
        .sum()
}
