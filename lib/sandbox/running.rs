//! A made sandbox at work: started and stopped (its egress and model
//! proxies with it), and commands run in it as its user: lw-sandbox's own
//! (the secrets, counting unpushed work) and the user's (`exec`, `shell`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Duration;

use super::{Network, Record, Sandboxes, disk, gone};
use base::error::{Error, Exit, Result};
use engine::{Container, ExecIo, ExecRequest, NetworkEngine, OutStream};
use wall::egress;
use wall::secrets::{self, Secret};
use wall::{LABEL_ROOT, REPO, WORK};

impl<'a> Sandboxes<'a> {
    /// Runs a command in a sandbox as its user, capturing its output.
    pub fn run(
        &self,
        rec: &Record,
        cmd: &[&str],
        stdin: Option<Vec<u8>>,
    ) -> Result<(i64, Vec<u8>, Vec<u8>)> {
        self.run_io(
            rec,
            cmd,
            stdin.map(|b| Box::new(std::io::Cursor::new(b)) as Box<dyn std::io::Read + Send>),
        )
    }

    /// [`Sandboxes::run`] with `stdin` streamed from a reader.
    pub(super) fn run_fed(
        &self,
        rec: &Record,
        cmd: &[&str],
        stdin: Box<dyn std::io::Read + Send>,
    ) -> Result<(i64, Vec<u8>, Vec<u8>)> {
        self.run_io(rec, cmd, Some(stdin))
    }

    fn run_io(
        &self,
        rec: &Record,
        cmd: &[&str],
        stdin: Option<Box<dyn std::io::Read + Send>>,
    ) -> Result<(i64, Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let req = ExecRequest {
            cmd: wall::confined(
                rec.runtime_name(),
                cmd.iter().map(|s| s.to_string()).collect(),
            ),
            env: vec![],
            user: Some(format!("{0}:{0}", rec.uid)),
            workdir: Some(WORK.into()),
        };
        let mut on = |s: OutStream, b: &[u8]| match s {
            OutStream::Stdout => out.extend_from_slice(b),
            OutStream::Stderr => err.extend_from_slice(b),
        };
        let io = ExecIo {
            stdin,
            tty: false,
            size: None,
            on_output: &mut on,
            stop: None,
        };
        let code = self
            .engine
            .exec_io(&rec.container, &req, io)
            .map_err(|e| died_under(&rec.name, Some(&cmd.join(" ")), e))?;
        Ok((code, out, err))
    }

    /// The container of a ready sandbox, started (without its secrets: only
    /// lw-sandbox's own git runs) if it was stopped; `Container::running`
    /// says whether it was running before.
    pub(super) fn running(&self, rec: &Record) -> Result<Container> {
        let c = self.engine.inspect(&rec.container)?.ok_or_else(|| {
            Error::new(
                Exit::NoInput,
                format!(
                    "the container of sandbox '{}' ('{}') is gone; its workspace cannot be reached; lw-sandbox gc reclaims the rest",
                    rec.name, rec.container
                ),
            )
        })?;
        if !c.running {
            self.mount_disks(rec)?;
            self.engine.start(&rec.container)?;
        }
        Ok(c)
    }

    /// Mounts the sandbox's disk images again (after a reboot) before its
    /// container starts: started without them, it would write the host's disk.
    pub(super) fn mount_disks(&self, rec: &Record) -> Result<()> {
        let name = &rec.name;
        for d in [disk::work(&self.root, name), disk::mail(&self.root, name)] {
            if d.image.exists() {
                d.mount()?;
            }
        }
        if super::scratch::needed(rec.runtime_name()) {
            // Still mounted unless the host rebooted; then at the default
            // size (the record does not keep the project's).
            super::scratch::make(&self.root, name, super::DEFAULT_TMP_SIZE)?;
        }
        Ok(())
    }

