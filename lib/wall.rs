//! The wall's common ground: what every container loopwright makes for a
//! mailbox root shares, whichever concern makes it (a sandbox, a shared
//! service, an agent's model proxy): the labels that find it again, the
//! root's id in its name, the hardening options, the paths inside a
//! sandbox, and sizes as the configuration writes them.  It imports no
//! other concern, so `sandbox`, `service` and `agent` can all stand on it.

use std::fs;
use std::path::Path;

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

/// Parses `512m`, `2g`, `1073741824` into bytes.
pub fn parse_bytes(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1i64 << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (&s[..], 1),
    };
    num.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(mul))
}

/// The sandboxes' seccomp profile: Docker's default without io_uring
/// (runtime/seccomp.json, made by scripts/seccomp-profile).
pub const SECCOMP_PROFILE: &str = include_str!("../runtime/seccomp.json");

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("512M"), Some(512 << 20));
        assert_eq!(parse_bytes("x"), None);
    }

    #[test]
    fn root_ids_differ_by_root() {
        assert_ne!(root_id(Path::new("/a")), root_id(Path::new("/b")));
        assert_eq!(root_id(Path::new("/nonexistent/x")).len(), 8);
    }
}
