//! A small client of the OCI distribution API (an image registry), enough to
//! keep build layers in one repository: manifests by tag, blobs by digest.
//!
//! Why not the engine's own push and pull: the engine trusts a registry's
//! CA only from `/etc/docker/certs.d/HOST/ca.crt`, a file that changes
//! every engine on the machine, it takes credentials in a header it does not
//! check before it starts, and it does not say how many bytes it moved.
//! Talking to the registry here keeps the CA (`build.cache-ca`), the
//! credentials (the Docker CLI's configuration and helpers, see
//! [`credentials`]) and the byte counts in loopwright's hands; the engine only
//! saves and loads archives.
//!
//! The protocol is the registry's HTTP API, over TLS always: `GET /v2/`
//! settles authentication once per client (HTTP Basic, or a bearer token from
//! the realm the registry names, asked for with the same credentials), then
//! `HEAD`/`GET /v2/REPO/blobs/DIGEST`, a monolithic upload (`POST
//! .../blobs/uploads/`, then `PUT LOCATION?digest=`), and `GET`/`PUT
//! /v2/REPO/manifests/TAG`.  Every blob read is checked against its digest.
//!
//! Errors: the registry cannot be reached (refused, DNS, TLS, timeout) is 69,
//! which `lw-build` treats as "build locally"; credentials refused is 77
//! naming the registry; an answer that makes no sense is 65.

/// The Docker CLI's credential store, a module of its own (the Kubernetes
/// runner's pull secrets read it too), here under the name it always had.
pub use crate::credentials;

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use base::error::{Error, Exit, Result};
pub use credentials::Credentials;

/// Media types this client writes (OCI) and accepts (OCI and Docker v2).
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Layers go up as the engine saves them: uncompressed tar.
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Per read or write on the connection; a blob of any size may take longer
/// in total, but never this long without a byte.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Where build layers are kept: `HOST[:PORT]/REPO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheRef {
    /// `HOST[:PORT]`, the key of the Docker CLI's credentials.
    pub host: String,
    /// The repository path inside the registry.
    pub repo: String,
}

impl CacheRef {
    /// Parses `HOST[:PORT]/REPO` (a leading `https://` is allowed); 78 when
    /// it is not one.
    pub fn parse(text: &str) -> Result<CacheRef> {
        let t = text.trim().trim_start_matches("https://");
        let bad = |why: &str| {
            Error::config(format!(
                "image cache '{text}': {why}; write HOST[:PORT]/REPO, e.g. registry.example.com:5000/team/layers"
            ))
        };
        if text.trim().starts_with("http://") {
            return Err(bad("plain http is not supported (the cache is always TLS)"));
        }
        let (host, repo) = t.split_once('/').ok_or_else(|| bad("no repository"))?;
        if host.is_empty() || host.contains(['@', '?', '#', ' ']) {
            return Err(bad("no host"));
        }
        let ok_repo = !repo.is_empty()
            && repo.split('/').all(|c| {
                !c.is_empty()
                    && c.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
                    && c.as_bytes()[0].is_ascii_alphanumeric()
            });
        if !ok_repo {
            return Err(bad(
                "the repository is lower-case letters, digits, '.', '_', '-' and '/'",
            ));
        }
        Ok(CacheRef {
            host: host.to_string(),
            repo: repo.to_string(),
        })
    }
}

impl std::fmt::Display for CacheRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host, self.repo)
    }
}

/// How to reach the registry.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// A PEM file of CA certificates to trust instead of the system's.
    pub ca_file: Option<std::path::PathBuf>,
    /// Credentials; `None` looks them up in the Docker configuration.
    pub credentials: Option<Credentials>,
    /// The most one request may take in all, its answer's body read
    /// included (`None`: no bound but a read's or a write's, which a
    /// registry sending a byte a minute never crosses).
    pub request_timeout: Option<Duration>,
}

/// What a tag points at.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The manifest's own digest (`sha256:...`).
    pub digest: String,
    /// The config blob's digest.
    pub config: String,
    /// The layer blobs, in order: digest, size, media type.
    pub layers: Vec<(String, u64, String)>,
}

/// A connection to one repository of one registry.
pub struct Client {
    pub cache: CacheRef,
    agent: ureq::Agent,
    /// Given ones; otherwise looked up when the registry asks (a build whose
    /// layers are all here runs no credential helper).
    creds: Option<Credentials>,
    auth: RefCell<Option<String>>,
    /// Blob bytes read from and written to the registry so far.
    pub bytes_down: Cell<u64>,
    pub bytes_up: Cell<u64>,
}

fn unreachable(cache: &CacheRef, e: impl std::fmt::Display) -> Error {
    Error::new(
        Exit::Unavailable,
        format!("cannot reach the image cache at {}: {e}", cache.host),
    )
}

