//! Sandboxes as pods: `lw-sandbox` with `LW_ENGINE=kubernetes` on the real
//! single-node cluster of scripts/k8s-cluster (crates/test-support/src/cluster.rs), the
//! project's image imported into its containerd (no registry).  The cluster
//! does not see this host's files, so every sandbox is in volume mode
//! (lib/sandbox/volume.rs): its workspace, mail dir and tools are
//! PersistentVolumeClaims (the test cluster's host-path provisioner), filled
//! as the sandbox's non-root user, and `lw-sandbox courier` carries the mail
//! through the pods/exec subresource.
//!
//! Asserted: create (with `--image`, and without: the project's image as
//! lw-build made it; with `build.cache` the pod names the cache's copy),
//! exec (uid, branch, HEAD, tools on PATH), post ->
//! mediator -> courier -> a waiting `lw-inbox --wait`, a contract change
//! between two pod sandboxes and its answer back, 1,000 messages with 0
//! lost and 0 duplicated, push (checked with git in the upstream), a pod
//! evicted mid-run (Eviction API): `ls` no longer lists it running, its
//! mail is kept on its claim and in the root, rm, and kill -9 of a create
//! at a seeded moment followed by gc (nothing of the root left in the
//! cluster but the shared tools claim: pods, claims and their volumes,
//! policies, configmaps, Services, Secrets, read through the API), an
//! image no node has (66, nothing of the root left through the API).  Figures: cluster
//! start, pod sandbox create against a Docker sandbox create (same run),
//! post->deliver latency through the courier, 1,000 messages.
//!
//! Without the cached binaries (scripts/k8s-build) the test says it cannot
//! run and why, and passes.

use support::cluster as kube_support;
use support::courier as courier_support;
use support::sandbox as sandbox_support;
use support::seeded;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use engine::{ContainerSpec, Engine, ExecRequest, KubeEngine, OutStream, VolumeMount};
use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, EvictParams, WatchEvent, WatchParams};
use sandbox_support::{Fixture, bin, git};

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Where lw-sandbox runs: the cluster (its kubeconfig) or the local Docker.
struct Target {
    kube: Option<PathBuf>,
    root: PathBuf,
}

impl Target {
    fn env<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("LW_ROOT", &self.root);
        match &self.kube {
            Some(k) => c.env("LW_ENGINE", "kubernetes").env("KUBECONFIG", k),
            None => c.env("LW_ENGINE", "docker").env_remove("KUBECONFIG"),
        }
    }
    fn sb(&self, fx: &Fixture, args: &[&str]) -> Output {
        self.env(&mut fx.cmd(args))
            .output()
            .expect("lw-sandbox runs")
    }
    fn ok(&self, fx: &Fixture, args: &[&str]) -> String {
        let o = self.sb(fx, args);
        assert!(
            o.status.success(),
            "lw-sandbox {args:?} exited {:?}: {}",
            o.status.code(),
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
    fn mediator(&self, policy: &Path) -> Child {
        Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&self.root)
            .arg("--policy")
            .arg(policy)
            // Storms post more than the default log budget allows.
            .args(["--log-max", "64m"])
            .stdout(Stdio::null())
            .spawn()
            .expect("lw-mediate runs")
    }
    fn mediate_once(&self, policy: &Path) {
        let o = Command::new(bin("lw-mediate"))
            .arg("--root")
            .arg(&self.root)
            .arg("--policy")
            .arg(policy)
            .args(["--log-max", "64m", "--once"])
            .output()
            .expect("lw-mediate runs");
        assert!(o.status.success(), "lw-mediate --once: {}", text(&o));
    }
    /// `lw-post` in sandbox `from`: the id.
    fn post(&self, fx: &Fixture, from: &str, args: &[&str]) -> String {
        let mut a = vec!["exec", from, "--", "lw-post"];
        a.extend_from_slice(args);
        a.push("body");
        self.ok(fx, &a).trim().to_string()
    }
    /// Names in directories of sandbox `name`.
    fn ls(&self, fx: &Fixture, name: &str, dirs: &str) -> Vec<String> {
        self.ok(
            fx,
            &["exec", name, "--", "sh", "-c", &format!("ls -1 {dirs}")],
        )
        .lines()
        .filter(|l| !l.is_empty() && !l.ends_with(':'))
        .map(str::to_string)
        .collect()
    }
}

use crate::courier_support::{Courier, id_time};

