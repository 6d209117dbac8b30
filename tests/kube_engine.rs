//! The Kubernetes engine (crates/engine/src/kubernetes) on a real single-node
//! cluster: scripts/k8s-cluster starts it from the binaries scripts/k8s-build
//! cached in /opt/loopwright-k8s (etcd, kube-apiserver, controller manager,
//! scheduler, a private containerd, kubelet; bridge CNI), with the test
//! image imported into its containerd (no registry), and stops it at the end.
//!
//! Through the engine contract: a hardened pod from the imported image (uid,
//! read-only root, no capabilities, no new privileges, seccomp), exec and its
//! exit status, exec_io with standard input, logs, inspect and ls by label, a
//! named volume (PVC), a network (NetworkPolicy; enforced when kube-router
//! is cached, reported as the bridge plugin gives it otherwise), stop and start, remove; `Sandboxes::gc` after kill -9 of
//! a process making pods leaves nothing labelled with the root; RBAC without
//! `create pods` is 77, an unreachable API server or no kubeconfig 69 naming
//! the context, a namespace quota 75 with nothing made.  Figures: cluster
//! start, pod create+start against Docker create+start in the same run, exec
//! latency.
//!
//! Without the cached binaries the test says it cannot run and why (CI has
//! them only on machines that built them; scripts/k8s-build takes about an
//! hour on 2 cores).  One test, so nothing else in this binary starts the
//! cluster; a lock file keeps two runs on one machine apart.

