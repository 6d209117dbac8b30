//! The Kubernetes warm pool (crates/engine/src/kubernetes/pool.rs) on the
//! single-node cluster of scripts/k8s-cluster, as a ServiceAccount bound to
//! exactly what `lw doctor --kube-role` prints.
//!
//! A pool of three hardened pods, each with a workspace and a mail claim
//! of its own, filled and running; a claim from it timed against an
//! ordinary create+start of the same spec and its two claims in the same
//! run (the goal: ≤ 1 s); the claimed pod's claims are then its owner's
//! (found by the owner's label, no pool label left); six claims racing for
//! two pods: two win, each its own pod, four get none; 16 claimed four at
//! a time, each its own; a claimed pod has left the pool for good (no later
//! claim returns it); the hostile case: from a claimed pod, what another
//! pool pod wrote in its scratch and in its own workspace claim is out of
//! reach, each pod mounts only its own claims and no claim is mounted by
//! two pods; a pool whose pods would share a writable volume, or whose own
//! claim's suffix makes no valid name, is refused before anything is
//! made; a drained pool leaves 0 pods and 0 claims of it, and the claims
//! of a pod claimed from it before stay its owner's.
//!
//! Without the cached binaries the test fails saying why (the kube suites
//! are run with --ignored only where they are cached).

use support::cluster as kube_support;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use base::error::Exit;
use engine::kubernetes::{Claimed, OwnClaim, POOL_LABEL, pool_key};
use engine::{ContainerSpec, Engine, KubeEngine, SandboxEngine, VolumeMount};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::ListParams;

use kube_support::{Cluster, IMAGE, nonce, run};

const SANDBOX: &str = "org.loopwright.sandbox";

/// The hardened spec of a pool pod: no name, no volume, its scratch an
/// emptyDir, no network.
fn spec(tag: &str) -> ContainerSpec {
    ContainerSpec {
        image: IMAGE.into(),
        cmd: vec!["sh".into(), "-c".into(), "exec sleep 3600".into()],
        env: vec![format!("POOL_TEST={tag}")],
        user: Some("100000:100000".into()),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: vec!["no-new-privileges".into()],
        memory_bytes: Some(64 << 20),
        nano_cpus: Some(250_000_000),
        pids_limit: Some(64),
        tmpfs: BTreeMap::from([("/tmp".to_string(), "rw,nosuid,size=16m".to_string())]),
        network: Some("none".into()),
        ..Default::default()
    }
}

/// A workspace and a mail claim per pool pod, as a sandbox's.
fn own() -> Vec<OwnClaim> {
    [("-work", "/work"), ("-mail", "/mail")]
        .map(|(suffix, target)| OwnClaim {
            suffix: suffix.into(),
            target: target.into(),
        })
        .to_vec()
}

fn owner(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(SANDBOX.to_string(), name.to_string())])
}

