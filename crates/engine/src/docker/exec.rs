//! An exec on the Docker Engine, raced against its container's death:
//! [`Engine::exec`](crate::Engine::exec) and
//! [`SandboxEngine::exec_io`](crate::SandboxEngine::exec_io) both
//! run here (stdin fed from the caller, a terminal when asked).
//!
//! Docker does not always end an exec's stream when its container dies.
//! Under gVisor (runsc), a sandbox kernel that dies (a fork bomb at the pids
//! limit: status 2; the memory limit's OOM kill of the whole sandbox) leaves
//! dockerd unable to file the exec's exit ("exit event ... no such
//! container" in its log), and the attach stream stays open for ever (an
//! exec hung 3 and 10 minutes, issue 29).  So every exec also waits on its
//! container (`POST /containers/ID/wait?condition=not-running`, the engine's
//! own notice, no polling) and, when that answers first, reads what output
//! is still in flight for at most [`DRAIN`], then asks the engine how the
//! container ended and returns it as a [`Died`] (69).  An inspect must
//! agree that it is not running; where the wait fails or answers early (an
//! engine that refuses it, a connection that broke), an inspect every
//! [`POLL`] stands in for it: the exec itself is never ended by a failed
//! watch.
//!
//! The exec's own status passes through while the container lives.  Under
//! runc a container's death kills the exec's processes (137), and the
//! engine may file that before the container's end, so an exec that
//! SIGKILL ended waits up to [`KILLED`] for the wait to answer before its
//! status is believed.

use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters as qp;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{DockerEngine, api_err, status_of};
use crate::died::{DRAIN, KILLED, POLL, RUNTIME_FAILED};
use crate::{Died, ExecIo, ExecRequest, OutStream};
use base::error::{Error, Exit, Result};

/// An exec may stream a whole repository's pack (push) or run for hours (shell).
const LONG: Duration = Duration::from_secs(24 * 3600);

/// An exec's attached streams.
type Output = std::pin::Pin<
    Box<
        dyn futures_util::Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>>
            + Send,
    >,
>;
type Input = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

impl DockerEngine {
    /// Runs `req` in `container` with `io` attached; returns its status, or
    /// 69 with a [`Died`] when the container ended while it ran.
    pub(crate) fn exec_attached(
        &self,
        container: &str,
        req: &ExecRequest,
        io: ExecIo<'_>,
    ) -> Result<i64> {
        let host = self.host().to_string();
        let cmd = req.cmd.join(" ");
        let what = format!("cannot run {cmd:?} in container '{container}'");
        let ExecIo {
            stdin,
            tty,
            size,
            on_output,
            stop,
        } = io;
        let cfg = ExecConfig {
            attach_stdin: Some(stdin.is_some()),
            tty: Some(tty),
            ..super::exec_config(req)
        };
        let docker = self.client().clone().with_timeout(LONG);
        let rx = crate::stdin::pump(stdin);
        let err = |e| api_err(&host, &what, e);
        self.block_on(async {
            let created = docker.create_exec(container, cfg).await.map_err(err)?;
            let death = dead(&docker, container);
            tokio::pin!(death);
            let opts = StartExecOptions {
                detach: false,
                tty,
                output_capacity: Some(64 * 1024),
            };
            let mut ended = Ended::Output;
            if let StartExecResults::Attached { output, input } = docker
                .start_exec(&created.id, Some(opts))
                .await
                .map_err(err)?
            {
                let streams = Streams {
                    docker: &docker,
                    exec: &created.id,
                    tty,
                    size,
                    on_output,
                    stop,
                };
                ended = streams
                    .run(output, input, rx, &mut death)
                    .await
                    .map_err(err)?;
            }
            match ended {
                Ended::Output => {}
                Ended::Died => return Err(dead_err(&docker, container, &cmd).await),
                // The attach connection went with the streams; the engine
                // leaves the command running (it is the caller's to end).
                Ended::Stopped => return Ok(crate::STOPPED),
            }
            let code = docker
                .inspect_exec(&created.id)
                .await
                .map_err(err)?
                .exit_code;
            // Killed (SIGKILL), or never filed as ended: the container's
            // death may be why, and the engine may file the exec's end
            // before the container's.  128 is the runtime failing the
            // exec itself (gVisor's `waiting on pid N ... EOF` when its
            // kernel went down with the OOM-killed sandbox): its death
            // may take longer to be filed, so it is waited for longer.
            let grace = match code {
                None | Some(137) => Some(KILLED),
                Some(128) => Some(RUNTIME_FAILED),
                _ => None,
            };
            if let Some(grace) = grace
                && tokio::time::timeout(grace, &mut death).await.is_ok()
            {
                return Err(dead_err(&docker, container, &cmd).await);
            }
            code.ok_or_else(|| {
                Error::new(
                    Exit::Software,
                    format!("{what}: the engine reported no exit status"),
                )
            })
        })
    }
}

/// An attached exec's streams, and where its output goes.
struct Streams<'a, 'o> {
    docker: &'a Docker,
    exec: &'a str,
    tty: bool,
    size: Option<(u16, u16)>,
    on_output: &'o mut dyn FnMut(OutStream, &[u8]),
    stop: Option<&'o std::sync::atomic::AtomicBool>,
}

/// Why an attached exec's streams were let go.
enum Ended {
    /// Its output ended.
    Output,
    /// Its container died first.
    Died,
    /// The caller set [`ExecIo::stop`].
    Stopped,
}

fn resize((h, w): (u16, u16)) -> qp::ResizeExecOptions {
    qp::ResizeExecOptions {
        h: h.into(),
        w: w.into(),
    }
}

