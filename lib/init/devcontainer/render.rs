//! The runtime lw init writes from a [`Mapping`]: `from` the configuration's
//! image, loopwright's base layer (its packages, user and entry), a layer per
//! local feature (its folder the input), a `devcontainer` layer with the
//! configuration's environment, and the deps layer whose script runs the
//! lifecycle commands in DIR.  Each layer's tag is the hash of what it
//! declares (lw-build(1)), so a changed lockfile rebuilds only the deps
//! layer and a changed feature only its layer and those after it.

use std::fmt::Write as _;

use super::features::layer_name;
use super::mapping::{Command, Mapping, Step};
use super::vars::Piece;

/// The runtime.conf's explanation, kept from the default one.
fn header() -> &'static str {
    let t = wall::image::DEFAULT_RUNTIME[0].1;
    &t[..t.find("from @FROM@").unwrap_or(0)]
}

/// runtime.conf for `m`, the base starting from `from`, the deps layer's
/// inputs `deps` (beside deps.sh).
pub fn runtime_conf(m: &Mapping, from: &str, deps: &[String]) -> String {
    let mut s = header().to_string();
    let _ = write!(
        s,
        "# Written by lw init from {}: lw init --force writes it again.\nfrom {from}\n",
        m.source
    );
    if let Some(b) = &m.build {
        s.push_str(&project_layer(b));
    }
    s.push_str("\n# OS packages, extra certificate authorities, the unprivileged user and the\n# sandbox's entry script.\nlayer base\n    dockerfile .loopwright/runtime/base.Dockerfile\n    input .loopwright/runtime/entry.sh .loopwright/runtime/ca-certificates\n");
    for f in &m.features {
        let n = layer_name(f);
        let _ = write!(
            s,
            "\n# The local feature {} ({}).\nlayer {n}\n    dockerfile .loopwright/runtime/{n}.Dockerfile\n    input {}\n",
            f.id, f.dir, f.dir
        );
    }
    s.push_str("\n# The configuration's containerEnv and remoteEnv.\nlayer devcontainer\n    dockerfile .loopwright/runtime/devcontainer.Dockerfile\n");
    s.push_str("\n# The lifecycle commands (deps.sh), with the files they read: the lockfiles\n# found and lw init --input; a command that reads another file must have it\n# declared here.\nlayer deps\n    dockerfile .loopwright/runtime/deps.Dockerfile\n    input .loopwright/runtime/deps.sh\n");
    for d in deps {
        let _ = writeln!(s, "    input {d}");
    }
    s
}

/// The `project` layer: the configuration's own Dockerfile, its context,
/// arguments and target, the files it COPYs as inputs.
fn project_layer(b: &super::mapping::Build) -> String {
    let mut s = format!(
        "\n# The configuration's own Dockerfile ('build'), built with its context; each\n# image its FROM lines name must be in the engine (lw-build asks no\n# registry).  Its inputs are the files its COPY and ADD lines read.\nlayer project\n    dockerfile {}\n    context {}\n",
        b.dockerfile,
        if b.context.is_empty() {
            "."
        } else {
            &b.context
        }
    );
    for (k, v) in &b.args {
        let _ = writeln!(s, "    arg {k}={v}");
    }
    if let Some(t) = &b.target {
        let _ = writeln!(s, "    target {t}");
    }
    for i in &b.inputs {
        let _ = writeln!(s, "    input {i}");
    }
    s
}

/// remoteUser (else containerUser) when it is not root: the user the
/// lifecycle commands run as.
fn remote_user(m: &Mapping) -> Option<&str> {
    m.user.as_deref().filter(|u| !matches!(*u, "root" | "0"))
}

/// The uid the image gives remoteUser: the sandbox's.
pub fn sandbox_uid(m: &Mapping) -> u32 {
    m.uid.unwrap_or(crate::sandbox::DEFAULT_UID)
}

