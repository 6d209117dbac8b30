//! What a named volume's PersistentVolumeClaim asks for: its size from the
//! project's limits, its StorageClass and access mode from `kube.*` keys.
//!
//! A volume labelled with a sandbox ([`SANDBOX_LABEL`]: a sandbox's
//! workspace, or its mail volume, whose name ends in `-mail`), or with a
//! pool pod (the same two, made with the pod: pool.rs), is one pod's:
//! `kube.access-mode` (default `ReadWriteOnce`), sized `sandbox.disk`
//! (`sandbox.mail-disk` for the mail volume; the defaults of
//! lw-sandbox(1) when unset or `off`).  One without (the per-root tools
//! volume, a service's) is shared by pods that may land on any node:
//! `kube.tools-access-mode` (default `ReadWriteOnce`, which pins a root's
//! sandboxes to the node that first mounted it; `ReadWriteMany` where the
//! class supports it spreads them), sized [`SHARED_SIZE`].  `ReadOnlyMany`
//! is refused there: the tools are written into the claim by a helper pod.
//! `kube.storage-class` names the class (unset: the cluster's default).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::pod;
use base::error::{Error, Result};

/// The `.loopwright/config` keys of a claim's class and access modes.
pub const STORAGE_CLASS_KEY: &str = "kube.storage-class";
pub const ACCESS_MODE_KEY: &str = "kube.access-mode";
pub const TOOLS_ACCESS_MODE_KEY: &str = "kube.tools-access-mode";

/// The label that names a volume's sandbox (crates/wall/src/lib.rs, `LABEL_SANDBOX`).
pub(super) const SANDBOX_LABEL: &str = "org.loopwright.sandbox";
/// The size a volume no sandbox owns asks for (the tools, a service's).
pub(super) const SHARED_SIZE: &str = "1Gi";
/// lw-sandbox(1)'s defaults of `sandbox.disk` and `sandbox.mail-disk`.
const DEFAULT_DISK: &str = "8g";
const DEFAULT_MAIL_DISK: &str = "64m";

const MODES: &[&str] = &[
    "ReadWriteOnce",
    "ReadWriteOncePod",
    "ReadWriteMany",
    "ReadOnlyMany",
];

/// The claims' settings, read once at connect.
#[derive(Clone, Debug, PartialEq)]
pub struct Storage {
    /// `None`: the cluster's default StorageClass.
    pub class: Option<String>,
    pub access_mode: String,
    pub tools_access_mode: String,
    /// Quantities: a workspace's and a mail volume's.
    pub work_size: String,
    pub mail_size: String,
}

impl Default for Storage {
    fn default() -> Storage {
        Storage {
            class: None,
            access_mode: "ReadWriteOnce".into(),
            tools_access_mode: "ReadWriteOnce".into(),
            work_size: quantity(8 << 30),
            mail_size: quantity(64 << 20),
        }
    }
}

impl Storage {
    /// From the project's keys (`get` returns a set, non-empty value); 78
    /// naming the key on a bad value.
    pub fn from_config(get: &dyn Fn(&str) -> Option<String>) -> Result<Storage> {
        let bad = |k: &str, v: &str, want: &str| {
            Error::config(format!(
                "'{k} = {v}' in .loopwright/config: expected {want}"
            ))
        };
        let mode = |k: &str, allowed: &[&str]| -> Result<String> {
            match get(k) {
                None => Ok("ReadWriteOnce".into()),
                Some(v) if allowed.contains(&v.as_str()) => Ok(v),
                Some(v) => Err(bad(k, &v, &format!("one of {}", allowed.join(", ")))),
            }
        };
        let size = |k: &str, default: &str| -> Result<String> {
            let v = get(k)
                .filter(|v| v != "off" || k != "sandbox.disk")
                .unwrap_or_else(|| default.to_string());
            base::config::parse_bytes(&v)
                .map(|n| quantity(n as u64))
                .ok_or_else(|| bad(k, &v, "a size above 0, such as 512m or 8g"))
        };
        let off = get("sandbox.disk").as_deref() == Some("off");
        Ok(Storage {
            class: get(STORAGE_CLASS_KEY),
            access_mode: mode(ACCESS_MODE_KEY, &MODES[..3])?,
            tools_access_mode: mode(TOOLS_ACCESS_MODE_KEY, &MODES[..3]).map_err(|e| {
                if get(TOOLS_ACCESS_MODE_KEY).as_deref() == Some("ReadOnlyMany") {
                    Error::config(format!(
                        "{}; ReadOnlyMany cannot be: the tools are written into the claim by a helper pod",
                        e.msg
                    ))
                } else {
                    e
                }
            })?,
            work_size: size("sandbox.disk", DEFAULT_DISK)?,
            mail_size: if off {
                Storage::default().mail_size
            } else {
                size("sandbox.mail-disk", DEFAULT_MAIL_DISK)?
            },
        })
    }

