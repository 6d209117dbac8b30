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

pub mod allow;
pub mod squid;

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use crate::engine::{Network, NetworkEngine, NetworkSpec};
pub use allow::{AllowList, Entry, HostPattern};
pub use squid::Request;

use crate::config::Config;
use crate::engine::{BuildEvent, BuildOutcome, BuildRequest, ContainerSpec, Engine};
use crate::error::{Error, Exit, Result};

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

/// The proxy image's recipe: its build context, from the toolkit's runtime/egress.
pub const PROXY_FILES: &[(&str, &str, u32)] = &[
    (
        "proxy.Dockerfile",
        include_str!("../../runtime/egress/proxy.Dockerfile"),
        0o644,
    ),
    (
        "entry.sh",
        include_str!("../../runtime/egress/entry.sh"),
        0o755,
    ),
];

/// Bump when the recipe's meaning changes without its files changing.
const RECIPE_VERSION: &str = "loopwright-egress-proxy 1";
/// The line squid writes once it accepts connections.
const READY_LINE: &str = "Accepting HTTP Socket connections";

/// Egress settings from a project's `.loopwright/config`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `egress.allow` plus every `egress.allow.*` key.
    pub allow: AllowList,
    /// `egress.proxy-from`: the image the proxy image is built from.
    pub proxy_from: String,
    /// `egress.network`: the shared network that leads out.
    pub outside: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            allow: AllowList::none(),
            proxy_from: DEFAULT_PROXY_FROM.into(),
            outside: DEFAULT_OUTSIDE.into(),
        }
    }
}

impl Settings {
    /// Reads the `egress.*` keys.  An unknown `egress.` key is an error
    /// (exit 78): a misspelt `egress.alow` would otherwise silently allow
    /// nothing, and a reader would never know why.
    pub fn from_config(cfg: &Config) -> Result<Settings> {
        let file = cfg.path.as_ref().map_or_else(
            || crate::config::FILE.to_string(),
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
                "proxy-from" | "network" => {}
                _ => {
                    return Err(Error::config(format!(
                        "{file}: unknown key '{key}'; egress keys are egress.allow, egress.allow.NAME, \
                         egress.proxy-from and egress.network"
                    )));
                }
            }
        }
        Ok(s)
    }
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
}