use support::cluster as kube_support;
use support::seeded;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base::error::Exit;
use engine::select::{PairedBuilder, docker_host};
use engine::{
    ContainerSpec, Engine, EngineKind, ExecIo, ExecRequest, HostPaths, Images, KubeEngine,
    NetworkEngine, NetworkSpec, Pair, SandboxEngine,
};
use k8s_openapi::api::core::v1::{
    Namespace, Pod, ResourceQuota, ResourceQuotaSpec, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use loopwright::sandbox::{LABEL_ROOT, LABEL_ROOT_PATH, LABEL_SANDBOX, Sandboxes, root_id};
use mailbox::layout::Root;

use kube_support::{Cluster, IMAGE, network_cached, nonce, run};

const CHILD: &str = "LW_KUBE_TEST_CHILD";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The hardened spec a sandbox asks for, labelled as lw-sandbox labels.
fn spec(name: &str, root: &Root, sandbox: &str) -> ContainerSpec {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_ROOT.to_string(), root_id(&root.dir));
    labels.insert(LABEL_SANDBOX.to_string(), sandbox.to_string());
    labels.insert(LABEL_ROOT_PATH.to_string(), root.dir.display().to_string());
    ContainerSpec {
        name: Some(name.to_string()),
        image: IMAGE.into(),
        cmd: vec![
            "sh".into(),
            "-c".into(),
            "echo ready; exec sleep 3600".into(),
        ],
        user: Some("100000:100000".into()),
        labels,
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

/// The child of the kill -9 case: makes the sandbox's volume, then pods
/// labelled as that sandbox's, one after another, until it is killed.
#[test]
#[ignore = "run by the_kubernetes_engine_on_a_real_cluster as its child"]
fn child_makes_pods_until_killed() {
    let Ok(args) = std::env::var(CHILD) else {
        return;
    };
    let mut it = args.split('\u{1f}');
    let (kubeconfig, ns, root) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
    let e =
        KubeEngine::connect_with(Some(kubeconfig), None, Some(ns.to_string())).expect("connects");
    let root = Root::new(root);
    let builder = PairedBuilder::new(docker_host(None));
    let sb = Sandboxes::new(root.clone(), on_cluster(&e, &builder));
    let labels: BTreeMap<String, String> = [
        (LABEL_ROOT.to_string(), sb.id.clone()),
        (LABEL_SANDBOX.to_string(), "crash".to_string()),
    ]
    .into();
    e.create_volume(&sb.volume_name("crash"), &labels)
        .expect("volume");
    for i in 0.. {
        let name = format!("{}-{i}", sb.container_name("crash"));
        e.create(&spec(&name, &root, "crash")).expect("create");
        println!("made {name}");
    }
}

#[test]
#[ignore = "needs the single-node Kubernetes cached by scripts/k8s-build; .ci/run runs it with --ignored when cached"]
fn the_kubernetes_engine_on_a_real_cluster() {
    let cluster = Cluster::start("kube_engine", &[IMAGE]).expect("started");
    let kc = cluster.kubeconfig();
    eprintln!(
        "figure: cluster start (node Ready, image imported) {:.1} s",
        cluster.started_in.as_secs_f64()
    );
    let admin = KubeEngine::connect_with(Some(&kc), None, None).expect("the admin connects");
    let ns = kube_support::namespace(&admin, "lw-test");
    let namespaces: Api<Namespace> = Api::all(admin.client().clone());
    let e = KubeEngine::connect_with(Some(&kc), None, Some(ns.clone())).expect("connects");
    let tmp = std::env::temp_dir().join(format!("lw-kube-{}", nonce()));
    std::fs::create_dir_all(&tmp).unwrap();
    let root = Root::new(&tmp);
    let id = root_id(&root.dir);

    life(&e, &root, &id);
    enforcement(&e, &root);
    figures(&e, &root);
    gc_after_kill(&e, &kc, &ns, &root, &id);
    commands(&kc, &ns, &root);
    bad_input(&admin, &e, &kc, &ns, &root);

    // Nothing of ours left in the namespace; then the namespace goes.
    assert!(
        e.containers_with_label(&format!("{LABEL_ROOT}={id}"))
            .unwrap()
            .is_empty()
    );
    let _ = admin.block_on(namespaces.delete(&ns, &DeleteParams::default()));
    let _ = std::fs::remove_dir_all(&tmp);
    drop(cluster);
}

/// A hardened pod's life through the contract.
/// The cluster as lw-sandbox pairs it (engine::select): the runner, and
/// the Docker builder of this machine.
fn on_cluster<'a>(e: &'a KubeEngine, builder: &'a PairedBuilder) -> Pair<'a> {
    Pair {
        runner: e,
        builder,
        kind: EngineKind::Kubernetes,
    }
}

fn life(e: &KubeEngine, root: &Root, id: &str) {
    let v = e.version().expect("version");
    let info = e.info().expect("info");
    eprintln!(
        "kubernetes {} (API {}), runtimes {:?}, engine id {}",
        v.version,
        v.api,
        info.names(),
        e.engine_id().unwrap()
    );
    assert_eq!(info.product, "kubernetes");
    // The cluster never sees this host's files.
    assert_eq!(e.read_through_bind(&root.dir, "x").unwrap(), None);
    // The imported image is reported by the node.
    assert!(e.image_exists(IMAGE).unwrap(), "the node reports {IMAGE}");
    assert!(!e.image_exists("loopwright/never-imported:1").unwrap());

    let name = format!("lw-kt-{}", nonce());
    let t0 = Instant::now();
    let made = e.create(&spec(&name, root, "one")).expect("create");
    assert_eq!(made, name);
    e.start(&name).expect("start");
    eprintln!("figure: first pod create+start {:.0} ms", ms(t0.elapsed()));

    let c = e.inspect(&name).unwrap().expect("inspect");
    assert!(c.running, "{c:?}");
    assert_eq!(c.status, "running");
    assert_eq!(c.runtime, "runc");
    assert_eq!(
        c.labels[LABEL_ROOT_PATH],
        root.dir.display().to_string(),
        "labels Kubernetes cannot hold come back"
    );

    // The wall: uid, read-only root, no capabilities, no new privileges, seccomp.
    let (code, out, _) = run(e, &name, &["id", "-u"]);
    assert_eq!((code, out.trim()), (0, "100000"));
    let (code, _, err) = run(e, &name, &["touch", "/x"]);
    assert_ne!(code, 0, "the root file system is read-only");
    assert!(err.contains("Read-only"), "{err}");
    let (_, status, _) = run(e, &name, &["cat", "/proc/self/status"]);
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("CapEff:"), "0000000000000000");
    assert_eq!(field("CapBnd:"), "0000000000000000");
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2", "seccomp RuntimeDefault filters");
    let (_, mem, _) = run(
        e,
        &name,
        &["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"],
    );
    assert_eq!(mem.trim(), (64u64 << 20).to_string(), "the memory limit");
    let (code, _, _) = run(
        e,
        &name,
        &["sh", "-c", "echo x > /tmp/f && cat /tmp/f >/dev/null"],
    );
    assert_eq!(code, 0, "the tmpfs (emptyDir in memory) is writable");

    // Exit statuses, a missing command, directory and environment.
    assert_eq!(run(e, &name, &["sh", "-c", "exit 3"]).0, 3);
    assert_eq!(run(e, &name, &["no-such-command"]).0, 127);
    let mut out = Vec::new();
    let code = e
        .exec(
            &name,
            &ExecRequest {
                cmd: vec!["sh".into(), "-c".into(), "echo $A $(pwd)".into()],
                env: vec!["A=1".into()],
                workdir: Some("/tmp".into()),
                user: None,
            },
            &mut |_, b| out.extend_from_slice(b),
        )
        .unwrap();
    assert_eq!((code, String::from_utf8_lossy(&out).trim()), (0, "1 /tmp"));
    let refused = e
        .exec(
            &name,
            &ExecRequest {
                cmd: vec!["true".into()],
                user: Some("0".into()),
                ..Default::default()
            },
            &mut |_, _| {},
        )
        .unwrap_err();
    assert_eq!(refused.exit, Exit::Usage, "{refused}");

    // exec_io: 1 MiB through stdin, counted and hashed inside.
    let input: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let mut out = Vec::new();
    let code = e
        .exec_io(
            &name,
            &ExecRequest {
                cmd: vec![
                    "sh".into(),
                    "-c".into(),
                    "cat > /tmp/in && wc -c < /tmp/in && md5sum < /tmp/in".into(),
                ],
                ..Default::default()
            },
            ExecIo {
                stdin: Some(Box::new(Cursor::new(input.clone()))),
                tty: false,
                size: None,
                on_output: &mut |_, b| out.extend_from_slice(b),
                stop: None,
            },
        )
        .expect("exec_io");
    let out = String::from_utf8_lossy(&out);
    assert_eq!(code, 0, "{out}");
    let mut lines = out.lines();
    assert_eq!(lines.next().map(str::trim), Some("1048576"));
    let md5 = Command::new("md5sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&input)?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(
        lines.next().unwrap().split_whitespace().next(),
        String::from_utf8_lossy(&md5.stdout)
            .split_whitespace()
            .next(),
        "stdin arrived whole"
    );
    // A terminal: one stream, sized.
    let mut out = Vec::new();
    let code = e
        .exec_io(
            &name,
            &ExecRequest {
                cmd: vec![
                    "sh".into(),
                    "-c".into(),
                    "tty >/dev/null && echo term".into(),
                ],
                ..Default::default()
            },
            ExecIo {
                stdin: None,
                tty: true,
                size: Some((40, 100)),
                on_output: &mut |_, b| out.extend_from_slice(b),
                stop: None,
            },
        )
        .expect("exec with a terminal");
    assert_eq!((code, String::from_utf8_lossy(&out).trim()), (0, "term"));

    // Logs.
    assert!(String::from_utf8_lossy(&e.logs(&name, true).unwrap()).contains("ready"));
    assert!(
        e.wait_for_line(&name, Duration::from_secs(10), &mut |l| l == "ready")
            .unwrap()
    );

    // ls by label: this root's and this sandbox's.
    let listed = e
        .containers_with_label(&format!("{LABEL_ROOT}={id}"))
        .unwrap();
    assert_eq!(
        listed.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        [name.as_str()]
    );
    assert!(
        e.containers_with_label(&format!("{LABEL_SANDBOX}=other"))
            .unwrap()
            .is_empty()
    );
    let bad = e
        .containers_with_label(&format!("{LABEL_ROOT_PATH}=/tmp/x"))
        .unwrap_err();
    assert_eq!(bad.exit, Exit::DataErr, "{bad}");

    // A named volume is a claim.
    let labels: BTreeMap<String, String> = [
        (LABEL_ROOT.to_string(), id.to_string()),
        (LABEL_SANDBOX.to_string(), "one".to_string()),
    ]
    .into();
    let vol = format!("lw-kt-vol-{}", nonce());
    e.create_volume(&vol, &labels).unwrap();
    e.create_volume(&vol, &labels)
        .expect("an existing volume is reused");
    let vols = e.volumes_with_label(&format!("{LABEL_ROOT}={id}")).unwrap();
    assert_eq!(
        vols.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        [vol.as_str()]
    );
    assert_eq!(vols[0].labels[LABEL_SANDBOX], "one");
    e.remove_volume(&vol).unwrap();
    e.remove_volume(&vol)
        .expect("a missing volume is not an error");
    assert!(
        e.volumes_with_label(&format!("{LABEL_ROOT}={id}"))
            .unwrap()
            .is_empty()
    );

    // A network is a policy; a pod joins by label.
    let net = format!("lw-kt-net-{}", nonce());
    let n = e
        .create_network(&NetworkSpec {
            name: net.clone(),
            internal: true,
            labels: labels.clone(),
            ..Default::default()
        })
        .unwrap();
    assert!(n.internal);
    e.connect(&net, &name, &[]).unwrap();
    let n = e.network(&net).unwrap().expect("the network");
    assert!(n.containers.contains_key(&name), "{n:?}");
    assert_eq!(
        e.networks_with_label(&format!("{LABEL_ROOT}={id}"))
            .unwrap()
            .len(),
        1
    );
    e.disconnect(&net, &name).unwrap();
    assert!(
        !e.network(&net)
            .unwrap()
            .unwrap()
            .containers
            .contains_key(&name)
    );
    e.remove_network(&net).unwrap();
    assert!(e.network(&net).unwrap().is_none());

    // Stop keeps the pod's manifest; start makes it again.
    e.stop(&name, Duration::from_secs(1)).unwrap();
    let c = e
        .inspect(&name)
        .unwrap()
        .expect("a stopped pod is still there");
    assert!(!c.running);
    assert_eq!(c.status, "exited");
    assert_eq!(
        e.containers_with_label(&format!("{LABEL_ROOT}={id}"))
            .unwrap()
            .len(),
        1
    );
    e.start(&name).unwrap();
    assert_eq!(run(e, &name, &["id", "-u"]).1.trim(), "100000");

    e.remove(&name, true).unwrap();
    assert!(e.inspect(&name).unwrap().is_none());
    e.remove(&name, true)
        .expect("a missing pod is not an error");
    assert!(
        e.containers_with_label(&format!("{LABEL_ROOT}={id}"))
            .unwrap()
            .is_empty()
    );
}

/// Default deny as the cluster gives it: the policy objects are made; a
/// pod without a network asks another pod for a file, and the bytes it gets
/// say whether the network plugin enforces them: kube-router's firewall
/// when scripts/k8s-build-net cached it (asserted; tests/kube_network.rs
/// counts the bytes), else the bridge plugin alone, which enforces none
/// (the figure says so).
fn enforcement(e: &KubeEngine, root: &Root) {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let server = format!("lw-kt-srv-{}", nonce());
    let mut s = spec(&server, root, "srv");
    // busybox-static's wget crashes without an /etc/passwd entry; nc does not.
    s.cmd = vec![
        "sh".into(),
        "-c".into(),
        "echo secret > /tmp/f; echo ready; while true; do nc -l -p 8080 < /tmp/f; done".into(),
    ];
    e.create(&s).unwrap();
    e.start(&server).unwrap();
    let client = format!("lw-kt-cli-{}", nonce());
    e.create(&spec(&client, root, "cli")).unwrap();
    e.start(&client).unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let deny = e
        .block_on(policies.get("loopwright-default-deny"))
        .expect("the default-deny policy");
    let spec_ = deny.spec.unwrap();
    assert_eq!(spec_.policy_types.unwrap(), ["Ingress", "Egress"]);
    assert!(
        spec_.ingress.is_none() && spec_.egress.is_none(),
        "it allows nothing"
    );
    assert_eq!(
        spec_.pod_selector.unwrap().match_labels.unwrap()["app.kubernetes.io/managed-by"],
        "loopwright"
    );
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &e.target().namespace);
    let ip = e
        .block_on(pods.get(&server))
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    // The check itself works: from inside the server's own pod, the file comes.
    let (code, out, _) = run(e, &server, &["nc", "-w", "3", "127.0.0.1", "8080"]);
    assert_eq!(
        (code, out.trim()),
        (0, "secret"),
        "the server answers on loopback"
    );
    // Control: both on a network that lets its members talk.
    let net = format!("lw-kt-open-{}", nonce());
    e.create_network(&NetworkSpec {
        name: net.clone(),
        ..Default::default()
    })
    .unwrap();
    e.connect(&net, &server, &[]).unwrap();
    e.connect(&net, &client, &[]).unwrap();
    // With a policy controller (kube-router), a change takes effect a
    // moment after the API call: wait for it, 0.2 s a try, 10 s at most.
    let enforcing = network_cached();
    let tries = if enforcing { 50 } else { 1 };
    let fetch = |want: &str| {
        let script = format!(
            "i=0; while true; do r=$(nc -w 3 {ip} 8080); i=$((i+1)); if [ \"$r\" = '{want}' ] || [ $i -ge {tries} ]; then printf %s \"$r\"; exit 0; fi; sleep 0.2; done"
        );
        run(e, &client, &["sh", "-c", &script])
    };
    let (_, allowed, _) = fetch("secret");
    // The client leaves it: only the default deny selects it now.
    e.disconnect(&net, &client).unwrap();
    let (code, out, err) = fetch("");
    let verdict = match (allowed.trim() == "secret", out.is_empty()) {
        (true, true) => "enforced",
        (true, false) => "NOT enforced by this cluster's network plugin (bridge CNI)",
        (false, _) => {
            "cannot tell: pods do not reach each other even when a policy allows it (host firewall)"
        }
    };
    eprintln!(
        "figure: NetworkPolicy: allowed pod got {} bytes; under the default deny {} bytes (nc status {code} {}): {verdict}",
        allowed.len(),
        out.len(),
        err.trim()
    );
    if enforcing {
        assert_eq!(
            verdict, "enforced",
            "kube-router is cached, so scripts/k8s-cluster runs it"
        );
    }
    e.remove_network(&net).unwrap();
    e.remove(&client, true).unwrap();
    e.remove(&server, true).unwrap();
}

