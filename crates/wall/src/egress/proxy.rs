//! A sandbox's way out: its internal network and its proxy, made (and
//! undone when the proxy does not come up), started again, torn down with
//! the sandbox, found when a killed create left them, and its log read.

use std::collections::BTreeMap;
use std::time::Duration;

use super::AllowList;
use super::{
    LABEL_EGRESS, LABEL_KEY, NetworkPlan, Options, PROXY_HOST, Request, check_key,
    ensure_proxy_image, network_name, proxy_env_at, proxy_name, sidecar, squid,
};

/// The uid (and gid) of Debian's `proxy` user, the proxy image's `USER`.
const PROXY_UID: u32 = 13;
use base::error::{Error, Exit, Result};
use engine::ContainerSpec;
use engine::{BuildEvent, ImageBuilder, Network, NetworkEngine, NetworkSpec};

/// The line squid writes once it accepts connections.
const READY_LINE: &str = "Accepting HTTP Socket connections";

/// Makes the egress topology of the sandbox `key` for `allow` and starts its
/// proxy; lw-sandbox then creates the sandbox with the returned plan.  Left
/// over objects of an earlier, interrupted attempt are removed first; on
/// failure, whatever this call made is removed again.  `engine` builds the
/// proxy image too (Docker); a runner paired with another builder makes
/// the image there ([`ensure_proxy_image`]) and calls
/// [`prepare_with_image`].
pub fn prepare(
    engine: &(impl NetworkEngine + ImageBuilder),
    key: &str,
    allow: &AllowList,
    opts: &Options,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<NetworkPlan> {
    check_key(key)?;
    let image = ensure_proxy_image(engine, &opts.proxy_from, on_event)?;
    prepare_with_image(engine, key, allow, &image, opts)
}

/// [`prepare`] with a proxy image the engine already has.  A Kubernetes
/// runner builds no images: there the image is built on the Docker builder
/// paired with it ([`ensure_proxy_image`]) and reaches the nodes through a
/// registry (`build.cache`) or an import into their runtime.
pub fn prepare_with_image(
    engine: &dyn NetworkEngine,
    key: &str,
    allow: &AllowList,
    image: &str,
    opts: &Options,
) -> Result<NetworkPlan> {
    check_key(key)?;
    // A sibling settling on the same way out may remove the network this
    // call chose (a newer duplicate, still empty), or an older one this call
    // could not see yet may appear: then make again on the oldest.  The
    // oldest is never removed, so every caller ends on it.
    for _ in 0..SETTLE_ATTEMPTS {
        let outside = outside_network(engine, &opts.outside)?;
        teardown(engine, key)?;
        match make(engine, key, allow, image, &outside, opts) {
            Ok(plan) if oldest_outside(engine, &opts.outside)?.as_deref() == Some(&outside) => {
                return Ok(plan);
            }
            Ok(_) => {}
            Err(e) if engine.network(&outside)?.is_some() => {
                let _ = teardown(engine, key);
                return Err(e);
            }
            Err(_) => {}
        }
        let _ = teardown(engine, key);
    }
    Err(unsettled(&opts.outside))
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
        // The image's user `proxy`, by number: Kubernetes checks that a
        // non-root user is one only when it is numeric.
        user: Some(format!("{PROXY_UID}:{PROXY_UID}")),
        hosts: opts.hosts.clone(),
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
    // Docker resolves the alias; Kubernetes gives a Service's address.
    let host = engine.publish(&proxy, squid::PORT, &labels("proxy"))?;
    Ok(NetworkPlan {
        network,
        proxy,
        env: proxy_env_at(host.as_deref().unwrap_or(PROXY_HOST)),
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
    let what = "the egress proxy";
    if let Some(log) = sidecar::start_until_ready(engine, what, &proxy, READY_LINE, timeout)? {
        let tail: Vec<&str> = log
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
                "{what} '{proxy}' did not start accepting connections within {}s:\n{}",
                timeout.as_secs(),
                tail.join("\n")
            ),
        ));
    }
    Ok(())
}