/// The deps layer's Dockerfile: the lifecycle commands run as
/// `remoteUser` (else `containerUser`), as the specification runs them;
/// the devcontainer layer made that user the sandbox's uid, so what they
/// make belongs to the sandbox's user.  None named, or root: root, the
/// image's own user, as the reference implementation runs them.
pub fn deps_dockerfile(m: &Mapping) -> String {
    let (user, who) = match remote_user(m) {
        Some(u) => (
            format!("{0}:{0}", sandbox_uid(m)),
            format!("as remoteUser '{u}', uid {}: the sandbox's", sandbox_uid(m)),
        ),
        None => (
            "root".to_string(),
            "as root, the user the\n# configuration names (or the image's, none named)".to_string(),
        ),
    };
    format!(
        "# Deps layer (written by lw init from {}): the lifecycle\n# commands, run by deps.sh {who}, over this layer's declared inputs.\nARG LW_PARENT\nFROM ${{LW_PARENT}}\nRUN mkdir -p /opt/loopwright/deps && chown {user} /opt/loopwright/deps\nCOPY --chown={user} . /opt/loopwright/deps/\nUSER {user}\nRUN sh /opt/loopwright/deps/.loopwright/runtime/deps.sh /opt/loopwright/deps\nUSER root\n",
        m.source
    )
}

/// The RUN that makes remoteUser the sandbox's user: the image's account
/// of that name (made when the image has none) given the sandbox's uid and
/// gid, and what belonged to its old ids given to the new ones, as the
/// reference's `updateRemoteUserUID` gives it the host user's.  The
/// sandbox runs as that uid, so what the features and the lifecycle
/// commands made in its home and in /opt/loopwright/deps is its own.
fn adopt_user(u: &str, id: u32) -> String {
    format!(
        "RUN set -eu; u={u}; id={id}; \\\n    for t in useradd usermod groupadd groupmod getent find; do command -v $t >/dev/null || {{ echo \"lw: remoteUser '$u' becomes uid $id, which needs $t in the image\" >&2; exit 1; }}; done; \\\n    if ! getent passwd \"$u\" >/dev/null; then \\\n        getent group \"$id\" >/dev/null || groupadd -o -g \"$id\" \"$u\"; \\\n        useradd -m -o -u \"$id\" -g \"$id\" -s /bin/sh \"$u\"; \\\n    else \\\n        n=$(getent passwd \"$u\" | cut -d: -f1); ou=$(id -u \"$n\"); og=$(id -g \"$n\"); \\\n        if [ \"$ou\" != \"$id\" ]; then usermod -o -u \"$id\" \"$n\"; find / -xdev -user \"$ou\" -exec chown -h \"$id\" {{}} +; fi; \\\n        if [ \"$og\" != \"$id\" ]; then \\\n            if getent group \"$id\" >/dev/null; then usermod -g \"$id\" \"$n\"; \\\n            else groupmod -o -g \"$id\" \"$(getent group \"$og\" | cut -d: -f1)\"; find / -xdev -group \"$og\" -exec chgrp -h \"$id\" {{}} +; fi; \\\n        fi; \\\n    fi\n",
        u = quote(u)
    )
}

/// A Dockerfile ENV value: quoted, the engine's `$` kept literal except
/// for `${containerEnv:…}`, which is the image's variable.
fn env_value(pieces: &[Piece]) -> String {
    let esc = |t: &str| {
        t.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('$', "\\$")
    };
    let mut v = String::from("\"");
    for p in pieces {
        match p {
            Piece::Text(t) => v.push_str(&esc(t)),
            Piece::ContainerEnv {
                name,
                default: None,
            } => {
                let _ = write!(v, "${{{name}}}");
            }
            Piece::ContainerEnv {
                name,
                default: Some(d),
            } => {
                let _ = write!(v, "${{{name}:-{}}}", esc(d).replace('}', ""));
            }
        }
    }
    v.push('"');
    v
}

/// The `devcontainer` layer's Dockerfile: containerEnv, then remoteEnv
/// (which may name containerEnv's variables, and the image's).
pub fn devcontainer_dockerfile(m: &Mapping) -> String {
    let mut s = format!(
        "# The environment of {} (written by lw init).\nARG LW_PARENT\nFROM ${{LW_PARENT}}\n",
        m.source
    );
    if let Some(u) = remote_user(m) {
        let _ = write!(
            s,
            "# remoteUser '{u}' is the sandbox's user, uid {} (sandbox.uid).\n{}",
            sandbox_uid(m),
            adopt_user(u, sandbox_uid(m))
        );
    }
    if let Some(script) = post_start_script(m) {
        // A JSON string, so its lines fit one label; kept whole by the
        // Dockerfile's quoting (env_value).
        let json = serde_json::Value::String(script).to_string();
        let _ = writeln!(
            s,
            "LABEL {}={}",
            wall::image::LABEL_POST_START,
            env_value(&[Piece::Text(json)])
        );
    }
    for remote in [false, true] {
        let vars: Vec<String> = m
            .env
            .iter()
            .filter(|e| e.remote == remote)
            .map(|e| format!("{}={}", e.name, env_value(&e.value)))
            .collect();
        if !vars.is_empty() {
            let _ = writeln!(s, "ENV {}", vars.join(" \\\n    "));
        }
    }
    s
}

