//! [`HostPaths`] on the Docker Engine API: a container made (never started)
//! from any image the engine has, with the directory bind-mounted read-only,
//! and the file read back through the archive endpoint (`docker cp`), which
//! mounts a stopped container's binds.  No image needs a shell or `cat`.

use std::io::Read;
use std::path::Path;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters as qp;
use futures_util::StreamExt;

use super::{DockerEngine, status_of};
use crate::HostPaths;
use base::error::{Error, Exit, Result};

const TARGET: &str = "/lw-probe";

impl HostPaths for DockerEngine {
    fn address(&self) -> String {
        self.host().to_string()
    }

    fn engine_id(&self) -> Result<String> {
        let info = self
            .block_on(self.client().info())
            .map_err(|e| self.err("cannot ask the engine its identity", e))?;
        Ok(info
            .id
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| self.host().to_string()))
    }

    fn read_through_bind(&self, dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
        let docker = self.client();
        let images = self
            .block_on(docker.list_images(None::<qp::ListImagesOptions>))
            .map_err(|e| self.err("cannot list the engine's images", e))?;
        let Some(image) = images.first().map(|i| i.id.clone()) else {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot tell whether the engine at {} sees this host's files: it has no image to make a probe container from; build or load one (lw-build)",
                    self.host()
                ),
            ));
        };
        let cname = format!(
            "lw-probe-{}",
            name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        );
        let body = probe_body(image, dir, name);
        let opts = qp::CreateContainerOptions {
            name: Some(cname.clone()),
            ..Default::default()
        };
        match self.block_on(docker.create_container(Some(opts), body)) {
            Ok(_) => {}
            // A bind source the engine cannot find on its side.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 400,
                message,
            }) if message.contains("does not exist") => return Ok(None),
            Err(e) => return Err(self.err("cannot make the probe container", e)),
        }
        let read = self.block_on(async {
            let mut stream = docker.download_from_container(
                &cname,
                Some(qp::DownloadFromContainerOptions {
                    path: format!("{TARGET}/{name}"),
                }),
            );
            let mut tar = Vec::new();
            while let Some(chunk) = stream.next().await {
                tar.extend_from_slice(&chunk?);
            }
            Ok::<_, bollard::errors::Error>(tar)
        });
        let removed = self.block_on(docker.remove_container(
            &cname,
            Some(qp::RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        ));
        let tar = match read {
            Ok(t) => t,
            Err(e) if status_of(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(self.err("cannot read through the probe container", e)),
        };
        removed.map_err(|e| self.err(&format!("cannot remove probe container '{cname}'"), e))?;
        first_file(&tar)
    }
}

/// A container of `image` that would show `dir` at [`TARGET`], read-only,
/// with no network; its command is never run.
fn probe_body(image: String, dir: &Path, name: &str) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image),
        cmd: Some(vec![format!("{TARGET}/{name}")]),
        entrypoint: Some(vec![]),
        network_disabled: Some(true),
        labels: Some([("loopwright.probe".to_string(), "1".to_string())].into()),
        host_config: Some(HostConfig {
            mounts: Some(vec![Mount {
                target: Some(TARGET.to_string()),
                source: Some(dir.display().to_string()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            }]),
            network_mode: Some("none".to_string()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The content of the first regular file in a tar archive.
fn first_file(tar: &[u8]) -> Result<Option<Vec<u8>>> {
    let bad = |e: std::io::Error| {
        Error::new(
            Exit::Unavailable,
            format!("the engine's archive of the probe file is unreadable: {e}"),
        )
    };
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if entry.header().entry_type().is_file() {
            let mut out = Vec::new();
            entry.read_to_end(&mut out).map_err(bad)?;
            return Ok(Some(out));
        }
    }
    Ok(None)
}
