//! The HTTP side, on hyper (HTTP/1.1) and a current-thread tokio runtime:
//! routing, the security headers every answer carries, and the event
//! stream.  Reading the root is blocking file I/O and git, so each API
//! request runs on tokio's blocking pool; the event streams only wait.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, HeaderValue, IF_NONE_MATCH};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::auth::{self, Verdict};
use super::{Cockpit, api};
use base::error::{Error, Exit, Result};

type Body = BoxBody<Bytes, Infallible>;

/// The Content-Security-Policy of every answer: nothing but this origin's
/// own script, style and requests; no inline script, no eval, no frames.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Largest request body read (an answer is at most a message body).
const MAX_REQUEST: usize = 256 * 1024;

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Largest request head read.  A page on another port of the same host
/// can plant cookies for this one (which the browser then sends with every
/// request, though they are never read here): a browser keeps at most 180
/// of 4 KiB each for a host, and this holds them all.
const MAX_HEAD: usize = 1024 * 1024;

/// Serves `listener` until SIGTERM or SIGINT, whose name it returns.  Each
/// URL a person opens goes to `urls`: the first at once (once the server can
/// take the signal), a new one on each SIGUSR1.  On a stop the port is
/// closed before anything else, so a cockpit started again on it at once
/// can bind it: a killed process holds its port until every thread has
/// ended, and the kernel can keep one closing a directory watcher for
/// seconds or longer (its marks wait for a grace period).
pub fn serve(
    listener: std::net::TcpListener,
    cockpit: Cockpit,
    urls: super::Notes,
) -> Result<&'static str> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            Error::new(Exit::Unavailable, "cannot start the I/O runtime").with_source(e)
        })?;
    let cockpit = Arc::new(cockpit);
    rt.block_on(async move {
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::new(Exit::Unavailable, "cannot listen").with_source(e))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::new(Exit::Unavailable, "cannot listen").with_source(e))?;
        use tokio::signal::unix::{SignalKind, signal};
        let take = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| {
                Error::new(Exit::Unavailable, format!("cannot take {name}")).with_source(e)
            })
        };
        let mut usr1 = take(SignalKind::user_defined1(), "SIGUSR1")?;
        let mut term = take(SignalKind::terminate(), "SIGTERM")?;
        let mut int = take(SignalKind::interrupt(), "SIGINT")?;
        urls(&cockpit.url());
        let c = cockpit.clone();
        tokio::spawn(async move {
            while usr1.recv().await.is_some() {
                urls(&c.url());
            }
        });
        loop {
            let conn = tokio::select! {
                _ = term.recv() => return Ok("SIGTERM"),
                _ = int.recv() => return Ok("SIGINT"),
                conn = listener.accept() => conn,
            };
            let Ok((conn, _)) = conn else {
                continue;
            };
            let c = cockpit.clone();
            let svc = service_fn(move |req| answer(c.clone(), req));
            tokio::spawn(async move {
                let _ = http1::Builder::new()
                    .max_buf_size(MAX_HEAD)
                    .serve_connection(TokioIo::new(conn), svc)
                    .await;
            });
        }
    })
}

fn full(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    full(status, "application/json", v.to_string())
}

