//! The product's keys of `.loopwright/config`, and every layer's assembled:
//! the list the product's commands check a project's file against (the one
//! loopwright(7) lists).  The format is `base::config`'s; the door's keys are
//! `mailbox::config`'s, the engine's `engine::config`'s.

use std::path::Path;

use base::config::{Check, Config, Keys, Project};
use base::error::Result;

/// The product's keys.
pub const KEYS: Keys = &[
    // lw-mirror(1)
    "mirror.path",
    "mirror.url",
    "mirror.fresh-within",
    // lw-build(1)
    "build.cache",
    "build.cache-ca",
    "build.ca",
    // lw-init(1): the host variables a devcontainer.json may read
    "devcontainer.local-env",
    // lw-init(1): the authorities it trusts for feature registries
    "devcontainer.feature-ca",
    // lw-init(1): the most one request to a feature registry may take
    "devcontainer.fetch-timeout",
    // lw-sandbox(1)
    "sandbox.cpus",
    "sandbox.memory",
    "sandbox.pids",
    "sandbox.disk",
    "sandbox.mail-disk",
    "sandbox.tmp-size",
    "sandbox.log-max-size",
    "sandbox.log-max-file",
    "sandbox.push-max",
    "sandbox.push-pr",
    "sandbox.pr-base",
    "sandbox.uid",
    "sandbox.ports",
    "sandbox.forward-ports",
    "sandbox.runtime",
    "sandbox.secrets",
    "sandbox.install",
    "sandbox.git-name",
    "sandbox.git-email",
    // lw-sandbox(1), AGENTS
    "agent.KIT.upstream",
    "agent.KIT.ca",
    "agent.KIT.key-env",
    "agent.KIT.key-file",
    "agent.KIT.max-request",
    "agent.KIT.max-rpm",
    "agent.KIT.max-tokens-hour",
    "agent.KIT.max-tokens-run",
    "agent.KIT.bell-max-blocks",
    // lw-sandbox(1), EGRESS
    "egress.allow",
    "egress.allow.NAME",
    "egress.host.NAME",
    "egress.proxy-from",
    "egress.network",
];

/// Every layer's keys: what a product command accepts.
pub const ALL: &[Keys] = &[mailbox::config::KEYS, engine::config::KEYS, KEYS];

/// The check the product's commands make: every key one of [`ALL`].
pub const CHECK: Check<'static> = Check::All(ALL);

/// The project that contains `dir` ([`Project::find`]), every key checked.
pub fn project(dir: &Path) -> Result<Option<Project>> {
    Project::find(dir, CHECK)
}

/// The config file of the project at `root` ([`Config::load`]: empty when
/// there is none), every key checked.
pub fn load(root: &Path) -> Result<Config> {
    Config::load(&root.join(base::config::FILE), CHECK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::error::Exit;

    #[test]
    fn unknown_keys_are_refused_with_the_file_the_line_and_the_closest_key() {
        let p = Path::new("/p/.loopwright/config");
        for (text, msg) in [
            (
                "# c\nsandbox.cpus = 2\nsandbx.memory = 2g\n",
                "unknown key 'sandbx.memory' in '/p/.loopwright/config' line 3; did you mean 'sandbox.memory'?",
            ),
            (
                "sandbox.cpuz = 2\n",
                "unknown key 'sandbox.cpuz' in '/p/.loopwright/config' line 1; did you mean 'sandbox.cpus'?",
            ),
            (
                "agent.claude.upstrem = https://x\n",
                "unknown key 'agent.claude.upstrem' in '/p/.loopwright/config' line 1; did you mean 'agent.claude.upstream'?",
            ),
            (
                "egress.alow.npm = registry.npmjs.org:443\n",
                "unknown key 'egress.alow.npm' in '/p/.loopwright/config' line 1; did you mean 'egress.allow.npm'?",
            ),
            (
                "colour = blue\n",
                "unknown key 'colour' in '/p/.loopwright/config' line 1; loopwright(7) lists the known keys",
            ),
        ] {
            let e = Config::parse_project(text, p, CHECK).unwrap_err();
            assert_eq!(e.exit, Exit::Config, "{text}");
            assert_eq!(e.msg, msg, "{text}");
        }
    }

    #[test]
    fn every_known_key_and_pattern_is_accepted() {
        let text = "engine = docker\nengine.host = unix:///x\nmirror.fresh-within = 0\n\
            build.cache-ca = ca.pem\nsandbox.git-email = a@b\nagent.claude.ca = c.pem\n\
            agent.my-kit.key-file = k\negress.allow = a:443\negress.allow.npm = b:443\n\
            egress.host.api.internal = 10.0.0.1\ndoor.secrets = A\ndoor.log-max = 1g\ndoor.quarantine-max = 16m\n";
        let c = Config::parse_project(text, Path::new("c"), CHECK).unwrap();
        assert_eq!(c.iter().count(), 13);
        for k in ALL
            .iter()
            .flat_map(|k| k.iter())
            .filter(|k| !k.bytes().any(|b| b.is_ascii_uppercase()))
        {
            assert!(CHECK.refuse(k).is_none(), "{k}");
        }
        for bad in ["agent.ca", "agent..ca", "agent.x", "egress.host", "mirror"] {
            assert!(CHECK.refuse(bad).is_some(), "{bad}");
        }
        // Config::parse (kit files, mirror state) keeps any key.
        assert!(Config::parse("colour = blue\n", Path::new("c")).is_ok());
    }
}
