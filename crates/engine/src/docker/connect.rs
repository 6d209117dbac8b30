//! The connection to the engine `DOCKER_HOST` names, read as the Docker CLI
//! reads it: `unix://PATH` (the default, `/var/run/docker.sock`), or
//! `tcp://HOST:PORT`, in plain HTTP unless `DOCKER_TLS_VERIFY` is set to
//! anything non-empty; then over TLS with the three files of
//! `DOCKER_CERT_PATH` (default `$DOCKER_CONFIG`, then `~/.docker`): `ca.pem`
//! (the CA that signed the engine's certificate, trusted beside the system's
//! roots), `cert.pem` and `key.pem` (this client's pair).  The engine's
//! certificate must name the host of `DOCKER_HOST`.
//!
//! Where the CLI goes on without a missing file (and fails later, or
//! unverified), this refuses at once: a missing or unreadable file, and a
//! handshake the certificates do not pass, are exit 69 naming the engine and
//! the file to fix.  `DOCKER_TLS` alone (TLS without verification) is refused
//! (78): loopwright always verifies.  `ssh://[USER@]HOST[:PORT][/SOCKET]`
//! goes through the system's `ssh` client (ssh.rs).

use std::path::{Path, PathBuf};

use bollard::{API_DEFAULT_VERSION, Docker};

use base::error::{Error, Exit, Result};

/// bollard's default request limit, in seconds.
const TIMEOUT_SECS: u64 = 120;

/// The certificate files of a TLS connection.
#[derive(Clone, Debug)]
pub(super) struct Tls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn non_empty(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// The directory of the certificates, as the CLI finds it.
fn cert_dir() -> Result<PathBuf> {
    if let Some(d) = non_empty("DOCKER_CERT_PATH").or_else(|| non_empty("DOCKER_CONFIG")) {
        return Ok(PathBuf::from(d));
    }
    match non_empty("HOME") {
        Some(h) => Ok(Path::new(&h).join(".docker")),
        None => Err(Error::config(
            "DOCKER_TLS_VERIFY is set but neither DOCKER_CERT_PATH nor HOME is; set DOCKER_CERT_PATH to the directory holding ca.pem, cert.pem and key.pem",
        )),
    }
}

/// Checks that `path` is a readable PEM file holding `marker`.
fn check_pem(host: &str, path: &Path, marker: &str, what: &str) -> Result<()> {
    let text = std::fs::read(path).map_err(|e| {
        Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach the Docker engine at {host} over TLS: {} ({what}): {e}; DOCKER_CERT_PATH names the directory holding ca.pem, cert.pem and key.pem",
                path.display()
            ),
        )
    })?;
    let text = String::from_utf8_lossy(&text);
    if !text.contains("-----BEGIN ") || !text.contains(marker) {
        return Err(Error::new(
            Exit::Unavailable,
            format!(
                "cannot reach the Docker engine at {host} over TLS: {} is not a PEM {what}",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// How a client reaches its engine, kept as long as the client is.
pub(super) enum Via {
    Direct,
    /// Over TLS, with these certificate files.
    Tls(Tls),
    /// Through an ssh tunnel, ended when this is dropped.
    Ssh(#[allow(dead_code, reason = "held for its Drop")] super::ssh::Tunnel),
}

impl Via {
    pub(super) fn tls(&self) -> Option<&Tls> {
        match self {
            Via::Tls(t) => Some(t),
            _ => None,
        }
    }
}

/// A client for `host`, and how it reaches it.
pub(super) fn client(host: &str) -> Result<(Docker, Via)> {
    if host.starts_with("ssh://") {
        let tunnel = super::ssh::Tunnel::open(host)?;
        let docker = Docker::connect_with_unix(
            &tunnel.socket().to_string_lossy(),
            TIMEOUT_SECS,
            API_DEFAULT_VERSION,
        )
        .map_err(|e| super::unreachable_err(host, &e))?;
        return Ok((docker, Via::Ssh(tunnel)));
    }
    let tcp = host.starts_with("tcp://");
    if tcp && non_empty("DOCKER_TLS_VERIFY").is_none() && non_empty("DOCKER_TLS").is_some() {
        return Err(Error::config(format!(
            "DOCKER_TLS without DOCKER_TLS_VERIFY would reach {host} without checking its certificate; set DOCKER_TLS_VERIFY=1 (and DOCKER_CERT_PATH)"
        )));
    }
    if tcp && non_empty("DOCKER_TLS_VERIFY").is_some() {
        let dir = cert_dir()?;
        let tls = Tls {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        };
        check_pem(host, &tls.ca, "CERTIFICATE-----", "CA certificate")?;
        check_pem(host, &tls.cert, "CERTIFICATE-----", "client certificate")?;
        check_pem(host, &tls.key, "PRIVATE KEY-----", "client key")?;
        let docker = Docker::connect_with_ssl(
            host,
            &tls.key,
            &tls.cert,
            &tls.ca,
            TIMEOUT_SECS,
            API_DEFAULT_VERSION,
        )
        .map_err(|e| {
            Error::new(
                Exit::Unavailable,
                format!(
                    "cannot reach the Docker engine at {host} over TLS: {e} (certificates in {})",
                    dir.display()
                ),
            )
        })?;
        return Ok((docker, Via::Tls(tls)));
    }
    let docker = Docker::connect_with_host(host).map_err(|e| match e {
        bollard::errors::Error::UnsupportedURISchemeError { .. } => Error::config(format!(
            "DOCKER_HOST '{host}' is not an engine address; use unix:///PATH, tcp://HOST:PORT or ssh://[USER@]HOST"
        )),
        e => super::unreachable_err(host, &e),
    })?;
    Ok((docker, Via::Direct))
}

/// The first request's failure, naming the certificate file to fix when the
/// TLS handshake is what failed.
pub(super) fn first_request_err(
    host: &str,
    tls: Option<&Tls>,
    e: &bollard::errors::Error,
) -> Error {
    let Some(tls) = tls else {
        return super::unreachable_err(host, e);
    };
    // rustls's reasons reach us wrapped in hyper's and io's errors; their
    // Debug form carries the variant names.
    let dbg = format!("{e:?}");
    let ca = tls.ca.display();
    let cert = tls.cert.display();
    let key = tls.key.display();
    let why = if dbg.contains("NotValidForName") {
        format!(
            "the engine's certificate does not name this host (checked against the CA in {ca}); make its certificate with the host's name or IP address in subjectAltName"
        )
    } else if dbg.contains("Expired") || dbg.contains("NotValidYet") {
        format!("the engine's certificate is outside its validity dates (CA {ca})")
    } else if dbg.contains("InvalidCertificate") || dbg.contains("UnknownIssuer") {
        format!(
            "the engine's certificate is not signed by the CA in {ca}; put the CA that signed the engine's certificate there"
        )
    } else if dbg.contains("AlertReceived") {
        format!(
            "the engine refused this client's certificate {cert} (key {key}); use a pair signed by a CA the engine trusts (its --tlscacert)"
        )
    } else if dbg.contains("InvalidMessage")
        || dbg.contains("CorruptMessage")
        || dbg.contains("InappropriateHandshakeMessage")
    {
        "the engine does not speak TLS at that port; check the port (TLS engines listen on 2376)"
            .to_string()
    } else {
        return super::unreachable_err(host, e);
    };
    Error::new(
        Exit::Unavailable,
        format!("cannot reach the Docker engine at {host} over TLS: {why} ({e})"),
    )
}
