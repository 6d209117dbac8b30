//! The table against the Role it prints and against the module's own calls.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::*;

#[test]
fn the_role_grants_every_row_in_its_scope() {
    let y = role_yaml("team-a");
    let (role, cluster) = y.split_once("kind: ClusterRole\n").expect("a ClusterRole");
    assert!(role.contains("kind: Role\nmetadata:\n  name: loopwright\n  namespace: team-a\n"));
    assert!(!cluster.contains("namespace:"), "{cluster}");
    for r in RULES {
        let part = match r.scope {
            Scope::Namespace => role,
            Scope::Cluster => cluster,
        };
        let head = format!(
            "- apiGroups: [\"{}\"]\n  resources: [\"{}\"]\n  verbs: [",
            r.group, r.resource
        );
        let at = part
            .find(&head)
            .unwrap_or_else(|| panic!("{r:?} not in\n{y}"));
        let verbs = part[at + head.len()..].lines().next().unwrap();
        assert!(verbs.contains(&format!("\"{}\"", r.verb)), "{r:?}: {verbs}");
    }
    // Every rule line of the YAML is a row (nothing granted beyond the table).
    let granted = y.matches("  verbs: [").count();
    let pairs: BTreeSet<_> = RULES.iter().map(|r| (r.group, r.resource)).collect();
    assert_eq!(granted, pairs.len());
}

/// The API object of each `Api<T>` the module names: (resource, group).
fn kind(t: &str) -> (&'static str, &'static str) {
    match t {
        "Pod" => ("pods", ""),
        "ConfigMap" => ("configmaps", ""),
        "PersistentVolumeClaim" => ("persistentvolumeclaims", ""),
        "Service" => ("services", ""),
        "Secret" => ("secrets", ""),
        "Node" => ("nodes", ""),
        "Namespace" => ("namespaces", ""),
        "NetworkPolicy" => ("networkpolicies", "networking.k8s.io"),
        "RuntimeClass" => ("runtimeclasses", "node.k8s.io"),
        "SelfSubjectAccessReview" => ("selfsubjectaccessreviews", "authorization.k8s.io"),
        other => panic!("Api<{other}>: add its resource here and its verbs to RULES"),
    }
}

/// A kube-rs method as the (verb, subresource) the API server authorizes.
fn verbs(method: &str) -> &'static [(&'static str, &'static str)] {
    match method {
        "create" => &[("create", "")],
        "get" | "get_opt" | "get_metadata" => &[("get", "")],
        "list" | "list_metadata" => &[("list", "")],
        "watch" | "watch_metadata" => &[("watch", "")],
        "delete" => &[("delete", "")],
        "delete_collection" => &[("deletecollection", "")],
        "patch" | "patch_status" | "patch_metadata" => &[("patch", "")],
        "replace" | "replace_status" => &[("update", "")],
        "exec" => &[("create", "exec"), ("get", "exec")],
        "attach" => &[("create", "attach"), ("get", "attach")],
        "log_stream" | "logs" => &[("get", "log")],
        "portforward" => &[("create", "portforward"), ("get", "portforward")],
        _ => &[],
    }
}

/// The module's sources without comments and test modules.
fn sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kubernetes");
    let mut files = Vec::new();
    let mut todo = vec![dir];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs")
                && !p.to_string_lossy().ends_with("_tests.rs")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                let text = text.split("#[cfg(test)]").next().unwrap();
                let code: Vec<&str> = text
                    .lines()
                    .map(|l| l.split("//").next().unwrap())
                    .collect();
                files.push((p.display().to_string(), code.join("\n")));
            }
        }
    }
    files
}

/// The identifier that ends `s`.
fn ident_before(s: &str) -> &str {
    let start = s
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    &s[start..]
}

/// Each `NAME: Api<T>` / `NAME: &Api<T>` / `fn NAME(&self) -> Api<T>` in
/// `code`, with where it is.
fn api_names(code: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("Api<") {
        let t: String = code[at + 4..].chars().take_while(|c| *c != '>').collect();
        let before = code[..at].trim_end_matches('&').trim_end();
        let name = if let Some(b) = before.strip_suffix(':') {
            ident_before(b.trim_end()).to_string()
        } else if let Some(b) = before.strip_suffix("(&self) ->") {
            ident_before(b).to_string()
        } else {
            continue;
        };
        out.push((at, name, t));
    }
    out
}

#[test]
fn every_api_call_of_the_module_is_in_the_table() {
    let files = sources();
    // Helpers (`self.pods()`) are shared across files; variables are the
    // last declared before the call in the same file.
    let mut helpers: BTreeMap<String, String> = BTreeMap::new();
    for (_, code) in &files {
        for (_, n, t) in api_names(code) {
            helpers.insert(n, t);
        }
    }
    let table: BTreeSet<(&str, &str, &str)> = RULES
        .iter()
        .map(|r| (r.verb, r.resource, r.group))
        .collect();
    let mut used: BTreeSet<(String, String)> = BTreeSet::new();
    let mut calls = 0;
    for (path, code) in &files {
        let vars = api_names(code);
        for (dot, _) in code.match_indices('.') {
            let rest = &code[dot + 1..];
            let method: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if verbs(&method).is_empty() || !rest[method.len()..].starts_with('(') {
                continue;
            }
            let recv = code[..dot].trim_end();
            let t = if let Some(h) = recv.strip_suffix("()") {
                let name = ident_before(h);
                if !h[..h.len() - name.len()].ends_with("self.") {
                    continue;
                }
                helpers.get(name).cloned()
            } else {
                let name = ident_before(recv);
                vars.iter()
                    .rev()
                    .find(|(at, n, _)| *at < dot && n == name)
                    .map(|(_, _, t)| t.clone())
            };
            let Some(t) = t else { continue };
            let (resource, group) = kind(&t);
            calls += 1;
            let mut wanted: Vec<(&str, String)> = verbs(&method)
                .iter()
                .map(|(v, sub)| match *sub {
                    "" => (*v, resource.to_string()),
                    s => (*v, format!("{resource}/{s}")),
                })
                .collect();
            // Server-side apply makes the object when it is not there.
            let call: String = rest.chars().take(200).collect();
            if method == "patch" && call.contains("PatchParams::apply") {
                wanted.push(("create", resource.to_string()));
            }
            for (v, res) in wanted {
                assert!(
                    table.contains(&(v, res.as_str(), group)),
                    "{path}: .{method}() on Api<{t}> needs ({v}, {res}, \"{group}\"), which RULES lacks"
                );
                used.insert((v.to_string(), res));
            }
        }
    }
    assert!(
        calls >= 40,
        "found only {calls} API calls: the scan is broken"
    );
    // And no row is left that no call needs.
    for r in RULES {
        assert!(
            used.contains(&(r.verb.to_string(), r.resource.to_string())),
            "{r:?} is in RULES but no call of the module needs it"
        );
    }
}
