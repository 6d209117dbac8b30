//! `create` from a warm pool (docs/scale.md): on an engine that keeps one
//! (Kubernetes, `kube.warm-pool` above 0), a volume-mode create takes a
//! ready pod instead of making its volumes, a setup pod and its own pod.
//!
//! A pool's pods are made from the **template**: the spec the sandbox's
//! pod would have, without what makes it a given sandbox's (its name,
//! labels, variables, network; its workspace and mail volumes, which each
//! pool pod has of its own instead) and with the secrets' tmpfs, empty
//! unless given secrets.  The root's tools volume is mounted read-only.
//! So every create of a root with the same image and limits meets the
//! same pool, whatever its name, branch, network or secrets.
//!
//! A claim ([`engine::WarmPool::claim`]) gives the pod and its two claims
//! the sandbox's labels; the record then names the pod as its container
//! and the claims as its volumes, and every later step (egress, clone,
//! secrets, push, `rm`, `gc`) works on them as on any sandbox's.  What the
//! pod's spec could not carry is given after: the mail skeleton (one exec
//! in the pod itself, as the sandbox's user, in place of the setup pod), the sandbox's variables (an annotation every exec reads
//! first, [`engine::WarmPool::set_env`]) and its network (a label, as
//! `connect` gives one).
//!
//! The create keeps its plan (the template, the claims, the size) in
//! `ROOT/state/pool.json`; the root's courier tops that pool up once
//! creates pause ([`refill`], courier/serve.rs), so a burst takes from the
//! pool with no pod made beside it, and drains the root's pools of other
//! templates (another image, other limits): one pool per root.  `gc`
//! drains those too, and every pool of the root when the pool is off; the
//! root's last sandbox gone takes the pools with the tools volume (gc.rs).

use std::path::PathBuf;

use super::volume::TOOLS_DIR;
use super::{MAILBOX, Record, Sandboxes, WORK, container_spec};
use base::error::{Error, Exit, Result};
use engine::{ContainerSpec, OwnClaim, VolumeMount, WarmPool, pool_key};

/// What a create needs to claim from its root's pool, and the root's
/// courier to refill it: kept in `ROOT/state/pool.json` by the latest
/// create that used it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct PoolPlan {
    pub template: ContainerSpec,
    pub own: Vec<OwnClaim>,
    pub key: String,
    pub size: usize,
    /// The tools build the template mounts.
    pub tools_key: String,
}

/// The template of a pool's pods from `spec`, a sandbox's (made with its
/// secrets' tmpfs): no name, variables, network or bind, `labels` (the
/// root's), the `tools` volume read-only as its only volume.
fn template(
    mut t: ContainerSpec,
    labels: std::collections::BTreeMap<String, String>,
    tools: &str,
) -> ContainerSpec {
    t.name = None;
    t.labels = labels;
    t.env.clear();
    t.network = None;
    t.binds.clear();
    t.volumes = vec![VolumeMount {
        volume: tools.to_string(),
        target: TOOLS_DIR.into(),
        read_only: true,
    }];
    t
}

/// The claims each pool pod is made with: its workspace and its mail.
fn own_claims() -> Vec<OwnClaim> {
    vec![
        OwnClaim {
            suffix: "-work".into(),
            target: WORK.into(),
        },
        OwnClaim {
            suffix: "-mail".into(),
            target: MAILBOX.into(),
        },
    ]
}

impl<'a> Sandboxes<'a> {
    /// The pool a create of `rec` (not yet made, in volume mode) would
    /// claim from: `None` when the engine keeps none or it is off, or the
    /// sandbox publishes ports (a pod's ports are in its spec).
    pub(super) fn pool_plan(
        &self,
        rec: &Record,
        settings: &super::Settings,
        bins: &[(PathBuf, &str)],
    ) -> Option<PoolPlan> {
        let pool = self.engine.warm_pool()?;
        let size = pool.pool_size();
        if size == 0 {
            // Off: the courier refills nothing more (gc drains the pool).
            forget_plan(self);
        }
        if size == 0 || !rec.volume_mode || !rec.ports.is_empty() {
            return None;
        }
        let boxdir = self.root.sandbox(&rec.name).dir;
        let tools_key = super::volume::tools_key(bins);
        let t = template(
            container_spec(self, rec, settings, &boxdir, bins, true),
            self.labels_for(None),
            &self.tools_volume(&tools_key),
        );
        let own = own_claims();
        let key = pool_key(&t, &own);
        let plan = PoolPlan {
            template: t,
            own,
            key,
            size,
            tools_key,
        };
        // The courier refills the pool this plan names (courier/serve.rs).
        if let Ok(b) = serde_json::to_vec_pretty(&plan)
            && std::fs::read(plan_path(self)).ok() != Some(b.clone())
        {
            let _ = base::fs::write_replace(
                &plan_path(self),
                &b,
                0o600,
                base::fs::Durability::Unsynced,
            );
        }
        Some(plan)
    }