impl Client {
    /// A client of `cache`.  Nothing is sent and no credential is looked up
    /// yet; [`Client::login`] is the first request.
    pub fn new(cache: &CacheRef, opts: &Options) -> Result<Client> {
        let roots = match &opts.ca_file {
            Some(p) => read_pem(p)?,
            None => system_roots(),
        };
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(certs) = roots {
            tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_per_read(Some(IO_TIMEOUT))
            .timeout_per_write(Some(IO_TIMEOUT))
            .timeout_global(opts.request_timeout)
            .tls_config(tls.build())
            .user_agent(concat!("loopwright/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client {
            cache: cache.clone(),
            agent,
            creds: opts.credentials.clone(),
            auth: RefCell::new(None),
            bytes_down: Cell::new(0),
            bytes_up: Cell::new(0),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}/v2/{}", self.cache.host, path)
    }

    fn repo_url(&self, path: &str) -> String {
        self.url(&format!("{}/{path}", self.cache.repo))
    }

    /// Settles authentication: `push` asks for write access too.  A registry
    /// that cannot be reached is 69; credentials refused (or missing where
    /// they are needed) is 77 naming the registry.
    pub fn login(&self, push: bool) -> Result<()> {
        let resp = self.send(self.agent.get(&self.url("")).call())?;
        if resp.status() == 200 {
            return Ok(());
        }
        if resp.status() != 401 {
            return Err(self.unexpected("GET /v2/", resp));
        }
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_string();
        let creds = match &self.creds {
            Some(c) => Some(c.clone()),
            None => credentials::lookup(&self.cache.host)?,
        };
        let bearer = challenge.to_ascii_lowercase().starts_with("bearer");
        // A public repository (a feature on ghcr.io) hands a pull token to
        // anyone who asks; without credentials, ask without them.
        let anonymous = Credentials {
            user: "anonymous".into(),
            secret: String::new(),
            source: "no credentials".into(),
        };
        let creds = match creds {
            Some(c) => c,
            None if bearer && !push => anonymous.clone(),
            None => return Err(self.denied("needs credentials and none are configured")),
        };
        let creds = &creds;
        let basic = (creds.source != anonymous.source).then(|| {
            format!(
                "Basic {}",
                credentials::base64_encode(format!("{}:{}", creds.user, creds.secret).as_bytes())
            )
        });
        let header = if bearer {
            let params = challenge_params(&challenge);
            let realm = params.get("realm").cloned().unwrap_or_default();
            let scope = format!(
                "repository:{}:{}",
                self.cache.repo,
                if push { "pull,push" } else { "pull" }
            );
            let mut req = self.agent.get(&realm).query("scope", &scope);
            if let Some(b) = &basic {
                req = req.header("Authorization", b);
            }
            if let Some(s) = params.get("service") {
                req = req.query("service", s);
            }
            let mut r = self.send(req.call())?;
            if r.status() == 401 || r.status() == 403 {
                return Err(self.denied(&format!(
                    "refused the credentials of '{}' (from {})",
                    creds.user, creds.source
                )));
            }
            let v: Value = r
                .body_mut()
                .read_json()
                .map_err(|e| Error::data(format!("token from '{realm}': {e}")))?;
            let token = v
                .get("token")
                .or_else(|| v.get("access_token"))
                .and_then(Value::as_str)
                .ok_or_else(|| Error::data(format!("token answer from '{realm}' has no token")))?;
            format!("Bearer {token}")
        } else {
            basic.unwrap_or_default()
        };
        *self.auth.borrow_mut() = Some(header);
        let resp = self
            .authed(self.agent.get(&self.url("")))
            .call()
            .map_err(|e| unreachable(&self.cache, e))?;
        match resp.status().as_u16() {
            200 => Ok(()),
            401 | 403 => Err(self.denied(&format!(
                "refused the credentials of '{}' (from {})",
                creds.user, creds.source
            ))),
            _ => Err(self.unexpected("GET /v2/", resp)),
        }
    }

    fn denied(&self, why: &str) -> Error {
        Error::new(
            Exit::NoPerm,
            format!(
                "the image cache at {} {why}; run 'docker login {}' or fix the credentials in {}",
                self.cache.host,
                self.cache.host,
                credentials::config_path().map_or("the Docker configuration".into(), |p| format!(
                    "'{}'",
                    p.display()
                ))
            ),
        )
    }

    fn authed<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &*self.auth.borrow() {
            Some(h) => req.header("Authorization", h),
            None => req,
        }
    }

    fn send(
        &self,
        r: std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let resp = r.map_err(|e| unreachable(&self.cache, e))?;
        if resp.status() == 401 && self.auth.borrow().is_some() {
            return Err(self.denied("refused a request with the credentials it had accepted"));
        }
        Ok(resp)
    }

    fn unexpected(&self, what: &str, mut resp: ureq::http::Response<ureq::Body>) -> Error {
        let status = resp.status();
        let body = resp
            .body_mut()
            .with_config()
            .limit(4096)
            .read_to_string()
            .unwrap_or_default();
        let exit = if status.is_server_error() {
            Exit::Unavailable
        } else {
            Exit::DataErr
        };
        Error::new(
            exit,
            format!(
                "image cache at {}: {what}: HTTP {status}: {}",
                self.cache.host,
                body.trim()
            ),
        )
    }

    /// The manifest `tag` points at, `None` when there is no such tag.
    pub fn manifest(&self, tag: &str) -> Result<Option<Manifest>> {
        let what = format!("GET manifest '{tag}'");
        let Some((_, bytes)) = self.manifest_bytes(tag)? else {
            return Ok(None);
        };
        let digest = format!("sha256:{}", base::digest::sha256_hex(&bytes));
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::data(format!("{what}: not JSON: {e}")))?;
        let bad = || Error::data(format!("{what}: not an image manifest"));
        let config = v
            .pointer("/config/digest")
            .and_then(Value::as_str)
            .ok_or_else(bad)?
            .to_string();
        let mut layers = Vec::new();
        for l in v.get("layers").and_then(Value::as_array).ok_or_else(bad)? {
            let d = l.get("digest").and_then(Value::as_str).ok_or_else(bad)?;
            let size = l.get("size").and_then(Value::as_u64).unwrap_or(0);
            let mt = l.get("mediaType").and_then(Value::as_str).unwrap_or("");
            layers.push((d.to_string(), size, mt.to_string()));
        }
        Ok(Some(Manifest {
            digest,
            config,
            layers,
        }))
    }

