//! The variables of a devcontainer.json, substituted as the specification
//! says, with one rule of loopwright's: the host's environment is not the
//! repository's to read.
//!
//! `${localEnv:NAME}` (and its alias `${env:NAME}`, with an optional
//! `:DEFAULT`) is replaced by the host's value only when NAME is allowed
//! (`devcontainer.local-env` in `.loopwright/config`, or `lw init
//! --local-env NAME`).  Anything else is refused naming the variable and
//! the key that allows it: a repository that writes
//! `${localEnv:AWS_SECRET_ACCESS_KEY}` would otherwise have lw init copy
//! the host's secret into `.loopwright/runtime/`, then into an image every
//! agent reads.  An allowed value is written into those files, so allow
//! only what may be read by whoever reads the repository.
//!
//! `${localWorkspaceFolder}` is the checkout's top on the host,
//! `${containerWorkspaceFolder}` the clone inside a sandbox (`/work/repo`),
//! and their `…Basename` forms the last part of each.
//! `${containerEnv:NAME[:DEFAULT]}` is kept as a [`Piece::ContainerEnv`]:
//! only `remoteEnv` may use it (the image's environment, expanded by the
//! engine when the layer is built).  `${devcontainerId}` and names the
//! specification does not define are left as written, as the reference
//! implementation leaves them.

/// One part of a substituted value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `${containerEnv:NAME:DEFAULT}`: the image's variable, or DEFAULT.
    ContainerEnv {
        name: String,
        default: Option<String>,
    },
}

/// What the substitution knows.
pub struct Context<'a> {
    /// The checkout's top on the host.
    pub local_folder: &'a str,
    /// Where the checkout is inside a sandbox.
    pub container_folder: &'a str,
    /// Host variables that may be read (`devcontainer.local-env`).
    pub allowed: &'a [String],
    /// The host's environment.
    pub local_env: &'a dyn Fn(&str) -> Option<String>,
}

/// Why a value was not substituted: the variable as written, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub variable: String,
    pub reason: String,
}

fn basename(p: &str) -> String {
    p.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string()
}

/// `s` with its variables substituted, in pieces.
pub fn substitute(s: &str, cx: &Context) -> Result<Vec<Piece>, Refused> {
    let mut out: Vec<Piece> = Vec::new();
    let mut text = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        text.push_str(&rest[..at]);
        let Some(len) = rest[at..].find('}') else {
            rest = &rest[at..];
            break;
        };
        let whole = &rest[at..at + len + 1];
        let inner = &whole[2..whole.len() - 1];
        rest = &rest[at + len + 1..];
        let (kind, arg) = inner.split_once(':').unwrap_or((inner, ""));
        let (name, default) = match arg.split_once(':') {
            Some((n, d)) => (n, Some(d.to_string())),
            None => (arg, None),
        };
        match kind {
            "localEnv" | "env" => {
                if !cx.allowed.iter().any(|a| a == name) {
                    return Err(Refused {
                        variable: whole.to_string(),
                        reason: format!(
                            "it reads the host's environment, whose value lw init would write into .loopwright/runtime/ and the image; allow it, if it may be public, with 'devcontainer.local-env = {name}' in .loopwright/config or 'lw init --local-env {name}'"
                        ),
                    });
                }
                let v = (cx.local_env)(name)
                    .filter(|v| !v.is_empty())
                    .or(default)
                    .unwrap_or_default();
                text.push_str(&v);
            }
            "containerEnv" => {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::ContainerEnv {
                    name: name.to_string(),
                    default,
                });
            }
            "localWorkspaceFolder" => text.push_str(cx.local_folder),
            "containerWorkspaceFolder" => text.push_str(cx.container_folder),
            "localWorkspaceFolderBasename" => text.push_str(&basename(cx.local_folder)),
            "containerWorkspaceFolderBasename" => text.push_str(&basename(cx.container_folder)),
            _ => text.push_str(whole),
        }
    }
    text.push_str(rest);
    if !text.is_empty() || out.is_empty() {
        out.push(Piece::Text(text));
    }
    Ok(out)
}

