//! [`SandboxEngine`] on Kubernetes: pods by label (and stopped pods kept as
//! manifests), named volumes as PersistentVolumeClaims, and exec through
//! the pods/exec subresource over WebSocket with standard input fed from
//! the caller and a terminal when asked.
//!
//! An exec watches its pod meanwhile, as the Docker engine's does
//! (docker/exec.rs): when the pod's container ends or the pod goes first,
//! the exec ends with 69 and a [`Died`] rather than wait on a stream the
//! runtime may never close (gVisor's, when its kernel dies).
//!
//! A named volume is a PVC sized, classed and shared as storage.rs says
//! (`sandbox.disk`, `kube.storage-class`, `kube.access-mode`): it outlives pods like a Docker volume does, which a
//! sandbox's clone must.  A cluster without a dynamic provisioner leaves the
//! claim Pending, and a pod mounting it waits; `start` says so when it
//! gives up.  Scratch space that lives and dies with one pod (tmpfs) is an
//! `emptyDir` (pod.rs).

use std::collections::BTreeMap;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{
    AttachParams, DeleteParams, ListParams, PostParams, TerminalSize, WatchEvent, WatchParams,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{KubeEngine, pod};
use crate::died::{DRAIN, KILLED, POLL};
use crate::{Container, Died, ExecIo, ExecRequest, OutStream, SandboxEngine, Volume};
use base::error::{Error, Exit, Result};

impl KubeEngine {
    pub(super) fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client().clone(), &self.target().namespace)
    }

    /// Whether claim `name` is there and being deleted (a list by name:
    /// `get` on claims is not in the Role).
    fn claim_terminating(&self, name: &str, what: &str) -> Result<bool> {
        let lp = ListParams::default().fields(&format!("metadata.name={name}"));
        let list = self
            .block_on(self.claims().list(&lp))
            .map_err(|e| self.err("list", "persistentvolumeclaims", what, e))?;
        Ok(list
            .items
            .iter()
            .any(|c| c.metadata.deletion_timestamp.is_some()))
    }
}

impl SandboxEngine for KubeEngine {
    fn containers_with_label(&self, label: &str) -> Result<Vec<Container>> {
        self.labelled(label)
    }

    fn warm_pool(&self) -> Option<&dyn crate::WarmPool> {
        Some(self)
    }

    fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        pod::check_name("volume", name)?;
        let what = format!("cannot create volume '{name}'");
        let claim = self.storage().claim(name, labels);
        let deadline = std::time::Instant::now() + super::REMOVE_TIMEOUT;
        loop {
            match self.block_on(self.claims().create(&PostParams::default(), &claim)) {
                Ok(_) => return Ok(()),
                // An existing one is reused, as the contract says; one
                // being deleted (a failed create's tools claim, gone once
                // its last pod is) is waited for and made again: a pod
                // mounting it would never start.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    if !self.claim_terminating(name, &what)? {
                        return Ok(());
                    }
                    if std::time::Instant::now() >= deadline {
                        return Err(Error::new(
                            Exit::TempFail,
                            format!(
                                "{what}: a claim of that name is still being deleted after {} s",
                                super::REMOVE_TIMEOUT.as_secs()
                            ),
                        ));
                    }
                    // Watching claims is not in the Role (access.rs), so
                    // the rare wait is a list each 200 ms.
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => return Err(self.err("create", "persistentvolumeclaims", &what, e)),
            }
        }
    }

    fn remove_volume(&self, name: &str) -> Result<()> {
        let what = format!("cannot remove volume '{name}'");
        match self.block_on(self.claims().delete(name, &DeleteParams::default())) {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.err("delete", "persistentvolumeclaims", &what, e)),
        }
    }

    fn volumes_with_label(&self, label: &str) -> Result<Vec<Volume>> {
        let what = format!("cannot list volumes labelled '{label}'");
        let lp = ListParams::default().labels(&pod::selector(label)?);
        let list = self
            .block_on(self.claims().list(&lp))
            .map_err(|e| self.err("list", "persistentvolumeclaims", &what, e))?;
        let mut out: Vec<Volume> = list
            .items
            .into_iter()
            // One being deleted is gone as far as a caller can tell.
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| Volume {
                name: c.metadata.name.clone().unwrap_or_default(),
                labels: c
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(pod::LABELS_ANNOTATION))
                    .and_then(|j| serde_json::from_str(j).ok())
                    .unwrap_or_else(|| c.metadata.labels.clone().unwrap_or_default()),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn exec_io(&self, container: &str, req: &ExecRequest, io: ExecIo<'_>) -> Result<i64> {
        exec_streams(self, container, req, io)
    }

    fn runs_as_root(&self) -> bool {
        false
    }
}