/// Pod create+start against Docker create+start, same run; exec latency.
fn figures(e: &KubeEngine, root: &Root) {
    let docker = engine::connect_docker(None).expect("the Docker engine is reachable");
    let mut kube_t = Vec::new();
    let mut docker_t = Vec::new();
    let mut exec_k = Vec::new();
    let mut exec_d = Vec::new();
    for i in 0..3 {
        let name = format!("lw-kt-fig-{}-{i}", nonce());
        let t0 = Instant::now();
        e.create(&spec(&name, root, "fig")).unwrap();
        e.start(&name).unwrap();
        kube_t.push(t0.elapsed());
        for _ in 0..5 {
            let t = Instant::now();
            assert_eq!(run(e, &name, &["true"]).0, 0);
            exec_k.push(t.elapsed());
        }
        e.remove(&name, true).unwrap();

        let mut s = spec(&name, root, "fig");
        s.tmpfs = BTreeMap::from([("/tmp".to_string(), "rw,nosuid,size=16m".to_string())]);
        let t0 = Instant::now();
        docker.create(&s).unwrap();
        docker.start(&name).unwrap();
        docker_t.push(t0.elapsed());
        for _ in 0..5 {
            let t = Instant::now();
            assert_eq!(run(&docker, &name, &["true"]).0, 0);
            exec_d.push(t.elapsed());
        }
        docker.remove(&name, true).unwrap();
    }
    let (k, d) = (median(kube_t), median(docker_t));
    let (xk, xd) = (median(exec_k), median(exec_d));
    eprintln!(
        "figure: create+start median of 3: pod {:.0} ms, Docker {:.0} ms, ratio {:.1}x; exec median of 15: pod {:.0} ms, Docker {:.0} ms, ratio {:.1}x",
        ms(k),
        ms(d),
        ms(k) / ms(d),
        ms(xk),
        ms(xd),
        ms(xk) / ms(xd)
    );
}