/// `s` substituted, where `${containerEnv:…}` has no meaning (`key`
/// names where, for the refusal).
pub fn plain(s: &str, cx: &Context, key: &str) -> Result<String, Refused> {
    let mut v = String::new();
    for p in substitute(s, cx)? {
        match p {
            Piece::Text(t) => v.push_str(&t),
            Piece::ContainerEnv { name, .. } => {
                return Err(Refused {
                    variable: format!("${{containerEnv:{name}}}"),
                    reason: format!(
                        "{key} is read before the container exists; only remoteEnv may name the container's environment (write $${name} in a command: the shell expands it)"
                    ),
                });
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx<'a>(allowed: &'a [String], env: &'a dyn Fn(&str) -> Option<String>) -> Context<'a> {
        Context {
            local_folder: "/home/me/src/app",
            container_folder: "/work/repo",
            allowed,
            local_env: env,
        }
    }

    #[test]
    fn host_variables_are_read_only_when_allowed() {
        let env = |n: &str| match n {
            "AWS_SECRET_ACCESS_KEY" => Some("s3cr3t".to_string()),
            "TZ" => Some("Europe/Paris".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let none: Vec<String> = vec![];
        let e = plain("${localEnv:AWS_SECRET_ACCESS_KEY}", &cx(&none, &env), "k").unwrap_err();
        assert_eq!(e.variable, "${localEnv:AWS_SECRET_ACCESS_KEY}");
        assert!(
            e.reason
                .contains("devcontainer.local-env = AWS_SECRET_ACCESS_KEY"),
            "{e:?}"
        );
        assert!(!e.reason.contains("s3cr3t"));
        // The alias is the same variable.
        assert!(plain("x${env:AWS_SECRET_ACCESS_KEY}", &cx(&none, &env), "k").is_err());
        let allowed = vec!["TZ".to_string(), "UNSET".into(), "EMPTY".into()];
        let c = cx(&allowed, &env);
        assert_eq!(
            plain("tz=${localEnv:TZ}", &c, "k").unwrap(),
            "tz=Europe/Paris"
        );
        assert_eq!(plain("${localEnv:UNSET}", &c, "k").unwrap(), "");
        assert_eq!(plain("${localEnv:UNSET:utc}", &c, "k").unwrap(), "utc");
        assert_eq!(plain("${localEnv:EMPTY:d}", &c, "k").unwrap(), "d");
        // The allowance is for one name, not for every one.
        assert!(plain("${localEnv:AWS_SECRET_ACCESS_KEY}", &c, "k").is_err());
    }

    #[test]
    fn folders_container_env_and_what_is_left_alone() {
        let env = |_: &str| None;
        let none: Vec<String> = vec![];
        let c = cx(&none, &env);
        assert_eq!(
            plain(
                "${localWorkspaceFolder}|${containerWorkspaceFolder}|${localWorkspaceFolderBasename}|${containerWorkspaceFolderBasename}",
                &c,
                "k"
            )
            .unwrap(),
            "/home/me/src/app|/work/repo|app|repo"
        );
        assert_eq!(
            plain("${devcontainerId} ${other} ${unclosed", &c, "k").unwrap(),
            "${devcontainerId} ${other} ${unclosed"
        );
        assert_eq!(
            substitute("${containerEnv:PATH}:/opt/bin", &c).unwrap(),
            vec![
                Piece::ContainerEnv {
                    name: "PATH".into(),
                    default: None
                },
                Piece::Text(":/opt/bin".into())
            ]
        );
        assert_eq!(
            substitute("a${containerEnv:X:d}", &c).unwrap(),
            vec![
                Piece::Text("a".into()),
                Piece::ContainerEnv {
                    name: "X".into(),
                    default: Some("d".into())
                }
            ]
        );
        let e = plain("${containerEnv:HOME}/x", &c, "containerEnv.A").unwrap_err();
        assert!(e.reason.contains("only remoteEnv"), "{e:?}");
        assert_eq!(
            substitute("", &c).unwrap(),
            vec![Piece::Text(String::new())]
        );
    }
}
