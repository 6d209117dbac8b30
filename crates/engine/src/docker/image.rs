//! The image builder contract on the Engine API: lookups, tags, builds
//! with their output streamed, and image archives in and out of the engine
//! (`docker save`, `docker load`) with an image's layer digests.
//!
//! Archives stream: a save is written to the caller's writer chunk by chunk
//! and a load reads the caller's file in chunks, so an image of gigabytes
//! never sits in memory.  Both take as long as the bytes take, so they run
//! without bollard's two-minute request limit.

use std::collections::HashMap;
use std::io::{Read, Write};

use bollard::query_parameters as qp;
use futures_util::StreamExt;

use super::{BUILD_TIMEOUT, DockerEngine, api_err, labels_of, status_of};
use crate::{BuildEvent, BuildOutcome, BuildRequest, Image, ImageBuilder, Images};
use base::error::{Error, Exit, Result};

const CHUNK: usize = 1 << 20;

impl Images for DockerEngine {
    fn image(&self, reference: &str) -> Result<Option<Image>> {
        match self.rt.block_on(self.docker.inspect_image(reference)) {
            Ok(i) => Ok(Some(Image {
                id: i.id.unwrap_or_default(),
                tags: i.repo_tags.unwrap_or_default(),
                labels: labels_of(i.config.and_then(|c| c.labels)),
                created: i
                    .created
                    .and_then(|d| base::time::parse_rfc3339(&d.to_string()))
                    .map_or(0, |t| t.as_secs() as i64),
            })),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.err(&format!("cannot inspect image '{reference}'"), e)),
        }
    }

    fn images_with_label(&self, label: &str) -> Result<Vec<Image>> {
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![label.to_string()]);
        let opts = qp::ListImagesOptions {
            filters: Some(filters),
            ..Default::default()
        };
        let list = self
            .rt
            .block_on(self.docker.list_images(Some(opts)))
            .map_err(|e| self.err(&format!("cannot list images labelled '{label}'"), e))?;
        let mut out: Vec<Image> = list
            .into_iter()
            .map(|s| Image {
                id: s.id,
                tags: s.repo_tags,
                labels: s.labels.into_iter().collect(),
                created: s.created,
            })
            .collect();
        out.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
        Ok(out)
    }
}

impl ImageBuilder for DockerEngine {
    fn tag(&self, image: &str, repo: &str, tag: &str) -> Result<()> {
        let opts = qp::TagImageOptions {
            repo: Some(repo.to_string()),
            tag: Some(tag.to_string()),
        };
        self.rt
            .block_on(self.docker.tag_image(image, Some(opts)))
            .map_err(|e| self.err(&format!("cannot tag '{image}' as '{repo}:{tag}'"), e))
    }

    fn remove_image(&self, reference: &str, force: bool) -> Result<()> {
        let opts = qp::RemoveImageOptions {
            force,
            ..Default::default()
        };
        match self
            .rt
            .block_on(self.docker.remove_image(reference, Some(opts), None))
        {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.err(&format!("cannot remove image '{reference}'"), e)),
        }
    }

    /// A build whose answer the engine broke off midway (the stream, not
    /// the build, failed: "bytes remaining on stream" under load) is asked
    /// once more; the layer cache keeps the steps already done.
    fn build(
        &self,
        req: &BuildRequest,
        on_event: &mut dyn FnMut(BuildEvent),
    ) -> Result<BuildOutcome> {
        let why = match self.build_once(req, on_event)? {
            Attempt::Done(o) => return Ok(o),
            Attempt::Broken(why) => why,
        };
        on_event(BuildEvent::Status(format!(
            "the engine broke off the build's answer ({why}); asking once more"
        )));
        match self.build_once(req, on_event)? {
            Attempt::Done(o) => Ok(o),
            Attempt::Broken(why) => Err(Error::new(
                Exit::TempFail,
                format!(
                    "the engine at {} broke off the build of '{}' twice ({why}); the steps done are cached: run it again",
                    self.host, req.tag
                ),
            )),
        }
    }

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

/// One try at a build: its outcome, or the engine's answer broken off
/// after it began.
enum Attempt {
    Done(BuildOutcome),
    Broken(String),
}

impl DockerEngine {
    fn build_once(
        &self,
        req: &BuildRequest,
        on_event: &mut dyn FnMut(BuildEvent),
    ) -> Result<Attempt> {
        let opts = qp::BuildImageOptions {
            dockerfile: req.dockerfile.clone(),
            t: Some(req.tag.clone()),
            rm: true,
            forcerm: true,
            labels: Some(req.labels.clone().into_iter().collect()),
            buildargs: Some(req.args.clone().into_iter().collect()),
            ..Default::default()
        };
        let docker = self.docker.clone().with_timeout(BUILD_TIMEOUT);
        let body = bollard::body_full(req.context.clone().into());
        self.rt.block_on(async {
            let mut stream = docker.build_image(opts, None, Some(body));
            let mut id = None;
            let mut answered = false;
            while let Some(item) = stream.next().await {
                match item {
                    Ok(info) => {
                        answered = true;
                        if let Some(s) = info.stream {
                            on_event(BuildEvent::Output(s));
                        }
                        if let Some(s) = info.status {
                            on_event(BuildEvent::Status(s));
                        }
                        if let Some(d) = info.error_detail {
                            return Ok(Attempt::Done(BuildOutcome::Failed(
                                d.message.unwrap_or_default(),
                            )));
                        }
                        if let Some(aux) = info.aux
                            && let Some(i) = aux.id
                        {
                            id = Some(i);
                        }
                    }
                    Err(bollard::errors::Error::DockerStreamError { error }) => {
                        return Ok(Attempt::Done(BuildOutcome::Failed(error)));
                    }
                    Err(e) if status_of(&e).is_some_and(|s| s < 500) => {
                        // The engine refused the request itself: a bad Dockerfile path,
                        // a syntax error; the build never ran.
                        let msg = match e {
                            bollard::errors::Error::DockerResponseServerError {
                                message, ..
                            } => message,
                            other => other.to_string(),
                        };
                        return Ok(Attempt::Done(BuildOutcome::Failed(msg)));
                    }
                    // Reached and answering, then cut off: the connection broke,
                    // not the build.
                    Err(e) if answered && status_of(&e).is_none() => {
                        return Ok(Attempt::Broken(e.to_string()));
                    }
                    Err(e) => {
                        return Err(api_err(
                            &self.host,
                            &format!("cannot build '{}'", req.tag),
                            e,
                        ));
                    }
                }
            }
            match id {
                Some(id) => Ok(Attempt::Done(BuildOutcome::Built(id))),
                // The legacy builder reports the id as text only: trust the tag.
                None => match self.docker.inspect_image(&req.tag).await {
                    Ok(i) => Ok(Attempt::Done(BuildOutcome::Built(i.id.unwrap_or_default()))),
                    Err(e) => Err(api_err(
                        &self.host,
                        &format!("build of '{}' left no image", req.tag),
                        e,
                    )),
                },
            }
        })
    }
}