/// kill -9 of a process making a sandbox's volume and pods, then gc.
fn gc_after_kill(e: &KubeEngine, kc: &str, ns: &str, root: &Root, id: &str) {
    let seed = seeded::seed();
    let extra = seeded::below(3);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_makes_pods_until_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, [kc, ns, root.dir.to_str().unwrap()].join("\u{1f}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the child starts");
    // Killed while it makes pod 1 + extra (seeded): a create is in flight.
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut made = 0usize;
    while made as u64 <= extra {
        let l = lines.next().expect("the child made a pod").unwrap();
        if l.starts_with("made ") {
            made += 1;
        }
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let _ = child.wait();
    let label = format!("{LABEL_ROOT}={id}");
    let before = e.containers_with_label(&label).unwrap().len();
    assert!(before >= made, "the pods it made are there ({before})");
    assert_eq!(e.volumes_with_label(&label).unwrap().len(), 1);
    let builder = PairedBuilder::new(docker_host(None));
    let sb = Sandboxes::new(root.clone(), on_cluster(e, &builder));
    let mut said = Vec::new();
    sb.gc(&mut |l| said.push(l.to_string())).expect("gc");
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), ns);
    let left = e
        .block_on(pods.list(&ListParams::default().labels(&label)))
        .unwrap();
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(e.client().clone(), ns);
    let lclaims = e
        .block_on(claims.list(&ListParams::default().labels(&label)))
        .unwrap();
    let live_claims: Vec<_> = lclaims
        .items
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    eprintln!(
        "gc after kill -9 (seed {seed}, killed after {made} pods): found {before} pods and 1 claim, removed: {said:?}; left: {} pods, {} claims",
        left.items.len(),
        live_claims.len()
    );
    assert!(
        left.items.is_empty(),
        "pods left: {:?}",
        left.items
            .iter()
            .map(|p| &p.metadata.name)
            .collect::<Vec<_>>()
    );
    assert!(live_claims.is_empty(), "claims left");
}

