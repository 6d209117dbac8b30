//! [`NetworkEngine`] on the Docker Engine: networks (create, inspect, list
//! by label, remove, connect, disconnect) and a container's log.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::{
    EndpointSettings, NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest,
};
use bollard::query_parameters as qp;
use futures_util::StreamExt;

use super::DockerEngine;
use crate::{Network, NetworkEngine, NetworkSpec};
use base::error::{Error, Exit, Result};

fn network_of(n: bollard::models::NetworkInspect) -> Network {
    let ipam = n.ipam.and_then(|i| i.config).unwrap_or_default();
    Network {
        id: n.id.unwrap_or_default(),
        name: n.name.unwrap_or_default(),
        internal: n.internal.unwrap_or(false),
        labels: n.labels.unwrap_or_default().into_iter().collect(),
        options: n.options.unwrap_or_default().into_iter().collect(),
        subnets: ipam
            .into_iter()
            .map(|c| (c.subnet.unwrap_or_default(), c.gateway.unwrap_or_default()))
            .collect(),
        containers: n
            .containers
            .unwrap_or_default()
            .into_values()
            .map(|c| {
                (
                    c.name.unwrap_or_default(),
                    c.ipv4_address.unwrap_or_default(),
                )
            })
            .collect(),
        created: n.created.map(|d| d.to_string()).unwrap_or_default(),
    }
}

impl NetworkEngine for DockerEngine {
    fn create_network(&self, spec: &NetworkSpec) -> Result<Network> {
        let mut options = HashMap::new();
        if spec.no_host_address {
            options.insert(
                "com.docker.network.bridge.inhibit_ipv4".to_string(),
                "true".to_string(),
            );
        }
        if spec.isolate_containers {
            options.insert(
                "com.docker.network.bridge.enable_icc".to_string(),
                "false".to_string(),
            );
        }
        let req = NetworkCreateRequest {
            name: spec.name.clone(),
            driver: Some("bridge".into()),
            internal: Some(spec.internal),
            enable_ipv6: Some(false),
            options: Some(options),
            labels: Some(spec.labels.clone().into_iter().collect()),
            ..Default::default()
        };
        let what = format!("cannot create network '{}'", spec.name);
        let r = self
            .block_on(self.client().create_network(req))
            .map_err(|e| self.err(&what, e))?;
        self.network(&r.id)?.ok_or_else(|| {
            Error::new(
                Exit::Unavailable,
                format!("{what}: the engine lost it right after creating it"),
            )
        })
    }

    fn network(&self, name_or_id: &str) -> Result<Option<Network>> {
        match self.block_on(
            self.client()
                .inspect_network(name_or_id, None::<qp::InspectNetworkOptions>),
        ) {
            Ok(n) => Ok(Some(network_of(n))),
            Err(e) if super::status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.err(&format!("cannot inspect network '{name_or_id}'"), e)),
        }
    }

    fn networks_with_label(&self, label: &str) -> Result<Vec<Network>> {
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![label.to_string()]);
        let opts = qp::ListNetworksOptions {
            filters: Some(filters),
        };
        let list = self
            .block_on(self.client().list_networks(Some(opts)))
            .map_err(|e| self.err(&format!("cannot list networks labelled '{label}'"), e))?;
        // The list leaves out attached containers; inspect each.
        let mut out = Vec::new();
        for n in list {
            if let Some(id) = n.id
                && let Some(net) = self.network(&id)?
            {
                out.push(net);
            }
        }
        out.sort_by(|a, b| (&a.created, &a.id).cmp(&(&b.created, &b.id)));
        Ok(out)
    }

    fn remove_network(&self, name_or_id: &str) -> Result<()> {
        match self.block_on(self.client().remove_network(name_or_id)) {
            Ok(()) => Ok(()),
            Err(e) if super::status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(self.err(&format!("cannot remove network '{name_or_id}'"), e)),
        }
    }

    fn connect(&self, network: &str, container: &str, aliases: &[&str]) -> Result<()> {
        let endpoint_config = (!aliases.is_empty()).then(|| EndpointSettings {
            aliases: Some(aliases.iter().map(|a| a.to_string()).collect()),
            ..Default::default()
        });
        let req = NetworkConnectRequest {
            container: container.to_string(),
            endpoint_config,
        };
        self.block_on(self.client().connect_network(network, req))
            .map_err(|e| {
                self.err(
                    &format!("cannot attach '{container}' to network '{network}'"),
                    e,
                )
            })
    }

    fn disconnect(&self, network: &str, container: &str) -> Result<()> {
        let req = NetworkDisconnectRequest {
            container: container.to_string(),
            force: Some(true),
        };
        match self.block_on(self.client().disconnect_network(network, req)) {
            Ok(()) => Ok(()),
            Err(e) if super::status_of(&e) == Some(404) => Ok(()),
            // 20.10 says 500 "container ... is not connected to network ..."
            Err(bollard::errors::Error::DockerResponseServerError { message, .. })
                if message.contains("is not connected") =>
            {
                Ok(())
            }
            Err(e) => Err(self.err(
                &format!("cannot detach '{container}' from network '{network}'"),
                e,
            )),
        }
    }

    fn logs(&self, container: &str, stdout: bool) -> Result<Vec<u8>> {
        use bollard::container::LogOutput;
        let opts = qp::LogsOptions {
            stdout,
            stderr: !stdout,
            tail: "all".into(),
            ..Default::default()
        };
        let what = format!("cannot read the log of container '{container}'");
        self.block_on(async {
            let mut out = Vec::new();
            let mut s = self.client().logs(container, Some(opts));
            while let Some(chunk) = s.next().await {
                match chunk.map_err(|e| self.err(&what, e))? {
                    LogOutput::StdOut { message }
                    | LogOutput::StdErr { message }
                    | LogOutput::Console { message } => out.extend_from_slice(&message),
                    LogOutput::StdIn { .. } => {}
                }
            }
            Ok(out)
        })
    }

    fn wait_for_line(
        &self,
        container: &str,
        timeout: Duration,
        done: &mut dyn FnMut(&str) -> bool,
    ) -> Result<bool> {
        use bollard::container::LogOutput;
        let opts = qp::LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            tail: "all".into(),
            ..Default::default()
        };
        let what = format!("cannot follow the log of container '{container}'");
        let deadline = Instant::now() + timeout;
        let docker = self
            .client()
            .clone()
            .with_timeout(timeout + Duration::from_secs(5));
        self.block_on(async {
            let mut s = docker.logs(container, Some(opts));
            let mut partial = Vec::new();
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let chunk = match tokio::time::timeout(left, s.next()).await {
                    Err(_) => return Ok(false),
                    // The stream ends when the container stops.
                    Ok(None) => return Ok(false),
                    Ok(Some(c)) => c.map_err(|e| self.err(&what, e))?,
                };
                if let LogOutput::StdOut { message }
                | LogOutput::StdErr { message }
                | LogOutput::Console { message } = chunk
                {
                    partial.extend_from_slice(&message);
                    while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = partial.drain(..=nl).collect();
                        if done(String::from_utf8_lossy(&line).trim_end()) {
                            return Ok(true);
                        }
                    }
                }
            }
        })
    }
}
