//! Egress: a sandbox reaches the hosts on its allow-list, and nothing else.
//!
//! The topology, made by [`prepare`] for one sandbox:
//!
//! ```text
//!   sandbox ──(KEY-egress: internal, no host address)── proxy ──(lw-egress)── out
//! ```
//!
//! - The sandbox is attached to one network only, `KEY-egress`, created
//!   `internal` (the engine gives it no route out) and without a host
//!   address (`inhibit_ipv4`): on Docker 20.10 an internal network still
//!   lets its containers reach every address of the host through the
//!   bridge's gateway address, which this removes.  No IPv6 is configured.
//!   Nothing else is on it but the sandbox's own proxy, so sandboxes never
//!   share a network and cannot reach each other.
//! - The proxy (squid, from Debian's packages, in an image built and cached
//!   by the hash of its recipe) is on that network, known there as
//!   [`PROXY_HOST`], and on the shared `lw-egress` bridge network, which
//!   leads out and on which containers cannot talk to each other (ICC off).
//!   It allows CONNECT and plain requests only to the listed host and port
//!   pairs and logs every request; see [`squid`] for the rules.
//! - The sandbox gets `HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY` (and their
//!   lower-case forms) pointing at the proxy.
//!
//! Failing closed follows from the shape, not from a rule that could be
//! missed: the sandbox has no route anywhere but its proxy, so a proxy that
//! is stopped, killed or misconfigured leaves it with no network at all.  An
//! empty allow-list renders a proxy that denies everything.  A proxy that
//! does not come up makes [`prepare`] fail and undo what it made.
//!
//! Everything made carries the labels [`LABEL_EGRESS`] and [`LABEL_KEY`], so
//! [`leftovers`] finds what a killed `create` left and [`teardown`] removes
//! it.  The caller (lw-sandbox) holds the sandbox's lock around these calls.
//!
//! By file: `allow` (the allow-list), `squid` (the proxy's configuration
//! and log), `image` (the proxy's image), `proxy` (a sandbox's network and
//! proxy: made, started, torn down, read); this file the settings and names.

pub mod allow;
mod image;
mod proxy;
pub mod sidecar;
pub mod squid;

use std::collections::BTreeMap;
use std::time::Duration;

pub use allow::{AllowList, Entry, HostPattern};
pub use image::{PROXY_FILES, ensure_proxy_image, proxy_tag};
pub use proxy::{
    denials, leftovers, outside_network, prepare, prepare_with_image, requests, start_proxy,
    teardown,
};
pub use squid::Request;

use base::config::Config;
use base::error::{Error, Result};

/// What each egress object is: `internal`, `proxy` or `outside`.
pub const LABEL_EGRESS: &str = "org.loopwright.egress";
/// The sandbox key an internal network or proxy belongs to.
pub const LABEL_KEY: &str = "org.loopwright.egress.key";
/// The proxy image's recipe, as hashed into its tag.
pub const LABEL_RECIPE: &str = "org.loopwright.egress.recipe";

/// The proxy's name on each sandbox's internal network.
pub const PROXY_HOST: &str = "lw-egress-proxy";
/// Where proxy images are tagged.
pub const PROXY_REPO: &str = "loopwright/egress-proxy";
/// The default base image of the proxy (any Debian with apt-get works).
pub const DEFAULT_PROXY_FROM: &str = "debian:bookworm-slim";
/// The default name of the shared network that leads out.
pub const DEFAULT_OUTSIDE: &str = "lw-egress";

/// Egress settings from a project's `.loopwright/config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `egress.allow` plus every `egress.allow.*` key.
    pub allow: AllowList,
    /// `egress.proxy-from`: the image the proxy image is built from.
    pub proxy_from: String,
    /// `egress.network`: the shared network that leads out.
    pub outside: String,
    /// `egress.host.NAME = ADDRESS`: names the proxy resolves itself,
    /// for hosts no resolver it can reach knows (a cluster without DNS,
    /// a private server); the allow-list still names them.
    pub hosts: BTreeMap<String, String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            allow: AllowList::none(),
            proxy_from: DEFAULT_PROXY_FROM.into(),
            outside: DEFAULT_OUTSIDE.into(),
            hosts: BTreeMap::new(),
        }
    }
}

