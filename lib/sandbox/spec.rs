//! The hardened container of a sandbox, as a `ContainerSpec`: its labels,
//! mounts, environment, limits and security options (what the module
//! documentation of lib/sandbox promises it sees, and nothing else).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Network, Record, Sandboxes, Settings, disk};
use engine::{Bind, ContainerSpec, PortMap};
use wall::egress;
use wall::secrets;
use wall::{
    BIN_DIR, HOME, LABEL_BRANCH, LABEL_ROOT, LABEL_ROOT_PATH, LABEL_SANDBOX, MAILBOX, MIRROR,
    REGISTRY, WORK, security_options,
};

/// PID 1 of a sandbox: waits, and leaves at once on SIGTERM so `stop` is quick.
pub(super) const KEEPALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// The hardened container of a sandbox.
#[allow(clippy::too_many_arguments)]
pub fn container_spec(
    sb: &Sandboxes,
    rec: &Record,
    settings: &Settings,
    mailbox: &Path,
    bins: &[(PathBuf, &str)],
    with_secrets: bool,
) -> ContainerSpec {
    let (env, network) = env_and_network(sb, rec);
    ContainerSpec {
        name: Some(rec.container.clone()),
        image: rec.image.clone(),
        cmd: vec![],
        entrypoint: Some(vec!["/bin/sh".into(), "-c".into(), KEEPALIVE.into()]),
        env,
        user: Some(format!("{0}:{0}", settings.uid)),
        workdir: Some(WORK.into()),
        labels: labels(sb, rec),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: security_options(),
        pids_limit: Some(super::scratch::host_pids(rec.runtime_name(), settings.pids)),
        memory_bytes: Some(settings.memory),
        nano_cpus: Some((settings.limits.cpus * 1e9) as i64),
        log_options: settings.limits.log_options().into_iter().collect(),
        tmpfs: tmpfs(settings, rec, with_secrets),
        binds: binds(sb, rec, mailbox, bins),
        volumes: vec![],
        network: Some(network),
        ports: rec
            .ports
            .iter()
            .map(|p| PortMap {
                container: p.container.clone(),
                // Volume mode: on the engine's host, for this host to reach.
                host_ip: if rec.volume_mode {
                    "0.0.0.0"
                } else {
                    "127.0.0.1"
                }
                .into(),
                host_port: p.host,
            })
            .collect(),
        tty: false,
        open_stdin: false,
        sysctls: BTreeMap::new(),
        // Below the host's own containers (1024), no core dumps of what the
        // agent ran, and a health check (CIS Docker 5.11, 5.18, 5.26).
        cpu_shares: Some(512),
        // (Only lowered: raising one above the engine's own is refused.)
        ulimits: vec![("core".into(), 0, 0)],
        healthcheck: Some((
            vec!["/bin/sh".into(), "-c".into(), format!("test -w {WORK}")],
            Duration::from_secs(300),
        )),
        runtime: rec.runtime.clone(),
        hosts: BTreeMap::new(),
        restart_on_failure: false,
    }
}

/// The labels that find the container again: its sandbox, root and branch.
pub(super) fn labels(sb: &Sandboxes, rec: &Record) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (LABEL_SANDBOX.to_string(), rec.name.clone()),
        (LABEL_ROOT.to_string(), sb.id.clone()),
        (
            LABEL_ROOT_PATH.to_string(),
            sb.root.dir.to_string_lossy().into_owned(),
        ),
        (LABEL_BRANCH.to_string(), rec.branch.clone()),
    ]);
    labels.retain(|_, v| !v.is_empty());
    labels
}

/// `/tmp` (under gVisor a bind of the host's, see `binds`), and the
/// secrets' tmpfs when it has secrets.
fn tmpfs(settings: &Settings, rec: &Record, with_secrets: bool) -> BTreeMap<String, String> {
    let mut tmpfs = BTreeMap::new();
    if !super::scratch::needed(rec.runtime_name()) {
        tmpfs.insert(
            "/tmp".to_string(),
            format!("rw,noexec,nosuid,nodev,size={}", settings.tmp_size),
        );
    }
    if with_secrets {
        tmpfs.insert(
            secrets::DIR.to_string(),
            format!(
                "rw,noexec,nosuid,nodev,size=1m,mode=0700,uid={0},gid={0}",
                settings.uid
            ),
        );
    }
    tmpfs
}

/// The host paths it sees: workspace, mirror, mailbox, registry, the mailbox
/// commands (and under gVisor its scratch places).
fn binds(sb: &Sandboxes, rec: &Record, mailbox: &Path, bins: &[(PathBuf, &str)]) -> Vec<Bind> {
    let mut binds = vec![
        Bind {
            // The workspace's own filesystem (or, with sandbox.disk = off, a
            // plain directory), given to the sandbox's user by the host.
            source: disk::work(&sb.root, &rec.name)
                .mount
                .to_string_lossy()
                .into_owned(),
            target: WORK.into(),
            read_only: false,
        },
        Bind {
            source: rec.mirror.to_string_lossy().into_owned(),
            target: MIRROR.into(),
            read_only: true,
        },
        Bind {
            source: mailbox.to_string_lossy().into_owned(),
            target: MAILBOX.into(),
            read_only: false,
        },
        // Read-only: lw-mcp's whoami names the peers and their scopes.
        Bind {
            source: sb.root.registry_dir().to_string_lossy().into_owned(),
            target: REGISTRY.into(),
            read_only: true,
        },
    ];
    for (src, name) in bins {
        binds.push(Bind {
            source: src.to_string_lossy().into_owned(),
            target: format!("{BIN_DIR}/{name}"),
            read_only: true,
        });
    }
    // Under gVisor, /tmp and /dev/shm from the host's noexec tmpfs (scratch.rs).
    if super::scratch::needed(rec.runtime_name()) {
        binds.extend(super::scratch::binds(&sb.root, &rec.name));
    }
    binds
}

/// Its environment and the network it is created on.
fn env_and_network(sb: &Sandboxes, rec: &Record) -> (Vec<String>, String) {
    let mut env = vec![
        format!("LW_MAILBOX={MAILBOX}"),
        format!("LW_SANDBOX={}", rec.name),
        format!("LW_REGISTRY={REGISTRY}"),
        format!("LW_BRANCH={}", rec.branch),
        format!("HOME={HOME}"),
    ];
    let network = match rec.network {
        // The plan egress::prepare returned names this network and this environment.
        Network::Egress => {
            env.extend(egress::proxy_env());
            egress::network_name(&rec.container)
        }
        // No network of its own: the first service's is its only one.
        Network::None if !rec.services.is_empty() => {
            crate::service::attach::primary_network(&sb.id, &rec.services)
                .expect("services is not empty")
        }
        n => n.as_str().to_string(),
    };
    super::agent::env(rec, &mut env);
    // A shared service is reached directly, never through the egress proxy.
    for e in env.iter_mut() {
        if !rec.services.is_empty() && (e.starts_with("NO_PROXY=") || e.starts_with("no_proxy=")) {
            e.push(',');
            e.push_str(&rec.services.join(","));
        }
    }
    (env, network)
}
