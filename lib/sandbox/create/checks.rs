//! `create`'s checks, all made before anything is: the name, the branch,
//! the settings and limit flags, ports against the network, the runtime,
//! the agent, the egress allow-list, secrets, services, the mailbox
//! commands and whether the engine sees this host's files.  Their warnings
//! (no disk quota, the bridge network) become the create's notes.

use std::path::PathBuf;

use super::super::settings::apply_overrides;
use super::super::{CreateOptions, Network, Sandboxes, Settings};
use agent::setup::Prepared;
use base::config::{Config, Project};
use base::error::{Error, Exit, Result};
use mailbox::registry;
use wall::egress;
use wall::secrets::{self, Secret};

/// What the checks found: everything the making steps need.
pub(in crate::sandbox) struct Checked {
    pub settings: Settings,
    /// The container ports to publish, `8080/tcp` form.
    pub ports: Vec<String>,
    pub runtime: Option<String>,
    pub agent: Option<Prepared>,
    /// The egress settings and the allow-list, for `--network egress`.
    pub egress: Option<(egress::Settings, egress::AllowList)>,
    pub secrets: Vec<Secret>,
    /// Warnings already shown.
    pub notes: Vec<String>,
    /// The engine does not see this host's files: volume mode
    /// (lib/sandbox/volume.rs).
    pub on_volumes: bool,
}

impl<'a> Sandboxes<'a> {
    /// All of `create`'s checks, in order; nothing is made.
    pub(super) fn check(
        &self,
        opts: &CreateOptions,
        project: Option<&Project>,
        bins: &[(PathBuf, &str)],
        warn: &mut dyn FnMut(&str),
    ) -> Result<Checked> {
        registry::check_name(&opts.name).map_err(Error::usage)?;
        check_branch(&opts.branch)?;
        let mut settings = Settings::from_project(project)?;
        apply_overrides(&mut settings, &opts.limits)?;
        let ports = check_ports(opts, project, warn)?;
        let runtime = self.check_runtime(
            opts.runtime.as_deref().or(settings.runtime.as_deref()),
            opts.network,
        )?;
        let agent = super::super::agent::check(project, opts, warn)?;
        let egress = match opts.network {
            Network::Egress => {
                let eg = egress::Settings::from_config(
                    project.map_or(&Config::default(), |p| &p.config),
                )?;
                let mut extra = opts.allow.clone();
                extra.extend(agent.iter().flat_map(|a| a.allow()));
                let allow = eg.allow_with(&extra)?;
                Some((eg, allow))
            }
            _ => None,
        };
        secrets::check_allowed(&opts.secrets, &settings.allowed_secrets)?;
        crate::service::attach::require(self.engines(), &self.id, &opts.services)?;
        let secrets = secrets::resolve(&opts.secrets, &|n| std::env::var_os(n))?;
        check_bins(bins)?;
        let mut notes = notes(&opts.name, &settings, opts.network, warn);
        // An engine that does not see the host's paths gets volumes instead
        // of binds (lib/sandbox/volume.rs).
        let on_volumes = super::super::volume::volume_mode(self)?;
        let cluster = self.kind == engine::EngineKind::Kubernetes;
        if on_volumes {
            super::super::volume::check(opts, &self.engine.address(), cluster)?;
            if let Some(r) = runtime
                .as_deref()
                .filter(|r| super::super::scratch::needed(r))
            {
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "runtime '{r}' is not available on the engine at {}, which does not see this host's files (volume mode): its /tmp and /dev/shm are host tmpfs mounts; use runc there",
                        self.engine.address()
                    ),
                ));
            }
            let n = format!(
                "sandbox '{}' is on the engine at {}, which does not see this host's files: its workspace and mail dir are volumes there, without disk quotas; its mail moves through the root's courier (lw-sandbox courier --ensure), which create starts",
                opts.name,
                self.engine.address()
            );
            warn(&n);
            notes.push(n);
        }
        Ok(Checked {
            settings,
            ports,
            runtime,
            agent,
            egress,
            secrets,
            notes,
            on_volumes,
        })
    }

    /// The runtime `wanted` (`--runtime` or `sandbox.runtime`), checked
    /// against what the engine offers before anything is made: unknown is
    /// 64 listing the known ones, gVisor missing 69 with its install line,
    /// gVisor without `--oci-seccomp` 69 (the profile would not apply),
    /// and a runtime the engine starts without networking (runsc's
    /// `--network=none`) refuses every network but `none` (64).
    pub fn check_runtime(&self, wanted: Option<&str>, network: Network) -> Result<Option<String>> {
        let Some(name) = wanted else {
            return Ok(None);
        };
        let info = self.engine.info()?;
        info.check(name)?;
        if !info.runtime_applies_seccomp(name) {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "runtime '{name}' is registered with the engine at {} without --oci-seccomp, so \
                     gVisor would not apply the sandbox's seccomp profile (user namespaces, for \
                     one, would be allowed inside); add \"--oci-seccomp\" to its runtimeArgs in \
                     /etc/docker/daemon.json and reload dockerd (kill -HUP $(pidof dockerd))",
                    info.host
                ),
            ));
        }
        if network != Network::None && info.runtime_without_network(name) {
            return Err(Error::usage(format!(
                "runtime '{name}' runs with its network switched off on the engine at {} \
                 (registered with --network=none), so a --network {} sandbox would reach nothing; \
                 create it with --network none (the default; an agent needs egress, so it runs \
                 under runc), or register {name} with a network that works on this host",
                info.host,
                network.as_str()
            )));
        }
        Ok(Some(name.to_string()))
    }
}