/// The same commands on the project's `engine = kubernetes`: lw doctor
/// reports the engine, lw-sandbox ls and gc talk to the cluster.
fn commands(kc: &str, ns: &str, root: &Root) {
    let proj = std::env::temp_dir().join(format!("lw-kube-proj-{}", nonce()));
    std::fs::create_dir_all(proj.join(".loopwright")).unwrap();
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .current_dir(&proj)
            .status()
            .unwrap()
            .success()
    );
    std::fs::write(
        proj.join(".loopwright/config"),
        format!("engine = kubernetes\nengine.kubeconfig = {kc}\nengine.namespace = {ns}\n"),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_lw-doctor"))
        .current_dir(&proj)
        .env_remove("KUBECONFIG")
        .env_remove("LW_ENGINE")
        .env("LW_ROOT", &root.dir)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let line = |check: &str| {
        out.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(check))
            .unwrap_or("")
            .to_string()
    };
    eprintln!(
        "lw doctor:\n{}",
        out.lines()
            .filter(|l| l.contains("engine") || l.contains("kube"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        line("engine").contains("kubernetes")
            && line("engine").contains(&format!("namespace {ns}")),
        "{out}"
    );
    assert!(line("kube-rbac").starts_with("ok"), "{out}");
    assert!(line("kube-network").starts_with("warn"), "{out}");
    // Docker is asked as the image builder only (#50: the image check said
    // it was not reachable, never having asked).
    assert!(
        line("docker").contains("the image builder paired with the Kubernetes runner"),
        "Docker checked as the builder on kubernetes: {out}"
    );
    assert!(line("engine-files").contains("cluster"), "{out}");
    for cmd in [["ls"], ["gc"]] {
        let o = Command::new(env!("CARGO_BIN_EXE_lw-sandbox"))
            .args(["--root", root.dir.to_str().unwrap()])
            .args(cmd)
            .current_dir(&proj)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "lw-sandbox {cmd:?} on kubernetes: {o:?}"
        );
    }
    // A project naming an unreachable context is 69 naming it.
    std::fs::write(
        proj.join(".loopwright/config"),
        format!("engine = kubernetes\nengine.kubeconfig = {kc}\nengine.context = elsewhere\n"),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_lw-sandbox"))
        .args(["--root", root.dir.to_str().unwrap(), "ls"])
        .current_dir(&proj)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(err.contains("'elsewhere'"), "{err}");
    let _ = std::fs::remove_dir_all(&proj);
}

/// RBAC without create pods (77), unreachable (69), no kubeconfig (69),
/// a quota (75, nothing made).
fn bad_input(admin: &KubeEngine, e: &KubeEngine, kc: &str, ns: &str, root: &Root) {
    let c = admin.client().clone();
    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), ns);
    let sa = "lw-reader";
    admin
        .block_on(sas.create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(sa.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        ))
        .unwrap();
    let roles: Api<Role> = Api::namespaced(c.clone(), ns);
    admin
        .block_on(roles.create(
            &PostParams::default(),
            &Role {
                metadata: ObjectMeta {
                    name: Some(sa.into()),
                    ..Default::default()
                },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["".into()]),
                    resources: Some(vec!["pods".into()]),
                    verbs: vec!["get".into(), "list".into(), "watch".into()],
                    ..Default::default()
                }]),
            },
        ))
        .unwrap();
    let rbs: Api<RoleBinding> = Api::namespaced(c.clone(), ns);
    admin
        .block_on(rbs.create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some(sa.into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: sa.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: sa.into(),
                    namespace: Some(ns.into()),
                    ..Default::default()
                }]),
            },
        ))
        .unwrap();
    let tr = admin
        .block_on(sas.create_token_request(sa, &PostParams::default(), &Default::default()))
        .expect("a token for the service account");
    let token = tr.status.expect("token").token;
    let dir = std::env::temp_dir().join(format!("lw-kube-kc-{}", nonce()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Path::new(kc).parent().unwrap().join("pki/ca.crt");
    let reader_kc = dir.join("reader.kubeconfig");
    std::fs::write(
        &reader_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: lw, cluster: {{server: \"https://127.0.0.1:{port}\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: reader, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: lw-reader, context: {{cluster: lw, user: reader, namespace: {ns}}}}}]\ncurrent-context: lw-reader\n",
            ca.display(),
            port = kube_support::plan_port(Path::new(kc), "apiserver"),
        ),
    )
    .unwrap();
    let reader =
        KubeEngine::connect_with(reader_kc.to_str(), None, None).expect("the reader connects");
    assert!(!reader.can("create", "pods").unwrap());
    let err = reader
        .create(&spec("lw-kt-forbidden", root, "rbac"))
        .unwrap_err();
    eprintln!("RBAC: {err}");
    assert_eq!(err.exit, Exit::NoPerm, "{err}");
    assert!(
        err.msg.contains("'create' on 'pods'") && err.msg.contains("lw-reader"),
        "{err}"
    );
    assert!(
        e.inspect("lw-kt-forbidden").unwrap().is_none(),
        "nothing was made"
    );

    // Unreachable: a context whose server does not listen.
    let gone_kc = dir.join("gone.kubeconfig");
    std::fs::write(
        &gone_kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: gone, cluster: {{server: \"https://127.0.0.1:1\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: u, user: {{token: x}}}}]\ncontexts: [{{name: lw-gone, context: {{cluster: gone, user: u}}}}]\ncurrent-context: lw-gone\n",
            ca.display()
        ),
    )
    .unwrap();
    let t0 = Instant::now();
    let err = KubeEngine::connect_with(gone_kc.to_str(), None, None)
        .err()
        .expect("unreachable");
    eprintln!("unreachable ({:.0} ms): {err}", ms(t0.elapsed()));
    assert_eq!(err.exit, Exit::Unavailable);
    assert!(err.msg.contains("'lw-gone'"), "{err}");
    let err = KubeEngine::connect_with(Some("/nonexistent/kubeconfig"), Some("prod".into()), None)
        .err()
        .unwrap();
    assert_eq!(err.exit, Exit::Unavailable);
    assert!(
        err.msg.contains("'prod'") && err.msg.contains("/nonexistent/kubeconfig"),
        "{err}"
    );
    let err = KubeEngine::connect_with(Some(kc), Some("nope".into()), None)
        .err()
        .unwrap();
    assert_eq!(err.exit, Exit::Unavailable);
    assert!(
        err.msg.contains("'nope'") && err.msg.contains("lw"),
        "{err}"
    );

    // A quota of one pod: the second create is refused and leaves nothing.
    let quotas: Api<ResourceQuota> = Api::namespaced(c.clone(), ns);
    admin
        .block_on(quotas.create(
            &PostParams::default(),
            &ResourceQuota {
                metadata: ObjectMeta {
                    name: Some("lw-one-pod".into()),
                    ..Default::default()
                },
                spec: Some(ResourceQuotaSpec {
                    hard: Some(BTreeMap::from([("pods".to_string(), Quantity("1".into()))])),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .unwrap();
    // The quota admits nothing until its controller has counted (status.hard set).
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin
        .block_on(quotas.get("lw-one-pod"))
        .unwrap()
        .status
        .and_then(|s| s.hard)
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the quota controller did not count within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let first = format!("lw-kt-q1-{}", nonce());
    e.create(&spec(&first, root, "quota"))
        .expect("the first pod fits");
    let second = format!("lw-kt-q2-{}", nonce());
    let err = e.create(&spec(&second, root, "quota2")).unwrap_err();
    eprintln!("quota: {err}");
    assert_eq!(err.exit, Exit::TempFail, "{err}");
    assert!(err.msg.contains("quota") && err.msg.contains(ns), "{err}");
    assert!(e.inspect(&second).unwrap().is_none());
    assert!(
        e.containers_with_label(&format!("{LABEL_SANDBOX}=quota2"))
            .unwrap()
            .is_empty()
    );
    e.remove(&first, true).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
