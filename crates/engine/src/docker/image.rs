//! Image archives in and out of the Docker engine (`docker save`, `docker
//! load`) and an image's layer digests: [`ImageTransfer`] on the Engine API.
//!
//! Archives stream: a save is written to the caller's writer chunk by chunk
//! and a load reads the caller's file in chunks, so an image of gigabytes
//! never sits in memory.  Both take as long as the bytes take, so they run
//! without bollard's two-minute request limit.

use std::io::{Read, Write};

use bollard::query_parameters as qp;
use futures_util::StreamExt;

use super::{BUILD_TIMEOUT, DockerEngine, status_of};
use crate::ImageTransfer;
use crate::error::{Error, Exit, Result};

const CHUNK: usize = 1 << 20;

impl ImageTransfer for DockerEngine {
    fn save_images(&self, references: &[&str], out: &mut dyn Write) -> Result<u64> {
        let docker = self.client().clone().with_timeout(BUILD_TIMEOUT);
        let what = format!("cannot save {}", references.join(" "));
        self.block_on(async {
            let mut stream = docker.export_images(references);
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

    fn load_images(&self, archive: std::fs::File) -> Result<Vec<String>> {
        let docker = self.client().clone().with_timeout(BUILD_TIMEOUT);
        let body = futures_util::stream::unfold(archive, |mut f| async move {
            let mut buf = vec![0u8; CHUNK];
            match f.read(&mut buf) {
                Ok(0) => None,
                Ok(k) => {
                    buf.truncate(k);
                    Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), f))
                }
                Err(e) => Some((Err(e), f)),
            }
        });
        let opts = qp::ImportImageOptions {
            quiet: true,
            ..Default::default()
        };
        self.block_on(async {
            let mut stream = docker.import_image_stream(opts, body, None);
            let mut loaded = Vec::new();
            while let Some(info) = stream.next().await {
                let info = info.map_err(|e| match e {
                    bollard::errors::Error::DockerStreamError { error } => {
                        Error::data(format!("the engine refused the image archive: {error}"))
                    }
                    e => self.err("cannot load the image archive", e),
                })?;
                if let Some(s) = info.stream.as_deref() {
                    for line in s.lines() {
                        if let Some(r) = line
                            .strip_prefix("Loaded image: ")
                            .or_else(|| line.strip_prefix("Loaded image ID: "))
                        {
                            loaded.push(r.trim().to_string());
                        }
                    }
                }
            }
            Ok(loaded)
        })
    }

    fn image_layers(&self, reference: &str) -> Result<Option<Vec<String>>> {
        match self.block_on(self.client().inspect_image(reference)) {
            Ok(i) => Ok(Some(i.root_fs.and_then(|r| r.layers).unwrap_or_default())),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.err(&format!("cannot inspect image '{reference}'"), e)),
        }
    }
}
