//! A service's declaration: `.loopwright/services/NAME`, in the `key = value`
//! format of `.loopwright/config` (crates/mailbox/src/config.rs parses it), with the
//! variable's own case kept in `env.NAME` keys.  Every key is known: an
//! unknown one is exit 78 naming it and the file, since a misspelt
//! `volum = /data` would otherwise lose the data at the first `down`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base::config::{Config, Project};
use base::error::{Error, Exit, Result};
use wall::egress::AllowList;

/// Where declarations live, relative to the project's top.
pub const DIR: &str = ".loopwright/services";

/// The keys a declaration may hold (and `env.NAME`).
pub const KEYS: &[&str] = &[
    "image",
    "build",
    "from",
    "command",
    "port",
    "secret",
    "volume",
    "ready",
    "ready-timeout",
    "egress",
    "user",
    "memory",
    "pids",
    "cpus",
];

/// Where the service's image comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A local image (tag or id).
    Image(String),
    /// `build = DIR` (project-relative, holding `Dockerfile`) on `from = IMAGE`,
    /// built as one lw-build layer (crates/wall/src/image/), tagged by its inputs' hash.
    Build { dir: String, from: String },
}

/// A parsed declaration.
#[derive(Clone, Debug)]
pub struct Declaration {
    pub name: String,
    pub path: PathBuf,
    /// The declaration's text, hashed into the container's label so that an
    /// edited declaration makes `up` replace a running container.
    pub text: String,
    pub source: Source,
    /// Run by `/bin/sh -c`; None keeps the image's own command.
    pub command: Option<String>,
    /// The port the service listens on inside its network.
    pub port: Option<u16>,
    /// `port = HOST:PORT` also publishes it on 127.0.0.1:HOST.
    pub publish: Option<u16>,
    pub env: Vec<(String, String)>,
    pub secrets: Vec<String>,
    /// The data path, kept in a named volume.
    pub volume: Option<String>,
    /// A readiness command, run by `/bin/sh -c` inside the service.
    pub ready: Option<String>,
    pub ready_timeout: Duration,
    /// Its own egress allow-list; None: the service reaches nothing outside.
    pub egress: Option<AllowList>,
    pub user: Option<String>,
    pub memory: i64,
    pub pids: i64,
    pub cpus: f64,
}

/// True for a service name: 1-30 of `a-z 0-9 -`, starting with a letter
/// (it is the DNS name sandboxes use, and part of engine object names).
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 30
        && b[0].is_ascii_lowercase()
        && !name.ends_with('-')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

pub fn check_name(name: &str) -> Result<()> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "'{}' is not a valid service name (1-30 of a-z 0-9 -, starting with a letter; it is the name sandboxes reach it by)",
            name.escape_debug()
        )))
    }
}

fn key_ok(key: &str) -> bool {
    match key.strip_prefix("env.") {
        Some(var) => wall::secrets::valid_name(var),
        None => base::config::valid_key(key),
    }
}

/// The declaration file of `name` in `project`.
pub fn path(project: &Project, name: &str) -> PathBuf {
    project.top.join(DIR).join(name)
}

/// The names of every declaration in `project`, sorted.
pub fn names(project: &Project) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(project.top.join(DIR))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| valid_name(n))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Reads the declaration of `name` (66 when there is none, 78 when bad).
pub fn load(project: &Project, name: &str) -> Result<Declaration> {
    check_name(name)?;
    let p = path(project, name);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "no service '{name}': '{}' does not exist; declare it there (see lw-service(1))",
                    p.display()
                ),
            ));
        }
        Err(e) => return Err(Error::io_as(Exit::Config, "cannot read", &p, e)),
    };
    parse(name, &text, &p)
}