    /// Points `tag` at an image manifest of `config` and `layers` (digest,
    /// size), all of them already uploaded.  Returns the manifest's digest.
    pub fn put_manifest(
        &self,
        tag: &str,
        config: (&str, u64),
        layers: &[(String, u64)],
    ) -> Result<String> {
        let body = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config.0, "size": config.1},
            "layers": layers.iter().map(|(d, s)| serde_json::json!({
                "mediaType": OCI_LAYER_TAR, "digest": d, "size": s
            })).collect::<Vec<_>>(),
        })
        .to_string();
        self.put_manifest_bytes(tag, OCI_MANIFEST, body.as_bytes())
    }

    /// Points `tag` at the manifest `bytes` as they are.
    pub fn put_manifest_bytes(&self, tag: &str, media_type: &str, bytes: &[u8]) -> Result<String> {
        let resp = self.send(
            self.authed(self.agent.put(&self.repo_url(&format!("manifests/{tag}"))))
                .header("Content-Type", media_type)
                .send(bytes),
        )?;
        if resp.status() != 201 && resp.status() != 200 {
            return Err(self.unexpected(&format!("PUT manifest '{tag}'"), resp));
        }
        Ok(format!("sha256:{}", base::digest::sha256_hex(bytes)))
    }

    /// The raw manifest `tag` points at, with its media type.
    pub fn manifest_bytes(&self, tag: &str) -> Result<Option<(String, Vec<u8>)>> {
        let mut resp = self.send(
            self.authed(self.agent.get(&self.repo_url(&format!("manifests/{tag}"))))
                .header("Accept", &format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}"))
                .call(),
        )?;
        if resp.status() == 404 {
            return Ok(None);
        }
        if resp.status() != 200 {
            return Err(self.unexpected(&format!("GET manifest '{tag}'"), resp));
        }
        let mt = resp
            .headers()
            .get("content-type")
            .and_then(|h| h.to_str().ok())
            .unwrap_or(OCI_MANIFEST)
            .to_string();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(4 << 20)
            .read_to_vec()
            .map_err(|e| unreachable(&self.cache, e))?;
        Ok(Some((mt, bytes)))
    }

    /// True when the repository holds blob `digest`.
    pub fn has_blob(&self, digest: &str) -> Result<bool> {
        let resp = self.send(
            self.authed(self.agent.head(&self.repo_url(&format!("blobs/{digest}"))))
                .call(),
        )?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(self.unexpected(&format!("HEAD blob {digest}"), resp)),
        }
    }

    /// Reads blob `digest` into `out`, checking the digest; returns its size.
    pub fn get_blob(&self, digest: &str, out: &mut dyn Write) -> Result<u64> {
        let what = format!("GET blob {digest}");
        let mut resp = self.send(
            self.authed(self.agent.get(&self.repo_url(&format!("blobs/{digest}"))))
                .call(),
        )?;
        if resp.status() != 200 {
            return Err(self.unexpected(&what, resp));
        }
        let mut reader = resp.body_mut().as_reader();
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 256 << 10];
        let mut n = 0u64;
        loop {
            let k = reader
                .read(&mut buf)
                .map_err(|e| unreachable(&self.cache, format!("{what}: {e}")))?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            out.write_all(&buf[..k])
                .map_err(|e| Error::new(Exit::IoErr, format!("{what}: cannot write: {e}")))?;
            n += k as u64;
        }
        self.bytes_down.set(self.bytes_down.get() + n);
        let got = format!("sha256:{}", base::digest::hex(&h.finalize()));
        if got != digest {
            return Err(Error::data(format!(
                "image cache at {}: blob {digest} arrived as {got} ({n} bytes); refused",
                self.cache.host
            )));
        }
        Ok(n)
    }

    /// Uploads the file `path` as blob `digest` of `size` bytes, unless the
    /// repository has it.  Returns the bytes sent (0 when it was there).
    pub fn put_blob(&self, digest: &str, size: u64, path: &Path) -> Result<u64> {
        if self.has_blob(digest)? {
            return Ok(0);
        }
        let what = format!("upload of blob {digest}");
        let resp = self.send(
            self.authed(self.agent.post(&self.repo_url("blobs/uploads/")))
                .header("Content-Length", "0")
                .send_empty(),
        )?;
        if resp.status() != 202 {
            return Err(self.unexpected(&what, resp));
        }
        let loc = resp
            .headers()
            .get("location")
            .and_then(|h| h.to_str().ok())
            .ok_or_else(|| Error::data(format!("{what}: no Location from the registry")))?;
        let mut url = if loc.starts_with('/') {
            format!("https://{}{loc}", self.cache.host)
        } else {
            loc.to_string()
        };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str("digest=");
        url.push_str(digest);
        let file = File::open(path).map_err(|e| Error::io("cannot read", path, e))?;
        let resp = self.send(
            self.authed(self.agent.put(&url))
                .header("Content-Type", "application/octet-stream")
                .header("Content-Length", &size.to_string())
                .send(ureq::SendBody::from_owned_reader(file)),
        )?;
        if resp.status() != 201 {
            return Err(self.unexpected(&what, resp));
        }
        self.bytes_up.set(self.bytes_up.get() + size);
        Ok(size)
    }
}