/// `s` as one word of sh.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The label a registry feature's layer carries: the feature and its
/// manifest's digest.
pub const LABEL_FEATURE: &str = "org.loopwright.feature";

/// A feature's layer: its folder copied in, install.sh run as root with
/// its options in the environment, as the specification runs it.
pub fn feature_dockerfile(m: &Mapping, f: &super::mapping::Feature) -> String {
    let user = m.user.as_deref().unwrap_or("root");
    let at = format!("/opt/loopwright/features/{}", layer_name(f));
    let mut s = match f.remote.as_ref().map(|r| (r, r.digest.as_deref())) {
        // The manifest's digest in the Dockerfile, so the layer's tag
        // hashes it: a moved tag is another layer.
        Some((r, Some(d))) => format!(
            "# The feature {} from {} (fetched and written by lw init from {}).\nARG LW_PARENT\nFROM ${{LW_PARENT}}\nLABEL {}={}\nCOPY {}/ {at}/\n",
            f.id,
            r.reference.registry,
            m.source,
            LABEL_FEATURE,
            env_value(&[Piece::Text(format!("{}@{d}", r.reference.resource()))]),
            f.dir
        ),
        _ => format!(
            "# The local feature {} (written by lw init from {}).\nARG LW_PARENT\nFROM ${{LW_PARENT}}\nCOPY {}/ {at}/\n",
            f.id, m.source, f.dir
        ),
    };
    if !f.env.is_empty() {
        let vars: Vec<String> = f
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", env_value(&[Piece::Text(v.clone())])))
            .collect();
        let _ = writeln!(s, "ENV {}", vars.join(" \\\n    "));
    }
    let mut run = format!("cd {at} && chmod +x install.sh && env");
    for (k, v) in &f.options {
        let _ = write!(run, " {k}={}", quote(v));
    }
    let _ = write!(
        run,
        " _REMOTE_USER={u} _CONTAINER_USER={u} _REMOTE_USER_HOME=\"$(getent passwd {u} | cut -d: -f6)\" _CONTAINER_USER_HOME=\"$(getent passwd {u} | cut -d: -f6)\" ./install.sh",
        u = quote(user)
    );
    let _ = writeln!(s, "RUN {run}");
    s
}

/// deps.sh: the lifecycle commands, in the specification's order, in DIR.
/// An object's commands run in parallel, as the specification runs them;
/// their output is shown whole, one command after another, once all ended.
/// A failure names the hook, the command and its status.
pub fn deps_script(m: &Mapping) -> String {
    let mut s = format!(
        "#!/bin/sh\n# deps.sh DIR: the lifecycle commands of {} (onCreateCommand,\n# updateContentCommand, postCreateCommand, in that order; an object's\n# commands in parallel), written by lw init.  They run in DIR: the deps\n# layer's inputs in the image (/opt/loopwright/deps), as remoteUser\n# (deps.Dockerfile); the sandbox's clone (/work/repo), as the sandbox's\n# user, when an incremental install runs them again.  They read only the files declared\n# as the deps layer's inputs (runtime.conf).\nset -eu\ncd \"$1\"\nlw_fail() {{ echo \"deps.sh: $1 failed (exit $2)\" >&2; exit \"$2\"; }}\n",
        m.source
    );
    if !m.steps.iter().any(|st| super::HOOKS.contains(&st.hook)) {
        s.push_str("echo \"deps.sh: the configuration has no lifecycle command\"\n");
    }
    for hook in super::HOOKS {
        hook_block(&mut s, m, hook, "deps.sh: ", hook);
    }
    s
}

