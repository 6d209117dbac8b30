use super::*;

/// A tar of `entries` (name, type, body, link target), names written raw
/// so that hostile ones (`..`, absolute) can be made.
pub(crate) fn tar_of(entries: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, body, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_size(body.len() as u64);
        h.set_mode(0o755);
        if !link.is_empty() {
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_cksum();
        b.append(&h, *body).expect("append");
    }
    b.into_inner().expect("tar")
}

const META: &[u8] = br#"{"id": "hello", "version": "1.0.0"}"#;
const FILE: tar::EntryType = tar::EntryType::Regular;

fn feature(extra: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let mut v = vec![
        ("./", tar::EntryType::Directory, &b""[..], ""),
        ("./devcontainer-feature.json", FILE, META, ""),
        ("./install.sh", FILE, b"#!/bin/sh\necho hi\n", ""),
    ];
    v.extend_from_slice(extra);
    tar_of(&v)
}

#[test]
fn identifiers_read_as_the_reference_reads_them() {
    let r = parse_ref("ghcr.io/devcontainers/features/node:1").unwrap();
    assert_eq!(
        (r.registry.as_str(), r.path.as_str(), r.version.as_str()),
        ("ghcr.io", "devcontainers/features/node", "1")
    );
    assert_eq!(r.name(), "node");
    let r = parse_ref("Localhost:5000/Team/Hello").unwrap();
    assert_eq!(
        (r.registry.as_str(), r.path.as_str(), r.version.as_str()),
        ("localhost:5000", "team/hello", "latest")
    );
    let d = format!("sha256:{}", "a".repeat(64));
    let r = parse_ref(&format!("ghcr.io/x/go@{d}")).unwrap();
    assert!(r.pinned());
    assert_eq!(r.to_string(), format!("ghcr.io/x/go@{d}"));
    for no in [
        "./local",
        "../up",
        "https://example.invalid/features/tool.tgz",
        "node",
        "ghcr.io/x/go@sha256:abc",
        "ghcr.io/x/go@md5:0123",
        "ghcr.io/x/../go:1",
        "ghcr.io/x/go:-bad",
        "ghcr.io/x/go:",
    ] {
        assert_eq!(parse_ref(no), None, "{no}");
    }
}

#[test]
fn a_feature_tar_unpacks_to_its_files() {
    let files = unpack(&feature(&[
        ("./lib/", tar::EntryType::Directory, b"", ""),
        ("./lib/a.sh", FILE, b"a", ""),
    ]))
    .unwrap();
    let names: Vec<&str> = files.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(
        names,
        ["devcontainer-feature.json", "install.sh", "lib/a.sh"]
    );
    assert_eq!(files[1].2, 0o755);
}

#[test]
fn hostile_tars_are_refused_whole() {
    for (what, extra, says) in [
        (
            "climbs",
            ("./../../etc/cron.d/x", FILE, &b"x"[..], ""),
            "outside the feature's folder",
        ),
        (
            "absolute",
            ("/etc/passwd", FILE, b"x", ""),
            "outside the feature's folder",
        ),
        (
            "symlink out",
            ("./lib", tar::EntryType::Symlink, b"", "/etc"),
            "a link",
        ),
        (
            "hard link",
            ("./x", tar::EntryType::Link, b"", "/etc/shadow"),
            "a link",
        ),
        (
            "device",
            ("./dev", tar::EntryType::Char, b"", ""),
            "special file",
        ),
    ] {
        let e = unpack(&feature(&[extra])).unwrap_err();
        assert!(e.contains(says), "{what}: {e}");
    }
    let e = unpack(&tar_of(&[("./install.sh", FILE, b"x", "")])).unwrap_err();
    assert!(e.contains("no devcontainer-feature.json"), "{e}");
    let many: Vec<String> = (0..=MAX_FILES).map(|i| format!("./f{i}")).collect();
    let entries: Vec<(&str, tar::EntryType, &[u8], &str)> = many
        .iter()
        .map(|n| (n.as_str(), FILE, &b""[..], ""))
        .collect();
    assert!(unpack(&tar_of(&entries)).unwrap_err().contains("entries"));
}

#[test]
fn a_blob_past_the_bound_is_refused_while_it_arrives() {
    let mut b = Bounded(Vec::new());
    let chunk = vec![0u8; 1 << 20];
    let mut refused = false;
    for _ in 0..=(MAX_BLOB >> 20) {
        if b.write(&chunk).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused);
    assert!(b.0.len() as u64 <= MAX_BLOB);
}

fn manifest(layer_digest: &str) -> Vec<u8> {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.devcontainers", "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer_digest, "size": 10240}],
    })
    .to_string()
    .into_bytes()
}

#[test]
fn a_manifest_must_hash_to_the_digest_asked_for() {
    let layer = format!("sha256:{}", "b".repeat(64));
    let m = manifest(&layer);
    let right = format!("sha256:{}", base::digest::sha256_hex(&m));
    let by_tag = parse_ref("ghcr.io/x/hello:1").unwrap();
    assert_eq!(
        layer_of(&m, &by_tag).unwrap(),
        (right.clone(), layer.clone(), 10240)
    );
    let pinned = parse_ref(&format!("ghcr.io/x/hello@{right}")).unwrap();
    assert!(layer_of(&m, &pinned).is_ok());
    let wrong = parse_ref(&format!("ghcr.io/x/hello@sha256:{}", "c".repeat(64))).unwrap();
    let e = layer_of(&m, &wrong).unwrap_err();
    assert!(e.contains("not the digest asked for"), "{e}");
    let e = layer_of(&manifest("sha256:short"), &by_tag).unwrap_err();
    assert!(e.contains("not a feature"), "{e}");
}
