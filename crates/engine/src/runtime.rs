//! Isolation levels: the OCI runtimes an engine offers and which one a
//! container asks for.
//!
//! A container shares the host's kernel under `runc` (and `crun`); under
//! gVisor's `runsc` it talks to a kernel written in user space, so a host
//! kernel bug is one more wall away; under `kata`/`krun` it is a small VM.
//! The engine says which runtimes it has ([`EngineInfo`], from its `/info`);
//! [`EngineInfo::check`] refuses a runtime it lacks before anything is made:
//! `runsc` not registered is 69 with the install line, any other unknown
//! name is 64 listing the ones it knows.

use base::error::{Error, Exit, Result};

/// One OCI runtime as the engine registered it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub name: String,
    /// The runtime's program (Docker may say only `runc`).
    pub path: String,
    /// Arguments the engine passes it (`--network=none` for runsc here).
    pub args: Vec<String>,
}

/// What an engine says about itself and its runtimes.
#[derive(Clone, Debug, Default)]
pub struct EngineInfo {
    /// Its address, as `DOCKER_HOST` would write it.
    pub host: String,
    /// `docker` or `podman`.
    pub product: String,
    pub version: String,
    pub runtimes: Vec<RuntimeInfo>,
    /// The runtime a container gets when it names none.
    pub default_runtime: String,
    /// The engine's security options as it words them
    /// (`name=seccomp,profile=default`, `name=apparmor`, `name=selinux`,
    /// `name=rootless`, `name=userns`).
    pub security: Vec<String>,
}

/// The isolation a runtime gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Namespaces and cgroups on the host's kernel (runc, crun).
    Container,
    /// A user-space kernel (gVisor's runsc).
    Gvisor,
    /// A virtual machine (kata, krun).
    Vm,
}

impl Isolation {
    /// The level of the runtime `name` (or program path); an unknown runtime
    /// is taken as sharing the host's kernel, the weakest claim.
    pub fn of(runtime: &str) -> Isolation {
        let base = runtime.rsplit('/').next().unwrap_or(runtime);
        if base == "runsc" || base.starts_with("runsc-") || base == "gvisor" {
            Isolation::Gvisor
        } else if base.starts_with("kata") || base == "krun" || base.contains("firecracker") {
            Isolation::Vm
        } else {
            Isolation::Container
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Gvisor => "gvisor",
            Isolation::Vm => "vm",
        }
    }
}

/// The runtimes loopwright names in its messages and man pages.
pub const DEFAULT_RUNTIME: &str = "runc";
pub const GVISOR: &str = "runsc";

/// How to install gVisor and register it with dockerd.
pub const RUNSC_INSTALL: &str = "install and register gVisor: apt-get install runsc; add \
{\"runtimes\": {\"runsc\": {\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \"--oci-seccomp\"]}}} \
to /etc/docker/daemon.json (keeping its other keys) and reload dockerd (kill -HUP $(pidof dockerd))";

impl EngineInfo {
    /// The runtime `name`, when the engine has it.
    pub fn runtime(&self, name: &str) -> Option<&RuntimeInfo> {
        self.runtimes.iter().find(|r| r.name == name)
    }

