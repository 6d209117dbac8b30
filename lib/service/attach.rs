//! The sandbox's side: `lw-sandbox create --service NAME` checks that the
//! service is up and ready before anything is made, and attaches the
//! sandbox to the service's network.  A sandbox of `--network none` has no
//! network to add one to, so it is created on the first service's network
//! (its only one); a bridge or egress sandbox joins the service networks
//! besides its own.

use super::*;
use base::error::{Error, Exit, Result};
use engine::{NetworkEngine, Pair};

/// Checks each service of `names` for a sandbox of root `root_id`: a name no
/// service of the root has is 64; a service down, failed or not ready is
/// 69, saying which and what to do.  Nothing is made.
pub fn require(engines: Pair<'_>, root_id: &str, names: &[String]) -> Result<()> {
    let engine = engines.runner;
    for name in names {
        decl::check_name(name)?;
        let nets: &dyn NetworkEngine = engine;
        let net = nets
            .network(&network_name(root_id, name))?
            .filter(|n| n.labels.get(LABEL_ROOT).map(String::as_str) == Some(root_id));
        let container = engine.inspect(&container_name(root_id, name))?;
        if net.is_none() && container.is_none() {
            return Err(Error::usage(format!(
                "--service '{name}': no such service in this mailbox root; declare it in .loopwright/services/{name} and run lw-service up {name}"
            )));
        }
        let Some(c) = container else {
            return Err(Error::new(
                Exit::Unavailable,
                format!("--service '{name}': the service is down; lw-service up {name}"),
            ));
        };
        let ready = c.labels.get(LABEL_READY).filter(|r| !r.is_empty());
        let svc = Services {
            id: root_id.to_string(),
            root_path: PathBuf::new(),
            engine,
            images: engines.builder,
        };
        if let Some(why) = svc.check(name, ready.map(String::as_str))? {
            let state = if why.starts_with("exited") {
                "failed"
            } else {
                "not ready"
            };
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "--service '{name}': the service is {state} ({why}); the sandbox was not made; see lw-service ls and lw-service logs {name}"
                ),
            ));
        }
    }
    Ok(())
}

/// The network a sandbox of `--network none` is created on: its first service's.
pub fn primary_network(root_id: &str, services: &[String]) -> Option<String> {
    services.first().map(|s| network_name(root_id, s))
}

/// Attaches the created (not started) sandbox `container` to the networks
/// of `services`, but the one it was created on (`created_on`).
pub fn connect(
    engine: &dyn NetworkEngine,
    root_id: &str,
    container: &str,
    services: &[String],
    created_on: Option<&str>,
) -> Result<()> {
    for s in services {
        let net = network_name(root_id, s);
        if Some(net.as_str()) != created_on {
            engine.connect(&net, container, &[])?;
        }
    }
    Ok(())
}