/// Parses a declaration; `file` names it in errors.
pub fn parse(name: &str, text: &str, file: &Path) -> Result<Declaration> {
    let c = Config::parse_keys(text, file, &key_ok)?;
    let f = file.display();
    let bad = |k: &str, v: &str, want: &str| bad(file, k, v, want);
    let mut env = Vec::new();
    for (k, v) in c.iter() {
        if let Some(var) = k.strip_prefix("env.") {
            env.push((var.to_string(), v.to_string()));
        } else if !KEYS.contains(&k) {
            return Err(Error::config(format!(
                "{f}: unknown field '{k}'; a service declaration knows {} and env.NAME",
                KEYS.join(", ")
            )));
        }
    }
    let source = source(&c, file)?;
    let (port, publish) = port(&c, file)?;
    let secrets = secrets(&c, file)?;
    let command = c.get("command").map(str::to_string);
    if !secrets.is_empty() && command.is_none() {
        return Err(Error::config(format!(
            "{f}: 'secret' needs 'command': the command starts once its secrets are in /run/secrets"
        )));
    }
    let volume = match c.get("volume") {
        Some(v) if !v.starts_with('/') || v == "/" => {
            return Err(bad(
                "volume",
                v,
                "an absolute path inside the service, e.g. /var/lib/postgresql/data",
            ));
        }
        v => v.map(str::to_string),
    };
    let ready_timeout = match c.get("ready-timeout") {
        None => Duration::from_secs(60),
        Some(v) => base::config::parse_duration(v)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| bad("ready-timeout", v, "a duration such as 30s or 2m"))?,
    };
    let egress = match c.get("egress") {
        None => None,
        Some(v) => Some(AllowList::parse(v, &format!("{f}: egress"))?),
    };
    let (memory, pids, cpus) = limits(&c, file)?;
    Ok(Declaration {
        name: name.to_string(),
        path: file.to_path_buf(),
        text: text.to_string(),
        source,
        command,
        port,
        publish,
        env,
        secrets,
        volume,
        ready: c.get("ready").map(str::to_string),
        ready_timeout,
        egress,
        user: c.get("user").map(str::to_string),
        memory,
        pids,
        cpus,
    })
}

/// `'KEY = VALUE': expected WANT`, naming the file (78).
fn bad(file: &Path, k: &str, v: &str, want: &str) -> Error {
    Error::config(format!("{}: '{k} = {v}': expected {want}", file.display()))
}

/// `image = REF`, or `build = DIR` with `from = IMAGE`.
fn source(c: &Config, file: &Path) -> Result<Source> {
    let f = file.display();
    Ok(match (c.get("image"), c.get("build")) {
        (Some(i), None) => Source::Image(i.to_string()),
        (None, Some(d)) => {
            let from = c.get("from").ok_or_else(|| {
                Error::config(format!(
                    "{f}: 'build = {d}' needs 'from = IMAGE', the image its Dockerfile's FROM ${{LW_PARENT}} names"
                ))
            })?;
            Source::Build {
                dir: d.trim_end_matches('/').to_string(),
                from: from.to_string(),
            }
        }
        (Some(_), Some(_)) => {
            return Err(Error::config(format!(
                "{f}: give either 'image' or 'build', not both"
            )));
        }
        (None, None) => {
            return Err(Error::config(format!(
                "{f}: no 'image' and no 'build': name a local image or a directory holding a Dockerfile"
            )));
        }
    })
}

/// `port = PORT` or `HOST-PORT:PORT`: (the service's port, the published one).
fn port(c: &Config, file: &Path) -> Result<(Option<u16>, Option<u16>)> {
    let bad = |k: &str, v: &str, want: &str| bad(file, k, v, want);
    Ok(match c.get("port") {
        None => (None, None),
        Some(v) => {
            let num = |s: &str| s.trim().parse::<u16>().ok().filter(|n| *n > 0);
            match v.split_once(':') {
                None => (
                    Some(num(v).ok_or_else(|| bad("port", v, "PORT or HOST-PORT:PORT"))?),
                    None,
                ),
                Some((h, p)) => match (num(h), num(p)) {
                    (Some(h), Some(p)) => (Some(p), Some(h)),
                    _ => return Err(bad("port", v, "PORT or HOST-PORT:PORT")),
                },
            }
        }
    })
}

