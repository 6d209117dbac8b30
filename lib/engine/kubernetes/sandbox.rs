//! [`SandboxEngine`] on Kubernetes: pods by label (and stopped pods kept as
//! manifests), named volumes as PersistentVolumeClaims, and exec through
//! the pods/exec subresource over WebSocket with standard input fed from
//! the caller and a terminal when asked.
//!
//! A named volume is a PVC of [`VOLUME_SIZE`] in the cluster's default
//! StorageClass: it outlives pods like a Docker volume does, which a
//! sandbox's clone must.  A cluster without a dynamic provisioner leaves the
//! claim Pending, and a pod mounting it waits; `start` says so when it
//! gives up.  Scratch space that lives and dies with one pod (tmpfs) is an
//! `emptyDir` (pod.rs).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{AttachParams, DeleteParams, ListParams, PostParams, TerminalSize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{KubeEngine, pod};
use crate::engine::{Container, ExecIo, ExecRequest, OutStream, SandboxEngine, Volume};
use crate::error::{Error, Exit, Result};

/// The size a named volume's claim asks for.
pub const VOLUME_SIZE: &str = "1Gi";

impl KubeEngine {
    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client().clone(), &self.target().namespace)
    }
}

impl SandboxEngine for KubeEngine {
    fn containers_with_label(&self, label: &str) -> Result<Vec<Container>> {
        self.labelled(label)
    }

    fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        pod::check_name("volume", name)?;
        let what = format!("cannot create volume '{name}'");
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(pod::object_labels(labels)),
                annotations: Some(BTreeMap::from([(
                    pod::LABELS_ANNOTATION.to_string(),
                    serde_json::to_string(labels).unwrap_or_default(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(VOLUME_SIZE.into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        match self.block_on(self.claims().create(&PostParams::default(), &claim)) {
            Ok(_) => Ok(()),
            // An existing one is reused, as the contract says.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(self.err("create", "persistentvolumeclaims", &what, e)),
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
fn wrapped(req: &ExecRequest) -> Vec<String> {
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

pub(super) fn exec_streams(
    engine: &KubeEngine,
    container: &str,
    req: &ExecRequest,
    io: ExecIo<'_>,
) -> Result<i64> {
    let what = format!("cannot run {:?} in pod '{container}'", req.cmd.join(" "));
    let pods: Api<Pod> = Api::namespaced(engine.client().clone(), &engine.target().namespace);
    if let Some(user) = &req.user {
        let p = engine
            .block_on(pods.get(container))
            .map_err(|e| engine.err("get", "pods", &what, e))?;
        let want: Option<i64> = user.split(':').next().and_then(|u| u.parse().ok());
        if want.is_none() || want != pod_uid(&p) {
            return Err(Error::usage(format!(
                "{what}: Kubernetes runs an exec as the pod's own user ({}), not as '{user}'",
                pod_uid(&p).map_or("the image's".into(), |u| format!("uid {u}"))
            )));
        }
    }
    let ExecIo {
        stdin,
        tty,
        size,
        on_output,
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
    let mut rx = crate::engine::stdin::pump(stdin);
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
        let mut out = proc.stdout();
        let mut err = proc.stderr();
        let mut input = proc.stdin();
        let mut obuf = vec![0u8; 64 * 1024];
        let mut ebuf = vec![0u8; 64 * 1024];
        let mut stdin_open = has_stdin;
        while out.is_some() || err.is_some() {
            tokio::select! {
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
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        let joined = proc.join().await;
        match (exit_status(status, &what), joined) {
            (Ok(code), _) => Ok(code),
            (Err(e), Err(j)) => Err(Error::new(e.exit, format!("{} ({j})", e.msg))),
            (Err(e), Ok(())) => Err(e),
        }
    })
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