/// The headers every answer carries.
fn harden(r: &mut Response<Body>) {
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

async fn answer(c: Arc<Cockpit>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let changes = req.method() != Method::GET && req.method() != Method::HEAD;
    let verdict = auth::judge(req.headers(), &c.here, &c.access, &path, changes);
    let mut r = match verdict {
        Verdict::Deny(why) => full(
            StatusCode::FORBIDDEN,
            "text/plain; charset=utf-8",
            format!("403 forbidden: {why}\n"),
        ),
        Verdict::Allow if changes => post(c, &path, req).await,
        Verdict::Allow => {
            let seen = req.headers().get(IF_NONE_MATCH).cloned();
            get(c, &path, query.as_deref(), seen).await
        }
    };
    harden(&mut r);
    Ok(r)
}

async fn get(
    c: Arc<Cockpit>,
    path: &str,
    query: Option<&str>,
    seen: Option<HeaderValue>,
) -> Response<Body> {
    match path {
        "/" => full(StatusCode::OK, "text/html; charset=utf-8", INDEX),
        "/app.js" => full(StatusCode::OK, "text/javascript; charset=utf-8", APP_JS),
        "/app.css" => full(StatusCode::OK, "text/css; charset=utf-8", APP_CSS),
        "/favicon.ico" => full(StatusCode::NO_CONTENT, "image/x-icon", Bytes::new()),
        "/api/events" => events(&c),
        _ if path.starts_with("/api/") => {
            let path = path.to_string();
            let params = api::params(query);
            let res = tokio::task::spawn_blocking(move || api::get(&c, &path, &params)).await;
            match res {
                Ok(Ok(Some(a))) => tagged(a, seen.as_ref()),
                Ok(Ok(None)) => not_found(),
                Ok(Err(e)) => error_response(&e),
                Err(_) => error_response(&Error::new(Exit::Software, "the request's task failed")),
            }
        }
        _ => not_found(),
    }
}

/// An answer with its entity tag: 304 and no body when the page already
/// holds that view (its If-None-Match names the tag).
fn tagged(a: api::Answer, seen: Option<&HeaderValue>) -> Response<Body> {
    let Some(tag) = a.tag.and_then(|t| HeaderValue::from_str(&t).ok()) else {
        return full(StatusCode::OK, a.ctype, a.body);
    };
    let same = seen.is_some_and(|s| {
        s.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().as_bytes() == tag.as_bytes()))
    });
    let mut r = if same {
        full(StatusCode::NOT_MODIFIED, a.ctype, Bytes::new())
    } else {
        full(StatusCode::OK, a.ctype, a.body)
    };
    r.headers_mut().insert(ETAG, tag);
    r
}

fn not_found() -> Response<Body> {
    full(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        "404 not found\n",
    )
}

/// An error as JSON, its status from the exit code it maps to.
fn error_response(e: &Error) -> Response<Body> {
    let status = match e.exit {
        Exit::Usage | Exit::DataErr => StatusCode::BAD_REQUEST,
        Exit::NoInput => StatusCode::NOT_FOUND,
        Exit::TempFail => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    json_response(status, &json!({ "error": format!("{e:#}") }))
}

/// The event stream of one page (see crates/cockpit/src/events.rs).
fn events(c: &Cockpit) -> Response<Body> {
    let rx = c.events.subscribe();
    // The engine's view is refreshed while a page listens: start now.
    c.live.wake();
    let hello = futures_util::stream::once(async {
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(b": hello\n\n")))
    });
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        let b = super::events::next(&mut rx).await?;
        Some((Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    use futures_util::StreamExt as _;
    let body = BodyExt::boxed(StreamBody::new(hello.chain(rest)));
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r
}

async fn post(c: Arc<Cockpit>, path: &str, req: Request<Incoming>) -> Response<Body> {
    let is_json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !is_json {
        return json_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &json!({ "error": "a change is sent as application/json" }),
        );
    }
    let Ok(body) = Limited::new(req.into_body(), MAX_REQUEST).collect().await else {
        return json_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &json!({ "error": format!("a request body holds at most {MAX_REQUEST} bytes") }),
        );
    };
    let Ok(v) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({ "error": "the body is not JSON" }),
        );
    };
    match path {
        auth::TRADE => return trade(&c, &v),
        "/api/ticket" => return json_response(StatusCode::OK, &json!({ "url": c.url() })),
        _ => {}
    }
    let path = path.to_string();
    match tokio::task::spawn_blocking(move || api::post(&c, &path, &v)).await {
        Ok(Ok(Some(v))) => json_response(StatusCode::OK, &v),
        Ok(Ok(None)) => not_found(),
        Ok(Err(e)) => error_response(&e),
        Err(_) => error_response(&Error::new(Exit::Software, "the request's task failed")),
    }
}

/// A ticket traded for a tab's secret (crates/cockpit/src/auth.rs).
fn trade(c: &Cockpit, v: &Value) -> Response<Body> {
    match v["ticket"].as_str().and_then(|t| c.access.trade(t)) {
        Some(secret) => json_response(StatusCode::OK, &json!({ "secret": secret })),
        None => json_response(
            StatusCode::FORBIDDEN,
            &json!({ "error": format!(
                "this link was used already or is older than {} minutes: each URL lw-cockpit \
                 prints opens the page once; for another, use \"new tab\" on a page already \
                 open, or send lw-cockpit SIGUSR1 (kill -USR1 {}) and it prints one",
                auth::TICKET_LIFE.as_secs() / 60,
                std::process::id()
            ) }),
        ),
    }
}