/// `secret = NAME ...`: names of secrets, checked.
fn secrets(c: &Config, file: &Path) -> Result<Vec<String>> {
    let secrets: Vec<String> = c
        .get("secret")
        .unwrap_or("")
        .split(|ch: char| ch.is_whitespace() || ch == ',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    for s in &secrets {
        if !wall::secrets::valid_name(s) {
            return Err(bad(
                file,
                "secret",
                s,
                "secret names (letters, digits and '_')",
            ));
        }
    }
    Ok(secrets)
}

/// `memory`, `pids` and `cpus`, with their defaults.
fn limits(c: &Config, file: &Path) -> Result<(i64, i64, f64)> {
    let bad = |k: &str, v: &str, want: &str| bad(file, k, v, want);
    let memory = match c.get("memory") {
        None => 1 << 30,
        Some(v) => base::config::parse_bytes(v)
            .ok_or_else(|| bad("memory", v, "a size such as 512m or 2g"))?,
    };
    let pids = match c.get("pids") {
        None => 256,
        Some(v) => v
            .parse()
            .ok()
            .filter(|n: &i64| *n > 0)
            .ok_or_else(|| bad("pids", v, "a positive number"))?,
    };
    let cpus = match c.get("cpus") {
        None => 1.0,
        Some(v) => v
            .parse()
            .ok()
            .filter(|n: &f64| *n > 0.0 && n.is_finite())
            .ok_or_else(|| bad("cpus", v, "a positive number such as 0.5"))?,
    };
    Ok((memory, pids, cpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Declaration> {
        parse("pg", text, Path::new(".loopwright/services/pg"))
    }

    #[test]
    fn a_full_declaration_parses() {
        let d = p("build = svc/pg\nfrom = debian:bookworm\ncommand = postgres -D /data\nport = 15432:5432\n\
                   env.PGDATA = /data\nsecret = PG_PASSWORD\nvolume = /data\nready = pg_isready\n\
                   ready-timeout = 30s\negress = deb.debian.org:80\nuser = postgres\nmemory = 512m\n")
        .unwrap();
        assert_eq!(
            d.source,
            Source::Build {
                dir: "svc/pg".into(),
                from: "debian:bookworm".into()
            }
        );
        assert_eq!((d.port, d.publish), (Some(5432), Some(15432)));
        assert_eq!(d.env, [("PGDATA".to_string(), "/data".to_string())]);
        assert_eq!(d.secrets, ["PG_PASSWORD"]);
        assert_eq!(d.ready_timeout, Duration::from_secs(30));
        assert_eq!(d.memory, 512 << 20);
        assert!(d.egress.is_some());
    }

    #[test]
    fn an_unknown_field_is_78_naming_it() {
        let e = p("image = x\nvolum = /data\n").unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(e.msg.contains("unknown field 'volum'"), "{}", e.msg);
        assert!(e.msg.starts_with(".loopwright/services/pg:"), "{}", e.msg);
    }

    #[test]
    fn bad_values_are_78() {
        for text in [
            "",
            "image = a\nbuild = b\n",
            "build = b\n",
            "image = a\nport = x\n",
            "image = a\nport = 0\n",
            "image = a\nvolume = data\n",
            "image = a\nsecret = A\n",
            "image = a\nmemory = lots\n",
            "image = a\nEnv.X = 1\n",
        ] {
            assert_eq!(p(text).unwrap_err().exit, Exit::Config, "{text:?}");
        }
    }

    #[test]
    fn names_are_dns_labels() {
        assert!(valid_name("pg"));
        assert!(valid_name("api-2"));
        for bad in ["", "2pg", "Pg", "pg-", "a_b", "a.b", &"x".repeat(31)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
