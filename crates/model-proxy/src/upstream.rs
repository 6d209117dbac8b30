//! The connection to the upstream: plain TCP for `http://` (the tests'
//! scripted model on loopback), TLS for `https://`, checked against
//! Mozilla's authorities compiled in, or against /run/lw-agent/ca.pem alone
//! when it exists (as Python's `create_default_context(cafile=...)` did).
//! One connection a request (`Connection: close`), as before.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::{SendRequest, handshake};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::Config;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A sender of one request to the upstream; the error is a short name of
/// what failed, for the log and the 502.
pub(crate) async fn connect(cfg: &Config) -> Result<SendRequest<Full<Bytes>>, String> {
    let tcp = match timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((cfg.host.as_str(), cfg.port)),
    )
    .await
    {
        Err(_) => return Err("TimeoutError".into()),
        Ok(Err(e)) => return Err(format!("{:?}", e.kind())),
        Ok(Ok(s)) => s,
    };
    // The head and the body go in separate writes: without this, Nagle's
    // algorithm holds the body until the upstream's delayed ACK.
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Io> = if cfg.https {
        let tls = tokio_rustls::TlsConnector::from(Arc::new(client_config(cfg)?));
        let name =
            ServerName::try_from(cfg.host.clone()).map_err(|_| "InvalidDnsName".to_string())?;
        match timeout(CONNECT_TIMEOUT, tls.connect(name, tcp)).await {
            Err(_) => return Err("TimeoutError".into()),
            Ok(Err(e)) => return Err(tls_name(&e)),
            Ok(Ok(s)) => Box::new(s),
        }
    } else {
        Box::new(tcp)
    };
    let (sender, conn) = handshake(TokioIo::new(io)).await.map_err(|e| name(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn client_config(cfg: &Config) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    if cfg.ca_file.exists() {
        let certs =
            CertificateDer::pem_file_iter(&cfg.ca_file).map_err(|_| "CAFileError".to_string())?;
        for c in certs {
            let c = c.map_err(|_| "CAFileError".to_string())?;
            roots.add(c).map_err(|_| "CAFileError".to_string())?;
        }
    } else {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| "TLSConfigError".to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

fn tls_name(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(_)) => "SSLCertVerificationError".into(),
        Some(_) => "SSLError".into(),
        None => format!("{:?}", e.kind()),
    }
}

/// A short name of a hyper error.
pub(crate) fn name(e: &hyper::Error) -> String {
    if e.is_timeout() {
        "TimeoutError".into()
    } else if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        "IncompleteReadError".into()
    } else if e.is_parse() {
        "ValueError".into()
    } else {
        "ConnectionError".into()
    }
}
