//! Sandboxes of one root on two nodes: scripts/k8s-cluster with
//! `LW_K8S_NODES=2` (a second containerd and kubelet on this host, its own
//! state directory), the default scheduler, `lw-sandbox create` as usual.
//!
//! Asserted: both nodes Ready; four sandboxes of one root are spread over
//! both (nothing of loopwright's pins them: the per-root tools claim has no
//! node affinity here, as a ReadWriteMany one has none on a real class);
//! a message crosses from a sandbox on one node to a sandbox on the other
//! and back, each listed by a waiting `lw-inbox --wait`; rm and gc leave
//! nothing labelled with the root.  Figures: the cluster's start, pods per
//! node, the two crossings.
//!
//! Without the cached binaries (scripts/k8s-build) it fails saying so; it
//! is #[ignore]d and `.ci/run` runs it with --ignored when they are cached.

use courier_support::{LwSandbox, id_time};
use support::cluster as kube_support;
use support::courier as courier_support;
use support::sandbox as sandbox_support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_support::{Fixture, bin};

#[test]
#[ignore = "needs the single-node Kubernetes cached by scripts/k8s-build; .ci/run runs it with --ignored when cached"]
fn sandboxes_of_one_root_on_two_nodes() {
    assert!(
        kube_support::missing().is_empty(),
        "kube_nodes: CANNOT RUN: Kubernetes is not cached: {:?} missing (scripts/k8s-build)",
        kube_support::missing()
    );
    let fx = Fixture::new("nodes");
    let image = kube_support::project_image(&fx.proj);
    let cluster =
        kube_support::Cluster::start_with("kube_nodes", &[&image], &[("LW_K8S_NODES", "2")], true)
            .expect("the cached binaries are there");
    let kc = cluster.kubeconfig();
    let nodes: Vec<String> = cluster
        .kubectl(&["get", "nodes", "-o", "name"])
        .lines()
        .map(|l| l.trim_start_matches("node/").to_string())
        .collect();
    assert_eq!(nodes.len(), 2, "two nodes: {nodes:?}");
    let base = |args: &[&str]| {
        let mut c = fx.cmd(args);
        c.env("LW_ENGINE", "kubernetes").env("KUBECONFIG", &kc);
        c
    };
    let lw = LwSandbox { base: &base };

    let names = ["a", "b", "c", "d"];
    for n in names {
        lw.ok(&["create", n, "--branch", n, "--image", &image]);
    }
    let placed: BTreeMap<String, String> = cluster
        .kubectl(&[
            "get",
            "pods",
            "-l",
            &format!("org.loopwright.root={}", fx.root_id()),
            "-o",
            "custom-columns=S:.metadata.labels.org\\.loopwright\\.sandbox,N:.spec.nodeName",
            "--no-headers",
        ])
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .filter(|(s, _)| names.contains(&s.as_str()))
        .collect();
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for n in placed.values() {
        *per_node.entry(n).or_default() += 1;
    }
    assert_eq!(
        per_node.len(),
        2,
        "the root's sandboxes are on both nodes: {placed:?}"
    );

    // A message from a sandbox on one node to one on the other, and back.
    let policy = fx.dir.join("policy");
    std::fs::write(&policy, "loopwright-policy 1\nrate off\nduplicates off\n").unwrap();
    let mut med = Command::new(bin("lw-mediate"))
        .arg("--root")
        .arg(&fx.root)
        .arg("--policy")
        .arg(&policy)
        .stdout(Stdio::null())
        .spawn()
        .expect("lw-mediate runs");
    let owned = |(s, n): (&String, &String)| (s.clone(), n.clone());
    let first = placed.iter().next().map(owned).expect("placed");
    let other = placed
        .iter()
        .find(|(_, n)| **n != first.1)
        .map(owned)
        .expect("one on the other node");
    let cross = |from: &str, to: &str| -> Duration {
        let w = lw.waiter(to);
        let id = lw.post(from, to, "across");
        let (_, at) = w.listed(&id);
        at.duration_since(id_time(&id)).unwrap_or_default()
    };
    let there = cross(&first.0, &other.0);
    let back = cross(&other.0, &first.0);
    let _ = med.kill();
    let _ = med.wait();

    let t = Instant::now();
    for n in names {
        lw.ok(&["rm", "--force", n]);
    }
    lw.ok(&["gc"]);
    let left = cluster.kubectl(&[
        "get",
        "pods,pvc,configmaps,networkpolicies",
        "-l",
        &format!("org.loopwright.root={}", fx.root_id()),
        "-o",
        "name",
    ]);
    assert_eq!(left.trim(), "", "objects of the root left after rm and gc");
    eprintln!(
        "figures: two-node cluster started in {:.1} s; sandboxes per node {per_node:?}; {} ({}) -> {} ({}) {} ms, back {} ms; rm and gc {:.1} s",
        cluster.started_in.as_secs_f64(),
        first.0,
        first.1,
        other.0,
        other.1,
        there.as_millis(),
        back.as_millis(),
        t.elapsed().as_secs_f64()
    );
}
