//! From a devcontainer.json to what loopwright takes of it: each key is
//! taken (the base image, the image's and the sandbox's environment, the
//! lifecycle commands as the deps layer's script, local features as layers,
//! the ports and the user as a report) or refused with its reason.
//!
//! The wall wins: nothing a configuration says widens a sandbox (no
//! privilege, capability, security option, host mount, wider `runArgs`,
//! host command), and nothing it names from the host's environment is
//! read unless the project allows it (vars.rs).  A refusal is `fatal`
//! when the runtime cannot be made without what was refused (no base
//! image, a feature that cannot be fetched, a variable not allowed); lw
//! init then writes nothing.  The rest are dropped and reported.

use std::path::Path;

use serde_json::Value;

use super::mapping::*;
use super::vars::{self, Context, Piece};

/// Maps the configuration `v` (read from `top/source`).
pub fn map(top: &Path, source: &str, v: &Value, cx: &Context) -> Mapping {
    let mut m = Mapping {
        source: source.to_string(),
        ..Mapping::default()
    };
    let obj = v.as_object().cloned().unwrap_or_default();
    let compose = obj.contains_key("dockerComposeFile");
    for (key, val) in &obj {
        let k = key.as_str();
        match k {
            "$schema"
            | "customizations"
            | "waitFor"
            | "updateRemoteUserUID"
            | "userEnvProbe"
            | "shutdownAction"
            | "overrideCommand"
            | "init"
            | "hostRequirements"
            | "otherPortsAttributes"
            | "overrideFeatureInstallOrder" => {
                ignored(&mut m, k);
            }
            "name" => {
                m.name = val.as_str().map(str::to_string);
                m.take(k, "reported");
            }
            "image" => image(&mut m, val, cx),
            "build" | "dockerFile" | "dockerfile" | "context" => {}
            "features" => super::features::features(&mut m, top, source, val, cx),
            "containerEnv" | "remoteEnv" => env(&mut m, k, val, cx),
            "remoteUser" | "containerUser" => user(&mut m, k, val, cx),
            "forwardPorts" | "appPort" => ports(&mut m, k, val),
            "portsAttributes" => labels(&mut m, val),
            "onCreateCommand" | "updateContentCommand" | "postCreateCommand"
            | "postStartCommand" => {}
            "postAttachCommand" => m.refuse(
                k,
                "a sandbox is attached to by programs (lw-sandbox exec, an agent's run) as often as by a person, and a command run at each would run under every one of theirs; put it in postStartCommand, or run it in lw-sandbox shell",
            ),
            "initializeCommand" => m.refuse(
                k,
                "it runs on the host, and nothing from a repository runs on the host",
            ),
            "privileged" if val == &Value::Bool(false) => m.take(k, "false: as a sandbox is"),
            "privileged" => m.refuse(k, "the wall: a sandbox is never privileged"),
            "capAdd" => m.refuse(k, "the wall: a sandbox has no capabilities"),
            "securityOpt" => m.refuse(
                k,
                "the wall: a sandbox keeps its seccomp, AppArmor and no-new-privileges options",
            ),
            "mounts" => mounts(&mut m, val),
            "workspaceMount" => m.refuse(
                k,
                "the wall: the workspace is the sandbox's own clone at /work/repo, no host folder",
            ),
            "workspaceFolder" if val.as_str() == Some(cx.container_folder) => {
                m.take(k, "the sandbox's clone");
            }
            "workspaceFolder" => m.refuse(
                k,
                format!(
                    "the workspace is {}; ${{containerWorkspaceFolder}} is that",
                    cx.container_folder
                ),
            ),
            "runArgs" => run_args(&mut m, val),
            "dockerComposeFile" | "service" | "runServices" => {
                let msg = "Docker Compose is not a sandbox's runtime: declare each service the configuration starts as a shared service (lw-service(1)) and give the development container's own image as 'image'";
                if compose && obj.get("image").is_none() && k == "dockerComposeFile" {
                    m.fatal(k, msg);
                } else {
                    m.refuse(k, msg);
                }
            }
            _ => m.refuse(
                k,
                "not a devcontainer.json property loopwright knows; ignored",
            ),
        }
    }
    super::build::build(&mut m, top, &obj, cx);
    commands(&mut m, &obj, cx);
    if m.image.is_none() && m.build.is_none() && !m.fatal_refusals().any(|_| true) {
        m.fatal(
            "image",
            "the configuration names no image and no Dockerfile; add 'image' or 'build.dockerfile', or give lw init --from IMAGE",
        );
    }
    m
}

