//! NetworkPolicy enforced, on the single-node cluster of scripts/k8s-cluster
//! with kube-router's firewall (scripts/k8s-build-net) beside the bridge
//! plugin, and the egress proxy as a Service.
//!
//! Denied: a pod on no loopwright network (only `loopwright-default-deny`
//! selects it) tries a peer pod, a pod of another network, the node's
//! address on a port where this test counts every byte it receives, the
//! API server's port on the node and the `kubernetes` Service; every answer
//! is empty and the counters stay at 0.  Controls, same run: a pod on a
//! network with egress gets the peer's bytes and reaches the counter.
//! Figures: how long a new pod waits until its allowed traffic passes (the
//! bridge fails closed until kube-router has classified it), and how long a
//! policy change takes to be enforced (deny, then allow again).
//!
//! Egress (engine level, `egress::prepare_with_image` on the KubeEngine):
//! the squid proxy as a pod with a Service in front, on the sandbox's
//! internal network and on a stand-in for the internet made here; the
//! sandbox fetches the allowed host through the Service, is refused the
//! forbidden one (403, counted 0 bytes at its server), and going around the
//! proxy to either server or the node gets 0 bytes there.  Teardown leaves
//! no pod, Service or policy of the sandbox.
//!
//! `lw-sandbox create --network egress` (a second test, its own cluster):
//! the same, through the command on a pod sandbox of a project whose
//! `egress.host.*` keys name the two servers (the test cluster has no DNS);
//! the sandbox's `HTTP_PROXY` is the proxy's Service, it still works after
//! `stop` and `start`, and `lw-sandbox rm` leaves no pod, Service or policy
//! of it.
//!
//! Without the cached binaries the tests say they cannot run and why; each
//! takes the cluster's lock (crates/test-support/src/cluster.rs).

use support::cluster as kube_support;
use support::sandbox as sandbox_support;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use engine::{ContainerSpec, Engine, KubeEngine, NetworkEngine, NetworkSpec};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use wall::egress::{self, AllowList, Options};

use kube_support::{Cluster, IMAGE, namespace, network_cached, nonce, pod_ip, run};

const DEBIAN: &str = "loopwright/test-debian:latest";
const TEST_LABEL: &str = "test.loopwright.org/run";

/// Every byte and connection the node receives on one port, from anyone.
struct Counter {
    port: u16,
    bytes: Arc<AtomicU64>,
    conns: Arc<AtomicU64>,
}

fn counter() -> Counter {
    // An ephemeral port: above the node-port range kube-router lets through.
    let l = TcpListener::bind("0.0.0.0:0").expect("a port on the node");
    let port = l.local_addr().unwrap().port();
    let bytes = Arc::new(AtomicU64::new(0));
    let conns = Arc::new(AtomicU64::new(0));
    let (b, c) = (bytes.clone(), conns.clone());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            c.fetch_add(1, Ordering::SeqCst);
            let b = b.clone();
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    b.fetch_add(n as u64, Ordering::SeqCst);
                }
            });
        }
    });
    Counter { port, bytes, conns }
}

fn pod_spec(name: &str, run_id: &str, network: &str, script: &str) -> ContainerSpec {
    ContainerSpec {
        name: Some(name.to_string()),
        image: IMAGE.into(),
        cmd: vec!["sh".into(), "-c".into(), script.into()],
        user: Some("100000:100000".into()),
        labels: BTreeMap::from([(TEST_LABEL.to_string(), run_id.to_string())]),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        memory_bytes: Some(64 << 20),
        tmpfs: BTreeMap::from([("/tmp".to_string(), "rw,size=8m".to_string())]),
        network: Some(network.into()),
        ..Default::default()
    }
}

fn up(e: &KubeEngine, spec: &ContainerSpec) -> String {
    let name = spec.name.clone().unwrap();
    e.create(spec).unwrap();
    e.start(&name).unwrap();
    name
}

/// A server of `secret` on 8080 that keeps every byte it receives in /tmp/in.
const SERVER: &str = "touch /tmp/in; while true; do echo secret | nc -l -p 8080 >> /tmp/in; done";