    /// Takes a pod of `plan`'s pool for `rec`, whose record then names it
    /// and its claims (written before anything else is done to it); false
    /// when the pool has none ready.
    pub(super) fn pool_take(
        &self,
        rec: &mut Record,
        plan: &PoolPlan,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<bool> {
        let pool = self.pool()?;
        let Some(got) = pool.claim(&plan.key, labels)? else {
            return Ok(false);
        };
        let claim = |suffix: &str| {
            got.claims
                .iter()
                .find(|c| c.ends_with(suffix))
                .cloned()
                .ok_or_else(|| {
                    Error::new(
                        Exit::Software,
                        format!(
                            "the pool pod '{}' has no '{suffix}' claim of its own (it has: {})",
                            got.pod,
                            got.claims.join(", ")
                        ),
                    )
                })
        };
        rec.container = got.pod.clone();
        // Named first: a failure below still finds its claims by them.
        let (work, mail) = (claim("-work"), claim("-mail"));
        if let Ok(w) = &work {
            rec.volume = w.clone();
        }
        rec.mail_volume = mail.as_ref().ok().cloned();
        self.write_record(rec)?;
        work?;
        mail?;
        Ok(true)
    }

    /// Makes the claimed pod of `rec` the sandbox `spec` describes: checks
    /// it may write its volumes, copies the mailbox's skeleton in, gives it
    /// the sandbox's variables and network; `spec` becomes the pod's.
    pub(super) fn pool_adopt(
        &self,
        rec: &Record,
        plan: &PoolPlan,
        spec: &mut ContainerSpec,
    ) -> Result<()> {
        let pool = self.pool()?;
        let name = rec.name.as_str();
        let key = &plan.tools_key;
        // One exec: the checks, the mail skeleton (a tar on its stdin,
        // unpacked as the pod's user, the files its own) and the PATH.
        let script = format!(
            "for d in {WORK} {MAILBOX}; do [ -w \"$d\" ] || {{ echo \"$d is not writable by uid $(id -u)\" >&2; exit 1; }}; done && \
             {{ [ -e {TOOLS_DIR}/.complete-{key} ] || {{ echo \"{TOOLS_DIR} does not hold the tools (.complete-{key})\" >&2; exit 1; }}; }} && \
             tar -x -o -f - -C {MAILBOX} && mkdir -p {WORK}/home && printf 'PATH=%s\\n' \"$PATH\""
        );
        let (code, out, err) = self.run_fed(
            rec,
            &["/bin/sh", "-c", &script],
            Box::new(super::volume::mail_skeleton(self, rec.uid)?),
        )?;
        if code != 0 {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot prepare pod '{}' of the warm pool for sandbox '{name}' (exit {code}): {}",
                    rec.container,
                    base::visible::visible(String::from_utf8_lossy(&err).trim())
                ),
            ));
        }
        let path = super::volume::image_path(&String::from_utf8_lossy(&out));
        let mail = rec.mail_volume.clone().unwrap_or_default();
        spec.name = Some(rec.container.clone());
        super::volume::on_volumes(
            spec,
            super::volume::mounts(&rec.volume, &mail),
            &self.tools_volume(key),
            &path,
        );
        pool.set_env(&rec.container, &spec.env)?;
        match spec.network.as_deref() {
            None | Some("") | Some("none") => {}
            Some(n) => self.engine.connect(n, &rec.container, &[])?,
        }
        Ok(())
    }

    /// Drains the root's pools but the one the plan names (`stale`: `gc`),
    /// or all of them, the plan forgotten first (the root's last sandbox
    /// gone, its tools volume with it), saying each to `out`.
    pub(super) fn pool_drain_root(&self, stale: bool, out: &mut dyn FnMut(&str)) -> Result<()> {
        let Some(pool) = self.engine.warm_pool() else {
            return Ok(());
        };
        let keep = if stale {
            read_plan(self).map(|p| p.key)
        } else {
            forget_plan(self);
            None
        };
        for k in pool.pool_keys(&self.root_label())? {
            if keep.as_deref() != Some(k.as_str()) {
                let n = pool.drain(&k)?;
                out(&format!("pool {k} ({n} pod(s))"));
            }
        }
        Ok(())
    }

    fn pool(&self) -> Result<&dyn WarmPool> {
        self.engine.warm_pool().ok_or_else(|| {
            Error::new(
                Exit::Software,
                "the engine keeps no warm pool, yet a create planned to use one",
            )
        })
    }
}