    /// The claim of volume `name` labelled `labels` (module documentation).
    pub fn claim(&self, name: &str, labels: &BTreeMap<String, String>) -> PersistentVolumeClaim {
        let own = labels.contains_key(SANDBOX_LABEL) || labels.contains_key(super::POOL_POD_LABEL);
        let (mode, size) = match own {
            true if name.ends_with("-mail") => (&self.access_mode, self.mail_size.clone()),
            true => (&self.access_mode, self.work_size.clone()),
            false => (&self.tools_access_mode, SHARED_SIZE.to_string()),
        };
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(pod::object_labels(labels)),
                annotations: Some(BTreeMap::from([(
                    pod::LABELS_ANNOTATION.to_string(),
                    serde_json::to_string(labels).unwrap_or_default(),
                )])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec![mode.clone()]),
                storage_class_name: self.class.clone(),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".to_string(), Quantity(size))])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }
}

/// `n` bytes as a Quantity: whole Gi or Mi when it is, else bytes.
fn quantity(n: u64) -> String {
    match n {
        n if n % (1 << 30) == 0 => format!("{}Gi", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}Mi", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}Ki", n >> 10),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storage(text: &str) -> Result<Storage> {
        let kv: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Storage::from_config(&|k| kv.get(k).cloned())
    }

    fn spec(s: &Storage, name: &str, sandbox: bool) -> (String, Option<String>, String) {
        let mut labels = BTreeMap::from([("org.loopwright.root".to_string(), "r1".to_string())]);
        if sandbox {
            labels.insert(SANDBOX_LABEL.into(), "a".into());
        }
        let c = s.claim(name, &labels);
        assert_eq!(c.metadata.name.as_deref(), Some(name));
        let spec = c.spec.unwrap();
        let modes = spec.access_modes.unwrap();
        assert_eq!(modes.len(), 1);
        let size = spec.resources.unwrap().requests.unwrap()["storage"]
            .0
            .clone();
        (size, spec.storage_class_name, modes[0].clone())
    }

    #[test]
    fn defaults_are_the_sandbox_limits_in_the_default_class() {
        let s = storage("").unwrap();
        assert_eq!(s, Storage::default());
        let rwo = "ReadWriteOnce".to_string();
        assert_eq!(
            spec(&s, "lw-sb-r1-a", true),
            ("8Gi".into(), None, rwo.clone())
        );
        assert_eq!(
            spec(&s, "lw-sb-r1-a-mail", true),
            ("64Mi".into(), None, rwo.clone())
        );
        assert_eq!(
            spec(&s, "lw-sb-r1-tools-k", false),
            ("1Gi".into(), None, rwo)
        );
    }

    #[test]
    fn sizes_class_and_modes_come_from_the_keys() {
        let s = storage(
            "sandbox.disk = 20g\nsandbox.mail-disk = 100m\nkube.storage-class = fast-csi\n\
             kube.access-mode = ReadWriteOncePod\nkube.tools-access-mode = ReadWriteMany",
        )
        .unwrap();
        let class = Some("fast-csi".to_string());
        assert_eq!(
            spec(&s, "lw-sb-r1-a", true),
            ("20Gi".into(), class.clone(), "ReadWriteOncePod".into())
        );
        assert_eq!(
            spec(&s, "lw-sb-r1-a-mail", true),
            ("100Mi".into(), class.clone(), "ReadWriteOncePod".into())
        );
        assert_eq!(
            spec(&s, "lw-sb-r1-tools-k", false),
            ("1Gi".into(), class, "ReadWriteMany".into())
        );
        // Without a quota on the host, a claim still needs a size.
        let off = storage("sandbox.disk = off").unwrap();
        assert_eq!(spec(&off, "lw-sb-r1-a", true).0, "8Gi");
        assert_eq!(spec(&off, "lw-sb-r1-a-mail", true).0, "64Mi");
        assert_eq!(quantity(1536), "1536");
        assert_eq!(quantity(3 << 10), "3Ki");
    }

    #[test]
    fn bad_values_are_78_naming_the_key() {
        for (text, key) in [
            ("kube.access-mode = rwx", "kube.access-mode"),
            ("kube.access-mode = ReadOnlyMany", "kube.access-mode"),
            ("kube.tools-access-mode = ReadOnlyMany", "helper pod"),
            ("sandbox.disk = lots", "sandbox.disk"),
            ("sandbox.mail-disk = 0", "sandbox.mail-disk"),
        ] {
            let e = storage(text).unwrap_err();
            assert_eq!(e.exit, base::error::Exit::Config, "{text}");
            assert!(e.msg.contains(key), "{text}: {}", e.msg);
        }
    }
}