impl Settings {
    /// Reads the `egress.*` keys.  An unknown `egress.` key is an error
    /// (exit 78): a misspelt `egress.alow` would otherwise silently allow
    /// nothing, and a reader would never know why.
    pub fn from_config(cfg: &Config) -> Result<Settings> {
        let file = cfg.path.as_ref().map_or_else(
            || base::config::FILE.to_string(),
            |p| p.display().to_string(),
        );
        let mut s = Settings::default();
        for (key, value) in cfg.iter() {
            let Some(rest) = key.strip_prefix("egress.") else {
                continue;
            };
            match rest {
                "allow" => s
                    .allow
                    .extend(&AllowList::parse(value, &format!("{file}: {key}"))?),
                r if r.starts_with("allow.") => s
                    .allow
                    .extend(&AllowList::parse(value, &format!("{file}: {key}"))?),
                "proxy-from" if !value.is_empty() => s.proxy_from = value.to_string(),
                "network" if !value.is_empty() => {
                    check_key(value)
                        .map_err(|e| Error::config(format!("{file}: {key}: {}", e.msg)))?;
                    s.outside = value.to_string()
                }
                r if r.starts_with("host.") => {
                    let (name, addr) = host_entry(&r["host.".len()..], value)
                        .map_err(|why| Error::config(format!("{file}: {key}: {why}")))?;
                    s.hosts.insert(name, addr);
                }
                "proxy-from" | "network" => {}
                _ => {
                    return Err(Error::config(format!(
                        "{file}: unknown key '{key}'; egress keys are egress.allow, egress.allow.NAME, \
                         egress.host.NAME, egress.proxy-from and egress.network"
                    )));
                }
            }
        }
        Ok(s)
    }
}

/// An `egress.host.NAME = ADDRESS` entry checked: a host name and an IP
/// address (the proxy's /etc/hosts takes nothing else).
fn host_entry(name: &str, value: &str) -> std::result::Result<(String, String), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.';
    if name.is_empty() || !name.chars().all(ok) || name.starts_with(['-', '.']) {
        return Err(format!(
            "'{name}' is not a host name (letters, digits, '-' and '.'); write egress.host.NAME = ADDRESS"
        ));
    }
    let addr: std::net::IpAddr = value.trim().parse().map_err(|_| {
        format!("'{value}' is not an IP address; write egress.host.{name} = ADDRESS, e.g. 10.0.0.5")
    })?;
    Ok((name.to_ascii_lowercase(), addr.to_string()))
}

impl Settings {
    /// The project's list extended by a sandbox's own entries (repeated
    /// `--allow HOST:PORT` flags); a bad entry is exit 78 naming it.
    pub fn allow_with<S: AsRef<str>>(&self, extra: &[S]) -> Result<AllowList> {
        let mut allow = self.allow.clone();
        allow.extend(&AllowList::from_entries(extra, "--allow")?);
        Ok(allow)
    }
}

/// What a sandbox container needs to use its egress: lw-sandbox puts these
/// in its container spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPlan {
    /// The only network to attach the sandbox to (`ContainerSpec::network`).
    pub network: String,
    /// The proxy container's name.
    pub proxy: String,
    /// `HTTP_PROXY=...` and the rest, for `ContainerSpec::env`.
    pub env: Vec<String>,
    /// Kernel settings for the sandbox: IPv6 off, so that no address of any
    /// kind is configured that the proxy does not govern.
    pub sysctls: BTreeMap<String, String>,
    /// The allow-list the proxy enforces.
    pub allow: AllowList,
}

/// How the proxy image is made and where the way out is.
#[derive(Clone, Debug)]
pub struct Options {
    pub proxy_from: String,
    pub outside: String,
    /// How long the proxy may take to accept connections.
    pub ready_timeout: Duration,
    /// Labels added to the sandbox's network and proxy (e.g. the caller's
    /// project label, so its `gc` finds them among its own objects).
    pub labels: BTreeMap<String, String>,
    /// Names the proxy resolves from its /etc/hosts (name -> address)
    /// before any DNS: hosts the resolver does not know.
    pub hosts: BTreeMap<String, String>,
}

impl From<&Settings> for Options {
    fn from(s: &Settings) -> Options {
        Options {
            proxy_from: s.proxy_from.clone(),
            outside: s.outside.clone(),
            ready_timeout: Duration::from_secs(30),
            labels: BTreeMap::new(),
            hosts: s.hosts.clone(),
        }
    }
}

/// The internal network of the sandbox `key`.
pub fn network_name(key: &str) -> String {
    format!("{key}-egress")
}

/// The proxy container of the sandbox `key`.
pub fn proxy_name(key: &str) -> String {
    format!("{key}-proxy")
}

/// The environment that sends a sandbox's HTTP(S) through its proxy.
pub fn proxy_env() -> Vec<String> {
    proxy_env_at(PROXY_HOST)
}

/// The same, with the proxy at `host` (an engine that names it otherwise:
/// a Service's address on Kubernetes, see [`NetworkPlan::env`]).
pub fn proxy_env_at(host: &str) -> Vec<String> {
    let url = format!("http://{host}:{}", squid::PORT);
    let no_proxy = "localhost,127.0.0.1,::1";
    let mut env = Vec::new();
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push(format!("{k}={url}"));
    }
    for k in ["NO_PROXY", "no_proxy"] {
        env.push(format!("{k}={no_proxy}"));
    }
    env
}