/// Fills the pool of `s` (each pod with claims `own`) to `n` and waits
/// until each of its pods runs.
fn fill_running(e: &KubeEngine, s: &ContainerSpec, own: &[OwnClaim], n: usize) -> Vec<String> {
    e.pool_fill(s, own, n).expect("the pool fills");
    let pods = e.pool_pods(&pool_key(s, own)).unwrap();
    assert_eq!(pods.len(), n, "{pods:?}");
    for p in &pods {
        e.start(p).expect("a pool pod runs");
    }
    pods
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
#[ignore = "needs the single-node Kubernetes cached by scripts/k8s-build; .ci/run runs it with --ignored when cached"]
fn a_warm_pool_on_a_real_cluster() {
    let cluster = Cluster::start("kube_pool", &[IMAGE]).expect("started");
    let tmp = std::env::temp_dir().join(format!("lw-kube-pool-{}", nonce()));
    std::fs::create_dir_all(&tmp).unwrap();
    let (kc, ns, _gone) = kube_support::service_account(&cluster, "lw-pool", &tmp);
    let kc = kc.to_str().unwrap().to_string();
    let e = KubeEngine::connect_with(Some(&kc), None, None).expect("the account connects");
    assert_eq!(e.target().namespace, ns);

    // A claim against an ordinary create of the same spec and its claims,
    // same run.
    let s = spec("timing");
    let key = pool_key(&s, &own());
    fill_running(&e, &s, &own(), 3);
    let t = Instant::now();
    let Claimed {
        pod: claimed,
        claims,
    } = e
        .pool_claim(&key, &owner("timed"))
        .unwrap()
        .expect("a running pod is claimed");
    let from_pool = t.elapsed();
    let mut plain = s.clone();
    let name = format!("lw-plain-{}", nonce());
    plain.name = Some(name.clone());
    let t = Instant::now();
    for c in own() {
        let v = format!("{name}{}", c.suffix);
        e.create_volume(&v, &owner("plain")).unwrap();
        plain.volumes.push(VolumeMount {
            volume: v,
            target: c.target,
            read_only: false,
        });
    }
    let made = e.create(&plain).unwrap();
    e.start(&made).unwrap();
    let ordinary = t.elapsed();
    eprintln!(
        "figure: a pod and its 2 claims from the pool {:.0} ms (claim), an ordinary create+start of both {:.0} ms, same run",
        ms(from_pool),
        ms(ordinary)
    );
    assert!(from_pool < Duration::from_secs(1), "claim {from_pool:?}");
    // The claimed pod runs, carries its owner's label and not the pool's,
    // and writes its own workspace.
    assert_eq!(run(&e, &claimed, &["id", "-u"]).1.trim(), "100000");
    let (code, _, err) = run(
        &e,
        &claimed,
        &["sh", "-c", "echo mine > /work/f && cat /work/f"],
    );
    assert_eq!(code, 0, "{err}");
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &ns);
    let labels = e
        .block_on(pods.get(&claimed))
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels.get(SANDBOX).map(String::as_str), Some("timed"));
    assert!(!labels.contains_key(POOL_LABEL), "{labels:?}");
    assert_eq!(
        e.containers_with_label(&format!("{SANDBOX}=timed"))
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect::<Vec<_>>(),
        std::slice::from_ref(&claimed)
    );
    // Its claims are the owner's now: by the owner's label, none left in
    // the pool's.
    let mut want: Vec<String> = own()
        .iter()
        .map(|c| format!("{claimed}{}", c.suffix))
        .collect();
    want.sort();
    let mut got = claims.clone();
    got.sort();
    assert_eq!(got, want);
    let mut by_owner: Vec<String> = e
        .volumes_with_label(&format!("{SANDBOX}=timed"))
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    by_owner.sort();
    assert_eq!(by_owner, want);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.client().clone(), &ns);
    let in_pool = |key: &str| -> Vec<String> {
        let lp = ListParams::default().labels(&format!("{POOL_LABEL}={key}"));
        let mut v: Vec<String> = e
            .block_on(pvcs.list(&lp))
            .unwrap()
            .items
            .into_iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| c.metadata.name)
            .collect();
        v.sort();
        v
    };
    assert_eq!(in_pool(&key).len(), 4, "{:?}", in_pool(&key));
    assert!(in_pool(&key).iter().all(|c| !c.starts_with(&claimed)));
    // Left the pool for good: two more claims take the other two, a
    // third finds none.
    let left = e.pool_pods(&key).unwrap();
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&claimed));
    hostile(&e, &claimed, &left[0]);
    let mut done = vec![(claimed.clone(), claims), (made, vec![])];
    for i in 0..2 {
        let got = e.pool_claim(&key, &owner(&format!("next-{i}"))).unwrap();
        assert!(got.as_ref().is_some_and(|g| g.pod != claimed), "{got:?}");
        done.extend(got.map(|g| (g.pod, g.claims)));
    }
    assert_eq!(e.pool_claim(&key, &owner("none")).unwrap(), None);
    assert!(in_pool(&key).is_empty(), "{:?}", in_pool(&key));
    // The node has 2 CPUs: what is done goes before the next pool.
    for (p, claims) in &done {
        e.remove(p, true).unwrap();
        for c in claims {
            e.remove_volume(c).unwrap();
        }
    }
    for c in own() {
        e.remove_volume(&format!("{name}{}", c.suffix)).unwrap();
    }

    race(&kc, &e);
    fleet(&kc, &e);
    refused(&e, &pods);

    // Drained: 0 pods and 0 claims of any pool left once they are gone;
    // the claims of a pod claimed from it before stay its owner's.
    let s = spec("drain");
    let key = pool_key(&s, &own());
    let pool = fill_running(&e, &s, &own(), 3);
    let kept = e
        .pool_claim(&key, &owner("kept"))
        .unwrap()
        .expect("claimed");
    assert_eq!(e.pool_drain(None).unwrap(), 2);
    for p in pool.iter().filter(|p| **p != kept.pod) {
        e.remove(p, true).unwrap();
    }
    let lp = ListParams::default().labels(POOL_LABEL);
    assert!(e.block_on(pods.list(&lp)).unwrap().items.is_empty());
    assert!(in_pool(&key).is_empty(), "{:?}", in_pool(&key));
    let mut kept_claims: Vec<String> = e
        .volumes_with_label(&format!("{SANDBOX}=kept"))
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    kept_claims.sort();
    let mut want = kept.claims.clone();
    want.sort();
    assert_eq!(kept_claims, want);
    let (code, _, err) = run(&e, &kept.pod, &["sh", "-c", "echo still > /work/f"]);
    assert_eq!(
        code, 0,
        "the claimed pod's workspace after the drain: {err}"
    );
    e.remove(&kept.pod, true).unwrap();
    for c in &kept.claims {
        e.remove_volume(c).unwrap();
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Six claims at once for a pool of two, each through its own connection:
/// two win with two different pods, four find none.
fn race(kc: &str, e: &KubeEngine) {
    let s = spec("race");
    let key = pool_key(&s, &[]);
    let pool = fill_running(e, &s, &[], 2);
    let go = Arc::new(Barrier::new(6));
    let racers: Vec<_> = (0..6)
        .map(|i| {
            let (kc, key, go) = (kc.to_string(), key.clone(), go.clone());
            std::thread::spawn(move || {
                let e = KubeEngine::connect_with(Some(&kc), None, None).unwrap();
                go.wait();
                e.pool_claim(&key, &owner(&format!("racer-{i}")))
                    .unwrap()
                    .map(|c| c.pod)
            })
        })
        .collect();
    let got: Vec<Option<String>> = racers.into_iter().map(|h| h.join().unwrap()).collect();
    let mut won: Vec<String> = got.iter().flatten().cloned().collect();
    won.sort();
    eprintln!("figure: 6 claims racing for a pool of 2: {got:?}");
    assert_eq!(won, pool, "each pod to one claim: {got:?}");
    for (i, g) in got.iter().enumerate() {
        if let Some(p) = g {
            let on: Vec<String> = e
                .containers_with_label(&format!("{SANDBOX}=racer-{i}"))
                .unwrap()
                .into_iter()
                .map(|c| c.name)
                .collect();
            assert_eq!(on, std::slice::from_ref(p), "racer {i}");
        }
    }
    assert!(e.pool_pods(&key).unwrap().is_empty());
    for p in &pool {
        e.remove(p, true).unwrap();
    }
}

/// A pool of 16, each pod with its own two claims, filled and running,
/// then claimed by four at a time: each pod to one claim; the fill and the
/// claims timed.
fn fleet(kc: &str, e: &KubeEngine) {
    const N: usize = 16;
    // 16 pods of 0.05 CPU fit the test node's 2 CPUs.
    let s = ContainerSpec {
        nano_cpus: Some(50_000_000),
        ..spec("fleet")
    };
    let key = pool_key(&s, &own());
    let t = Instant::now();
    let pool = fill_running(e, &s, &own(), N);
    let filled = t.elapsed();
    let t = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (kc, key) = (kc.to_string(), key.clone());
            std::thread::spawn(move || {
                let e = KubeEngine::connect_with(Some(&kc), None, None).unwrap();
                (0..N / 4)
                    .map(|i| {
                        let t = Instant::now();
                        let got = e.pool_claim(&key, &owner(&format!("fleet-{w}-{i}")));
                        (
                            got.unwrap().expect("a pod is left for each claim"),
                            t.elapsed(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let got: Vec<(Claimed, Duration)> = workers
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let claimed = t.elapsed();
    let mut names: Vec<String> = got.iter().map(|(c, _)| c.pod.clone()).collect();
    names.sort();
    assert_eq!(names, pool, "each pod to one claim");
    let mut each: Vec<Duration> = got.iter().map(|(_, d)| *d).collect();
    each.sort();
    eprintln!(
        "figure: a pool of {N} pods, each with 2 claims of its own, filled and running in {:.1} s; {N} claims four at a time in {:.0} ms (median {:.0} ms, max {:.0} ms)",
        filled.as_secs_f64(),
        ms(claimed),
        ms(each[N / 2]),
        ms(each[N - 1])
    );
    for (c, _) in &got {
        assert_eq!(c.claims.len(), 2, "{c:?}");
        e.remove(&c.pod, true).unwrap();
        for v in &c.claims {
            e.remove_volume(v).unwrap();
        }
    }
}

/// From claimed pod `mine`, what pool pod `other` wrote is out of reach:
/// its scratch is its own emptyDir and its workspace its own claim; each
/// mounts only claims named after itself, and no claim in the namespace is
/// mounted by two pods.
fn hostile(e: &KubeEngine, mine: &str, other: &str) {
    let marker = format!("pool-secret-{}", nonce());
    let (code, _, err) = run(
        e,
        other,
        &[
            "sh",
            "-c",
            &format!("echo {marker} > /tmp/left-by-other && echo {marker} > /work/left-by-other"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = run(
        e,
        mine,
        &[
            "sh",
            "-c",
            &format!("grep -rs {marker} /tmp /work /mail /home 2>/dev/null; cat /proc/self/mounts"),
        ],
    );
    assert_eq!(code, 0);
    assert!(
        !out.contains(&marker),
        "the other pod's file is readable:\n{out}"
    );
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let claims = |pod: &Pod| -> Vec<String> {
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect()
    };
    for p in [mine, other] {
        let c = claims(&e.block_on(pods.get(p)).unwrap());
        assert_eq!(c.len(), 2, "{p}: {c:?}");
        assert!(
            c.iter().all(|c| c.starts_with(&format!("{p}-"))),
            "{p}: {c:?}"
        );
    }
    let mut mounted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in e.block_on(pods.list(&ListParams::default())).unwrap().items {
        for c in claims(&p) {
            mounted
                .entry(c)
                .or_default()
                .extend(p.metadata.name.clone());
        }
    }
    let shared: Vec<_> = mounted.iter().filter(|(_, p)| p.len() > 1).collect();
    assert!(shared.is_empty(), "claims mounted by two pods: {shared:?}");
}

/// A pool whose pods would share a writable volume, or whose own claim's
/// suffix makes no valid name: 64, nothing made.
fn refused(e: &KubeEngine, pods: &Api<Pod>) {
    let mut s = spec("shared");
    s.volumes.push(VolumeMount {
        volume: "lw-work-shared".into(),
        target: "/work".into(),
        read_only: false,
    });
    let err = e.pool_fill(&s, &[], 2).unwrap_err();
    assert_eq!(err.exit, Exit::Usage, "{err}");
    assert!(err.msg.contains("lw-work-shared"), "{err}");
    let bad = [OwnClaim {
        suffix: "/../x".into(),
        target: "/work".into(),
    }];
    let err = e.pool_fill(&spec("bad-suffix"), &bad, 2).unwrap_err();
    assert_eq!(err.exit, Exit::Usage, "{err}");
    assert!(err.msg.contains("/../x"), "{err}");
    for key in [pool_key(&s, &[]), pool_key(&spec("bad-suffix"), &bad)] {
        let lp = ListParams::default().labels(&format!("{POOL_LABEL}={key}"));
        assert!(e.block_on(pods.list(&lp)).unwrap().items.is_empty());
    }
}