/// Bytes the server `pod` has received.
fn received(e: &KubeEngine, pod: &str, file: &str) -> u64 {
    let (code, out, err) = run(e, pod, &["sh", "-c", &format!("wc -c < {file}")]);
    assert_eq!(code, 0, "wc in {pod}: {err}");
    out.trim().parse().unwrap()
}

/// Runs in `pod`, every 0.1 s for at most `tries`, `nc` to `ip:port`
/// until its answer `is` wanted (empty: refused); returns the wall time
/// taken (one exec's latency included) and whether it came.
fn until(e: &KubeEngine, pod: &str, ip: &str, port: u16, want: &str, tries: u32) -> (f64, bool) {
    let test = if want.is_empty() {
        "[ -z \"$r\" ]".to_string()
    } else {
        format!("[ \"$r\" = {want} ]")
    };
    let script = format!(
        "i=0; while [ $i -lt {tries} ]; do r=$(echo ping | nc -w 1 {ip} {port} 2>/dev/null); if {test}; then exit 0; fi; i=$((i+1)); sleep 0.1; done; exit 1"
    );
    let t0 = Instant::now();
    let (code, _, _) = run(e, pod, &["sh", "-c", &script]);
    (t0.elapsed().as_secs_f64(), code == 0)
}

/// One try from `pod` to `ip:port`, sending a line: what came back.
fn attempt(e: &KubeEngine, pod: &str, ip: &str, port: u16) -> String {
    let (_, out, _) = run(
        e,
        pod,
        &[
            "sh",
            "-c",
            &format!("echo leak-from-{pod} | nc -w 2 {ip} {port}"),
        ],
    );
    out
}

#[test]
#[ignore = "needs the cached Kubernetes and its network components (scripts/k8s-build, scripts/k8s-build-net); .ci/run runs it with --ignored when cached"]
fn network_policy_is_enforced_on_a_real_cluster() {
    if !network_cached() {
        panic!(
            "kube_network: CANNOT RUN: kube-router and kube-proxy are not cached (scripts/k8s-build-net builds them in minutes once scripts/k8s-build has run); without them the cluster enforces no NetworkPolicy"
        );
    }
    let proxy_image = proxy_image();
    let cluster = Cluster::start("kube_network", &[IMAGE, &proxy_image]).expect("started");
    let kc = cluster.kubeconfig();
    eprintln!(
        "figure: cluster start (node Ready, images imported) {:.1} s",
        cluster.started_in.as_secs_f64()
    );
    let admin = KubeEngine::connect_with(Some(&kc), None, None).expect("the admin connects");
    let ns = namespace(&admin, "lw-net");
    let e = KubeEngine::connect_with(Some(&kc), None, Some(ns.clone())).expect("connects");
    let run_id = nonce();

    denied_pod_reaches_nothing(&e, &run_id, cluster.port("apiserver"));
    egress_through_the_service(&e, &run_id, &proxy_image);

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.client().clone());
    let _ = admin.block_on(namespaces.delete(&ns, &DeleteParams::default()));
    drop(cluster);
}