/// The project's config key of the ports every sandbox publishes (lw init
/// writes a devcontainer.json's `forwardPorts` there).
pub(super) const KEY_FORWARD_PORTS: &str = "sandbox.forward-ports";

/// `--port` and `--allow` against the network: the ports, parsed, with the
/// project's `sandbox.forward-ports` when the network can publish them
/// (else they are left out, said in a warning: the network chosen wins).
fn check_ports(
    opts: &CreateOptions,
    project: Option<&Project>,
    warn: &mut dyn FnMut(&str),
) -> Result<Vec<String>> {
    let mut whats = opts
        .ports
        .iter()
        .map(|p| parse_port(p))
        .collect::<Result<Vec<_>>>()?;
    let forward = project.and_then(|p| p.config.get(KEY_FORWARD_PORTS));
    let forward: Vec<&str> = forward
        .unwrap_or("")
        .split([',', ' ', '\t'])
        .filter(|s| !s.is_empty())
        .collect();
    if !forward.is_empty() && opts.network != Network::Bridge {
        warn(&format!(
            "{KEY_FORWARD_PORTS} ({}) not published: --network {} has no bridge; add --network bridge to publish them",
            forward.join(", "),
            opts.network.as_str()
        ));
    } else {
        for f in forward {
            let p = parse_port(f).map_err(|e| {
                Error::config(format!(
                    "{KEY_FORWARD_PORTS} in {}: {}",
                    base::config::FILE,
                    e.msg
                ))
            })?;
            if !whats.contains(&p) {
                whats.push(p);
            }
        }
    }
    if !whats.is_empty() && opts.network != Network::Bridge {
        return Err(Error::usage(format!(
            "--port publishes on 127.0.0.1 through the engine's bridge, which --network {} has not; add --network bridge",
            opts.network.as_str()
        )));
    }
    if !opts.allow.is_empty() && opts.network != Network::Egress {
        return Err(Error::usage(
            "--allow extends the egress allow-list; add --network egress",
        ));
    }
    Ok(whats)
}