fn ignored(m: &mut Mapping, k: &str) {
    let why = match k {
        "customizations" => "editor settings; nothing for a sandbox",
        "hostRequirements" => "lw-sandbox's limits are sandbox.cpus, sandbox.memory, sandbox.disk",
        "overrideCommand" | "init" | "shutdownAction" => "lw-sandbox runs its own entry and init",
        "updateRemoteUserUID" => "remoteUser is always given the sandbox's user id, sandbox.uid",
        "overrideFeatureInstallOrder" => {
            "features install in the order written, each after those its installsAfter and dependsOn name"
        }
        _ => "nothing for a sandbox",
    };
    m.refuse(k, format!("ignored: {why}"));
}

fn image(m: &mut Mapping, val: &Value, cx: &Context) {
    match val.as_str().map(|s| vars::plain(s, cx, "image")) {
        Some(Ok(s)) if !s.trim().is_empty() => {
            m.take("image", format!("the base layer starts from {s}"));
            m.image = Some(s);
        }
        Some(Err(e)) => m.var("image", e),
        _ => m.fatal("image", "expected an image reference (a string)"),
    }
}

fn env(m: &mut Mapping, k: &str, val: &Value, cx: &Context) {
    let Some(obj) = val.as_object() else {
        return m.refuse(k, "expected an object of NAME: value");
    };
    let remote = k == "remoteEnv";
    let mut names = Vec::new();
    for (name, v) in obj {
        let key = format!("{k}.{name}");
        let valid = !name.is_empty()
            && !name.as_bytes()[0].is_ascii_digit()
            && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_');
        if !valid {
            m.refuse(&key, "not a variable name (letters, digits, '_')");
            continue;
        }
        if OWN_ENV.contains(&name.as_str()) || name.starts_with("LW_") {
            m.refuse(&key, "lw-sandbox sets it for every sandbox");
            continue;
        }
        let Some(s) = v.as_str() else {
            // null in remoteEnv unsets: the image simply does not set it.
            if !v.is_null() {
                m.refuse(&key, "expected a string");
            }
            continue;
        };
        if s.contains('\n') {
            m.refuse(&key, "a value on several lines is not an image's variable");
            continue;
        }
        let value = if remote {
            vars::substitute(s, cx)
        } else {
            vars::plain(s, cx, k).map(|t| vec![Piece::Text(t)])
        };
        match value {
            Ok(value) => {
                names.push(name.clone());
                m.env.push(EnvVar {
                    name: name.clone(),
                    value,
                    remote,
                });
            }
            Err(e) => m.var(&key, e),
        }
    }
    if !names.is_empty() {
        let whose = if remote {
            "every command in a sandbox"
        } else {
            "the image"
        };
        m.take(k, format!("{}: set for {whose}", names.join(", ")));
    }
}

fn user(m: &mut Mapping, k: &str, val: &Value, cx: &Context) {
    match val.as_str().map(|s| vars::plain(s, cx, k)) {
        Some(Ok(u)) => {
            m.take(
                k,
                format!(
                    "'{u}': the sandbox's user (sandbox.uid, never root) runs everything; the image's account '{u}' is given that uid"
                ),
            );
            if k == "remoteUser" || m.user.is_none() {
                m.user = Some(u);
            }
        }
        Some(Err(e)) => m.var(k, e),
        None => m.refuse(k, "expected a user name"),
    }
}

fn ports(m: &mut Mapping, k: &str, val: &Value) {
    let list = match val {
        Value::Array(a) => a.clone(),
        v => vec![v.clone()],
    };
    for p in list {
        let n = match &p {
            Value::Number(n) => n.as_u64(),
            Value::String(s) if !s.contains(':') => s.parse().ok(),
            _ => None,
        };
        let key = format!("{k}[{}]", p.as_str().map_or(p.to_string(), str::to_string));
        if let (Some(n), None) = (n, n.and_then(|n| u16::try_from(n).ok()).filter(|&n| n > 0)) {
            m.refuse(&key, format!("{n} is no port (1 to 65535)"));
            continue;
        }
        match n.and_then(|n| u16::try_from(n).ok()).filter(|&n| n > 0) {
            Some(port) if !m.ports.iter().any(|q| q.port == port) => {
                m.ports.push(Port { port, label: None })
            }
            Some(_) => {}
            None => m.refuse(
                &format!("{k}[{}]", p.as_str().map_or(p.to_string(), str::to_string)),
                "a port of another container (HOST:PORT) is a shared service's: see lw-service(1)",
            ),
        }
    }
    if !m.ports.is_empty() {
        let list: Vec<String> = m.ports.iter().map(|p| p.port.to_string()).collect();
        m.take(
            k,
            format!(
                "{}: sandbox.forward-ports, published by lw-sandbox create --network bridge (host ports leased from sandbox.ports)",
                list.join(", ")
            ),
        );
    }
}