/// Keys name engine objects: letters, digits, `_`, `.`, `-`, starting with
/// a letter or digit (Docker's rule), short enough for a suffix.
fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= 200
        && key.as_bytes()[0].is_ascii_alphanumeric()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "invalid egress name '{key}': use letters, digits, '_', '.' and '-', starting with a letter or digit"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::error::Exit;
    use std::path::Path;

    #[test]
    fn settings_gather_every_allow_key_and_refuse_unknown_egress_keys() {
        let c = Config::parse(
            "egress.allow = api.example.com:443\negress.allow.npm = registry.npmjs.org:443\nmirror.path = x\n",
            Path::new("cfg"),
        )
        .unwrap();
        let s = Settings::from_config(&c).unwrap();
        assert_eq!(
            s.allow.to_string(),
            "api.example.com:443 registry.npmjs.org:443"
        );
        assert_eq!(s.proxy_from, DEFAULT_PROXY_FROM);
        let c = Config::parse("egress.alow = api.example.com:443\n", Path::new("cfg")).unwrap();
        let e = Settings::from_config(&c).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(e.msg.contains("unknown key 'egress.alow'"), "{}", e.msg);
    }

    #[test]
    fn host_keys_reach_the_proxy_options_and_a_bad_one_is_78() {
        let c = Config::parse(
            "egress.host.web.test = 10.0.0.5\negress.host.v6.test = ::1\n",
            Path::new("cfg"),
        )
        .unwrap();
        let o = Options::from(&Settings::from_config(&c).unwrap());
        assert_eq!(
            o.hosts.get("web.test").map(String::as_str),
            Some("10.0.0.5")
        );
        assert_eq!(o.hosts.get("v6.test").map(String::as_str), Some("::1"));
        for (text, says) in [
            (
                "egress.host.web.test = nowhere\n",
                "'nowhere' is not an IP address",
            ),
            ("egress.host.a_b = 10.0.0.5\n", "'a_b' is not a host name"),
        ] {
            let c = Config::parse(text, Path::new("cfg")).unwrap();
            let e = Settings::from_config(&c).unwrap_err();
            assert_eq!(e.exit, Exit::Config);
            assert!(
                e.msg.starts_with("cfg: egress.host.") && e.msg.contains(says),
                "{}",
                e.msg
            );
        }
    }

    #[test]
    fn a_bad_entry_in_the_config_is_78_naming_file_key_and_entry() {
        let c = Config::parse(
            "egress.allow.x = ok.example:443 *:443\n",
            Path::new(".loopwright/config"),
        )
        .unwrap();
        let e = Settings::from_config(&c).unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(
            e.msg
                .starts_with(".loopwright/config: egress.allow.x: invalid egress entry '*:443'"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn a_sandbox_extends_the_project_list_and_bad_extras_are_78() {
        let c = Config::parse("egress.allow = api.example.com:443\n", Path::new("c")).unwrap();
        let s = Settings::from_config(&c).unwrap();
        let l = s.allow_with(&["registry.npmjs.org:443"]).unwrap();
        assert_eq!(l.to_string(), "api.example.com:443 registry.npmjs.org:443");
        let e = s.allow_with(&["*:*"]).unwrap_err();
        assert_eq!((e.exit, e.exit.code()), (Exit::Config, 78));
        assert!(
            e.msg.starts_with("--allow: invalid egress entry '*:*'"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn no_allow_key_means_nothing_allowed() {
        let s = Settings::from_config(&Config::parse("", Path::new("c")).unwrap()).unwrap();
        assert!(s.allow.is_empty());
        let s = Settings::from_config(&Config::parse("egress.allow =\n", Path::new("c")).unwrap())
            .unwrap();
        assert!(s.allow.is_empty());
    }

    #[test]
    fn the_environment_names_the_proxy_in_both_cases() {
        let env = proxy_env();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            assert!(
                env.contains(&format!("{k}=http://lw-egress-proxy:3128")),
                "{k}"
            );
        }
        assert!(env.iter().any(|e| e.starts_with("NO_PROXY=localhost")));
        assert!(env.iter().any(|e| e.starts_with("no_proxy=localhost")));
    }

    #[test]
    fn keys_are_engine_names() {
        assert!(check_key("lw-sb-0123-task_1.a").is_ok());
        for bad in ["", "-x", "a/b", "a b", "ä"] {
            assert_eq!(check_key(bad).unwrap_err().exit, Exit::Usage, "{bad}");
        }
    }
}