impl From<&Settings> for Options {
    fn from(s: &Settings) -> Options {
        Options {
            proxy_from: s.proxy_from.clone(),
            outside: s.outside.clone(),
            ready_timeout: Duration::from_secs(30),
            labels: BTreeMap::new(),
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
    let url = format!("http://{PROXY_HOST}:{}", squid::PORT);
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

/// The proxy image's tag for the base image `from` (by its id), and the
/// recipe text it hashes.
pub fn proxy_tag(engine: &dyn Engine, from: &str) -> Result<(String, String)> {
    let Some(base) = engine.image(from)? else {
        return Err(Error::new(
            Exit::NoInput,
            format!(
                "the egress proxy's base image '{from}' is not in the engine; load a Debian image (docker load, or \
                 debootstrap + docker import as scripts/test-images does) or name one in egress.proxy-from \
                 in .loopwright/config"
            ),
        ));
    };
    let mut recipe = format!("{RECIPE_VERSION}\nfrom {from} {}\n", base.id);
    for (path, text, mode) in PROXY_FILES {
        let h = Sha256::digest(text.as_bytes());
        let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
        recipe.push_str(&format!("file {path} {mode:o} {hex}\n"));
    }
    let h = Sha256::digest(recipe.as_bytes());
    let hex: String = h.iter().take(12).map(|b| format!("{b:02x}")).collect();
    Ok((format!("{PROXY_REPO}:{hex}"), recipe))
}

/// Makes sure the proxy image for `from` exists, building it when missing;
/// build output goes to `on_event`.  Returns its tag.
pub fn ensure_proxy_image(
    engine: &dyn Engine,
    from: &str,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<String> {
    let (tag, recipe) = proxy_tag(engine, from)?;
    if engine.image_exists(&tag)? {
        return Ok(tag);
    }
    let mut b = tar::Builder::new(Vec::new());
    let tar_err = |e: std::io::Error| {
        Error::new(Exit::Software, "cannot make the proxy's build context").with_source(e)
    };
    for (path, text, mode) in PROXY_FILES {
        let mut h = tar::Header::new_gnu();
        h.set_mode(*mode);
        h.set_mtime(0);
        h.set_size(text.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, text.as_bytes())
            .map_err(tar_err)?;
    }
    let context = b.into_inner().map_err(tar_err)?;
    let req = BuildRequest {
        context,
        dockerfile: "proxy.Dockerfile".into(),
        tag: tag.clone(),
        labels: [
            (LABEL_EGRESS.to_string(), "proxy".to_string()),
            (LABEL_RECIPE.to_string(), recipe),
        ]
        .into(),
        args: [("LW_EGRESS_FROM".to_string(), from.to_string())].into(),
    };
    let mut tail: Vec<String> = Vec::new();
    let outcome = engine.build(&req, &mut |ev| {
        if let BuildEvent::Output(s) = &ev {
            tail.extend(s.lines().map(str::to_string));
            let n = tail.len().saturating_sub(15);
            tail.drain(..n);
        }
        on_event(ev);
    })?;
    match outcome {
        BuildOutcome::Built(_) => Ok(tag),
        BuildOutcome::Failed(msg) => Err(Error::new(
            Exit::Unavailable,
            format!(
                "cannot build the egress proxy image '{tag}' from '{from}': {msg}\n{}\n(the build installs squid with \
                 apt-get: the base must be Debian-like and reach its package archive)",
                tail.join("\n")
            ),
        )),
    }
}

/// Makes the egress topology of the sandbox `key` for `allow` and starts its
/// proxy; lw-sandbox then creates the sandbox with the returned plan.  Left
/// over objects of an earlier, interrupted attempt are removed first; on
/// failure, whatever this call made is removed again.
pub fn prepare(
    engine: &dyn NetworkEngine,
    key: &str,
    allow: &AllowList,
    opts: &Options,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<NetworkPlan> {
    check_key(key)?;
    let image = ensure_proxy_image(engine, &opts.proxy_from, on_event)?;
    let outside = outside_network(engine, &opts.outside)?;
    teardown(engine, key)?;
    let made = make(engine, key, allow, &image, &outside, opts);
    if made.is_err() {
        let _ = teardown(engine, key);
    }
    made
}

fn make(
    engine: &dyn NetworkEngine,
    key: &str,
    allow: &AllowList,
    image: &str,
    outside: &str,
    opts: &Options,
) -> Result<NetworkPlan> {
    let network = network_name(key);
    let proxy = proxy_name(key);
    let labels = |kind: &str| -> BTreeMap<String, String> {
        let mut l = opts.labels.clone();
        l.insert(LABEL_EGRESS.to_string(), kind.to_string());
        l.insert(LABEL_KEY.to_string(), key.to_string());
        l
    };
    engine.create_network(&NetworkSpec {
        name: network.clone(),
        internal: true,
        no_host_address: true,
        isolate_containers: false,
        labels: labels("internal"),
    })?;
    let spec = ContainerSpec {
        name: Some(proxy.clone()),
        image: image.to_string(),
        env: vec![format!("LW_EGRESS_CONF={}", squid::render(allow))],
        labels: labels("proxy"),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: vec!["no-new-privileges".into()],
        pids_limit: Some(256),
        memory_bytes: Some(256 << 20),
        network: Some(outside.to_string()),
        // The proxy relays at the application level only: a packet routed
        // through it would bypass the allow-list.
        sysctls: [("net.ipv4.ip_forward".to_string(), "0".to_string())].into(),
        log_options: [
            ("max-size".to_string(), "10m".to_string()),
            ("max-file".to_string(), "3".to_string()),
        ]
        .into(),
        ..Default::default()
    };
    engine.create(&spec)?;
    engine.connect(&network, &proxy, &[PROXY_HOST])?;
    start_proxy(engine, key, opts.ready_timeout)?;
    Ok(NetworkPlan {
        network,
        proxy,
        env: proxy_env(),
        sysctls: [(
            "net.ipv6.conf.all.disable_ipv6".to_string(),
            "1".to_string(),
        )]
        .into(),
        allow: allow.clone(),
    })
}

/// Starts the proxy of `key` (after a `stop`, or a crash) and waits until it
/// accepts connections.  lw-sandbox calls it from `start`.
pub fn start_proxy(engine: &dyn NetworkEngine, key: &str, timeout: Duration) -> Result<()> {
    let proxy = proxy_name(key);
    match engine.inspect(&proxy)? {
        None => {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "the egress proxy '{proxy}' is gone; remove the sandbox and create it again"
                ),
            ));
        }
        Some(c) if c.running => return Ok(()),
        Some(_) => {}
    }
    // Only lines logged since this start count: an earlier run's ready line
    // is in the same log.
    let before = String::from_utf8_lossy(&engine.logs(&proxy, false)?)
        .matches(READY_LINE)
        .count();
    engine.start(&proxy)?;
    let mut seen_before = 0usize;
    let ready = engine.wait_for_line(&proxy, timeout, &mut |line| {
        if line.contains(READY_LINE) {
            seen_before += 1;
            return seen_before > before;
        }
        false
    })?;
    if !ready {
        let err = String::from_utf8_lossy(&engine.logs(&proxy, false)?).into_owned();
        let tail: Vec<&str> = err
            .lines()
            .rev()
            .take(10)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(Error::new(
            Exit::Unavailable,
            format!(
                "the egress proxy '{proxy}' did not start accepting connections within {}s:\n{}",
                timeout.as_secs(),
                tail.join("\n")
            ),
        ));
    }
    Ok(())
}

/// Finds or makes the shared network that leads out.  The engine does not
/// keep network names unique, so two `prepare`s racing may each make one:
/// every caller then settles on the oldest and removes the others.
fn outside_network(engine: &dyn NetworkEngine, name: &str) -> Result<String> {
    let find = || -> Result<Vec<Network>> {
        Ok(engine
            .networks_with_label(&format!("{LABEL_EGRESS}=outside"))?
            .into_iter()
            .filter(|n| n.name == name)
            .collect())
    };
    let mut found = find()?;
    if found.is_empty() {
        if let Some(other) = engine.network(name)?
            && other.name == name
        {
            return Err(Error::config(format!(
                "network '{name}' exists but was not made for egress (it lacks the label {LABEL_EGRESS}=outside); \
                 remove it or name another in egress.network"
            )));
        }
        engine.create_network(&NetworkSpec {
            name: name.to_string(),
            internal: false,
            no_host_address: false,
            isolate_containers: true,
            labels: [(LABEL_EGRESS.to_string(), "outside".to_string())].into(),
        })?;
        found = find()?;
    }
    let Some(first) = found.first() else {
        return Err(Error::new(
            Exit::Unavailable,
            format!("network '{name}' vanished right after it was made"),
        ));
    };
    for extra in &found[1..] {
        if extra.containers.is_empty() {
            let _ = engine.remove_network(&extra.id);
        }
    }
    Ok(first.id.clone())
}

/// Removes the proxy and the internal network of `key`.  A sandbox still
/// attached to the network is detached first, leaving it with no network
/// at all.  Missing pieces are not an error.
pub fn teardown(engine: &dyn NetworkEngine, key: &str) -> Result<()> {
    check_key(key)?;
    engine.remove(&proxy_name(key), true)?;
    let label = format!("{LABEL_KEY}={key}");
    for net in engine.networks_with_label(&label)? {
        if net.labels.get(LABEL_EGRESS).map(String::as_str) != Some("internal") {
            continue;
        }
        for container in net.containers.keys() {
            engine.disconnect(&net.id, container)?;
        }
        engine.remove_network(&net.id)?;
    }
    Ok(())
}

/// The keys of every sandbox that has egress objects in the engine, for
/// `lw-sandbox gc` to compare with the sandboxes it knows.  With `label`
/// (`key=value`, as given in [`Options::labels`]), only those carrying it.
pub fn leftovers(engine: &dyn NetworkEngine, label: Option<&str>) -> Result<Vec<String>> {
    let mut keys: Vec<String> = engine
        .networks_with_label(label.unwrap_or(LABEL_KEY))?
        .into_iter()
        .filter(|n| n.labels.get(LABEL_EGRESS).map(String::as_str) == Some("internal"))
        .filter_map(|n| n.labels.get(LABEL_KEY).cloned())
        .collect();
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// Every request the proxy of `key` has logged, oldest first.
pub fn requests(engine: &dyn NetworkEngine, key: &str) -> Result<Vec<Request>> {
    let proxy = proxy_name(key);
    if engine.inspect(&proxy)?.is_none() {
        return Err(Error::new(
            Exit::NoInput,
            format!("sandbox '{key}' has no egress proxy"),
        ));
    }
    Ok(squid::parse_log(&String::from_utf8_lossy(
        &engine.logs(&proxy, true)?,
    )))
}

/// The requests the proxy of `key` refused, oldest first.
pub fn denials(engine: &dyn NetworkEngine, key: &str) -> Result<Vec<Request>> {
    Ok(requests(engine, key)?
        .into_iter()
        .filter(Request::denied)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
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
