//! Every command loopwright runs in a gVisor sandbox starts through
//! lw-confine (bins/lw-confine.rs, lib/seccomp), which installs the
//! sandbox's seccomp profile before it execs the command: the runsc of
//! these hosts gives a process started by `docker exec` no filter at all.
//! Under runc the container's own filter applies to every exec, so the
//! command runs as given.  A user's own `docker exec` into a gVisor sandbox
//! is not wrapped (docs/engines.md).

use crate::engine::Isolation;

/// The launcher's name, mounted at `BIN_DIR/lw-confine` in every sandbox.
pub const CONFINE: &str = "lw-confine";

/// `cmd` as it must be started in a sandbox under `runtime`.
pub fn command(runtime: &str, cmd: Vec<String>) -> Vec<String> {
    if Isolation::of(runtime) != Isolation::Gvisor {
        return cmd;
    }
    let mut v = Vec::with_capacity(cmd.len() + 2);
    v.push(format!("{}/{CONFINE}", super::BIN_DIR));
    v.push("--".into());
    v.extend(cmd);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_gvisor_commands_are_wrapped() {
        let c = vec!["sh".to_string(), "-c".into(), "true".into()];
        assert_eq!(command("runc", c.clone()), c);
        assert_eq!(
            command("runsc", c.clone()),
            ["/usr/local/bin/lw-confine", "--", "sh", "-c", "true"]
        );
    }
}