/// `lw-sandbox courier --interval MS` for `t`.
fn start_courier(fx: &Fixture, t: &Target, interval_ms: u32) -> Courier {
    Courier::spawn(t.env(&mut fx.cmd(&["courier", "--interval", &interval_ms.to_string()])))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A waiting `lw-inbox --wait` in sandbox `name`, once it says it waits.
fn waiter(fx: &Fixture, t: &Target, name: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut w = t
        .env(&mut fx.cmd(&[
            "exec",
            name,
            "--",
            "sh",
            "-c",
            "echo waiting; exec lw-inbox --wait --timeout 120",
        ]))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(w.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first.trim(), "waiting", "lw-inbox in {name}");
    (w, out)
}

/// The line a waiting lw-inbox lists, after it ended well.
fn waited(mut w: (Child, BufReader<std::process::ChildStdout>)) -> String {
    let mut listed = String::new();
    w.1.read_line(&mut listed).unwrap();
    let st = w.0.wait().unwrap();
    assert!(st.success(), "lw-inbox --wait: {st:?}");
    listed
}

/// Pod `name` evicted through the Eviction API, waited for until deleted.
fn evict(e: &KubeEngine, name: &str) {
    let pods: Api<Pod> = Api::namespaced(e.client().clone(), &e.target().namespace);
    e.block_on(async {
        let p = pods.get(name).await.expect("the pod exists");
        let rv = p.metadata.resource_version.unwrap_or_default();
        let ep = EvictParams {
            delete_options: Some(DeleteParams {
                grace_period_seconds: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        pods.evict(name, &ep)
            .await
            .expect("the eviction is accepted");
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(60);
        let mut s = pods.watch(&wp, &rv).await.expect("watch").boxed();
        while let Some(ev) = s.try_next().await.expect("watch") {
            if let WatchEvent::Deleted(_) = ev {
                return;
            }
        }
        panic!("pod {name} was not deleted within 60 s of its eviction");
    })
}

/// The names in `dirs` of claim `volume`, read by a pod that mounts it.
fn on_claim(e: &KubeEngine, image: &str, volume: &str, dirs: &[&str]) -> Vec<String> {
    let name = format!("lw-test-reader-{}", sandbox_support::nonce());
    let spec = ContainerSpec {
        name: Some(name.clone()),
        image: image.into(),
        entrypoint: Some(vec!["sleep".into(), "600".into()]),
        user: Some("100000:100000".into()),
        read_only_root: true,
        volumes: vec![VolumeMount {
            volume: volume.into(),
            target: "/m".into(),
            read_only: true,
        }],
        network: Some("none".into()),
        ..Default::default()
    };
    e.create(&spec).expect("the reader pod is made");
    e.start(&name).expect("the reader pod starts");
    let mut out = Vec::new();
    let mut cmd = vec!["ls".to_string(), "-1".into()];
    cmd.extend(dirs.iter().map(|d| format!("/m/{d}")));
    let req = ExecRequest {
        cmd,
        ..Default::default()
    };
    let code = e
        .exec(&name, &req, &mut |s, b| {
            if s == OutStream::Stdout {
                out.extend_from_slice(b)
            }
        })
        .expect("exec in the reader");
    e.remove(&name, true).expect("the reader goes");
    assert_eq!(code, 0, "ls on claim {volume}");
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.is_empty() && !l.ends_with(':'))
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs the single-node Kubernetes cached by scripts/k8s-build; .ci/run runs it with --ignored when cached"]
fn sandboxes_as_pods() {
    assert!(
        kube_support::missing().is_empty(),
        "kube_sandbox: CANNOT RUN: Kubernetes is not cached: {:?} missing (scripts/k8s-build)",
        kube_support::missing()
    );
    let fx = Fixture::new("kube");
    let project = wall::config::project(&fx.proj)
        .unwrap()
        .expect("the fixture is a project");
    let docker = engine::connect_docker(None).expect("the Docker engine is reachable");
    let image = loopwright::sandbox::resolve_image(&docker, Some(&project), None, false)
        .expect("the fixture's image is built")
        .reference;
    let cluster = kube_support::Cluster::start("kube_sandbox", &[&image])
        .expect("the cached binaries are there");
    let started = Instant::now();
    let ke = KubeEngine::connect_with(Some(cluster.kubeconfig.to_str().unwrap()), None, None)
        .expect("connects to the test cluster");
    let tk = Target {
        kube: Some(cluster.kubeconfig.clone()),
        root: fx.root.clone(),
    };
    let tl = Target {
        kube: None,
        root: fx.dir.join("root-local"),
    };
    std::fs::create_dir_all(&tl.root).unwrap();
    let policy = fx.dir.join("policy");
    std::fs::write(
        &policy,
        "loopwright-policy 1\nroute contract-change named\nrate off\nduplicates off\n",
    )
    .unwrap();

    // create: two pod sandboxes, one Docker sandbox, same run.
    let create = |t: &Target, name: &str| {
        let s = Instant::now();
        t.ok(&fx, &["create", name, "--branch", name, "--image", &image]);
        s.elapsed()
    };
    let create_k = create(&tk, "a");
    // Without --image: the project's image, chosen where lw-build built it.
    let s = Instant::now();
    tk.ok(&fx, &["create", "b", "--branch", "b"]);
    let create_k2 = s.elapsed();
    let create_d = create(&tl, "a");

    // With build.cache, the pod names the cache's copy of the last layer
    // (here a registry that is not there: the pull fails, nothing is left).
    let config = fx.proj.join(".loopwright/config");
    std::fs::write(&config, "build.cache = 127.0.0.1:9/lw/layers\n").unwrap();
    let o = tk.sb(&fx, &["create", "c", "--branch", "c"]);
    std::fs::write(&config, "").unwrap();
    assert_eq!(o.status.code(), Some(66), "a pull that fails: {}", text(&o));
    assert!(
        text(&o).contains("127.0.0.1:9/lw/layers:deps-"),
        "the pod named the cache's reference: {}",
        text(&o)
    );
    assert!(
        !tk.ok(&fx, &["ls"]).lines().any(|l| l.starts_with("c\t")),
        "nothing of c is left"
    );
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.root.join("state/sandbox/a.json")).unwrap())
            .unwrap();
    assert_eq!(rec["volume_mode"], true, "a pod sandbox is in volume mode");
    let claims = cluster.kubectl(&[
        "get",
        "pvc",
        "-l",
        "org.loopwright.sandbox=a",
        "-o",
        "custom-columns=N:.metadata.name,S:.status.phase",
        "--no-headers",
    ]);
    assert!(
        claims.contains("-a-work") && claims.contains("-a-mail"),
        "a's workspace and mail dir are claims: {claims}"
    );
    assert!(
        claims.lines().all(|l| l.ends_with("Bound")),
        "and bound: {claims}"
    );

    // exec: the clone on its branch, as the sandbox's user, the tools on PATH.
    let o = tk.ok(
        &fx,
        &[
            "exec",
            "a",
            "--",
            "sh",
            "-c",
            "id -u; git rev-parse --abbrev-ref HEAD; git rev-parse HEAD; command -v lw-post",
        ],
    );
    let l: Vec<&str> = o.lines().collect();
    assert_eq!(l[0], "100000", "exec in the pod: {o}");
    assert_eq!(l[1], "a", "the clone is on branch a: {o}");
    assert_eq!(
        l[2],
        git(&fx.proj, &["rev-parse", "HEAD"]),
        "it starts at the upstream's HEAD: {o}"
    );
    assert_eq!(l[3], "/lw/bin/lw-post", "the tools are on PATH: {o}");

    // A contract change from a reaches b's waiting lw-inbox; b's answer
    // reaches a's.
    let mut med = tk.mediator(&policy);
    // create started the root's courier (volume mode); the one run here
    // counts its lines, so that one is stopped first.
    tk.ok(&fx, &["courier", "--stop"]);
    let courier = start_courier(&fx, &tk, 100);
    let wb = waiter(&fx, &tk, "b");
    let change = tk.post(
        &fx,
        "a",
        &[
            "--to",
            "b",
            "--kind",
            "contract-change",
            "--ref",
            "src/api/schema.json",
            "--subject",
            "users becomes a list",
        ],
    );
    let listed = waited(wb);
    assert!(
        listed.starts_with(&change) && listed.contains("users becomes a list"),
        "b's waiting lw-inbox lists a's contract change: {listed:?}"
    );
    let wa = waiter(&fx, &tk, "a");
    let answer = tk.post(
        &fx,
        "b",
        &[
            "--kind",
            "answer",
            "--reply-to",
            &change,
            "--subject",
            "b follows the list",
        ],
    );
    let listed = waited(wa);
    assert!(
        listed.starts_with(&answer) && listed.contains("b follows the list"),
        "a's waiting lw-inbox lists b's answer: {listed:?}"
    );
    tk.ok(&fx, &["exec", "b", "--", "lw-inbox", "ack", &change]);

    // post -> deliver latency through the courier.
    let lat = median(
        (0..7)
            .map(|i| {
                let id = tk.post(
                    &fx,
                    "a",
                    &[
                        "--to",
                        "b",
                        "--kind",
                        "request",
                        "--subject",
                        &format!("latency {i}"),
                    ],
                );
                let at = courier.until_in(1, Duration::from_secs(60));
                at.duration_since(id_time(&id)).unwrap_or_default()
            })
            .collect(),
    );

    // 1,000 messages: each reaches b once.
    let start = Instant::now();
    let poster = tk
        .env(&mut fx.cmd(&[
            "exec",
            "a",
            "--",
            "sh",
            "-c",
            "for i in $(seq 1000); do lw-post --to b --kind status --subject \"flood $i\" x || exit 1; done",
        ]))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    courier.until_in(1000, Duration::from_secs(300));
    let thousand = start.elapsed();
    let o = poster.wait_with_output().unwrap();
    assert!(o.status.success(), "the flood's poster: {}", text(&o));
    let ids: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 1000, "the poster posted 1,000");
    let inbox = tk.ls(&fx, "b", "/lw/mailbox/inbox/new /lw/mailbox/inbox/cur");
    let want: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
    let mut per_id: BTreeMap<&str, usize> = BTreeMap::new();
    for n in inbox
        .iter()
        .map(String::as_str)
        .filter(|n| want.contains(n))
    {
        *per_id.entry(n).or_default() += 1;
    }
    let lost = want.len() - per_id.len();
    let quarantined = std::fs::read_dir(fx.root.join("quarantine/new")).map_or(0, |r| r.count());
    let duplicated = per_id.values().filter(|n| **n > 1).count() + quarantined;
    eprintln!(
        "figure: 1,000 messages a -> b through pods: {:.1} s, lost {lost}, duplicated {duplicated}",
        thousand.as_secs_f64()
    );
    assert_eq!((lost, duplicated), (0, 0), "1,000 messages through pods");
    drop(courier);
    let _ = med.kill();
    let _ = med.wait();

    // push: the branch leaves through exec, checked with git in the upstream.
    tk.ok(
        &fx,
        &[
            "exec",
            "a",
            "--",
            "sh",
            "-c",
            "echo pod > pod.txt && git add pod.txt && git commit -qm 'from a pod'",
        ],
    );
    let pushed = tk.ok(&fx, &["push", "a"]);
    let tip = tk.ok(&fx, &["exec", "a", "--", "git", "rev-parse", "HEAD"]);
    assert!(
        pushed.starts_with(&format!("a {} new", tip.trim())),
        "push from a pod: {pushed}"
    );
    assert_eq!(
        git(&fx.upstream, &["rev-parse", "refs/heads/a"]),
        tip.trim(),
        "the upstream has a's commit"
    );
    assert_eq!(
        git(&fx.upstream, &["show", "refs/heads/a:pod.txt"]),
        "pod",
        "with its file"
    );

    // b evicted mid-run, with mail carried into its claim and mail of its
    // own not carried out yet: listed as gone, the mail kept.
    let before: Vec<String> = (0..3)
        .map(|i| {
            tk.post(
                &fx,
                "a",
                &[
                    "--to",
                    "b",
                    "--kind",
                    "request",
                    "--subject",
                    &format!("before eviction {i}"),
                ],
            )
        })
        .collect();
    // Out of a's claim, through the mediator, into b's claim.
    tk.ok(&fx, &["courier", "--once"]);
    tk.mediate_once(&policy);
    tk.ok(&fx, &["courier", "--once"]);
    let unsent = tk.post(
        &fx,
        "b",
        &[
            "--to",
            "a",
            "--kind",
            "status",
            "--subject",
            "b's last word",
        ],
    );
    evict(&ke, &fx.container("b"));
    let ls = tk.ok(&fx, &["ls"]);
    let state = ls
        .lines()
        .find(|l| l.starts_with("b\t"))
        .and_then(|l| l.split('\t').nth(2))
        .unwrap_or_default()
        .to_string();
    assert!(
        state == "lost" || state == "missing",
        "an evicted pod's sandbox is listed as gone: {ls}"
    );
    assert!(
        ls.lines()
            .find(|l| l.starts_with("a\t"))
            .is_some_and(|l| l.contains("\trunning\t")),
        "a runs on: {ls}"
    );
    let root_inbox: BTreeSet<String> = std::fs::read_dir(fx.root.join("sandboxes/b/inbox/new"))
        .unwrap()
        .chain(std::fs::read_dir(fx.root.join("sandboxes/b/inbox/cur")).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mail = format!("lw-sb-{}-b-mail", fx.root_id());
    let claim = on_claim(&ke, &image, &mail, &["inbox/new", "outbox/new"]);
    for id in &before {
        assert!(root_inbox.contains(id), "{id} is kept in the root");
        assert!(claim.contains(id), "{id} is kept on b's claim: {claim:?}");
    }
    assert!(
        claim.contains(&unsent),
        "b's uncarried {unsent} is kept on its claim: {claim:?}"
    );
    // The courier passes over the lost sandbox and goes on with the others.
    tk.ok(&fx, &["courier", "--once"]);

    // rm: the pods, their claims and records go; the tools claim stays.
    tk.ok(&fx, &["rm", "a"]);
    tk.ok(&fx, &["rm", "--force", "b"]);
    tl.ok(&fx, &["rm", "--force", "a"]);

    // (a and b gone, the node has room again.)  An image the node has not
    // and cannot pull: the pod's own status says so, 66 naming the image
    // and the fix; nothing is left.
    let o = tk.sb(
        &fx,
        &[
            "create",
            "n",
            "--branch",
            "n",
            "--image",
            "loopwright/never-imported:1",
        ],
    );
    assert_eq!(
        o.status.code(),
        Some(66),
        "an image no node has: {}",
        text(&o)
    );
    assert!(
        text(&o).contains("loopwright/never-imported:1")
            && text(&o).contains("ctr -n k8s.io images import"),
        "names the image and the fix: {}",
        text(&o)
    );
    assert!(
        !tk.ok(&fx, &["ls"]).lines().any(|l| l.starts_with("n\t")),
        "nothing of n is left"
    );
    // Through the API too: no pod, claim, volume, policy, Service or
    // Secret of the root, the tools claim included (a and b were the
    // root's last sandboxes, so n's create made it again and took it back).
    let left = kube_support::leftovers(&cluster, "default", &fx.root_id(), None);
    assert_eq!(
        left, "",
        "objects of the root left by a create on an image no node has"
    );
    // Imported a moment ago (a new name on the node, which the kubelet has
    // not reported yet): made at once.
    let fresh = format!(
        "docker.io/loopwright/just-imported:{}",
        sandbox_support::nonce()
    );
    let normal = engine::kubernetes::normalize(&image);
    cluster.ctr(&["images", "tag", &normal, &fresh]);
    let s = Instant::now();
    tk.ok(
        &fx,
        &[
            "create", "j", "--branch", "j", "--image", &fresh, "--cpus", "0.1",
        ],
    );
    eprintln!(
        "figure: create from an image tagged on the node just before: {:.1} s",
        s.elapsed().as_secs_f64()
    );
    tk.ok(&fx, &["rm", "--force", "j"]);

    // kill -9 of a create at a seeded moment, then gc: nothing of it left.
    let kill_at = Duration::from_millis(500 + seeded::below(4000));
    let mut c = tk
        .env(&mut fx.cmd(&["create", "k", "--branch", "k"]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The kill's moment is the point (seeded), so this sleep waits for no event.
    std::thread::sleep(kill_at);
    let finished = match c.try_wait().unwrap() {
        Some(st) => format!("finished first ({st:?})"),
        None => {
            c.kill().unwrap();
            c.wait().unwrap();
            "killed".to_string()
        }
    };
    eprintln!(
        "figure: create of k {finished} at {} ms (seed {})",
        kill_at.as_millis(),
        seeded::seed()
    );
    tk.ok(&fx, &["gc"]);
    if finished != "killed" {
        tk.ok(&fx, &["rm", "--force", "k"]);
    }
    let left = kube_support::leftovers(&cluster, "default", &fx.root_id(), Some("-tools-"));
    assert_eq!(
        left, "",
        "objects of the root left in the cluster but the tools claim"
    );

    eprintln!(
        "figure: cluster start (node Ready, images imported) {:.1} s; the suite on it {:.1} s",
        cluster.started_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    eprintln!(
        "figure: lw-sandbox create: pod {:.1} s (second {:.1} s), Docker {:.1} s: pod/Docker {:.1}x",
        create_k.as_secs_f64(),
        create_k2.as_secs_f64(),
        create_d.as_secs_f64(),
        create_k2.as_secs_f64() / create_d.as_secs_f64()
    );
    eprintln!(
        "figure: post->deliver through the courier on pods: median of 7 {:.0} ms",
        lat.as_secs_f64() * 1000.0
    );
}
