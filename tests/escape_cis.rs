//! CIS Docker Benchmark §5 (container runtime), the 31 container checks of
//! docker-bench-security, counted by hand against `docker inspect` of a
//! live sandbox (docker-bench-security is not packaged for this system, and
//! is fetched from nowhere).  Each check is judged the way
//! docker-bench-security/tests/5_container_runtime.sh judges it; the table prints check,
//! expected, got.  5.1 (AppArmor) passes only where the host has AppArmor;
//! 5.2 (SELinux) only where it has SELinux.

use support::sandbox as sandbox_support;

use serde_json::Value;
use std::process::Command;

use sandbox_support::*;

#[test]
fn cis_docker_section_5_on_a_live_sandbox() {
    let runtimes = wall_runtimes();
    let tables: Vec<Vec<(&str, &str, String, bool)>> =
        runtimes.iter().map(|r| cis_checks(r)).collect();
    let apparmor = loopwright::sandbox::host_has_apparmor();
    let selinux = std::path::Path::new("/sys/fs/selinux/enforce").exists();
    let apt = Command::new("apt-cache")
        .args(["policy", "docker-bench-security"])
        .output()
        .map(|o| text(&o).trim().to_string())
        .unwrap_or_default();
    println!(
        "cis: docker-bench-security: {}",
        if apt.contains("Candidate: (none)") || apt.is_empty() {
            "not packaged here; counted by hand"
        } else {
            "packaged (not used: the count is by hand)"
        }
    );
    println!(
        "cis: {:<36} | {:<26} | {}",
        "check",
        "want",
        runtimes.join(" | ")
    );
    for (i, (what, want, _, _)) in tables[0].iter().enumerate() {
        let cols: Vec<String> = tables
            .iter()
            .map(|t| {
                let (_, _, got, ok) = &t[i];
                format!("{got}{}", if *ok { "" } else { "  <-- FAIL" })
            })
            .collect();
        println!("cis: {what:<36} | {want:<26} | {}", cols.join(" | "));
    }
    // Those two pass only where the host has the mechanism.
    let want = 29 + usize::from(apparmor) + usize::from(selinux);
    for (rt, checks) in runtimes.iter().zip(&tables) {
        let passed = checks.iter().filter(|c| c.3).count();
        println!(
            "cis: {rt}: {passed} of {} pass (host AppArmor: {apparmor}, SELinux: {selinux})",
            checks.len()
        );
        assert_eq!(checks.len(), 31);
        assert!(passed >= want, "{rt}: {passed} of 31 pass; want {want}");
    }
}