/// The command that gives `req` its directory and environment, which the
/// exec subresource does not take.
pub(super) fn wrapped(req: &ExecRequest) -> Vec<String> {
    let mut cmd = Vec::new();
    if let Some(dir) = &req.workdir {
        cmd.extend([
            "sh".to_string(),
            "-c".into(),
            "cd \"$0\" && exec \"$@\"".into(),
            dir.clone(),
        ]);
    }
    if !req.env.is_empty() {
        cmd.push("env".into());
        cmd.extend(req.env.iter().cloned());
    }
    cmd.extend(req.cmd.iter().cloned());
    cmd
}

/// The uid a pod's main container runs as, when its manifest says.
fn pod_uid(p: &Pod) -> Option<i64> {
    let spec = p.spec.as_ref()?;
    spec.containers
        .iter()
        .find(|c| c.name == pod::MAIN)
        .and_then(|c| c.security_context.as_ref()?.run_as_user)
        .or_else(|| spec.security_context.as_ref()?.run_as_user)
}

/// An exec's end as an exit status: `Success` is 0, `NonZeroExitCode` its
/// code; a command that could not be started 127 (not found) or 126.
fn exit_status(
    s: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>,
    what: &str,
) -> Result<i64> {
    let Some(s) = s else {
        return Err(Error::new(
            Exit::Unavailable,
            format!("{what}: the API server closed the stream without an exit status"),
        ));
    };
    if s.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if s.reason.as_deref() == Some("NonZeroExitCode")
        && let Some(code) = s
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref()?.parse::<i64>().ok())
    {
        return Ok(code);
    }
    let msg = s.message.unwrap_or_default();
    if msg.contains("executable file not found") || msg.contains("no such file or directory") {
        return Ok(127);
    }
    if msg.contains("permission denied") {
        return Ok(126);
    }
    Err(Error::new(Exit::Unavailable, format!("{what}: {msg}")))
}

/// A user an exec may run as: the pod's own, or none named.
fn check_user(p: &Pod, req: &ExecRequest, what: &str) -> Result<()> {
    let Some(user) = &req.user else {
        return Ok(());
    };
    let want: Option<i64> = user.split(':').next().and_then(|u| u.parse().ok());
    if want.is_none() || want != pod_uid(p) {
        return Err(Error::usage(format!(
            "{what}: Kubernetes runs an exec as the pod's own user ({}), not as '{user}'",
            pod_uid(p).map_or("the image's".into(), |u| format!("uid {u}"))
        )));
    }
    Ok(())
}

