//! The crate `wall`: the parts every container loopwright makes for a
//! mailbox root is built from, whichever concern makes it (a sandbox, a
//! shared service, an agent's model proxy).
//!
//! - [`image`]: layered runtime images, each tagged by a hash of its
//!   declared inputs (lw-build);
//! - [`egress`]: the allow-list proxy a sandbox's only way out goes through;
//! - [`secrets`], [`ports`]: what a sandbox may be handed, and the host
//!   ports it publishes on;
//! - [`config`]: the product's keys of `.loopwright/config`, and every
//!   layer's assembled for the product's commands;
//! - [`finding`]: a health check's finding, for `lw doctor`.
//!
//! This root is the wall's common ground: the labels that find a container
//! again, the root's id in its name, the hardening options, the paths inside
//! a sandbox, and sizes as the configuration writes them.  It names no
//! sandbox, agent or repository code, so `sandbox`, `service` and `agent`
//! can all stand on it.

pub mod config;
pub mod egress;
pub mod finding;
pub mod image;
pub mod ports;
pub mod secrets;

use std::fs;
use std::path::Path;

use confine::SECCOMP_PROFILE;
use sha2::{Digest, Sha256};

/// Labels on every container and volume lw-sandbox makes.
pub const LABEL_SANDBOX: &str = "org.loopwright.sandbox";
/// The mailbox root's id (see [`root_id`]).
pub const LABEL_ROOT: &str = "org.loopwright.root";
/// The mailbox root's path, for people reading `docker ps`.
pub const LABEL_ROOT_PATH: &str = "org.loopwright.root-path";
pub const LABEL_BRANCH: &str = "org.loopwright.branch";

/// Paths inside a sandbox.
pub const WORK: &str = "/work";
pub const REPO: &str = "/work/repo";
pub const HOME: &str = "/work/home";
pub const MIRROR: &str = "/lw/mirror";
pub const MAILBOX: &str = "/lw/mailbox";
pub const REGISTRY: &str = "/lw/registry";
pub const BIN_DIR: &str = "/usr/local/bin";

/// The id of a mailbox root: 8 hex digits of the sha256 of its canonical
/// path.  Container and volume names carry it so that two roots on one
/// engine never collide.
pub fn root_id(root: &Path) -> String {
    let canon = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let d = Sha256::digest(canon.as_os_str().as_encoded_bytes());
    d[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// True when the host's kernel has AppArmor enabled.
pub fn host_has_apparmor() -> bool {
    fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim_start().starts_with('Y'))
}

/// no-new-privileges, the seccomp profile, and AppArmor's docker-default
/// where the host has AppArmor (lw doctor says when it has not).
pub fn security_options() -> Vec<String> {
    let mut v = vec![
        "no-new-privileges:true".to_string(),
        format!("seccomp={SECCOMP_PROFILE}"),
    ];
    if host_has_apparmor() {
        v.push("apparmor=docker-default".into());
    }
    v
}

/// The launcher that installs the sandbox's seccomp profile before it execs
/// a command (crates/confine/src/bin/lw-confine.rs, crates/confine/src/seccomp), mounted at
/// `BIN_DIR/lw-confine` in every sandbox.  Every command loopwright runs in a
/// gVisor sandbox starts through it: the runsc of these hosts gives a
/// process started by `docker exec` no filter at all.  Under runc the
/// container's own filter applies to every exec, so the command runs as
/// given.  A user's own `docker exec` is not wrapped (docs/engines.md).
pub const CONFINE: &str = "lw-confine";

/// `cmd` as it must be started in a sandbox under `runtime`.
pub fn confined(runtime: &str, cmd: Vec<String>) -> Vec<String> {
    if engine::Isolation::of(runtime) != engine::Isolation::Gvisor {
        return cmd;
    }
    let mut v = Vec::with_capacity(cmd.len() + 2);
    v.push(format!("{BIN_DIR}/{CONFINE}"));
    v.push("--".into());
    v.extend(cmd);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_gvisor_commands_are_confined() {
        let c = vec!["sh".to_string(), "-c".into(), "true".into()];
        assert_eq!(confined("runc", c.clone()), c);
        assert_eq!(
            confined("runsc", c.clone()),
            ["/usr/local/bin/lw-confine", "--", "sh", "-c", "true"]
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(base::config::parse_bytes("2g"), Some(2 << 30));
        assert_eq!(base::config::parse_bytes("512M"), Some(512 << 20));
        assert_eq!(base::config::parse_bytes("x"), None);
    }

    #[test]
    fn root_ids_differ_by_root() {
        assert_ne!(root_id(Path::new("/a")), root_id(Path::new("/b")));
        assert_eq!(root_id(Path::new("/nonexistent/x")).len(), 8);
    }
}