impl Streams<'_, '_> {
    /// Passes output on and feeds stdin (from `rx`) until the output ends,
    /// `death` resolves first (after what was in flight is drained), or the
    /// caller stops it: then the streams are dropped at once, which closes
    /// the attach connection.  A local terminal's resizes follow it to the
    /// exec's.
    async fn run<D: std::future::Future<Output = ()>>(
        self,
        mut output: Output,
        mut input: Input,
        mut rx: tokio::sync::mpsc::Receiver<Option<Vec<u8>>>,
        death: &mut std::pin::Pin<&mut D>,
    ) -> std::result::Result<Ended, bollard::errors::Error> {
        let Streams {
            docker,
            exec,
            tty,
            size,
            on_output,
            stop,
        } = self;
        let stopped = || stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed));
        if let Some(s) = size {
            let _ = docker.resize_exec(exec, resize(s)).await;
        }
        let mut stdin_open = true;
        let mut winch = if tty && size.is_some() {
            use tokio::signal::unix::{SignalKind, signal};
            signal(SignalKind::window_change()).ok()
        } else {
            None
        };
        let mut on_chunk = |c: LogOutput| match c {
            LogOutput::StdOut { message } | LogOutput::Console { message } => {
                on_output(OutStream::Stdout, &message)
            }
            LogOutput::StdErr { message } => on_output(OutStream::Stderr, &message),
            LogOutput::StdIn { .. } => {}
        };
        loop {
            tokio::select! {
                () = &mut *death => {
                    // What the container wrote before it died may still
                    // be on its way.
                    let until = tokio::time::Instant::now() + DRAIN;
                    while let Ok(Some(Ok(c))) =
                        tokio::time::timeout_at(until, output.next()).await
                    {
                        on_chunk(c);
                    }
                    return Ok(Ended::Died);
                }
                Some(()) = async { match winch.as_mut() { Some(w) => w.recv().await, None => None } } => {
                    if let Some(s) = crate::tty::size() {
                        let _ = docker.resize_exec(exec, resize(s)).await;
                    }
                }
                chunk = output.next() => match chunk {
                    None => return Ok(Ended::Output),
                    Some(Ok(c)) => {
                        on_chunk(c);
                        if stopped() {
                            return Ok(Ended::Stopped);
                        }
                    }
                    // A command that exits with input unread leaves bytes
                    // in the engine's socket, and its close is then a
                    // reset: the exec ended, and its status says how.
                    Some(Err(e)) => {
                        return if exec_ended(docker, exec).await { Ok(Ended::Output) } else { Err(e) };
                    }
                },
                data = rx.recv(), if stdin_open => match data {
                    Some(Some(bytes)) => {
                        // The command may have closed its stdin; its output says the rest.
                        if input.write_all(&bytes).await.is_err() {
                            stdin_open = false;
                        }
                    }
                    _ => {
                        stdin_open = false;
                        let _ = input.shutdown().await;
                    }
                },
            }
        }
    }
}

/// True when the engine files `exec`'s end within [`KILLED`] (its stream
/// may break as it ends, before the end is filed; that is no fault of the
/// engine's).  An engine that cannot be asked has not.
async fn exec_ended(docker: &Docker, exec: &str) -> bool {
    let until = tokio::time::Instant::now() + KILLED;
    loop {
        match docker.inspect_exec(exec).await {
            Ok(i) if i.running == Some(false) && i.exit_code.is_some() => return true,
            Ok(_) if tokio::time::Instant::now() < until => {
                // The engine gives no notice of an exec's end but its
                // stream, which is what broke.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            _ => return false,
        }
    }
}

/// The error of an exec whose container is no longer running.
async fn dead_err(docker: &Docker, container: &str, cmd: &str) -> Error {
    let d = ended(docker, container, cmd).await.unwrap_or_else(|| Died {
        container: container.to_string(),
        cmd: cmd.to_string(),
        ..Default::default()
    });
    d.into_error()
}

/// Resolves once `container` is no longer running: when the engine's
/// wait answers and an inspect agrees; while they disagree (an engine that
/// answers the wait at once, or refuses it), an inspect every [`POLL`].
async fn dead(docker: &Docker, container: &str) {
    let opts = qp::WaitContainerOptions {
        condition: "not-running".into(),
    };
    // Any answer, a status other than 0 (an error of bollard's) included.
    let _ = docker.wait_container(container, Some(opts)).next().await;
    while ended(docker, container, "").await.is_none() {
        tokio::time::sleep(POLL).await;
    }
}

/// How `container` ended, as the engine says; `None` while it runs (or
/// when the engine cannot say: a watch that cannot see must not end an
/// exec).
async fn ended(docker: &Docker, container: &str, cmd: &str) -> Option<Died> {
    let mut d = Died {
        container: container.to_string(),
        cmd: cmd.to_string(),
        ..Default::default()
    };
    match docker
        .inspect_container(container, None::<qp::InspectContainerOptions>)
        .await
    {
        Ok(c) => {
            let s = c.state.unwrap_or_default();
            if s.running.unwrap_or(false) {
                return None;
            }
            d.code = s.exit_code;
            d.oom_killed = s.oom_killed.unwrap_or(false);
            d.error = s.error.unwrap_or_default();
            d.finished = s.finished_at.unwrap_or_default();
            d.runtime = c.host_config.and_then(|h| h.runtime).unwrap_or_default();
        }
        Err(e) if status_of(&e) == Some(404) => d.removed = true,
        Err(_) => return None,
    }
    Some(d)
}