pub(super) fn exec_streams(
    engine: &KubeEngine,
    container: &str,
    req: &ExecRequest,
    io: ExecIo<'_>,
) -> Result<i64> {
    let what = format!("cannot run {:?} in pod '{container}'", req.cmd.join(" "));
    let pods: Api<Pod> = Api::namespaced(engine.client().clone(), &engine.target().namespace);
    let p = engine
        .block_on(pods.get(container))
        .map_err(|e| engine.err("get", "pods", &what, e))?;
    check_user(&p, req, &what)?;
    let req = &*super::pool::with_pod_env(&p, req)?;
    let ExecIo {
        stdin,
        tty,
        size,
        on_output,
        stop,
    } = io;
    let ap = AttachParams {
        container: Some(pod::MAIN.into()),
        stdin: stdin.is_some(),
        stdout: true,
        stderr: !tty,
        tty,
        max_stdin_buf_size: Some(64 * 1024),
        max_stdout_buf_size: Some(64 * 1024),
        max_stderr_buf_size: Some(64 * 1024),
    };
    let has_stdin = stdin.is_some();
    let rx = crate::stdin::pump(stdin);
    let cmd = wrapped(req);
    engine.block_on(async {
        let mut proc = pods
            .exec(container, cmd, &ap)
            .await
            .map_err(|e| engine.err("create", "pods/exec", &what, e))?;
        if let (Some(mut resize), Some((h, w))) = (proc.terminal_size(), size) {
            use futures_util::SinkExt;
            let _ = resize
                .send(TerminalSize {
                    width: w,
                    height: h,
                })
                .await;
        }
        let status = proc.take_status();
        let shown = req.cmd.join(" ");
        let death = pod_death(&pods, container, &shown);
        tokio::pin!(death);
        let streams = (proc.stdout(), proc.stderr(), proc.stdin());
        match relay(streams, (rx, has_stdin), &mut death, on_output, stop).await {
            Relayed::Output => {}
            Relayed::Died(d) => return Err(d.into_error()),
            Relayed::Stopped => {
                // The streams went with relay; the task that holds the
                // WebSocket is ended and awaited, so the connection is
                // closed before this returns (an aborted task is only
                // dropped when the runtime next runs it).  The API server
                // then closes the exec's streams: a command still writing
                // gets SIGPIPE, one blocked on a kubelet that does not
                // close them is the caller's to end (as copy_out does).
                proc.abort();
                let _ = proc.join().await;
                return Ok(crate::STOPPED);
            }
        }
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        let joined = proc.join().await;
        let ended = match (exit_status(status, &what), joined) {
            (Ok(code), _) => Ok(code),
            (Err(e), Err(j)) => Err(Error::new(e.exit, format!("{} ({j})", e.msg))),
            (Err(e), Ok(())) => Err(e),
        };
        // Killed, or no status: the container's death may be why, filed a
        // moment after the exec's end.
        if !matches!(ended, Ok(c) if c != 128 + 9)
            && let Ok(d) = tokio::time::timeout(KILLED, &mut death).await
        {
            return Err(d.into_error());
        }
        ended
    })
}

/// Why [`relay`] returned.
#[derive(Debug)]
enum Relayed {
    /// Both outputs ended.
    Output,
    /// The container died (after what was in flight was read).
    Died(Died),
    /// The caller set [`ExecIo::stop`]: nothing more was read.
    Stopped,
}