/// The commands of `hook`: one run, or an object's in parallel; a failure
/// names `failing` (the hook, or the hook and its command).
fn hook_block(s: &mut String, m: &Mapping, hook: &str, prefix: &str, failing: &str) {
    let steps: Vec<&Step> = m.steps.iter().filter(|st| st.hook == hook).collect();
    match steps.as_slice() {
        [] => {}
        [one] if one.name.is_none() => {
            let _ = writeln!(s, "echo {} >&2", quote(&format!("{prefix}{hook}")));
            let _ = writeln!(
                s,
                "{} || lw_fail {} $?",
                command_line(&one.command),
                quote(failing)
            );
        }
        many => parallel(s, hook, prefix, many),
    }
}

/// The postStartCommand as the sh script lw-sandbox runs at create and at
/// each start (in /work/repo, as the sandbox's user), or None.  A failure
/// names the command and its status, on the last line.
pub fn post_start_script(m: &Mapping) -> Option<String> {
    use super::mapping::POST_START;
    let steps: Vec<&Step> = m.steps.iter().filter(|st| st.hook == POST_START).collect();
    let failing = match steps.as_slice() {
        [] => return None,
        [one] => format!(
            "{POST_START} {}",
            quote(&match &one.command {
                Command::Shell(c) => c.clone(),
                Command::Exec(a) => a.join(" "),
            })
        ),
        _ => POST_START.to_string(),
    };
    let mut s = format!(
        "# The postStartCommand of {} (lw init).\nset -eu\nlw_fail() {{ echo \"$1 failed (exit $2)\" >&2; exit \"$2\"; }}\n",
        m.source
    );
    hook_block(&mut s, m, POST_START, "", &failing);
    Some(s)
}

fn command_line(c: &Command) -> String {
    match c {
        Command::Shell(c) => format!("/bin/sh -c {}", quote(c)),
        Command::Exec(a) => a.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" "),
    }
}

/// An object's commands: each started in the background with its output
/// kept, all waited for, the outputs shown, the failures named together.
fn parallel(s: &mut String, hook: &str, prefix: &str, steps: &[&Step]) {
    let names: Vec<&str> = steps.iter().filter_map(|st| st.name.as_deref()).collect();
    let _ = writeln!(
        s,
        "echo {} >&2",
        quote(&format!(
            "{prefix}{hook} ({}: in parallel)",
            names.join(", ")
        ))
    );
    s.push_str("lw_out=$(mktemp -d)\nlw_failed=\n");
    for (i, st) in steps.iter().enumerate() {
        let _ = writeln!(
            s,
            "{} >\"$lw_out/{i}\" 2>&1 </dev/null & lw_p{i}=$!",
            command_line(&st.command)
        );
    }
    for (i, st) in steps.iter().enumerate() {
        let what = format!("{hook} ({})", st.name.as_deref().unwrap_or(""));
        let _ = writeln!(
            s,
            "wait \"$lw_p{i}\" || lw_failed=\"$lw_failed, \"{}\" (exit $?)\"\necho {} >&2; cat \"$lw_out/{i}\" >&2",
            quote(&what),
            quote(&format!("{prefix}{what}:"))
        );
    }
    let _ = writeln!(
        s,
        "rm -rf \"$lw_out\"\n[ -z \"$lw_failed\" ] || {{ echo \"{prefix}failed: ${{lw_failed#, }}\" >&2; exit 1; }}"
    );
}

/// Every file of the runtime for `m`: `(path, text, mode)`, paths relative
/// to the checkout's top.  The default runtime's base layer, entry script
/// and deps Dockerfile are kept; its toolchain layer is not (the
/// configuration's image and features are the toolchain).
pub fn files(
    m: &Mapping,
    from: &str,
    deps: &[String],
    digest: &str,
) -> Vec<(String, Vec<u8>, u32)> {
    let dir = wall::image::RUNTIME_DIR;
    let mut v = Vec::new();
    for (name, text, mode) in wall::image::DEFAULT_RUNTIME {
        let text = match *name {
            "runtime.conf" => runtime_conf(m, from, deps),
            // The configuration's image or Dockerfile may end as another
            // user (a devcontainer image's is often vscode or node), which
            // lw init cannot see without asking an engine: the base layer
            // installs packages as root whatever it is.
            "base.Dockerfile" => {
                text.replacen("FROM ${LW_PARENT}\n", "FROM ${LW_PARENT}\nUSER root\n", 1)
            }
            "deps.sh" => deps_script(m),
            "deps.Dockerfile" => deps_dockerfile(m),
            "toolchain.Dockerfile" | "mise.toml" => continue,
            _ => text.to_string(),
        };
        v.push((format!("{dir}/{name}"), text.into_bytes(), *mode));
    }
    for f in &m.features {
        v.push((
            format!("{dir}/{}.Dockerfile", layer_name(f)),
            feature_dockerfile(m, f).into_bytes(),
            0o644,
        ));
    }
    for f in m
        .features
        .iter()
        .filter_map(|f| Some((f, f.remote.as_ref()?)))
    {
        for (p, bytes, mode) in &f.1.files {
            v.push((format!("{}/{p}", f.0.dir), bytes.clone(), *mode));
        }
    }
    v.push((
        format!("{dir}/devcontainer.Dockerfile"),
        devcontainer_dockerfile(m).into_bytes(),
        0o644,
    ));
    v.push((
        super::RECORD.to_string(),
        record(m, digest).into_bytes(),
        0o644,
    ));
    v
}

