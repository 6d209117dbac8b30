//! `DOCKER_HOST=ssh://[USER@]HOST[:PORT][/SOCKET]`: the engine's socket on
//! HOST (`/var/run/docker.sock`, or SOCKET) reached through the system's
//! `ssh` client, as the Docker CLI reaches it, with whatever `ssh` reads:
//! `~/.ssh/config`, keys, agent, `known_hosts`.  bollard's own `ssh` feature
//! needs a crate this project does not build with; the client it would
//! spawn is the same program.
//!
//! One tunnel per connection: `ssh -L LOCAL:SOCKET HOST` forwards a unix
//! socket in a private directory (mode 0700) to the engine's, and bollard
//! speaks HTTP over it as over any local socket.  The remote command prints
//! a line once the session is up (local forwards are listening before the
//! session opens) and then reads its standard input, which is a pipe from
//! this process: when this process ends, however it ends, the pipe closes,
//! the remote command ends and so does `ssh`.  Dropping the tunnel ends it
//! at once and removes the directory.
//!
//! `ssh` runs non-interactively (`BatchMode`: no password or host-key
//! prompt), so a host key that `known_hosts` does not hold, or a login
//! without a key, is exit 69 with ssh's own words.  `LW_SSH_COMMAND`
//! replaces `ssh` (split on white space, like `GIT_SSH_COMMAND`), e.g.
//! `ssh -F /etc/loopwright/ssh_config`.

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use base::error::{Error, Exit, Result};

/// The engine's socket when the address names none.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// What the remote command prints once the session (and so the forward) is up.
const READY: &str = "lw-ssh-ready";

/// What an `ssh://` address says.
#[derive(Debug, PartialEq, Eq)]
struct Address {
    user: Option<String>,
    host: String,
    port: Option<u16>,
    socket: String,
}

/// Reads `ssh://[USER@]HOST[:PORT][/SOCKET]`; anything else is 78.
fn parse(addr: &str) -> Result<Address> {
    let bad = |why: &str| {
        Error::config(format!(
            "DOCKER_HOST '{addr}': {why}; write ssh://[USER@]HOST[:PORT][/SOCKET]"
        ))
    };
    let rest = addr
        .strip_prefix("ssh://")
        .ok_or_else(|| bad("not ssh://"))?;
    let (authority, socket) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, DEFAULT_SOCKET.to_string()),
    };
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| bad("an unclosed '['"))?;
        match after.strip_prefix(':') {
            Some(p) => (h.to_string(), Some(p)),
            None if after.is_empty() => (h.to_string(), None),
            None => return Err(bad("text after ']'")),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| bad("the port is not a number"))?,
        ),
        None => None,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    // Nothing of the address may read as an option of ssh's.
    if host.starts_with('-')
        || user
            .as_deref()
            .is_some_and(|u| u.is_empty() || u.starts_with('-'))
    {
        return Err(bad("a host or user may not be empty or start with '-'"));
    }
    if socket.contains(char::is_whitespace) || socket.contains(':') {
        return Err(bad("the socket path may hold no white space or ':'"));
    }
    Ok(Address {
        user,
        host,
        port,
        socket,
    })
}

/// The `ssh` command line: `LW_SSH_COMMAND`, else `ssh`.
fn ssh_command() -> Vec<String> {
    let words: Vec<String> = std::env::var("LW_SSH_COMMAND")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if words.is_empty() {
        vec!["ssh".into()]
    } else {
        words
    }
}

/// An open tunnel to an engine's socket; ended on drop.
pub(super) struct Tunnel {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
    socket: PathBuf,
}

impl Tunnel {
    /// Opens the tunnel `addr` names and waits until its local socket
    /// listens (or ssh has ended, saying why: 69).
    pub(super) fn open(addr: &str) -> Result<Tunnel> {
        Tunnel::open_with(addr, ssh_command())
    }