    /// The runtimes' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.runtimes.iter().map(|r| r.name.as_str()).collect();
        v.sort_unstable();
        v
    }

    /// Whether a runtime's program is on this host: Podman lists every
    /// runtime of its configuration, installed or not.  `None` when the
    /// engine gave no absolute path (Docker's own `runc`) or is not local.
    pub fn installed(&self, r: &RuntimeInfo, local: bool) -> Option<bool> {
        (local && r.path.starts_with('/')).then(|| std::path::Path::new(&r.path).exists())
    }

    /// Refuses `name` when the engine cannot run it: gVisor missing is 69
    /// with the install line, a name the engine does not know 64 listing the
    /// ones it does, a listed runtime whose program is absent 69.
    pub fn check(&self, name: &str) -> Result<&RuntimeInfo> {
        let host = self.host.as_str();
        let local = host.starts_with("unix://");
        let known = self.names().join(", ");
        match self.runtime(name) {
            Some(r) if self.installed(r, local) == Some(false) => Err(Error::new(
                Exit::Unavailable,
                if Isolation::of(name) == Isolation::Gvisor {
                    format!(
                        "runtime '{name}' is configured in the engine at {host} but {} is not installed; {RUNSC_INSTALL}",
                        r.path
                    )
                } else {
                    format!(
                        "runtime '{name}' is configured in the engine at {host} but {} is not installed; install it or pick one of: {known}",
                        r.path
                    )
                },
            )),
            Some(r) => Ok(r),
            None if name == GVISOR => Err(Error::new(
                Exit::Unavailable,
                format!(
                    "runtime 'runsc' (gVisor) is not registered with the engine at {host} (it has: {known}); {RUNSC_INSTALL}"
                ),
            )),
            None => Err(Error::usage(format!(
                "runtime '{name}' is not one the engine at {host} offers; known runtimes: {known}"
            ))),
        }
    }

    /// True when the engine starts `runtime` with networking switched off
    /// (runsc's `--network=none`): its containers have loopback only,
    /// whatever network the engine attaches.
    pub fn runtime_without_network(&self, runtime: &str) -> bool {
        self.runtime(runtime).is_some_and(|r| {
            r.args
                .windows(2)
                .any(|w| w[0] == "--network" && w[1] == "none")
                || r.args.iter().any(|a| a == "--network=none")
        })
    }

    /// False when `runtime` is gVisor registered without `--oci-seccomp`:
    /// runsc then ignores the container's seccomp profile (a user namespace,
    /// for one, is allowed inside), so the wall lacks a layer it promises.
    pub fn runtime_applies_seccomp(&self, runtime: &str) -> bool {
        match self.runtime(runtime) {
            Some(r)
                if Isolation::of(&r.name) == Isolation::Gvisor
                    || Isolation::of(&r.path) == Isolation::Gvisor =>
            {
                r.args
                    .iter()
                    .any(|a| a == "--oci-seccomp" || a == "--oci-seccomp=true")
            }
            _ => true,
        }
    }

    /// The engine's security options as short names (`seccomp`, `apparmor`,
    /// `selinux`, `rootless`, `userns`, `cgroupns`).
    pub fn security_names(&self) -> Vec<String> {
        self.security
            .iter()
            .filter_map(|o| {
                o.split(',')
                    .find_map(|kv| kv.strip_prefix("name="))
                    .or(Some(o.as_str()))
                    .map(str::to_string)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(runtimes: &[(&str, &str, &[&str])]) -> EngineInfo {
        EngineInfo {
            host: "unix:///s".into(),
            product: "docker".into(),
            version: "20.10".into(),
            runtimes: runtimes
                .iter()
                .map(|(n, p, a)| RuntimeInfo {
                    name: n.to_string(),
                    path: p.to_string(),
                    args: a.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
            default_runtime: "runc".into(),
            security: vec![
                "name=seccomp,profile=default".into(),
                "name=rootless".into(),
            ],
        }
    }

    #[test]
    fn runsc_missing_is_unavailable_with_the_install_line() {
        let i = info(&[("runc", "runc", &[])]);
        let e = i.check("runsc").unwrap_err();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(e.msg.contains("apt-get install runsc"), "{}", e.msg);
        assert!(e.msg.contains("daemon.json"), "{}", e.msg);
    }

    #[test]
    fn unknown_runtime_is_usage_listing_the_known_ones() {
        let i = info(&[("runsc", "/usr/bin/runsc", &[]), ("runc", "runc", &[])]);
        let e = i.check("runx").unwrap_err();
        assert_eq!(e.exit, Exit::Usage);
        assert!(e.msg.contains("known runtimes: runc, runsc"), "{}", e.msg);
    }

    #[test]
    fn a_listed_runtime_without_its_program_is_unavailable() {
        let mut i = info(&[("kata", "/nonexistent/kata-runtime", &[])]);
        let e = i.check("kata").unwrap_err();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(e.msg.contains("/nonexistent/kata-runtime"), "{}", e.msg);
        // Remote: the path is the remote host's; the engine decides.
        i.host = "tcp://h:2375".into();
        assert!(i.check("kata").is_ok());
    }

    #[test]
    fn levels_and_network_and_security_names() {
        assert_eq!(Isolation::of("runc"), Isolation::Container);
        assert_eq!(Isolation::of("/usr/bin/runsc"), Isolation::Gvisor);
        assert_eq!(Isolation::of("kata-runtime"), Isolation::Vm);
        let i = info(&[
            ("runsc", "/usr/bin/runsc", &["--network=none"]),
            ("runsc-net", "/usr/bin/runsc", &["--network", "sandbox"]),
        ]);
        assert!(i.runtime_without_network("runsc"));
        assert!(!i.runtime_applies_seccomp("runsc"));
        assert!(i.runtime_applies_seccomp("runc"));
        assert!(!i.runtime_without_network("runsc-net"));
        assert!(!i.runtime_without_network("runc"));
        assert_eq!(i.security_names(), vec!["seccomp", "rootless"]);
    }
}