/// The mailbox commands to mount must exist.
fn check_bins(bins: &[(PathBuf, &str)]) -> Result<()> {
    for (p, _) in bins {
        if !p.is_file() {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "'{}' is missing; install lw-post, lw-inbox, lw-mcp and lw-confine beside lw-sandbox",
                    p.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The warnings of a create that goes on: no disk quota, the bridge network.
fn notes(
    name: &str,
    settings: &Settings,
    network: Network,
    warn: &mut dyn FnMut(&str),
) -> Vec<String> {
    let mut notes = Vec::new();
    if settings.limits.disk.is_none() {
        let n = format!(
            "sandbox '{name}' has no disk quota (sandbox.disk = off): it can fill the host's disk, and its mail dir is mounted without nosuid,nodev,noexec"
        );
        warn(&n);
        notes.push(n);
    }
    if network == Network::Bridge {
        let n = format!(
            "sandbox '{name}' gets the bridge network: it can reach anything this host reaches"
        );
        warn(&n);
        notes.push(n);
    }
    notes
}

/// Parses `8080`, `8080/tcp`, `53/udp` into `8080/tcp` form.
pub fn parse_port(s: &str) -> Result<String> {
    let (num, proto) = s.split_once('/').unwrap_or((s, "tcp"));
    match (num.parse::<u16>(), proto) {
        (Ok(n), "tcp" | "udp") if n > 0 => Ok(format!("{n}/{proto}")),
        _ => Err(Error::usage(format!(
            "'{s}' is not a container port (PORT or PORT/tcp or PORT/udp)"
        ))),
    }
}

/// Checks a branch name the way git does.
pub fn check_branch(branch: &str) -> Result<()> {
    let bad = || {
        Error::usage(format!(
            "'{}' is not a valid branch name (see git check-ref-format); e.g. lw/api-change",
            branch.escape_debug()
        ))
    };
    if branch.is_empty() || branch.starts_with('-') || branch == "HEAD" {
        return Err(bad());
    }
    let out = repo::git::output(
        repo::git::command(None).args(["check-ref-format", &format!("refs/heads/{branch}")]),
        "check a branch name",
    )?;
    if out.status.success() {
        Ok(())
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_branches() {
        assert_eq!(parse_port("8080").unwrap(), "8080/tcp");
        assert_eq!(parse_port("53/udp").unwrap(), "53/udp");
        for bad in ["0", "x", "80/sctp", "70000"] {
            assert_eq!(parse_port(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
        assert!(check_branch("lw/api-1").is_ok());
        for bad in ["", "-x", "a..b", "a b", "x.lock", "HEAD", "a~1", "a:b"] {
            assert_eq!(check_branch(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
    }

    /// A devcontainer.json's forwardPorts, in the config as
    /// sandbox.forward-ports: published with --network bridge besides
    /// --port (once each), left out with a warning on another network; a
    /// bad one is the config's error, naming the key.
    #[test]
    fn forward_ports_join_the_ports_on_a_bridge_only() {
        let project = |v: &str| Project {
            top: PathBuf::from("/p"),
            git_dir: PathBuf::from("/p/.git"),
            config: Config::parse_project(
                &format!("{KEY_FORWARD_PORTS} = {v}\n"),
                std::path::Path::new("/p/.loopwright/config"),
                wall::config::CHECK,
            )
            .expect("the key is known"),
        };
        let mut opts = CreateOptions {
            name: "a".into(),
            branch: "a".into(),
            from: None,
            scope: vec![],
            ports: vec!["3000".into()],
            secrets: vec![],
            network: Network::Bridge,
            allow: vec![],
            image: None,
            allow_stale: false,
            no_fetch: false,
            agent: None,
            limits: Default::default(),
            allow_install_change: false,
            services: vec![],
            runtime: None,
        };
        let mut warned = Vec::new();
        let p = project("3000, 8080 53/udp");
        let got = check_ports(&opts, Some(&p), &mut |w| warned.push(w.to_string())).unwrap();
        assert_eq!(got, ["3000/tcp", "8080/tcp", "53/udp"]);
        assert!(warned.is_empty());
        opts.ports.clear();
        opts.network = Network::None;
        let got = check_ports(&opts, Some(&p), &mut |w| warned.push(w.to_string())).unwrap();
        assert!(got.is_empty());
        assert_eq!(
            warned,
            [
                "sandbox.forward-ports (3000, 8080, 53/udp) not published: --network none has no bridge; add --network bridge to publish them"
            ]
        );
        opts.network = Network::Bridge;
        let e = check_ports(&opts, Some(&project("70000")), &mut |_| {}).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(
            e.msg.starts_with(
                "sandbox.forward-ports in .loopwright/config: '70000' is not a container port"
            ),
            "{}",
            e.msg
        );
    }
}
