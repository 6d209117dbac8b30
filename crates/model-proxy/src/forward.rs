//! One request: its route checked, its body read within the caps, the
//! agent's credentials dropped, the key added, and the answer streamed back
//! with its usage counted.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue};
use hyper::{Method, Request, Response};
use tokio::time::{Sleep, sleep, timeout};

use crate::State;
use crate::answer::Refuse;
use crate::route::without_key;
use crate::upstream;
use crate::usage::Usage;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Answer = Response<BoxBody<Bytes, BoxError>>;

const BODY_IDLE: Duration = Duration::from_secs(30);
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(600);

/// Credentials and hop-by-hop headers the agent may send: never forwarded.
const DROP: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "x-goog-api-key",
    "openai-organization",
    "openai-project",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
];

/// Hop-by-hop headers of the upstream's answer: not passed back.
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "content-length",
];

/// hyper's service: every refusal becomes the provider's error shape.
pub(crate) async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    match serve(&state, req).await {
        Ok(a) => Ok(a),
        Err(r) => {
            if !r.logged {
                state.refusal(&method, &path, &r);
            }
            Ok(refusal(&state, &r))
        }
    }
}

pub(crate) fn refusal(state: &State, r: &Refuse) -> Answer {
    let mut a = Response::new(full(r.body(state.cfg.shape)));
    *a.status_mut() =
        hyper::StatusCode::from_u16(r.status).expect("the proxy's statuses are valid");
    let h = a.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(s) = r.retry {
        h.insert("retry-after", HeaderValue::from(s));
    }
    h.insert("connection", HeaderValue::from_static("close"));
    a
}

fn full(b: Bytes) -> BoxBody<Bytes, BoxError> {
    Full::new(b).map_err(|n| match n {}).boxed()
}

async fn serve(state: &Arc<State>, req: Request<Incoming>) -> Result<Answer, Refuse> {
    let cfg = &state.cfg;
    let method = req.method().clone();
    if method == Method::CONNECT {
        let target = req.uri().to_string();
        state.log_quiet("deny", &[method.as_str(), &target, &cfg.hostport]);
        return Err(Refuse::new(501, "invalid_request_error", "CONNECT is not supported").logged());
    }
    // Only origin-form: hyper would hand an absolute URL's path on as if it
    // were ours, and its host is not the upstream.
    let uri = req.uri();
    let origin = uri.scheme().is_none() && uri.authority().is_none() && uri.path().starts_with('/');
    let path = uri.path().to_string();
    if !origin || !cfg.routes.iter().any(|r| r.matches(method.as_str(), &path)) {
        let shown = if origin { path.as_str() } else { "-" };
        state.log_quiet("deny", &[method.as_str(), shown, &cfg.hostport]);
        let list: Vec<String> = cfg
            .routes
            .iter()
            .map(|r| format!("{} {}", r.method, r.path()))
            .collect();
        let verb = if list.len() == 1 { "is" } else { "are" };
        return Err(Refuse::new(
            403,
            "permission_error",
            format!("only {} {verb} forwarded", list.join(", ")),
        )
        .logged());
    }
    let target = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let (parts, body) = req.into_parts();
    let length = match parts.headers.get(CONTENT_LENGTH) {
        Some(v) => v.to_str().ok().and_then(|v| v.parse::<u64>().ok()),
        None => None,
    };
    if length.is_some_and(|n| n > cfg.max_request) {
        return Err(state.too_large());
    }
    let body = read_body(state, body, length).await?;
    forward(state, &method, &target, &parts.headers, body).await
}