/// Where the root's pool plan is kept.
fn plan_path(sb: &Sandboxes) -> PathBuf {
    sb.root.state_dir().join("pool.json")
}

fn forget_plan(sb: &Sandboxes) {
    let _ = std::fs::remove_file(plan_path(sb));
}

fn read_plan(sb: &Sandboxes) -> Option<PoolPlan> {
    serde_json::from_slice(&std::fs::read(plan_path(sb)).ok()?).ok()
}

/// What a courier's refill did.
pub(super) struct Refilled {
    pub key: String,
    /// Pods made now.
    pub made: usize,
    /// Pods of the root's other pools removed.
    pub drained: usize,
    /// Whether the pool may still lack pods (it made as many as it may at once).
    pub more: bool,
}

/// The root's courier tops the pool of the latest create's plan up, at
/// most `most` pods at once, and drains the root's pools of other
/// templates; `None` without a plan (no pool, or it is off).  The courier
/// calls it when creates have paused (courier/serve.rs), so a burst of
/// creates takes from the pool without pods being made beside it.
pub(super) fn refill(sb: &Sandboxes, most: usize) -> Result<Option<Refilled>> {
    let Some(plan) = read_plan(sb) else {
        return Ok(None);
    };
    let Some(pool) = sb.engine.warm_pool() else {
        return Ok(None);
    };
    let mut drained = 0;
    for k in pool.pool_keys(&sb.root_label())? {
        if k != plan.key {
            drained += pool.drain(&k)?;
        }
    }
    let made = pool.fill(&plan.template, &plan.own, plan.size, Some(most))?;
    Ok(Some(Refilled {
        key: plan.key,
        more: made.len() >= most,
        made: made.len(),
        drained,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(name: &str, network: &str, memory: i64) -> ContainerSpec {
        ContainerSpec {
            name: Some(format!("lw-sb-r-{name}")),
            image: "lw-img:1".into(),
            env: vec![
                format!("LW_SANDBOX={name}"),
                "HTTP_PROXY=http://10.0.0.1:3128".into(),
            ],
            labels: [("org.loopwright.sandbox".to_string(), name.to_string())].into(),
            network: Some(network.into()),
            binds: vec![engine::Bind {
                source: format!("/root/{name}"),
                target: WORK.into(),
                read_only: false,
            }],
            memory_bytes: Some(memory),
            user: Some("1000:1000".into()),
            ..Default::default()
        }
    }

    #[test]
    fn sandboxes_that_differ_only_in_what_a_claim_gives_meet_one_pool() {
        let root = std::collections::BTreeMap::from([(
            "org.loopwright.root".to_string(),
            "r".to_string(),
        )]);
        let t = |s| template(s, root.clone(), "lw-sb-r-tools-k");
        let a = t(sandbox("a", "none", 96 << 20));
        let b = t(sandbox("b", "r-b-egress", 96 << 20));
        let own = own_claims();
        assert_eq!(pool_key(&a, &own), pool_key(&b, &own));
        assert_ne!(
            pool_key(&a, &own),
            pool_key(&t(sandbox("c", "none", 128 << 20)), &own)
        );
        // Nothing of a sandbox's in it: no variables, network, name or
        // bind; the tools its only volume, read-only.
        assert!(a.env.is_empty() && a.network.is_none() && a.name.is_none() && a.binds.is_empty());
        assert_eq!(a.labels, root);
        assert_eq!(a.volumes.len(), 1);
        assert!(a.volumes[0].read_only && a.volumes[0].target == TOOLS_DIR);
        // Each pod's own claims: the workspace and the mail dir.
        let targets: Vec<&str> = own.iter().map(|c| c.target.as_str()).collect();
        assert_eq!(targets, [WORK, MAILBOX]);
    }
}