/// How often a prepare looks again when siblings racing it moved the
/// ground (a network made or removed between two looks); each look is a
/// few engine calls, no wait.
const SETTLE_ATTEMPTS: usize = 16;

fn unsettled(name: &str) -> Error {
    Error::new(
        Exit::TempFail,
        format!(
            "network '{name}' did not settle after {SETTLE_ATTEMPTS} attempts: \
             other prepares kept making or removing it; try again"
        ),
    )
}

/// Finds or makes the shared network `name` that leads out and returns its
/// id.  Names are not unique to every engine (Docker 20.10 keeps
/// duplicates, newer engines answer 409), so prepares racing one another
/// may each make one: every caller settles on the oldest labelled one and
/// removes the empty others.  Only a network by that name that lacks the
/// label is the user's mistake; one a sibling made after this call listed
/// (the inspect sees it before the list does) or two siblings' duplicates
/// (the engine calls the name ambiguous) mean: look again.
pub fn outside_network(engine: &dyn NetworkEngine, name: &str) -> Result<String> {
    let mut last = None;
    for _ in 0..SETTLE_ATTEMPTS {
        if let Some(id) = settle_outside(engine, name)? {
            return Ok(id);
        }
        match engine.network(name) {
            Ok(Some(n)) if n.name == name && is_outside(&n) => continue,
            Ok(Some(n)) if n.name == name => {
                return Err(Error::config(format!(
                    "network '{name}' exists but was not made for egress (it lacks the label {LABEL_EGRESS}=outside); \
                     remove it or name another in egress.network"
                )));
            }
            Ok(_) => {}
            Err(e) => {
                last = Some(e);
                continue;
            }
        }
        match engine.create_network(&NetworkSpec {
            name: name.to_string(),
            internal: false,
            no_host_address: false,
            isolate_containers: true,
            labels: [(LABEL_EGRESS.to_string(), "outside".to_string())].into(),
        }) {
            Ok(_) => {}
            // 409 from an engine that keeps names unique, or no address
            // pool left after siblings' duplicates: use theirs if it is there.
            Err(e) => match settle_outside(engine, name)? {
                Some(id) => return Ok(id),
                None if e.exit == Exit::CantCreat => last = Some(e),
                None => return Err(e),
            },
        }
    }
    Err(last.unwrap_or_else(|| unsettled(name)))
}

fn is_outside(n: &Network) -> bool {
    n.labels.get(LABEL_EGRESS).map(String::as_str) == Some("outside")
}

/// The labelled networks named `name`, oldest first.
fn outside_networks(engine: &dyn NetworkEngine, name: &str) -> Result<Vec<Network>> {
    Ok(engine
        .networks_with_label(&format!("{LABEL_EGRESS}=outside"))?
        .into_iter()
        .filter(|n| n.name == name)
        .collect())
}

fn oldest_outside(engine: &dyn NetworkEngine, name: &str) -> Result<Option<String>> {
    Ok(outside_networks(engine, name)?
        .into_iter()
        .next()
        .map(|n| n.id))
}

/// The oldest labelled network named `name`, once the empty younger ones
/// are removed (one in use stays: the engine refuses, and its user moves
/// when it checks its choice).
fn settle_outside(engine: &dyn NetworkEngine, name: &str) -> Result<Option<String>> {
    let found = outside_networks(engine, name)?;
    let Some(first) = found.first() else {
        return Ok(None);
    };
    for extra in &found[1..] {
        if extra.containers.is_empty() {
            let _ = engine.remove_network(&extra.id);
        }
    }
    Ok(Some(first.id.clone()))
}

/// Removes the proxy and the internal network of `key`.  A sandbox still
/// attached to the network is detached first, leaving it with no network
/// at all.  Missing pieces are not an error.
pub fn teardown(engine: &dyn NetworkEngine, key: &str) -> Result<()> {
    check_key(key)?;
    engine.unpublish(&proxy_name(key))?;
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