    /// Writes the sandbox's secrets from the environment into its tmpfs.
    pub(super) fn install_secrets(&self, rec: &Record, secrets: &[Secret]) -> Result<()> {
        for s in secrets {
            let cmd = secrets::install_cmd(&s.name);
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let (code, _, err) = self.run(rec, &cmd, Some(s.value.clone()))?;
            if code != 0 {
                return Err(Error::new(
                    Exit::Software,
                    format!(
                        "cannot write secret '{}' into sandbox '{}': {}",
                        s.name,
                        rec.name,
                        base::visible::visible(String::from_utf8_lossy(&err).trim())
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Starts a stopped sandbox, writes its secrets again and runs its
    /// postStartCommand (its output to `say`, a line at a time); a running
    /// one gets its secrets again, and no postStartCommand.
    pub fn start(&self, name: &str, say: &mut dyn FnMut(&str)) -> Result<Record> {
        let rec = self.get(name)?;
        let secrets = secrets::resolve(&rec.secrets, &|n| std::env::var_os(n))?;
        // The values it was made with, or none: the door knows those
        // (crates/mailbox/src/door_record.rs), and would pass another.
        mailbox::door_record::DoorRecord::new(&self.root).check(name, &|n| std::env::var_os(n))?;
        let c = self
            .engine
            .inspect(&rec.container)?
            .ok_or_else(|| gone(&rec))?;
        // The proxy first: a sandbox started without it has no network.
        if rec.network == Network::Egress {
            let nets: &dyn NetworkEngine = self.engine;
            egress::start_proxy(nets, &rec.container, Duration::from_secs(30))?;
            // On Kubernetes the proxy's pod was made again: it goes back
            // behind its Service (made again, labelled as create made it,
            // if it was lost; a no-op on Docker, whose alias stays).
            let labels = BTreeMap::from([
                (egress::LABEL_EGRESS.to_string(), "proxy".to_string()),
                (egress::LABEL_KEY.to_string(), rec.container.clone()),
                (LABEL_ROOT.to_string(), self.id.clone()),
            ]);
            nets.publish(
                &egress::proxy_name(&rec.container),
                egress::squid::PORT,
                &labels,
            )?;
            self.start_model_proxy(&rec)?;
        }
        if !c.running {
            self.mount_disks(&rec)?;
            self.engine.start(&rec.container)?;
        }
        self.install_secrets(&rec, &secrets)?;
        if c.running {
            // Not a start: the command ran when it did start.
            return Ok(rec);
        }
        self.post_start(&rec, say).map_err(|e| {
            Error::new(
                e.exit,
                format!(
                    "{}; it is started all the same (lw-sandbox stop {name} stops it)",
                    e.msg
                ),
            )
        })?;
        Ok(rec)
    }

    pub fn stop(&self, name: &str) -> Result<Record> {
        let rec = self.get(name)?;
        match self.engine.inspect(&rec.container)? {
            None => Err(gone(&rec)),
            Some(_) => {
                self.engine.stop(&rec.container, Duration::from_secs(10))?;
                let proxy = egress::proxy_name(&rec.container);
                if rec.network == Network::Egress && self.engine.inspect(&proxy)?.is_some() {
                    self.engine.stop(&proxy, Duration::from_secs(10))?;
                }
                self.stop_model_proxy(&rec)?;
                Ok(rec)
            }
        }
    }

    /// Commits on the sandbox's branch that no upstream ref holds, and
    /// uncommitted changes, as the sandbox's own git sees them after a fetch
    /// from the mirror.  The numbers are parsed strictly: the sandbox writes them.
    pub fn unpushed(&self, rec: &Record) -> Result<(u64, u64, String)> {
        let script = "cd /work/repo || exit 3; git fetch -q origin 2>/dev/null; \
            echo \"$(git rev-list --count \"refs/heads/$1\" --not --remotes=origin)\"; \
            echo \"$(git status --porcelain | wc -l)\"; \
            git log --oneline -n 20 \"refs/heads/$1\" --not --remotes=origin";
        let (code, out, err) = self.run(
            rec,
            &["/bin/sh", "-c", script, "lw-unpushed", &rec.branch],
            None,
        )?;
        let text = String::from_utf8_lossy(&out);
        let mut lines = text.lines();
        let n = lines.next().and_then(|l| l.trim().parse::<u64>().ok());
        let dirty = lines.next().and_then(|l| l.trim().parse::<u64>().ok());
        match (code, n, dirty) {
            (0, Some(n), Some(d)) => Ok((n, d, lines.collect::<Vec<_>>().join("\n"))),
            _ => Err(Error::new(
                Exit::Software,
                format!(
                    "cannot count unpushed commits in sandbox '{}' (exit {code}): {}",
                    rec.name,
                    base::visible::visible(String::from_utf8_lossy(&err).trim())
                ),
            )),
        }
    }

    /// `exec` and `shell`: runs `cmd` in a running sandbox as its user, with
    /// this process's standard input, output and error (a terminal in raw
    /// mode when `tty`); returns the command's status.
    pub fn attach(
        &self,
        name: &str,
        cmd: Vec<String>,
        tty: bool,
        workdir: Option<String>,
    ) -> Result<i64> {
        let rec = self.get(name)?;
        match self.engine.inspect(&rec.container)? {
            Some(c) if c.running => {}
            Some(_) => {
                return Err(Error::new(
                    Exit::Unavailable,
                    format!("sandbox '{name}' is stopped; lw-sandbox start {name}"),
                ));
            }
            None => return Err(gone(&rec)),
        }
        let term = std::env::var("TERM").unwrap_or_else(|_| "xterm".into());
        let shown = cmd.join(" ");
        let req = ExecRequest {
            cmd: wall::confined(rec.runtime_name(), cmd),
            env: if tty {
                vec![format!("TERM={term}")]
            } else {
                vec![]
            },
            user: Some(format!("{0}:{0}", rec.uid)),
            workdir: Some(workdir.unwrap_or_else(|| REPO.into())),
        };
        let _raw = tty.then(engine::tty::RawMode::enter);
        let mut stdout = std::io::stdout().lock();
        let mut stderr = std::io::stderr();
        let mut on = |s: OutStream, b: &[u8]| {
            // Flushed at once: git's transport (push) converses through us.
            let _ = match s {
                OutStream::Stdout => stdout.write_all(b).and_then(|_| stdout.flush()),
                OutStream::Stderr => stderr.write_all(b),
            };
        };
        let io = ExecIo {
            stdin: Some(Box::new(std::io::stdin())),
            tty,
            size: engine::tty::size(),
            on_output: &mut on,
            stop: None,
        };
        self.engine
            .exec_io(&rec.container, &req, io)
            .map_err(|e| died_under(name, Some(&shown), e))
    }
}

/// An exec's error as the sandbox's own: when its container died under
/// the command (the engine's [`engine::Died`]), 69 naming the sandbox,
/// how it ended and how to bring it back; any other error as it is.  `cmd`
/// is the command as its caller knows it (else the engine's, unconfined).
pub(crate) fn died_under(name: &str, cmd: Option<&str>, e: Error) -> Error {
    let Some(d) = engine::died(&e) else {
        return e;
    };
    let confine = format!("{}/{} -- ", wall::BIN_DIR, wall::CONFINE);
    let cmd = cmd.unwrap_or_else(|| d.cmd.strip_prefix(&confine).unwrap_or(&d.cmd));
    let fix = if d.removed {
        "lw-sandbox gc reclaims the rest".to_string()
    } else if d.oom_killed {
        format!(
            "lw-sandbox start {name} brings it back; give it more memory (sandbox.memory, \
             create --memory) or make the command use less"
        )
    } else if d.gvisor() && d.code.is_some_and(|c| (1..=128).contains(&c)) {
        // lib/sandbox/scratch.rs: gVisor's kernel needs host tasks of
        // its own, and dies when its pids limit refuses one.
        format!(
            "lw-sandbox start {name} brings it back; under gVisor a storm of processes at \
             its pids limit (sandbox.pids, create --pids) ends its kernel"
        )
    } else {
        format!("lw-sandbox start {name} brings it back")
    };
    Error::new(
        Exit::Unavailable,
        format!(
            "sandbox '{name}' {} while '{cmd}' ran in it: {d}; {fix}",
            d.state()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::Died;

    #[test]
    fn a_container_that_died_under_an_exec_is_named_as_its_sandbox() {
        let d = Died {
            container: "lw-sb-0-a".into(),
            cmd: "/usr/local/bin/lw-confine -- sh -c x".into(),
            code: Some(137),
            oom_killed: true,
            runtime: "runsc".into(),
            ..Default::default()
        };
        let e = died_under("a", None, d.into_error());
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(
            e.msg
                .starts_with("sandbox 'a' exited (OOM) while 'sh -c x' ran in it: "),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("lw-sandbox start a"), "{}", e.msg);
        assert!(!e.msg.contains("lw-confine"), "{}", e.msg);
        let sentry = Died {
            code: Some(2),
            runtime: "runsc".into(),
            ..Default::default()
        };
        let e = died_under("b", Some("make"), sentry.into_error());
        assert!(
            e.msg.starts_with("sandbox 'b' exited (2) while 'make'"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("pids limit"), "{}", e.msg);
        let killed = Died {
            code: Some(137),
            runtime: "runsc".into(),
            ..Default::default()
        };
        let e = died_under("b", Some("make"), killed.into_error());
        assert!(
            e.msg
                .ends_with("it was killed (signal 9); lw-sandbox start b brings it back"),
            "{}",
            e.msg
        );
        let other = Error::new(Exit::NoInput, "x");
        assert_eq!(died_under("a", None, other).msg, "x");
    }
}