    /// [`Tunnel::open`] with the `ssh` command line `words`.
    fn open_with(addr: &str, words: Vec<String>) -> Result<Tunnel> {
        let a = parse(addr)?;
        let tmp = std::env::temp_dir();
        let dir = tmp.join(format!(
            "lw-ssh-{}-{}",
            std::process::id(),
            base::id::new_id().rsplit('.').next().unwrap_or("0")
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                Error::new(
                    Exit::CantCreat,
                    format!("cannot make {} for the ssh tunnel: {e}", dir.display()),
                )
            })?;
        sweep(&tmp, &dir);
        let socket = dir.join("engine.sock");
        let log = dir.join("ssh.err");
        let mut cmd = Command::new(&words[0]);
        cmd.args(&words[1..])
            .args(["-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes"])
            .args(["-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15"])
            .arg("-T")
            .arg("-L")
            .arg(format!("{}:{}", socket.display(), a.socket));
        if let Some(p) = a.port {
            cmd.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &a.user {
            cmd.arg("-l").arg(u);
        }
        cmd.arg("--")
            .arg(&a.host)
            .arg(format!("echo {READY} && exec cat >/dev/null"));
        let stderr = std::fs::File::create(&log).map_err(|e| {
            Error::new(
                Exit::CantCreat,
                format!("cannot make {}: {e}", log.display()),
            )
        })?;
        let spawned = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "cannot reach the Docker engine at {addr}: cannot run '{}': {e}; install the OpenSSH client or set LW_SSH_COMMAND",
                        words[0]
                    ),
                ));
            }
        };
        let stdin = child.stdin.take();
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        let mut t = Tunnel {
            child,
            stdin,
            dir,
            socket,
        };
        if matches!(read, Some(Ok(_))) && line.trim() == READY && t.socket.exists() {
            return Ok(t);
        }
        // ssh ended (or the far side said something else): say why.
        t.stdin = None;
        let _ = t.child.kill();
        let _ = t.child.wait();
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        Err(Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach the Docker engine at {addr} through ssh: {}; check that `{} {}` logs in without a prompt (a key, and the host's key in known_hosts) and that {} is the engine's socket there",
                last_words(&said, &line),
                words.join(" "),
                a.host,
                a.socket
            ),
        ))
    }

    /// The local end, a unix socket.
    pub(super) fn socket(&self) -> &Path {
        &self.socket
    }
}

/// Removes the tunnel directories (`lw-ssh-PID-*` in `tmp`, owned by the
/// owner of `mine`) of processes that ended without dropping their tunnel:
/// a courier ended by SIGTERM, anything SIGKILLed.  Their ssh ended with
/// them (its standard input closed); the directory and its dead socket
/// stay until the next tunnel is opened.
fn sweep(tmp: &Path, mine: &Path) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(uid) = std::fs::metadata(mine).map(|m| m.uid()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix("lw-ssh-"))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else {
            continue;
        };
        let alive = running(pid);
        let own = e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == uid);
        if !alive && own {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` runs: it exists and is not a zombie (a courier
/// ended by SIGTERM stays one until whoever adopted it reaps it).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// ssh's own reason: its last lines that are not warnings about known hosts.
fn last_words(stderr: &str, stdout: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Warning: Permanently added"))
        .collect();
    match lines.len() {
        0 if stdout.trim().is_empty() => "ssh ended without a word".into(),
        0 => format!("the far side answered '{}'", stdout.trim()),
        n => lines[n.saturating_sub(3)..].join(" / "),
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_options_are_refused() {
        let a = parse("ssh://root@10.0.0.2").unwrap();
        assert_eq!(
            a,
            Address {
                user: Some("root".into()),
                host: "10.0.0.2".into(),
                port: None,
                socket: DEFAULT_SOCKET.into()
            }
        );
        let a = parse("ssh://build.example:2222/run/podman/podman.sock").unwrap();
        assert_eq!(
            (a.user, a.host.as_str(), a.port, a.socket.as_str()),
            (None, "build.example", Some(2222), "/run/podman/podman.sock")
        );
        let a = parse("ssh://me@[fd00::2]:22").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("fd00::2", Some(22)));
        for bad in [
            "ssh://",
            "ssh://-oProxyCommand=x",
            "ssh://-l@host",
            "ssh://@host",
            "ssh://host:port",
            "ssh://[fd00::2",
            "ssh://host/a b",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit, Exit::Config, "{bad}: {}", e.msg);
            assert!(e.msg.contains(bad), "{}", e.msg);
        }
    }

    #[test]
    fn tunnel_dirs_of_ended_processes_are_swept() {
        let tmp = std::env::temp_dir().join(format!("lw-ssh-sweep-test-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        // A pid that has ended: a child, waited for.
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let dead = c.id();
        c.wait().unwrap();
        let mine = tmp.join(format!("lw-ssh-{}-a", std::process::id()));
        let stale = tmp.join(format!("lw-ssh-{dead}-b"));
        let other = tmp.join("lw-ssh-notapid-c");
        for d in [&mine, &stale, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("ssh.err"), "").unwrap();
        }
        assert!(running(std::process::id()) && !running(dead));
        sweep(&tmp, &mine);
        assert!(mine.exists() && other.exists());
        assert!(!stale.exists(), "{} was swept", stale.display());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn a_missing_client_is_unavailable_and_leaves_nothing() {
        let words = vec!["/nonexistent/ssh".to_string(), "-v".to_string()];
        let e = Tunnel::open_with("ssh://root@192.0.2.1", words)
            .err()
            .unwrap();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(
            e.msg.contains("/nonexistent/ssh") && e.msg.contains("LW_SSH_COMMAND"),
            "{}",
            e.msg
        );
        let mine = format!("lw-ssh-{}-", std::process::id());
        let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
