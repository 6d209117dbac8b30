//! The HTTP side, on hyper: HTTP/1.1 with keep-alive on a current-thread
//! tokio runtime, one lock around the state, so requests are handled one at
//! a time (all a serial client needs).  A handler that asks to drop the
//! connection makes the service fail, which closes it without an answer.

use std::convert::Infallible;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use base::{Error, Exit, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

use crate::api;
use crate::state::State;
use crate::wire::Limits;
use crate::wire::{Request, Response};

/// Request bodies larger than this close the connection.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// The service's error: close the connection without answering.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

/// Serves `listener` for ever.
pub(crate) fn serve(listener: TcpListener, state: State, limits: Limits) -> Result<Infallible> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| {
            Error::new(Exit::Unavailable, "cannot start the I/O runtime").with_source(e)
        })?;
    let shared = Arc::new((Mutex::new(state), limits));
    rt.block_on(async move {
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::new(Exit::Unavailable, "cannot listen").with_source(e))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::new(Exit::Unavailable, "cannot listen").with_source(e))?;
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                continue;
            };
            let shared = shared.clone();
            let svc = service_fn(move |req| answer(shared.clone(), req));
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(conn), svc)
                    .await;
            });
        }
    })
}

async fn answer(
    shared: Arc<(Mutex<State>, Limits)>,
    req: hyper::Request<Incoming>,
) -> std::result::Result<hyper::Response<Full<Bytes>>, Dropped> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| Dropped)?
        .to_bytes();
    let req = Request {
        method: parts.method.as_str().to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        headers: parts
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect(),
        body: body.to_vec(),
    };
    let res = {
        let (state, limits) = &*shared;
        let mut st = state.lock().expect("server state lock");
        api::handle(&mut st, limits, &req)
    };
    if res.drop {
        return Err(Dropped);
    }
    Ok(to_hyper(res))
}

fn to_hyper(res: Response) -> hyper::Response<Full<Bytes>> {
    let mut out = hyper::Response::new(Full::new(Bytes::from(res.body)));
    *out.status_mut() =
        hyper::StatusCode::from_u16(res.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let h = out.headers_mut();
    if !res
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        h.insert(
            hyper::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
    }
    for (k, v) in res.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(&v),
        ) {
            h.append(k, v);
        }
    }
    out
}
