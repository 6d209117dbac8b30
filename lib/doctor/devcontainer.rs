//! The doctor's devcontainer check: which configuration the runtime came
//! from (lw init's record), whether it changed since, and which of its keys
//! loopwright ignores; a repository with a configuration its runtime was
//! not made from is told how to take it.

use base::config::Project;

use super::{Finding, Status, f};
use crate::init::devcontainer::{self, render};

pub(super) fn devcontainer(p: &Project) -> Option<Finding> {
    let found = devcontainer::find(&p.top);
    let record = std::fs::read_to_string(p.top.join(devcontainer::RECORD)).ok();
    let Some((source, sha)) = record.as_deref().and_then(render::parse_record) else {
        let runtime = p.top.join(wall::image::RUNTIME_FILE).is_file();
        return (runtime && !found.is_empty()).then(|| {
            f(
                "devcontainer",
                Status::Warn,
                format!(
                    "the repository has {} but its runtime was not made from it",
                    found.join(", ")
                ),
                Some(format!(
                    "lw init --force --devcontainer {} (lw init --dry-run first)",
                    found[0]
                )),
            )
        });
    };
    if devcontainer::digest(&p.top, &source).as_deref() != Some(sha.as_str()) {
        return Some(f(
            "devcontainer",
            Status::Warn,
            format!("the runtime came from {source}, which changed (or went) since lw init"),
            Some("lw init --force takes it again (lw init --dry-run says what it takes)".into()),
        ));
    }
    let uid = p
        .config
        .get("sandbox.uid")
        .and_then(|u| u.parse().ok())
        .unwrap_or(crate::sandbox::DEFAULT_UID);
    if let Some(given) = record.as_deref().and_then(render::recorded_uid)
        && given != uid
    {
        return Some(f(
            "devcontainer",
            Status::Warn,
            format!(
                "the runtime gave remoteUser uid {given}, but sandbox.uid is {uid}: the sandbox's user does not own what the lifecycle commands made"
            ),
            Some("lw init --force, then lw-build".into()),
        ));
    }
    let m = match devcontainer::load(&p.top, &source, &devcontainer::allowed(&p.config)) {
        Ok(m) => m,
        Err(e) => {
            return Some(f(
                "devcontainer",
                Status::Fail,
                e.to_string(),
                Some(format!("fix {source}, then lw init --force")),
            ));
        }
    };
    let ignored: Vec<&str> = m.refused.iter().map(|r| r.key.as_str()).collect();
    let detail = if ignored.is_empty() {
        format!("the runtime comes from {source}; every key taken")
    } else {
        format!(
            "the runtime comes from {source}; ignored: {} (lw init --dry-run says why)",
            ignored.join(", ")
        )
    };
    Some(f("devcontainer", Status::Ok, detail, None))
}