/// `key="value"` pairs of a `WWW-Authenticate` challenge.
fn challenge_params(h: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let rest = h.split_once(' ').map_or("", |(_, r)| r);
    let mut s = rest;
    while let Some((k, v)) = s.split_once('=') {
        let k = k.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let v = v.trim_start();
        let (val, tail) = if let Some(q) = v.strip_prefix('"') {
            match q.split_once('"') {
                Some((a, b)) => (a, b),
                None => (q, ""),
            }
        } else {
            match v.split_once(',') {
                Some((a, b)) => (a, b),
                None => (v, ""),
            }
        };
        out.insert(k, val.to_string());
        s = tail;
    }
    out
}

fn read_pem(path: &Path) -> Result<Option<Vec<ureq::tls::Certificate<'static>>>> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io_as(Exit::Config, "cannot read", path, e))?;
    let certs = pem_certs(&bytes);
    if certs.is_empty() {
        return Err(Error::config(format!(
            "'{}' holds no PEM certificate (build.cache-ca, --cache-ca)",
            path.display()
        )));
    }
    Ok(Some(certs))
}

fn pem_certs(bytes: &[u8]) -> Vec<ureq::tls::Certificate<'static>> {
    ureq::tls::parse_pem(bytes)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect()
}

/// The system's trust store (Debian's bundle and its usual siblings), or
/// `None` to keep ureq's built-in roots when there is none.
fn system_roots() -> Option<Vec<ureq::tls::Certificate<'static>>> {
    for p in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
    ] {
        if let Ok(bytes) = std::fs::read(p) {
            let certs = pem_certs(&bytes);
            if !certs.is_empty() {
                return Some(certs);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_refs_parse_and_refuse() {
        let c = CacheRef::parse("127.0.0.1:5000/team/layers").expect("valid");
        assert_eq!(c.host, "127.0.0.1:5000");
        assert_eq!(c.repo, "team/layers");
        assert_eq!(
            CacheRef::parse("https://r.example/x").expect("valid").host,
            "r.example"
        );
        for bad in ["r.example", "http://r/x", "r/Upper", "/x", "r/a//b"] {
            let e = CacheRef::parse(bad).expect_err(bad);
            assert_eq!(e.exit, Exit::Config, "{bad}");
        }
    }

    #[test]
    fn bearer_challenges_split() {
        let p = challenge_params(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#,
        );
        assert_eq!(p["realm"], "https://auth.example/token");
        assert_eq!(p["service"], "registry.example");
        assert_eq!(p["scope"], "repository:a/b:pull");
    }
}
