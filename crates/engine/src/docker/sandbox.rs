//! [`SandboxEngine`] on the Docker Engine: containers and volumes by label,
//! named volumes, and an exec whose standard input is fed from the caller,
//! with a terminal when asked (`shell`, `exec`, the transport of `push`,
//! secrets written without touching argv; exec.rs runs it).

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::time::Duration;

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters as qp;
use futures_util::StreamExt;

use super::DockerEngine;
use crate::{Container, ExecIo, ExecRequest, PortMap, SandboxEngine, Volume};
use base::error::{Error, Exit, Result};

/// An exec may stream a whole repository's pack (push) or run for hours (shell).
const LONG: Duration = Duration::from_secs(24 * 3600);

fn label_filter(label: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec![label.to_string()])])
}

impl SandboxEngine for DockerEngine {
    fn containers_with_label(&self, label: &str) -> Result<Vec<Container>> {
        let opts = qp::ListContainersOptions {
            all: true,
            filters: Some(label_filter(label)),
            ..Default::default()
        };
        let list = self
            .block_on(self.client().list_containers(Some(opts)))
            .map_err(|e| self.err(&format!("cannot list containers labelled '{label}'"), e))?;
        let mut out: Vec<Container> = list
            .into_iter()
            .map(|c| {
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                let mut ports: Vec<PortMap> = c
                    .ports
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|p| {
                        let typ = p.typ.map(|t| t.to_string()).unwrap_or_else(|| "tcp".into());
                        Some(PortMap {
                            container: format!("{}/{typ}", p.private_port),
                            host_ip: p.ip.unwrap_or_default(),
                            host_port: p.public_port?,
                        })
                    })
                    .collect();
                ports.sort_by(|a, b| (&a.container, a.host_port).cmp(&(&b.container, b.host_port)));
                Container {
                    id: c.id.unwrap_or_default(),
                    name: c
                        .names
                        .unwrap_or_default()
                        .first()
                        .map(|n| n.trim_start_matches('/').to_string())
                        .unwrap_or_default(),
                    image: c.image_id.unwrap_or_default(),
                    running: state == "running",
                    status: state,
                    exit_code: None,
                    oom_killed: false,
                    labels: c.labels.unwrap_or_default().into_iter().collect(),
                    ports,
                    // The list does not say; inspect does.
                    runtime: String::new(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn create_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let req = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels.clone().into_iter().collect()),
            ..Default::default()
        };
        self.block_on(self.client().create_volume(req))
            .map(|_| ())
            .map_err(|e| self.err(&format!("cannot create volume '{name}'"), e))
    }

    fn remove_volume(&self, name: &str) -> Result<()> {
        let opts = qp::RemoveVolumeOptions { force: false };
        match self.block_on(self.client().remove_volume(name, Some(opts))) {
            Ok(()) => Ok(()),
            Err(e) if super::status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.err(&format!("cannot remove volume '{name}'"), e)),
        }
    }

    fn volumes_with_label(&self, label: &str) -> Result<Vec<Volume>> {
        let opts = qp::ListVolumesOptions {
            filters: Some(label_filter(label)),
        };
        let list = self
            .block_on(self.client().list_volumes(Some(opts)))
            .map_err(|e| self.err(&format!("cannot list volumes labelled '{label}'"), e))?;
        let mut out: Vec<Volume> = list
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| Volume {
                name: v.name,
                labels: v.labels.into_iter().collect(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn copy_in(&self, container: &str, dir: &str, tar: Box<dyn Read + Send>) -> Result<()> {
        let docker = self.client().clone().with_timeout(LONG);
        let what = format!("cannot copy into '{dir}' of container '{container}'");
        let body = futures_util::stream::unfold(tar, |mut r| async move {
            let mut buf = vec![0u8; 256 * 1024];
            match r.read(&mut buf) {
                Ok(0) => None,
                Ok(k) => {
                    buf.truncate(k);
                    Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), r))
                }
                Err(e) => Some((Err(e), r)),
            }
        });
        let opts = qp::UploadToContainerOptions {
            path: dir.to_string(),
            ..Default::default()
        };
        self.block_on(docker.upload_to_container(
            container,
            Some(opts),
            bollard::body_try_stream(body),
        ))
        .map_err(|e| self.err(&what, e))
    }

    fn copy_out(&self, container: &str, path: &str, out: &mut dyn Write) -> Result<u64> {
        let docker = self.client().clone().with_timeout(LONG);
        let what = format!("cannot copy '{path}' out of container '{container}'");
        self.block_on(async {
            let mut stream = docker.download_from_container(
                container,
                Some(qp::DownloadFromContainerOptions {
                    path: path.to_string(),
                }),
            );
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| self.err(&what, e))?;
                out.write_all(&chunk)
                    .map_err(|e| Error::new(Exit::IoErr, format!("{what}: cannot write: {e}")))?;
                n += chunk.len() as u64;
            }
            Ok(n)
        })
    }

    fn exec_io(&self, container: &str, req: &ExecRequest, io: ExecIo<'_>) -> Result<i64> {
        self.exec_attached(container, req, io)
    }
}
