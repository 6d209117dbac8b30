//! What lw-service knows of a service while it runs: its readiness check
//! (once, or waited for), its logs, the sandboxes attached to it, and the
//! state `ls` shows of every service of the root.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Declaration, LABEL_PROJECT, LABEL_SERVICE, Services, container_name, decl};
use super::{network_name, tail};
use base::config::Project;
use base::error::{Error, Exit, Result};
use engine::{ExecRequest, NetworkEngine};
use wall::LABEL_ROOT;

/// How `ls` sees a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    /// `ready`, `unready` (running, its readiness check fails), `failed`
    /// (its container stopped by itself), `down` (no container), `orphan`
    /// (its declaration is gone; `gc` removes it).
    pub state: String,
    /// Why, when not ready: the readiness check's or the exit's words.
    pub detail: String,
    pub port: Option<u16>,
    pub publish: Option<u16>,
    /// Sandboxes attached to its network.
    pub sandboxes: Vec<String>,
    pub volume: Option<String>,
}

impl Status {
    pub fn line(&self) -> String {
        let port = match (self.port, self.publish) {
            (Some(p), Some(h)) => format!("{}:{p},127.0.0.1:{h}", self.name),
            (Some(p), None) => format!("{}:{p}", self.name),
            _ => "-".into(),
        };
        let sbs = if self.sandboxes.is_empty() {
            "-".to_string()
        } else {
            self.sandboxes.join(",")
        };
        let mut l = format!("{}\t{}\t{port}\t{sbs}", self.name, self.state);
        if !self.detail.is_empty() {
            l.push('\t');
            l.push_str(&base::visible::visible_line(&self.detail));
        }
        l
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "service", "name": self.name, "state": self.state, "detail": self.detail,
            "port": self.port, "published": self.publish.map(|h| format!("127.0.0.1:{h}")),
            "sandboxes": self.sandboxes, "volume": self.volume,
        })
    }
}

impl<'a> Services<'a> {
    /// Runs the readiness check once: Ok(None) when ready, Ok(Some(why)) when not.
    pub fn check(&self, name: &str, ready: Option<&str>) -> Result<Option<String>> {
        let container = container_name(&self.id, name);
        let c = match self.engine.inspect(&container)? {
            None => return Ok(Some("down".into())),
            Some(c) => c,
        };
        if !c.running {
            return Ok(Some(format!(
                "exited with status {}",
                c.exit_code.unwrap_or(-1)
            )));
        }
        let Some(ready) = ready else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let req = ExecRequest {
            cmd: vec!["/bin/sh".into(), "-c".into(), ready.to_string()],
            ..Default::default()
        };
        let code = self
            .engine
            .exec(&container, &req, &mut |_, b| out.extend_from_slice(b))?;
        Ok((code != 0).then(|| {
            let t = tail(&out, 1);
            format!(
                "readiness check '{ready}' exited {code}{}{t}",
                if t.is_empty() { "" } else { ": " }
            )
        }))
    }