/// The request body, never more than max-request bytes, all bodies held at
/// once within the budget.
async fn read_body(
    state: &Arc<State>,
    mut body: Incoming,
    length: Option<u64>,
) -> Result<Bytes, Refuse> {
    let mut held = state.hold(length.unwrap_or(0))?;
    let mut out = Vec::with_capacity(length.unwrap_or(0) as usize);
    loop {
        let frame = match timeout(BODY_IDLE, body.frame()).await {
            Err(_) => return Err(Refuse::bad("the request body stalled for 30 s")),
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(Refuse::bad("an incomplete or malformed request body")),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if (out.len() + data.len()) as u64 > state.cfg.max_request {
            return Err(state.too_large());
        }
        if length.is_none() {
            held.more(data.len() as u64)?;
        }
        out.extend_from_slice(&data);
    }
    drop(held);
    Ok(Bytes::from(out))
}

/// Sends the request upstream with the key and streams the answer back.
async fn forward(
    state: &Arc<State>,
    method: &Method,
    target: &str,
    headers: &hyper::HeaderMap,
    body: Bytes,
) -> Result<Answer, Refuse> {
    let cfg = &state.cfg;
    let path = target.split('?').next().unwrap_or_default();
    let key = std::fs::read_to_string(&cfg.key_file).unwrap_or_default();
    let key = key.trim();
    if key.is_empty() {
        state.log(&["nokey", method.as_str(), path, &cfg.hostport]);
        return Err(Refuse::new(
            503,
            "api_error",
            "no key on the host for this sandbox (lw-sandbox run writes it)",
        )
        .logged());
    }
    state
        .meter
        .lock()
        .expect("the meter is never poisoned")
        .admit()?;
    let mut req = Request::builder()
        .method(method.clone())
        .uri(without_key(target));
    for (k, v) in headers {
        if !DROP.contains(&k.as_str()) {
            req = req.header(k, v);
        }
    }
    // The kit's header, as model-proxy.py sent it: the key itself, or
    // `Authorization: Bearer KEY` for any other name.
    let (auth_name, auth) = match cfg.key_header.as_str() {
        "x-api-key" => (HeaderName::from_static("x-api-key"), key.to_string()),
        "x-goog-api-key" => (HeaderName::from_static("x-goog-api-key"), key.to_string()),
        _ => (hyper::header::AUTHORIZATION, format!("Bearer {key}")),
    };
    let req = req
        .header("host", cfg.host_header())
        .header(CONTENT_LENGTH, body.len())
        .header("connection", "close")
        .header(auth_name, auth)
        .body(Full::new(body))
        .map_err(|_| Refuse::bad("a header that cannot be forwarded"))?;
    let fail = |what: &str| {
        state.log(&["fail", method.as_str(), path, &cfg.hostport, what]);
        Refuse::new(
            502,
            "api_error",
            format!("cannot reach {}: {what}", cfg.hostport),
        )
        .logged()
    };
    let mut sender = upstream::connect(cfg).await.map_err(|e| fail(&e))?;
    let answer = match timeout(UPSTREAM_TIMEOUT, sender.send_request(req)).await {
        Err(_) => return Err(fail("TimeoutError")),
        Ok(Err(e)) => return Err(fail(&upstream::name(&e))),
        Ok(Ok(a)) => a,
    };
    let status = answer.status();
    state.log(&[
        "forward",
        method.as_str(),
        path,
        &cfg.hostport,
        status.as_str(),
    ]);
    let (parts, incoming) = answer.into_parts();
    let sse = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("event-stream"));
    let metered = Metered {
        inner: incoming,
        usage: Usage::new(sse),
        state: state.clone(),
        idle: Box::pin(sleep(UPSTREAM_TIMEOUT)),
    };
    let mut out = Response::new(metered.boxed());
    *out.status_mut() = status;
    for (k, v) in &parts.headers {
        if !HOP.contains(&k.as_str()) {
            out.headers_mut().append(k, v.clone());
        }
    }
    Ok(out)
}

/// The upstream's answer as it streams, its usage charged as it passes.
struct Metered {
    inner: Incoming,
    usage: Usage,
    state: Arc<State>,
    idle: Pin<Box<Sleep>>,
}

impl Metered {
    fn charge(&self, n: u64) {
        if n > 0 {
            self.state
                .meter
                .lock()
                .expect("the meter is never poisoned")
                .charge(n);
        }
    }
}

impl Body for Metered {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    let n = this.usage.feed(d);
                    this.charge(n);
                }
                let at = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
                this.idle.as_mut().reset(at);
                Poll::Ready(Some(Ok(f)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                let n = this.usage.finish();
                this.charge(n);
                Poll::Ready(None)
            }
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err("the upstream went quiet".into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}