/// `apiserver`: the API server's port (scripts/k8s-cluster's plan).
fn denied_pod_reaches_nothing(e: &KubeEngine, run_id: &str, apiserver: u16) {
    let open = format!("lw-kn-open-{}", nonce());
    let other = format!("lw-kn-other-{}", nonce());
    for n in [&open, &other] {
        e.create_network(&NetworkSpec {
            name: n.clone(),
            ..Default::default()
        })
        .unwrap();
    }
    let srv = up(e, &pod_spec("lw-kn-srv", run_id, &open, SERVER));
    let far = up(e, &pod_spec("lw-kn-far", run_id, &other, SERVER));
    let idle = "echo ready; exec sleep 3600";
    let t_new = Instant::now();
    let ok = up(e, &pod_spec("lw-kn-ok", run_id, &open, idle));
    let (srv_ip, far_ip) = (pod_ip(e, &srv), pod_ip(e, &far));
    // Control: a member of the open network gets the peer's bytes.
    let (t, came) = until(e, &ok, &srv_ip, 8080, "secret", 100);
    assert!(came, "the allowed pod never got the peer's bytes");
    eprintln!(
        "figure: a new pod's allowed traffic passes {:.2} s after start returned ({:.2} s after create; exec latency included; dropped until kube-router classifies the pod)",
        t,
        t_new.elapsed().as_secs_f64()
    );
    let node = counter();
    let gw = gateway(&srv_ip);
    attempt(e, &ok, &gw, node.port);
    assert!(
        node.bytes.load(Ordering::SeqCst) > 0,
        "control: the allowed pod's bytes reach the node's counter at {gw}:{}",
        node.port
    );
    let control = node.bytes.swap(0, Ordering::SeqCst);
    node.conns.store(0, Ordering::SeqCst);

    let deny = up(e, &pod_spec("lw-kn-deny", run_id, "none", idle));
    let before = (received(e, &srv, "/tmp/in"), received(e, &far, "/tmp/in"));
    let targets: Vec<(String, u16, &str)> = vec![
        (srv_ip.clone(), 8080, "a peer pod"),
        (far_ip.clone(), 8080, "a pod of another network"),
        (pod_ip(e, &ok), 8080, "an allowed pod"),
        (gw.clone(), node.port, "the node (counted)"),
        (gw.clone(), apiserver, "the API server's port on the node"),
        ("10.0.0.1".into(), 443, "the kubernetes Service"),
    ];
    for (ip, port, what) in &targets {
        let got = attempt(e, &deny, ip, *port);
        assert_eq!(
            got, "",
            "the denied pod got an answer from {what} ({ip}:{port})"
        );
    }
    let after = (received(e, &srv, "/tmp/in"), received(e, &far, "/tmp/in"));
    let node_bytes = node.bytes.load(Ordering::SeqCst);
    eprintln!(
        "figure: bytes out of a denied pod: node counter {node_bytes} ({} connections), peer {}, other network {} (control: the allowed pod's {control} bytes reached the node)",
        node.conns.load(Ordering::SeqCst),
        after.0 - before.0,
        after.1 - before.1
    );
    assert_eq!(node_bytes, 0, "bytes from the denied pod reached the node");
    assert_eq!(node.conns.load(Ordering::SeqCst), 0);
    assert_eq!(after, before, "bytes from the denied pod reached a pod");

    // A policy change: the allowed pod leaves the network, then joins again.
    let t0 = Instant::now();
    e.disconnect(&open, &ok).unwrap();
    let (_, denied) = until(e, &ok, &srv_ip, 8080, "", 100);
    let t_deny = t0.elapsed().as_secs_f64();
    assert!(denied, "leaving the network did not cut the pod off");
    let t0 = Instant::now();
    e.connect(&open, &ok, &[]).unwrap();
    let (_, allowed) = until(e, &ok, &srv_ip, 8080, "secret", 100);
    let t_allow = t0.elapsed().as_secs_f64();
    assert!(
        allowed,
        "joining the network again did not let the pod talk"
    );
    eprintln!(
        "figure: policy change enforced: deny {t_deny:.2} s, allow {t_allow:.2} s (from the API call; one exec included)"
    );
    for p in [&deny, &ok, &far, &srv] {
        e.remove(p, true).unwrap();
    }
    for n in [&open, &other] {
        e.remove_network(n).unwrap();
    }
}

/// The bridge's own address: the node, as its pods see it.
fn gateway(pod_ip: &str) -> String {
    let (net, _) = pod_ip.rsplit_once('.').unwrap();
    format!("{net}.1")
}