    /// Waits until the readiness check passes; a container that stops is
    /// `failed` (69, with its log's last lines); a check still failing at
    /// the timeout is 69 saying so.
    pub(super) fn wait_ready(&self, d: &Declaration) -> Result<()> {
        let container = container_name(&self.id, &d.name);
        let deadline = Instant::now() + d.ready_timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let why = self.check(&d.name, d.ready.as_deref())?;
            let Some(why) = why else { return Ok(()) };
            if why.starts_with("exited") || why == "down" {
                let log = self.log_text(&container)?;
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "service '{}' failed at start ({why}); no sandbox was attached; its log:\n{}",
                        d.name,
                        tail(&log, 20)
                    ),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "service '{}' is not ready after {}s: {why}; see lw-service logs {}",
                        d.name,
                        d.ready_timeout.as_secs(),
                        d.name
                    ),
                ));
            }
            // A readiness command has no event to wait on: poll, backing off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    pub(super) fn log_text(&self, container: &str) -> Result<Vec<u8>> {
        let nets: &dyn NetworkEngine = self.engine;
        let mut log = nets.logs(container, true)?;
        log.extend(nets.logs(container, false)?);
        Ok(log)
    }

    /// `logs`: what the service wrote, standard output then standard error.
    pub fn logs(&self, name: &str) -> Result<Vec<u8>> {
        decl::check_name(name)?;
        let container = container_name(&self.id, name);
        if self.engine.inspect(&container)?.is_none() {
            return Err(Error::new(
                Exit::NoInput,
                format!("service '{name}' has no container (it is down); lw-service up {name}"),
            ));
        }
        self.log_text(&container)
    }

    /// Sandbox names attached to the network of service `name`.
    pub fn sandboxes_of(&self, name: &str) -> Result<Vec<String>> {
        let nets: &dyn NetworkEngine = self.engine;
        let prefix = format!("lw-sb-{}-", self.id);
        Ok(match nets.network(&network_name(&self.id, name))? {
            Some(n) if n.labels.get(LABEL_ROOT) == Some(&self.id) => n
                .containers
                .keys()
                .filter_map(|c| c.strip_prefix(&prefix).map(str::to_string))
                .collect(),
            _ => vec![],
        })
    }

    /// Every service of this root the engine holds, with the project it came from.
    pub(super) fn known(&self) -> Result<BTreeMap<String, PathBuf>> {
        let label = format!("{LABEL_ROOT}={}", self.id);
        let mut out = BTreeMap::new();
        let nets: &dyn NetworkEngine = self.engine;
        let labels = self
            .engine
            .containers_with_label(&label)?
            .into_iter()
            .map(|c| c.labels)
            .chain(
                nets.networks_with_label(&label)?
                    .into_iter()
                    .map(|n| n.labels),
            )
            .chain(
                self.engine
                    .volumes_with_label(&label)?
                    .into_iter()
                    .map(|v| v.labels),
            );
        for l in labels {
            if let (Some(n), Some(p)) = (l.get(LABEL_SERVICE), l.get(LABEL_PROJECT)) {
                out.insert(n.clone(), PathBuf::from(p));
            }
        }
        Ok(out)
    }

    /// `ls`: the project's declared services and every one this root runs.
    pub fn list(&self, project: Option<&Project>) -> Result<Vec<Status>> {
        let mut names: BTreeMap<String, Option<PathBuf>> = BTreeMap::new();
        if let Some(p) = project {
            for n in decl::names(p) {
                names.insert(n, Some(p.top.clone()));
            }
        }
        for (n, p) in self.known()? {
            names.entry(n).or_insert(Some(p));
        }
        let mut out = Vec::new();
        for (name, top) in names {
            let file = top.as_ref().map(|t| t.join(decl::DIR).join(&name));
            let d = match &file {
                Some(f) if f.exists() => Some(
                    std::fs::read_to_string(f)
                        .map_err(|e| Error::io_as(Exit::Config, "cannot read", f, e))
                        .and_then(|t| decl::parse(&name, &t, f)),
                ),
                _ => None,
            };
            let (state, detail, port, publish, volume) = match &d {
                None => (
                    "orphan".to_string(),
                    "its declaration is gone; lw-service gc".to_string(),
                    None,
                    None,
                    None,
                ),
                Some(Err(e)) => ("invalid".to_string(), e.msg.clone(), None, None, None),
                Some(Ok(d)) => {
                    let (state, detail) = match self.check(&name, d.ready.as_deref())? {
                        None => ("ready".to_string(), String::new()),
                        Some(w) if w == "down" => ("down".to_string(), String::new()),
                        Some(w) if w.starts_with("exited") => ("failed".to_string(), w),
                        Some(w) => ("unready".to_string(), w),
                    };
                    (state, detail, d.port, d.publish, d.volume.clone())
                }
            };
            out.push(Status {
                sandboxes: self.sandboxes_of(&name)?,
                name,
                state,
                detail,
                port,
                publish,
                volume,
            });
        }
        Ok(out)
    }
}