/// The lines lw init adds to the config it writes.
pub fn config_lines(m: &Mapping, allowed: &[String]) -> String {
    let mut s = format!(
        "\n# The runtime comes from {} (lw init; lw doctor says what it ignored).\n",
        m.source
    );
    if !allowed.is_empty() {
        let _ = writeln!(
            s,
            "# The host variables it may read, whose values lw init writes into the runtime:\n{} = {}",
            super::KEY_LOCAL_ENV,
            allowed.join(", ")
        );
    }
    if let Some(uid) = m.uid {
        let _ = writeln!(
            s,
            "# The sandbox's user id, which the image gives remoteUser:\nsandbox.uid = {uid}"
        );
    }
    if let Some(ca) = &m.feature_ca {
        let _ = writeln!(
            s,
            "# The certificate authorities lw init trusts for feature registries:\n{} = {ca}",
            super::KEY_FEATURE_CA
        );
    }
    if let Some(t) = &m.fetch_timeout {
        let _ = writeln!(
            s,
            "# The most one request to a feature registry may take:\n{} = {t}",
            super::KEY_FETCH_TIMEOUT
        );
    }
    if !m.ports.is_empty() {
        let labels: Vec<String> = m
            .ports
            .iter()
            .map(|p| match &p.label {
                Some(l) => format!("{} ({l})", p.port),
                None => p.port.to_string(),
            })
            .collect();
        let ports: Vec<String> = m.ports.iter().map(|p| p.port.to_string()).collect();
        let _ = writeln!(
            s,
            "# Its forwarded ports ({}): every sandbox created with --network bridge\n# publishes them on 127.0.0.1, at host ports leased from sandbox.ports.\nsandbox.forward-ports = {}",
            labels.join(", "),
            ports.join(", ")
        );
    }
    s
}

/// The record lw doctor reads: the configuration, its digest, what was
/// taken and refused.
pub fn record(m: &Mapping, digest: &str) -> String {
    let mut s = format!(
        "# What lw init took from a devcontainer configuration (lw doctor reads it).\nsource {}\nsha256 {digest}\n",
        m.source
    );
    if remote_user(m).is_some() {
        let _ = writeln!(s, "uid {}", sandbox_uid(m));
    }
    for f in &m.features {
        if let Some(d) = f.remote.as_ref().and_then(|r| r.digest.as_ref()) {
            let _ = writeln!(s, "feature {} {d}", f.id);
        }
    }
    for t in &m.taken {
        let _ = writeln!(s, "took {}: {}", t.key, t.how);
    }
    for r in &m.refused {
        let _ = writeln!(s, "refused {}: {}", r.key, r.reason);
    }
    s
}

/// The registry features a record names: `(identifier, manifest digest)`.
pub fn recorded_features(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("feature "))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(id, d)| (id.to_string(), d.to_string()))
        .collect()
}

/// The uid a record says remoteUser was given, if any.
pub fn recorded_uid(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("uid "))
        .and_then(|u| u.trim().parse().ok())
}

/// `(source, sha256)` from a record's text.
pub fn parse_record(text: &str) -> Option<(String, String)> {
    let mut source = None;
    let mut sha = None;
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("source ") {
            source = Some(v.to_string());
        } else if let Some(v) = l.strip_prefix("sha256 ") {
            sha = Some(v.to_string());
        }
    }
    Some((source?, sha?))
}