/// Passes an exec's output (stdout, stderr) on and feeds its stdin from
/// `rx` (when `stdin_open`) until both outputs end, `death` resolves (then
/// what was in flight is read for [`DRAIN`] and the death returned), or
/// `stop` is set: then it returns at once, reading nothing more.
async fn relay<O, E, I, D>(
    (mut out, mut err, mut input): (Option<O>, Option<E>, Option<I>),
    (mut rx, mut stdin_open): (tokio::sync::mpsc::Receiver<Option<Vec<u8>>>, bool),
    death: &mut std::pin::Pin<&mut D>,
    on_output: &mut dyn FnMut(OutStream, &[u8]),
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Relayed
where
    O: tokio::io::AsyncRead + Unpin,
    E: tokio::io::AsyncRead + Unpin,
    I: tokio::io::AsyncWrite + Unpin,
    D: std::future::Future<Output = Died>,
{
    let mut obuf = vec![0u8; 64 * 1024];
    let mut ebuf = vec![0u8; 64 * 1024];
    let mut died: Option<Died> = None;
    let mut drained = tokio::time::Instant::now();
    let stopped = || stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
    while out.is_some() || err.is_some() {
        if stopped() {
            return Relayed::Stopped;
        }
        tokio::select! {
            d = &mut *death, if died.is_none() => {
                // What the container wrote before it died may still
                // be on its way.
                died = Some(d);
                drained = tokio::time::Instant::now() + DRAIN;
            }
            () = tokio::time::sleep_until(drained), if died.is_some() => break,
            n = async { out.as_mut().unwrap().read(&mut obuf).await }, if out.is_some() => match n {
                Ok(0) | Err(_) => out = None,
                Ok(n) => on_output(OutStream::Stdout, &obuf[..n]),
            },
            n = async { err.as_mut().unwrap().read(&mut ebuf).await }, if err.is_some() => match n {
                Ok(0) | Err(_) => err = None,
                Ok(n) => on_output(OutStream::Stderr, &ebuf[..n]),
            },
            data = rx.recv(), if stdin_open => match (data, input.as_mut()) {
                (Some(Some(bytes)), Some(w)) => {
                    // The command may have closed its stdin; its output says the rest.
                    if w.write_all(&bytes).await.is_err() {
                        stdin_open = false;
                        input = None;
                    }
                }
                _ => {
                    stdin_open = false;
                    if let Some(mut w) = input.take() {
                        let _ = w.shutdown().await;
                    }
                }
            },
        }
    }
    match died {
        Some(d) => Relayed::Died(d),
        None => Relayed::Output,
    }
}

/// Resolves, with how it ended, once pod `name`'s container no longer runs
/// or the pod is gone: a list of it, then a watch from the list's version
/// (again when a watch times out; `KubeEngine::pod_now` says why not the
/// pod's own).  A failed get or watch ends nothing: it is asked
/// again after [`POLL`], or, forbidden, never (the exec runs on unwatched,
/// as it did before).
async fn pod_death(pods: &Api<Pod>, name: &str, cmd: &str) -> Died {
    let gone = || Died {
        container: name.to_string(),
        cmd: cmd.to_string(),
        removed: true,
        ..Default::default()
    };
    loop {
        let rv = match KubeEngine::pod_now(pods, name).await {
            Ok((None, _)) => return gone(),
            Ok((Some(p), rv)) => match pod_ended(&p, cmd) {
                Some(d) => return d,
                None => rv,
            },
            Err(kube::Error::Api(s)) if s.code == 403 => std::future::pending().await,
            Err(_) => {
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let watched = tokio::time::Instant::now();
        let mut events = match pods.watch(&wp, &rv).await {
            Ok(s) => s.boxed(),
            Err(_) => {
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        while let Ok(Some(ev)) = events.try_next().await {
            match ev {
                // A stop deletes the pod: its last state says how it ended.
                WatchEvent::Deleted(p) => return pod_ended(&p, cmd).unwrap_or_else(gone),
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    if let Some(d) = pod_ended(&p, cmd) {
                        return d;
                    }
                }
                WatchEvent::Error(_) => break,
                WatchEvent::Bookmark(_) => {}
            }
        }
        // A watch that ended at once (an error event, a broken stream) is
        // not asked again at once: that would be a get and a watch a loop
        // for as long as the exec runs (a courier's ring runs for days).
        if watched.elapsed() < POLL {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// How pod `p`'s container ended, `None` while it runs.
fn pod_ended(p: &Pod, cmd: &str) -> Option<Died> {
    let c = pod::container_of(p);
    if c.running {
        return None;
    }
    Some(Died {
        container: c.name,
        cmd: cmd.to_string(),
        code: c.exit_code,
        oom_killed: c.oom_killed,
        runtime: c.runtime,
        error: main_message(p),
        ..Default::default()
    })
}

/// The reason and message the kubelet gave for the main container's end.
fn main_message(p: &Pod) -> String {
    let t = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == pod::MAIN))
        .and_then(|c| c.state.as_ref()?.terminated.as_ref());
    match t {
        Some(t) => [t.reason.as_deref(), t.message.as_deref()]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty() && *s != "OOMKilled" && *s != "Completed" && *s != "Error")
            .collect::<Vec<_>>()
            .join(": "),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

    #[test]
    fn directory_and_environment_wrap_the_command() {
        let req = ExecRequest {
            cmd: vec!["id".into(), "-u".into()],
            env: vec!["A=1".into()],
            workdir: Some("/work".into()),
            user: None,
        };
        assert_eq!(
            wrapped(&req),
            [
                "sh",
                "-c",
                "cd \"$0\" && exec \"$@\"",
                "/work",
                "env",
                "A=1",
                "id",
                "-u"
            ]
        );
    }

    #[test]
    fn a_pod_whose_container_ended_is_a_death_and_a_running_one_is_not() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
            PodStatus,
        };
        let pod = |phase: &str, state: ContainerState| Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("lw-sb-x-a".into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: pod::MAIN.into(),
                    state: Some(state),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        assert_eq!(pod_ended(&pod("Running", running), "make"), None);
        let oom = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("OOMKilled".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = pod_ended(&pod("Failed", oom), "make").expect("a death");
        assert_eq!(
            (d.container.as_str(), d.code, d.oom_killed, d.error.as_str()),
            ("lw-sb-x-a", Some(137), true, "")
        );
        assert_eq!(d.state(), "exited (OOM)");
        let crashed = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 2,
                reason: Some("Error".into()),
                message: Some("sentry died".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let d = pod_ended(&pod("Failed", crashed), "make").expect("a death");
        assert_eq!(
            (d.state().as_str(), d.error.as_str()),
            ("exited (2)", "sentry died")
        );
    }

    /// Runs `relay` over an output without end (`tokio::io::repeat`), a
    /// container that never dies and no stdin, for at most 10 s.
    fn relay_endless(stop_after: u64) -> (Option<Relayed>, u64) {
        let rt = crate::io_runtime().expect("a runtime");
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut seen = 0u64;
        let mut on = |_: OutStream, b: &[u8]| {
            seen += b.len() as u64;
            if seen >= stop_after {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let r = rt.block_on(async {
            let death = std::future::pending::<Died>();
            tokio::pin!(death);
            let (_tx, rx) = tokio::sync::mpsc::channel(1);
            let streams = (
                Some(tokio::io::repeat(b'x')),
                Some(tokio::io::empty()),
                None::<tokio::io::Sink>,
            );
            let relayed = relay(streams, (rx, false), &mut death, &mut on, Some(&stop));
            tokio::time::timeout(std::time::Duration::from_secs(10), relayed)
                .await
                .ok()
        });
        (r, seen)
    }

    #[test]
    fn a_stopped_exec_reads_no_more_of_an_output_without_end() {
        // The old relay read to the output's end: here, never (10 s, then
        // `None`).
        let (r, seen) = relay_endless(1 << 20);
        assert!(
            matches!(r, Some(Relayed::Stopped)),
            "relay returned {r:?} after {seen} bytes"
        );
        // At most the chunk in hand past the stop.
        assert!(seen < (1 << 20) + (64 << 10), "{seen} bytes read");
    }

    #[test]
    fn statuses_become_exit_codes() {
        let ok = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(exit_status(Some(ok), "x").unwrap(), 0);
        let three = Status {
            status: Some("Failure".into()),
            reason: Some("NonZeroExitCode".into()),
            details: Some(StatusDetails {
                causes: Some(vec![StatusCause {
                    reason: Some("ExitCode".into()),
                    message: Some("3".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(exit_status(Some(three), "x").unwrap(), 3);
        assert_eq!(exit_status(None, "x").unwrap_err().exit, Exit::Unavailable);
    }
}