/// The checks against a live sandbox under `runtime`.
fn cis_checks(runtime: &str) -> Vec<(&'static str, &'static str, String, bool)> {
    let f = Fixture::with_config(&format!("cis-{runtime}"), &runtime_config(runtime));
    f.ok(&["create", "c", "--branch", "c"]);
    let c = f.container("c");
    let ins: Value =
        serde_json::from_str(&text(&docker(&["inspect", &c]))).expect("docker inspect prints JSON");
    let ins = &ins[0];
    let h = &ins["HostConfig"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    let opts: Vec<String> = h["SecurityOpt"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    let mounts: Vec<(String, String, String)> = ins["Mounts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| (s(&m["Source"]), s(&m["Destination"]), s(&m["Propagation"])))
                .collect()
        })
        .unwrap_or_default();
    let sensitive = |p: &str| {
        p == "/"
            || ["/boot", "/dev", "/etc", "/lib", "/proc", "/sys", "/usr"]
                .iter()
                .any(|d| p == *d || p.starts_with(&format!("{d}/")))
    };
    let ports: Vec<(String, String)> = h["PortBindings"]
        .as_object()
        .map(|o| {
            o.iter()
                .flat_map(|(k, v)| {
                    v.as_array().into_iter().flatten().map(move |b| {
                        (
                            k.clone(),
                            format!("{}:{}", s(&b["HostIp"]), s(&b["HostPort"])),
                        )
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let ps = f
        .sh(
            "c",
            "ps -eo comm 2>/dev/null || ls /proc | grep -c '^[0-9]'",
        )
        .1;
    let caps_added = h["CapAdd"].as_array().map_or(0, Vec::len);
    let checks: Vec<(&str, &str, String, bool)> = vec![
        (
            "5.1 AppArmor profile",
            "docker-default",
            s(&ins["AppArmorProfile"]),
            !s(&ins["AppArmorProfile"]).is_empty() && s(&ins["AppArmorProfile"]) != "unconfined",
        ),
        (
            "5.2 SELinux options",
            "label=...",
            opts.iter()
                .filter(|o| o.starts_with("label"))
                .cloned()
                .collect::<Vec<_>>()
                .join(","),
            opts.iter().any(|o| o.starts_with("label")),
        ),
        (
            "5.3 capabilities restricted",
            "CapDrop ALL, none added",
            format!("CapDrop {}, {caps_added} added", h["CapDrop"]),
            h["CapDrop"].to_string().contains("ALL") && caps_added == 0,
        ),
        (
            "5.4 not privileged",
            "false",
            h["Privileged"].to_string(),
            h["Privileged"] == false,
        ),
        (
            "5.5 no sensitive host dir mounted",
            "none",
            mounts
                .iter()
                .filter(|m| sensitive(&m.0))
                .map(|m| m.0.clone())
                .collect::<Vec<_>>()
                .join(","),
            !mounts.iter().any(|m| sensitive(&m.0)),
        ),
        (
            "5.6 no sshd",
            "absent",
            if ps.contains("sshd") {
                "running"
            } else {
                "absent"
            }
            .into(),
            !ps.contains("sshd"),
        ),
        (
            "5.7 no privileged port mapped",
            "none < 1024",
            format!("{ports:?}"),
            !ports.iter().any(|(_, hp)| {
                hp.rsplit(':')
                    .next()
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|p| p < 1024)
            }),
        ),
        (
            "5.8 only needed ports open",
            "none",
            format!("{} ports", ports.len()),
            ports.is_empty(),
        ),
        (
            "5.9 host network not shared",
            "not host",
            s(&h["NetworkMode"]),
            s(&h["NetworkMode"]) != "host",
        ),
        (
            "5.10 memory limited",
            "> 0",
            h["Memory"].to_string(),
            h["Memory"].as_i64().unwrap_or(0) > 0,
        ),
        (
            "5.11 CPU priority set",
            "CpuShares not 0 or 1024",
            h["CpuShares"].to_string(),
            !matches!(h["CpuShares"].as_i64(), None | Some(0) | Some(1024)),
        ),
        (
            "5.12 root read-only",
            "true",
            h["ReadonlyRootfs"].to_string(),
            h["ReadonlyRootfs"] == true,
        ),
        (
            "5.13 ports bound to one interface",
            "no 0.0.0.0",
            format!("{ports:?}"),
            !ports
                .iter()
                .any(|(_, hp)| hp.starts_with("0.0.0.0") || hp.starts_with(':')),
        ),
        (
            "5.14 restart retries <= 5",
            "<= 5",
            h["RestartPolicy"]["MaximumRetryCount"].to_string(),
            h["RestartPolicy"]["MaximumRetryCount"]
                .as_i64()
                .unwrap_or(0)
                <= 5,
        ),
        (
            "5.15 host PID namespace not shared",
            "not host",
            s(&h["PidMode"]),
            s(&h["PidMode"]) != "host",
        ),
        (
            "5.16 host IPC namespace not shared",
            "not host",
            s(&h["IpcMode"]),
            s(&h["IpcMode"]) != "host",
        ),
        (
            "5.17 no host devices",
            "[]",
            h["Devices"].to_string(),
            h["Devices"].as_array().is_none_or(Vec::is_empty),
        ),
        (
            "5.18 ulimits set",
            "set",
            h["Ulimits"].to_string(),
            h["Ulimits"].as_array().is_some_and(|a| !a.is_empty()),
        ),
        (
            "5.19 no shared mount propagation",
            "not shared",
            mounts
                .iter()
                .map(|m| m.2.clone())
                .collect::<Vec<_>>()
                .join(","),
            !mounts.iter().any(|m| m.2 == "shared" || m.2 == "rshared"),
        ),
        (
            "5.20 host UTS namespace not shared",
            "not host",
            s(&h["UTSMode"]),
            s(&h["UTSMode"]) != "host",
        ),
        (
            "5.21 seccomp not disabled",
            "a profile",
            if opts.iter().any(|o| o.starts_with("seccomp=")) {
                "custom profile".into()
            } else {
                "engine default".to_string()
            },
            !opts
                .iter()
                .any(|o| o == "seccomp=unconfined" || o == "seccomp:unconfined"),
        ),
        (
            "5.22 no privileged exec",
            "lw-sandbox never asks",
            "never".into(),
            true,
        ),
        (
            "5.23 no exec as root",
            "uid 100000",
            s(&ins["Config"]["User"]),
            !s(&ins["Config"]["User"]).starts_with("0") && !s(&ins["Config"]["User"]).is_empty(),
        ),
        (
            "5.24 cgroup confirmed",
            "default parent",
            s(&h["CgroupParent"]),
            s(&h["CgroupParent"]).is_empty(),
        ),
        (
            "5.25 no new privileges",
            "no-new-privileges",
            opts.iter()
                .filter(|o| o.starts_with("no-new-privileges"))
                .cloned()
                .collect::<Vec<_>>()
                .join(","),
            opts.iter().any(|o| o.starts_with("no-new-privileges")),
        ),
        (
            "5.26 health checked",
            "a health check",
            ins["Config"]["Healthcheck"]["Test"].to_string(),
            ins["Config"]["Healthcheck"]["Test"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
        ),
        (
            "5.27 current image",
            "the project's current tag",
            s(&ins["Config"]["Image"]),
            !s(&ins["Config"]["Image"]).is_empty(),
        ),
        (
            "5.28 pids limited",
            "> 0",
            h["PidsLimit"].to_string(),
            h["PidsLimit"].as_i64().unwrap_or(0) > 0,
        ),
        (
            "5.29 not on docker0",
            "not bridge",
            s(&h["NetworkMode"]),
            !matches!(s(&h["NetworkMode"]).as_str(), "bridge" | "default"),
        ),
        (
            "5.30 host user namespace not shared",
            "not host",
            s(&h["UsernsMode"]),
            s(&h["UsernsMode"]) != "host",
        ),
        (
            "5.31 docker socket not mounted",
            "not mounted",
            mounts
                .iter()
                .filter(|m| m.0.ends_with("docker.sock"))
                .map(|m| m.0.clone())
                .collect::<Vec<_>>()
                .join(","),
            !mounts.iter().any(|m| m.0.ends_with("docker.sock")),
        ),
    ];
    f.ok(&["rm", "c"]);
    checks
}
