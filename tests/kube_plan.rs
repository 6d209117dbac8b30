//! scripts/k8s-cluster's plan: what lets two test clusters share a host
//! (issue 31).  Each state directory takes an index (bridge lwk8sN, pods
//! 10.89.N.0/24) and ports of its own, kept in STATE/plan and reused on
//! the next run; what is in the way is diagnosed by whether the cluster
//! that owns it is running (a pid file in its state directory naming a
//! live process of it).  `k8s-cluster plan` takes and prints all that and
//! starts nothing, so this runs without the cluster's binaries; a real
//! two-cluster start needs scripts/k8s-build's binaries (kube_engine's
//! suites).  Each test has its own registry (`LW_K8S_CLUSTERS`), and they
//! run one at a time: a port one holds would move another's.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/k8s-cluster")
}

struct Host {
    dir: PathBuf,
}

impl Host {
    fn new(name: &str) -> Host {
        for tool in ["bash", "ss", "ip", "flock", "realpath"] {
            assert!(
                Command::new("sh")
                    .args(["-c", &format!("command -v {tool}")])
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
                    .success(),
                "kube_plan: {tool} is not installed (apt-get install iproute2 util-linux coreutils)"
            );
        }
        let dir = std::env::temp_dir().join(format!(
            "lw-kube-plan-{name}-{}-{:08x}",
            std::process::id(),
            base::id::random128() as u32
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Host { dir }
    }

    fn state(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn run(&self, args: &[&str], state: &Path) -> (BTreeMap<String, String>, String) {
        let o = Command::new(script())
            .args(args)
            .env("LW_K8S_CLUSTERS", self.dir.join("clusters"))
            .env("LW_K8S_STATE", state)
            .env("LW_K8S_NO_NETPOL", "1")
            .output()
            .expect("scripts/k8s-cluster runs");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "k8s-cluster {args:?}: {o:?}");
        let out = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (out, err)
    }

    /// `k8s-cluster plan` for `state`: its lines as a map, and its stderr.
    fn plan(&self, state: &Path) -> (BTreeMap<String, String>, String) {
        self.run(&["plan"], state)
    }

    fn status(&self) -> String {
        let o = Command::new(script())
            .arg("status")
            .env("LW_K8S_CLUSTERS", self.dir.join("clusters"))
            .output()
            .expect("scripts/k8s-cluster runs");
        assert!(o.status.success(), "k8s-cluster status: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ports(plan: &BTreeMap<String, String>) -> Vec<u16> {
    plan.iter()
        .filter(|(k, _)| k.starts_with("port."))
        .map(|(_, v)| v.parse().expect("a port number"))
        .collect()
}

/// A component of the cluster at `state`: a process whose command line
/// names the state directory, its pid in STATE/etcd.pid; it ends when its
/// standard input closes.
fn component(state: &Path) -> Child {
    std::fs::create_dir_all(state).unwrap();
    let child = Command::new("sh")
        .args(["-c", "read _"])
        .arg(state.join("etcd"))
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh runs");
    std::fs::write(state.join("etcd.pid"), child.id().to_string()).unwrap();
    child
}

#[test]
fn two_state_dirs_get_their_own_bridge_network_and_ports_and_keep_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new("two");
    let (a, b) = (host.state("a"), host.state("b"));
    let (pa, _) = host.plan(&a);
    let (pb, _) = host.plan(&b);
    for key in ["index", "bridge", "pod-cidr", "cni-network", "apiserver"] {
        assert_ne!(pa[key], pb[key], "{key} is the same for both clusters");
    }
    assert_eq!(pa["bridge"], format!("lwk8s{}", pa["index"]));
    assert_eq!(pa["pod-cidr"], format!("10.89.{}.0/24", pa["index"]));
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let (porta, portb) = (ports(&pa), ports(&pb));
    assert_eq!(
        porta.len(),
        11,
        "a port for each component (the second node's kubelet included): {pa:?}"
    );
    let mut all = porta.clone();
    all.extend(&portb);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 22, "ports shared: {porta:?} {portb:?}");
    assert!(
        all.iter().all(|p| *p < low),
        "ports in the ephemeral range (from {low}): {all:?}"
    );
    assert_eq!(
        pa["apiserver"],
        format!("https://127.0.0.1:{}", pa["port.apiserver"])
    );
    assert_eq!(pa["hostpath"], "/tmp/hostpath_pv (shared by every cluster)");
    // Stable across reruns, in either order, and kept in the state dir.
    assert_eq!(host.plan(&b).0, pb);
    assert_eq!(host.plan(&a).0, pa);
    let saved = std::fs::read_to_string(a.join("plan")).unwrap();
    assert!(
        saved.contains(&format!("port.apiserver {}\n", pa["port.apiserver"])),
        "{saved}"
    );
    let status = host.status();
    assert_eq!(status.lines().count(), 2, "{status}");
    assert!(
        status.contains(&format!("{} {} stopped", pa["bridge"], a.display())),
        "{status}"
    );
}

#[test]
fn a_copied_plan_yields_to_a_running_cluster_and_takes_over_from_a_stopped_one() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new("copy");
    let a = host.state("a");
    let (pa, _) = host.plan(&a);

    // Running: a pid file of a names a live process of a.
    let mut etcd = component(&a);
    let status = host.status();
    assert!(
        status.contains(&format!("{} running (etcd pid {})", a.display(), etcd.id())),
        "{status}"
    );
    let c = host.state("c");
    std::fs::create_dir_all(&c).unwrap();
    std::fs::copy(a.join("plan"), c.join("plan")).unwrap();
    let (pc, err) = host.plan(&c);
    assert_ne!(pc["index"], pa["index"], "{err}");
    assert_ne!(pc["bridge"], pa["bridge"]);
    assert!(
        ports(&pc).iter().all(|p| !ports(&pa).contains(p)),
        "{pc:?} {pa:?}"
    );
    assert!(
        err.contains(&format!(
            "index {} (bridge {}) in {}/plan is the cluster at {}'s, which is running (etcd pid {})",
            pa["index"],
            pa["bridge"],
            c.display(),
            a.display(),
            etcd.id()
        )),
        "{err}"
    );

    // Stopped: the pid file names a process that ended.
    drop(etcd.stdin.take());
    etcd.wait().unwrap();
    assert!(
        host.status().contains(&format!("{} stopped", a.display())),
        "{}",
        host.status()
    );
    // A pid file naming a live process that is not the cluster's (the
    // kernel gave its pid to another) is stopped too.
    std::fs::write(a.join("etcd.pid"), std::process::id().to_string()).unwrap();
    let d = host.state("d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(a.join("plan"), d.join("plan")).unwrap();
    let (pd, err) = host.plan(&d);
    assert_eq!(pd["index"], pa["index"], "{err}");
    assert_eq!(ports(&pd), ports(&pa), "{err}");
    assert!(
        err.contains(&format!(
            "index {} (bridge {}) was the cluster at {}'s, which is not running",
            pa["index"],
            pa["bridge"],
            a.display()
        )),
        "{err}"
    );
    let status = host.status();
    assert!(
        status.contains(&format!("{} {} stopped", pa["bridge"], d.display())),
        "{status}"
    );
}

#[test]
fn a_port_held_by_another_process_is_left_to_it_and_the_new_one_kept() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new("port");
    let b = host.state("b");
    let (pb, _) = host.plan(&b);
    let held: u16 = pb["port.apiserver"].parse().unwrap();
    let listener = TcpListener::bind(("127.0.0.1", held)).expect("the planned port is free");
    let (moved, err) = host.plan(&b);
    let now: u16 = moved["port.apiserver"].parse().unwrap();
    assert_ne!(now, held, "{err}");
    assert!(!ports(&pb).contains(&now), "{moved:?}");
    assert!(
        err.contains(&format!(
            "port {held} for apiserver: held by pid {}",
            std::process::id()
        )),
        "{err}"
    );
    for (k, v) in &pb {
        if k != "port.apiserver" && k != "apiserver" {
            assert_eq!(&moved[k], v, "{k} moved with the apiserver's port");
        }
    }
    drop(listener);
    let (again, err) = host.plan(&b);
    assert_eq!(
        again, moved,
        "the new port is kept once the old one is free: {err}"
    );
}

#[test]
fn kube_router_and_kube_proxy_run_in_one_cluster_at_a_time() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new("net");
    // What scripts/k8s-build-net looks for, as stand-ins: nothing here
    // runs them (plan starts nothing; start is refused before).
    let cache = host.dir.join("cache");
    for bin in ["kube-router/2.1.0/bin/kube-router", "1.35.4/bin/kube-proxy"] {
        let path = cache.join(bin);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = |args: &[&str], state: &Path| {
        Command::new(script())
            .args(args)
            .env("LW_K8S_CLUSTERS", host.dir.join("clusters"))
            .env("LW_K8S_STATE", state)
            .env("LW_K8S_CACHE", &cache)
            .env_remove("LW_K8S_NO_NETPOL")
            .output()
            .expect("scripts/k8s-cluster runs")
    };
    let (a, b) = (host.state("a"), host.state("b"));
    let plan_a = run(&["plan"], &a);
    assert!(
        String::from_utf8_lossy(&plan_a.stdout).contains("\nnetpol on\n"),
        "{plan_a:?}"
    );
    let mut etcd = component(&a);
    std::fs::write(host.dir.join("clusters/net"), format!("{}\n", a.display())).unwrap();
    let plan_b = run(&["plan"], &b);
    let out = String::from_utf8_lossy(&plan_b.stdout);
    assert!(
        out.contains(&format!(
            "\nnetpol refused (the cluster at {} runs kube-router and kube-proxy)\n",
            a.display()
        )),
        "{plan_b:?}"
    );
    let start_b = run(&["start"], &b);
    let err = String::from_utf8_lossy(&start_b.stderr);
    assert_eq!(start_b.status.code(), Some(75), "{err}");
    assert!(
        err.contains(&format!(
            "the cluster at {} runs them (running (etcd pid {}))",
            a.display(),
            etcd.id()
        )) && err.contains("LW_K8S_NO_NETPOL=1"),
        "{err}"
    );
    drop(etcd.stdin.take());
    etcd.wait().unwrap();
    let plan_b = run(&["plan"], &b);
    assert!(
        String::from_utf8_lossy(&plan_b.stdout).contains("\nnetpol on\n"),
        "{plan_b:?}"
    );
}

/// The kubelet's chains, as `iptables -S` (and ip6tables) lists them in
/// each table: the lines that name one.
fn kubelet_chains() -> String {
    let mut out = String::new();
    for ipt in ["iptables", "ip6tables"] {
        for t in ["filter", "nat", "mangle"] {
            let o = Command::new(ipt)
                .args(["-t", t, "-S"])
                .output()
                .unwrap_or_else(|e| {
                    panic!("kube_plan: {ipt} runs: {e} (apt-get install iptables)")
                });
            for l in String::from_utf8_lossy(&o.stdout).lines() {
                if ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"]
                    .iter()
                    .any(|c| l.contains(c))
                {
                    out += &format!("{ipt} -t {t} {l}\n");
                }
            }
        }
    }
    out
}

#[test]
fn stop_removes_the_kubelets_chains_unless_another_cluster_runs() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The chains are host-wide: a real cluster (which holds this lock while
    // it runs) keeps its kubelet's, and must not see them go.
    let _real = base::fs::lock(Path::new("/tmp/lw-k8s.lock")).expect("the clusters' lock file");
    let host = Host::new("chains");
    // An empty cache (LW_K8S_CACHE below): stop runs no kube-proxy
    // --cleanup of the real one.
    let (a, b) = (host.state("a"), host.state("b"));
    host.plan(&a);
    host.plan(&b);
    // A stop first: what an earlier run left goes (no cluster runs).
    let stop = |state: &Path| {
        let o = Command::new(script())
            .arg("stop")
            .env("LW_K8S_CLUSTERS", host.dir.join("clusters"))
            .env("LW_K8S_STATE", state)
            .env("LW_K8S_CACHE", host.dir.join("cache"))
            .env("LW_K8S_NO_NETPOL", "1")
            .output()
            .expect("scripts/k8s-cluster runs");
        assert!(o.status.success(), "k8s-cluster stop: {o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let said = stop(&a);
    let before = kubelet_chains();
    assert_eq!(before, "", "no cluster runs, yet stop left: {said}");
    // What a kubelet of 1.35 leaves (its DROP rule's place taken by a
    // RETURN with a quoted comment, which the script must read back whole).
    for ipt in ["iptables", "ip6tables"] {
        let mut rules: Vec<Vec<&str>> = vec![
            vec!["-t", "filter", "-N", "KUBE-FIREWALL"],
            vec![
                "-t",
                "filter",
                "-A",
                "KUBE-FIREWALL",
                "-m",
                "comment",
                "--comment",
                "block incoming localnet connections",
                "-j",
                "RETURN",
            ],
            vec!["-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"],
            vec!["-t", "filter", "-A", "OUTPUT", "-j", "KUBE-FIREWALL"],
            vec!["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"],
        ];
        for t in ["filter", "nat", "mangle"] {
            rules.push(vec!["-t", t, "-N", "KUBE-KUBELET-CANARY"]);
        }
        for r in rules {
            let o = Command::new(ipt).args(&r).output().unwrap();
            assert!(o.status.success(), "{ipt} {r:?}: {o:?}");
        }
    }
    let made = kubelet_chains();
    assert_eq!(made.lines().count(), 2 * 8, "{made}");
    // b runs: its kubelet keeps them.
    let mut etcd = component(&b);
    let said = stop(&a);
    let kept = kubelet_chains();
    drop(etcd.stdin.take());
    etcd.wait().unwrap();
    assert_eq!(
        kept, made,
        "stop of a took the chains b's kubelet keeps: {said}"
    );
    assert!(
        said.contains(&format!(
            "the kubelet's iptables chains left in place: the cluster at {} runs",
            b.display()
        )),
        "{said}"
    );
    // The last cluster stopped: all gone, iptables -S as before.
    let said = stop(&a);
    assert_eq!(kubelet_chains(), before, "after stop: {said}");
}