fn labels(m: &mut Mapping, val: &Value) {
    for (p, attrs) in val.as_object().into_iter().flatten() {
        let label = attrs.get("label").and_then(Value::as_str);
        if let (Ok(n), Some(l)) = (p.parse::<u16>(), label)
            && let Some(port) = m.ports.iter_mut().find(|q| q.port == n)
        {
            port.label = Some(l.to_string());
        }
    }
    m.take("portsAttributes", "labels reported with the ports");
}

fn mounts(m: &mut Mapping, val: &Value) {
    for (i, mnt) in val.as_array().into_iter().flatten().enumerate() {
        let kind = match mnt {
            Value::String(s) => s
                .split(',')
                .find_map(|kv| kv.trim().strip_prefix("type="))
                .unwrap_or("volume")
                .to_string(),
            Value::Object(o) => o
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("volume")
                .to_string(),
            _ => "?".into(),
        };
        let reason = if kind == "bind" {
            "the wall: a host path is never mounted into a sandbox"
        } else {
            "a sandbox's only writable places are /work and /tmp; keep caches under /work"
        };
        m.refuse(&format!("mounts[{i}] ({kind})"), reason);
    }
}

/// `runArgs`: each refused, those that widen the container named as such.
fn run_args(m: &mut Mapping, val: &Value) {
    const WIDEN: &[&str] = &[
        "--privileged",
        "--cap-add",
        "--security-opt",
        "--device",
        "--network",
        "--net",
        "--pid",
        "--ipc",
        "--uts",
        "--userns",
        "-v",
        "--volume",
        "--mount",
        "--gpus",
        "--cgroupns",
        "--device-cgroup-rule",
        "--sysctl",
        "--add-host",
        "-p",
        "--publish",
    ];
    for a in val
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let flag = a.split('=').next().unwrap_or(a);
        if WIDEN.contains(&flag) {
            m.refuse(&format!("runArgs {a}"), "the wall: it widens the container");
        } else if flag.starts_with('-') {
            m.refuse(
                &format!("runArgs {a}"),
                "ignored: lw-sandbox sets a sandbox's options (sandbox.* in .loopwright/config)",
            );
        }
    }
}

/// The lifecycle commands, in the specification's order.
fn commands(m: &mut Mapping, obj: &serde_json::Map<String, Value>, cx: &Context) {
    for hook in HOOKS.iter().chain([&POST_START]) {
        let Some(v) = obj.get(*hook) else { continue };
        let before = m.steps.len();
        let mut parts: Vec<(Option<String>, &Value)> = Vec::new();
        match v {
            Value::Object(o) => parts.extend(o.iter().map(|(n, c)| (Some(n.clone()), c))),
            c => parts.push((None, c)),
        }
        for (name, c) in parts {
            let key = match &name {
                Some(n) => format!("{hook}.{n}"),
                None => hook.to_string(),
            };
            let command = match c {
                Value::String(s) => vars::plain(s, cx, hook).map(Command::Shell),
                Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_string) => a
                    .iter()
                    .map(|s| vars::plain(s.as_str().unwrap_or(""), cx, hook))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Command::Exec),
                _ => {
                    m.refuse(
                        &key,
                        "expected a string, an array of strings or an object of them",
                    );
                    continue;
                }
            };
            match command {
                Ok(command) => m.steps.push(Step {
                    hook,
                    name,
                    command,
                }),
                Err(e) => m.var(&key, e),
            }
        }
        if m.steps.len() > before {
            m.take(
                hook,
                if *hook == POST_START {
                    "run by lw-sandbox create and each lw-sandbox start, as the sandbox's user in its clone (kept in the image's label, not read from the clone)"
                } else {
                    "run by the deps layer's script, and again by an incremental install"
                },
            );
        }
    }
}
