//! `lw doctor`'s agent checks: per kit in use, its file, its CLI layer, its
//! key on the host and where the model proxy will send it.
//!
//! A kit is "in use" when the project configures it (`agent.KIT.*`), its
//! layer is built, or its key variable is set; the others are named in one
//! `skip` line, so a project that runs only Claude Code is not told about
//! Codex's missing key.

use super::kit::{self, Kit};
use super::{KeySource, Settings, layer};
use base::config::Project;
use engine::Images;
use wall::finding::{Finding, Status};
use wall::image::Runtime;

fn finding(status: Status, detail: String, fix: Option<String>) -> Finding {
    Finding {
        check: "agent",
        status,
        detail,
        fix,
    }
}

/// The CLI layer's tag for `kit` on the project's first layer, and whether it exists.
fn layer_of(p: &Project, engine: &dyn Images, kit: &Kit) -> Option<(String, bool)> {
    let rt = Runtime::load(&p.top).ok()?;
    let plan = rt.plan(engine).ok()?;
    let first = plan.layers.first()?.tag.clone();
    let (cli, _) = layer::plan(engine, &rt.image, kit, &first, plan.final_tag()).ok()?;
    Some((cli.tag, cli.built))
}

pub fn checks(p: &Project, engine: Option<&dyn Images>) -> Vec<Finding> {
    let kits = match kit::all(Some(&p.top)) {
        Ok(k) => k,
        Err(e) => {
            return vec![finding(
                Status::Fail,
                e.to_string(),
                Some("fix the kit file at the key named".into()),
            )];
        }
    };
    let mut out = Vec::new();
    let mut idle = Vec::new();
    for k in &kits {
        let configured = p
            .config
            .iter()
            .any(|(key, _)| key.starts_with(&format!("agent.{}.", k.name)));
        let settings = match Settings::from_project(Some(p), k) {
            Ok(s) => s,
            Err(e) => {
                out.push(finding(Status::Fail, e.to_string(), None));
                continue;
            }
        };
        let key_set = match &settings.key {
            KeySource::Env(v) => std::env::var_os(v).is_some_and(|x| !x.is_empty()),
            KeySource::File(f) => f.is_file(),
        };
        let built = engine.and_then(|e| layer_of(p, e, k));
        if !configured && !key_set && !built.as_ref().is_some_and(|b| b.1) {
            idle.push(k.name.as_str());
            continue;
        }
        kit_findings(k, &settings, built.as_ref(), key_set, &mut out);
    }
    if !out.is_empty() {
        out.push(proxy_command(&super::proxy::command()));
    }
    if !idle.is_empty() {
        out.push(finding(
            Status::Skip,
            format!("kits not set up here: {}", idle.join(", ")),
            None,
        ));
    }
    out
}

/// The model proxy's command, which `lw-sandbox create --agent` copies into
/// the proxy's image: without it the create stops with 66.
fn proxy_command(path: &std::path::Path) -> Finding {
    if path.is_file() {
        finding(
            Status::Ok,
            format!("model proxy command {}", path.display()),
            None,
        )
    } else {
        finding(
            Status::Fail,
            format!(
                "'{}' is missing: lw-sandbox create --agent stops with 66 (the model proxy's image is built from it)",
                path.display()
            ),
            Some("install lw-model-proxy beside lw-sandbox (scripts/install)".into()),
        )
    }
}

/// The layer, key and upstream findings of a kit in use.
fn kit_findings(
    k: &Kit,
    settings: &Settings,
    built: Option<&(String, bool)>,
    key_set: bool,
    out: &mut Vec<Finding>,
) {
    let name = &k.name;
    out.push(match built {
        Some((tag, true)) => finding(
            Status::Ok,
            format!("{name}: {}@{} layer {tag}", k.package, k.version),
            None,
        ),
        Some((tag, false)) => finding(
            Status::Warn,
            format!(
                "{name}: {}@{} layer {tag} is not built",
                k.package, k.version
            ),
            Some(format!(
                "lw-build --agent {name} (or the first lw-sandbox create --agent {name} builds it)"
            )),
        ),
        None => finding(
            Status::Skip,
            format!("{name}: no engine or runtime definition; layer not checked"),
            None,
        ),
    });
    out.push(if key_set {
        finding(
            Status::Ok,
            format!(
                "{name}: key in {} (the model proxy reads it; the sandbox never does)",
                settings.key_source()
            ),
            None,
        )
    } else {
        finding(
            Status::Warn,
            format!(
                "{name}: no key in {}; lw-sandbox run will refuse",
                settings.key_source()
            ),
            Some(match &settings.key {
                KeySource::Env(v) => format!("export {v}=... on the host"),
                KeySource::File(f) => format!("write the key into {}", f.display()),
            }),
        )
    });
    let tls = if settings.upstream.starts_with("http://") {
        Status::Warn
    } else {
        Status::Ok
    };
    out.push(finding(
        tls,
        format!(
            "{name}: model proxy forwards {} to {}{}",
            k.endpoint(),
            settings.upstream,
            settings
                .ca
                .as_ref()
                .map(|c| format!(" (CA {})", c.display()))
                .unwrap_or_default()
        ),
        (tls == Status::Warn)
            .then(|| "use https:// unless the gateway is on a private network".into()),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_model_proxy_command_fails_naming_the_fix() {
        let dir = std::env::temp_dir().join(format!("lw-doctor-proxy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cmd = dir.join(super::super::proxy::COMMAND);
        let missing = proxy_command(&cmd);
        assert_eq!(missing.status, Status::Fail, "{}", missing.detail);
        assert!(
            missing.detail.contains("lw-model-proxy"),
            "{}",
            missing.detail
        );
        assert!(missing.fix.as_deref().unwrap().contains("scripts/install"));
        std::fs::write(&cmd, b"").unwrap();
        assert_eq!(proxy_command(&cmd).status, Status::Ok);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