/// The egress proxy's image, built on Docker (the API builds none).
fn proxy_image() -> String {
    let docker = engine::connect_docker(None).expect("the Docker engine is reachable");
    let t0 = Instant::now();
    let tag = egress::ensure_proxy_image(&docker, DEBIAN, &mut |_| {})
        .expect("the proxy image builds on Docker");
    eprintln!(
        "figure: proxy image {tag} ready on Docker in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    tag
}

fn egress_through_the_service(e: &KubeEngine, run_id: &str, image: &str) {
    let world = format!("lw-kn-world-{}", nonce());
    e.create_network(&NetworkSpec {
        name: world.clone(),
        labels: [(egress::LABEL_EGRESS.to_string(), "outside".to_string())].into(),
        ..Default::default()
    })
    .unwrap();
    let web_script = "mkdir -p /tmp/www; echo hello-allowed > /tmp/www/index.html; touch /tmp/in9090; \
         (while true; do nc -l -p 9090 >> /tmp/in9090; done) & exec httpd -f -p 8080 -h /tmp/www";
    let web = up(e, &pod_spec("lw-kn-web", run_id, &world, web_script));
    let bad = up(e, &pod_spec("lw-kn-bad", run_id, &world, SERVER));
    let (web_ip, bad_ip) = (pod_ip(e, &web), pod_ip(e, &bad));
    let key = format!("lw-kn-{}", nonce());
    let opts = Options {
        proxy_from: DEBIAN.into(),
        outside: world.clone(),
        ready_timeout: Duration::from_secs(90),
        labels: [(TEST_LABEL.to_string(), run_id.to_string())].into(),
        hosts: [
            ("web.test".to_string(), web_ip.clone()),
            ("forbidden.test".to_string(), bad_ip.clone()),
        ]
        .into(),
    };
    let allow = AllowList::from_entries(&["web.test:8080"], "the test").unwrap();
    let t0 = Instant::now();
    let plan =
        egress::prepare_with_image(e, &key, &allow, image, &opts).expect("egress on Kubernetes");
    eprintln!(
        "figure: egress proxy pod + Service + policies ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let proxy = plan
        .env
        .iter()
        .find_map(|v| v.strip_prefix("HTTP_PROXY=http://"))
        .and_then(|v| v.split(':').next())
        .expect("the plan names the proxy")
        .to_string();
    let services: Api<Service> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let svc = e
        .block_on(services.get(&plan.proxy))
        .expect("the proxy's Service");
    assert_eq!(
        svc.spec.unwrap().cluster_ip.as_deref(),
        Some(proxy.as_str())
    );
    let mut s = pod_spec(
        &format!("{key}-sb"),
        run_id,
        &plan.network,
        "echo ready; exec sleep 3600",
    );
    s.env = plan.env.clone();
    let sb = up(e, &s);
    // busybox nc closes the connection when its input ends, which squid
    // takes for a client that gave up: the input stays open 3 s.
    let get = |host: &str| {
        format!(
            "(printf 'GET http://{host}:8080/ HTTP/1.0\\r\\nHost: {host}:8080\\r\\n\\r\\n'; sleep 3) | nc -w 5 {proxy} 3128"
        )
    };
    // The allowed host, through the Service (the new pod may wait a moment).
    let t0 = Instant::now();
    let mut fetched = String::new();
    for _ in 0..50 {
        fetched = run(e, &sb, &["sh", "-c", &get("web.test")]).1;
        if fetched.contains("hello-allowed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if !fetched.contains("hello-allowed") {
        let direct = get("web.test").replace(&proxy, &pod_ip(e, &plan.proxy));
        let (_, d, derr) = run(e, &sb, &["sh", "-c", &direct]);
        let (_, pol, _) = run(e, &plan.proxy, &["sh", "-c", "cat /etc/hosts"]);
        let nat = std::process::Command::new("sh")
            .args([
                "-c",
                "iptables -t nat -S | grep -i proxy; iptables -S | grep -c KUBE-POD-FW",
            ])
            .output()
            .unwrap();
        panic!(
            "the allowed host through the proxy's Service: {fetched:?}; to the proxy pod directly: {d:?} {derr}; its hosts: {pol}; nat: {}",
            String::from_utf8_lossy(&nat.stdout)
        );
    }
    eprintln!(
        "figure: allowed host fetched through the proxy Service {:.2} s after the sandbox started",
        t0.elapsed().as_secs_f64()
    );
    let before = (
        received(e, &web, "/tmp/in9090"),
        received(e, &bad, "/tmp/in"),
    );
    let refused = run(e, &sb, &["sh", "-c", &get("forbidden.test")]).1;
    assert!(
        refused.starts_with("HTTP/1.1 403"),
        "the forbidden host is refused by squid: {refused:?}"
    );
    let node = counter();
    let gw = gateway(&web_ip);
    for (ip, port) in [
        (web_ip.as_str(), 9090),
        (bad_ip.as_str(), 8080),
        (gw.as_str(), node.port),
    ] {
        assert_eq!(attempt(e, &sb, ip, port), "", "bypass to {ip}:{port}");
    }
    let after = (
        received(e, &web, "/tmp/in9090"),
        received(e, &bad, "/tmp/in"),
    );
    eprintln!(
        "figure: egress bypass bytes: allowed host {}, forbidden host {}, node {}",
        after.0 - before.0,
        after.1 - before.1,
        node.bytes.load(Ordering::SeqCst)
    );
    assert_eq!(after, before, "bytes went around the proxy");
    assert_eq!(node.bytes.load(Ordering::SeqCst), 0);
    let denials = egress::denials(e, &key).unwrap();
    assert!(
        denials.iter().any(|d| d.host == "forbidden.test"),
        "the proxy's log names the refused host: {denials:?}"
    );

    e.remove(&sb, true).unwrap();
    egress::teardown(e, &key).unwrap();
    let label = format!("{}={key}", egress::LABEL_KEY);
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let policies: Api<NetworkPolicy> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let lp = ListParams::default().labels(&label);
    assert!(e.block_on(pods.list(&lp)).unwrap().items.is_empty());
    assert!(e.block_on(services.list(&lp)).unwrap().items.is_empty());
    assert!(e.block_on(policies.list(&lp)).unwrap().items.is_empty());
    for p in [&web, &bad] {
        e.remove(p, true).unwrap();
    }
    e.remove_network(&world).unwrap();
}

fn both(o: &std::process::Output) -> String {
    sandbox_support::text(o) + &sandbox_support::err(o)
}

/// Sends `request` to the proxy named by the sandbox's own `HTTP_PROXY`
/// and prints the answer (bash's /dev/tcp: the image has no nc).
fn through_proxy(host: &str) -> String {
    format!(
        "h=${{HTTP_PROXY#http://}}; h=${{h%:*}}; exec 3<>/dev/tcp/$h/3128 || exit 9; \
         printf 'GET http://{host}:8080/ HTTP/1.0\\r\\nHost: {host}:8080\\r\\n\\r\\n' >&3; timeout 5 cat <&3"
    )
}

#[test]
#[ignore = "needs the cached Kubernetes and its network components (scripts/k8s-build, scripts/k8s-build-net); .ci/run runs it with --ignored when cached"]
fn sandbox_created_with_network_egress_on_a_real_cluster() {
    if !network_cached() {
        panic!(
            "kube_network: CANNOT RUN: kube-router and kube-proxy are not cached (scripts/k8s-build-net)"
        );
    }
    let proxy_image = proxy_image();
    let world = format!("lw-kn-world-{}", nonce());
    let fx = sandbox_support::Fixture::new("kegress");
    let project = wall::config::project(&fx.proj).unwrap().expect("a project");
    let docker = engine::connect_docker(None).expect("the Docker engine is reachable");
    let image = loopwright::sandbox::resolve_image(&docker, Some(&project), None, false)
        .expect("the fixture's image is built")
        .reference;
    let cluster = Cluster::start("kube_network", &[IMAGE, &proxy_image, &image]).expect("started");
    let kc = cluster.kubeconfig();
    let e = KubeEngine::connect_with(Some(&kc), None, None).expect("connects");
    let run_id = nonce();
    e.create_network(&NetworkSpec {
        name: world.clone(),
        labels: [(egress::LABEL_EGRESS.to_string(), "outside".to_string())].into(),
        ..Default::default()
    })
    .unwrap();
    let web_script = "mkdir -p /tmp/www; echo hello-allowed > /tmp/www/index.html; touch /tmp/in9090; \
         (while true; do nc -l -p 9090 >> /tmp/in9090; done) & exec httpd -f -p 8080 -h /tmp/www";
    let web = up(&e, &pod_spec("lw-kn-sweb", &run_id, &world, web_script));
    let bad = up(&e, &pod_spec("lw-kn-sbad", &run_id, &world, SERVER));
    let (web_ip, bad_ip) = (pod_ip(&e, &web), pod_ip(&e, &bad));
    std::fs::write(
        fx.proj.join(".loopwright/config"),
        format!(
            "egress.proxy-from = {DEBIAN}\negress.network = {world}\negress.host.web.test = {web_ip}\negress.host.forbidden.test = {bad_ip}\n"
        ),
    )
    .unwrap();
    let sb = |args: &[&str]| {
        fx.cmd(args)
            .env("LW_ENGINE", "kubernetes")
            .env("KUBECONFIG", &kc)
            .output()
            .expect("lw-sandbox runs")
    };
    let t0 = Instant::now();
    let o = sb(&[
        "create",
        "egr",
        "--branch",
        "egr",
        "--image",
        &image,
        "--network",
        "egress",
        "--allow",
        "web.test:8080",
    ]);
    assert!(o.status.success(), "create --network egress: {}", both(&o));
    eprintln!(
        "figure: pod sandbox with egress created in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let container = fx.container("egr");
    let services: Api<Service> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let svc = e
        .block_on(services.get(&egress::proxy_name(&container)))
        .expect("the proxy's Service");
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    let exec = |script: &str| sb(&["exec", "egr", "--", "timeout", "10", "bash", "-c", script]);
    let env = String::from_utf8_lossy(&exec("echo $HTTP_PROXY").stdout)
        .trim()
        .to_string();
    assert_eq!(
        env,
        format!("http://{ip}:3128"),
        "HTTP_PROXY is the Service"
    );
    // A new pod's traffic passes once kube-router has classified it.
    let fetch_allowed = |after: &str| {
        let t0 = Instant::now();
        let mut fetched = String::new();
        for _ in 0..50 {
            fetched =
                String::from_utf8_lossy(&exec(&through_proxy("web.test")).stdout).into_owned();
            if fetched.contains("hello-allowed") {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(
            fetched.contains("hello-allowed"),
            "the allowed host through the proxy after {after}: {fetched:?}"
        );
        eprintln!(
            "figure: allowed host fetched {:.2} s after {after} returned",
            t0.elapsed().as_secs_f64()
        );
    };
    fetch_allowed("create");
    let before = (
        received(&e, &web, "/tmp/in9090"),
        received(&e, &bad, "/tmp/in"),
    );
    let refused =
        String::from_utf8_lossy(&exec(&through_proxy("forbidden.test")).stdout).into_owned();
    assert!(
        refused.starts_with("HTTP/1.1 403"),
        "the forbidden host is refused: {refused:?}"
    );
    let node = counter();
    let gw = gateway(&web_ip);
    for (ip, port) in [
        (web_ip.as_str(), 9090),
        (bad_ip.as_str(), 8080),
        (gw.as_str(), node.port),
    ] {
        exec(&format!("echo leak > /dev/tcp/{ip}/{port}"));
    }
    let after = (
        received(&e, &web, "/tmp/in9090"),
        received(&e, &bad, "/tmp/in"),
    );
    eprintln!(
        "figure: sandbox bypass bytes: allowed host {}, forbidden host {}, node {}",
        after.0 - before.0,
        after.1 - before.1,
        node.bytes.load(Ordering::SeqCst)
    );
    assert_eq!(after, before, "bytes went around the proxy");
    assert_eq!(node.bytes.load(Ordering::SeqCst), 0);
    let logs = sb(&["logs", "--egress", "egr"]);
    assert!(
        both(&logs).contains("forbidden.test"),
        "logs --egress: {}",
        both(&logs)
    );

    // stop makes the pods end; start makes them again, the proxy's back
    // behind its Service, whose address the sandbox keeps.
    for verb in ["stop", "start"] {
        let o = sb(&[verb, "egr"]);
        assert!(o.status.success(), "{verb}: {}", both(&o));
    }
    fetch_allowed("stop and start");

    let o = sb(&["rm", "egr"]);
    assert!(o.status.success(), "rm: {}", both(&o));
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let policies: Api<NetworkPolicy> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let lp = ListParams::default();
    let mut left: Vec<String> = e
        .block_on(pods.list(&lp))
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    left.extend(
        e.block_on(services.list(&lp))
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name),
    );
    left.extend(
        e.block_on(policies.list(&lp))
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name),
    );
    left.retain(|n| n.starts_with(&container));
    assert!(left.is_empty(), "rm left {left:?}");
    for p in [&web, &bad] {
        e.remove(p, true).unwrap();
    }
    e.remove_network(&world).unwrap();
    drop(cluster);
}
