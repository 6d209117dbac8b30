//! lw-model-proxy: the one way an agent in a sandbox reaches its model.
//!
//! It listens on the sandbox's internal network (known there as lw-model)
//! and forwards exactly the kit's endpoints (`LW_MODEL_ENDPOINT`, e.g.
//! `POST /v1/messages`, or several separated by commas; `{model}` in a path
//! stands for one model name) to one upstream (`LW_MODEL_UPSTREAM`,
//! `https://HOST[:PORT]`) over TLS.  Every credential the agent sends is
//! dropped (headers, and a `key=` or `api_key=` query parameter); the real
//! key is read from /run/lw-agent/key (`LW_MODEL_DIR`) for each request, so
//! the key never enters the sandbox and a key rotated on the host takes
//! effect on the next request.  Anything else is answered 403.  One log
//! line per request on stderr, `TIME ACTION METHOD PATH UPSTREAM [STATUS]`
//! (crates/agent/src/proxy.rs reads them): never a header or a body; refusals at
//! most one a second of each kind, with a count.
//!
//! It is a door that distrusts the agent's bytes (issues 35 and 42): hyper
//! parses HTTP/1.1, after a gate (gate.rs) that refuses 400 what hyper
//! tolerates (a bare LF, a folded line, duplicate or conflicting framing
//! headers, a second key header).  Memory is bounded whatever the agent
//! sends: at most `LW_MODEL_MAX_CONNS` connections (256; more are answered
//! 503), a head of at most 32 KiB within 10 s, a body of at most
//! `LW_MODEL_MAX_REQUEST` bytes (413 as soon as it is known to be larger),
//! all bodies held at once within four of the largest (at least 32 MiB;
//! else 503), a body idle for 30 s ends.  One request a connection: the
//! answer says `Connection: close`, and a pipelined second request is never
//! read.  Answers stream back with backpressure.
//!
//! Caps per sandbox (meter.rs): requests a minute and tokens an hour and a
//! run (`LW_MODEL_MAX_RPM`, `_TOKENS_HOUR`, `_TOKENS_RUN`, or
//! /run/lw-agent/caps), 429 with retry-after; counts in
//! /run/lw-usage/usage.json (`LW_MODEL_USAGE`).  Errors are in the
//! provider's shape (answer.rs).  Exit status: 64 for an argument (it
//! takes none but --help and --version), 78 for a missing or bad setting,
//! 69 when it cannot listen.

mod answer;
mod forward;
mod gate;
mod io;
mod meter;
mod route;
mod state;
mod upstream;
mod usage;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use answer::Refuse;
use meter::Meter;
pub use state::{Config, State};

const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// One line of the log, on standard error (the command's, not its
/// modules': state.rs formats, this writes).
pub fn log_line(line: &str) {
    eprintln!("{line}");
}

/// Writes a refusal made before hyper has the connection, then closes.
async fn refuse_raw(state: &State, mut sock: TcpStream, r: &Refuse) {
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        sock.write_all(&r.raw(state.cfg.shape)),
    )
    .await;
    linger(sock).await;
}

/// Closes the sending side, then reads what the agent still sends for a
/// moment, so that closing does not reset the connection before the agent
/// reads the answer.
async fn linger(mut sock: TcpStream) {
    let _ = sock.shutdown().await;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while sock.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    })
    .await;
}

async fn connection(state: Arc<State>, mut sock: TcpStream) {
    if state.conns.load(Ordering::Acquire) >= state.cfg.max_conns {
        let (m, p) = state.default_route();
        let r = Refuse::new(
            503,
            "overloaded_error",
            "too many connections at once; try again",
        )
        .retry(1);
        state.refusal(&m, &p, &r);
        return refuse_raw(&state, sock, &r).await;
    }
    state.conns.fetch_add(1, Ordering::AcqRel);
    struct Open<'a>(&'a AtomicUsize);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let _open = Open(&state.conns);
    let head = match tokio::time::timeout(HEAD_TIMEOUT, gate::read(&mut sock)).await {
        Err(_) | Ok(Ok(None)) => return,
        Ok(Err(r)) => {
            let (m, p) = state.default_route();
            state.refusal(&m, &p, &r);
            return refuse_raw(&state, sock, &r).await;
        }
        Ok(Ok(Some(head))) => head,
    };
    let io = TokioIo::new(io::Prefixed::new(head, sock));
    let svc_state = state.clone();
    let svc = service_fn(move |req| forward::handle(svc_state.clone(), req));
    let conn = http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(2 * gate::HEAD_MAX)
        .serve_connection(io, svc)
        .without_shutdown();
    if let Ok(parts) = conn.await {
        linger(parts.io.into_inner().inner).await;
    }
}

async fn listen(state: Arc<State>) -> Result<(), String> {
    let port: u16 = match std::env::var("LW_MODEL_PORT") {
        Ok(p) if !p.is_empty() => p
            .parse()
            .map_err(|_| format!("LW_MODEL_PORT: '{p}' is not a port"))?,
        _ => 8080,
    };
    let addr = match std::env::var("LW_MODEL_LISTEN") {
        Ok(a) if !a.is_empty() => a,
        _ => {
            let name = std::env::var("LW_MODEL_NAME").unwrap_or_else(|_| "lw-model".into());
            let found = tokio::net::lookup_host((name.as_str(), 0))
                .await
                .map_err(|e| format!("cannot resolve '{name}': {e}"))?
                .find(|a| a.is_ipv4())
                .ok_or_else(|| format!("cannot resolve '{name}' to an IPv4 address"))?;
            found.ip().to_string()
        }
    };
    let srv = TcpListener::bind((addr.as_str(), port))
        .await
        .map_err(|e| format!("cannot listen on {addr}:{port}: {e}"))?;
    let port = srv.local_addr().map(|a| a.port()).unwrap_or(port);
    let cfg = &state.cfg;
    let routes: Vec<String> = cfg
        .routes
        .iter()
        .map(|r| format!("{} {}", r.method, r.path()))
        .collect();
    let caps = state.meter.lock().expect("never poisoned").caps();
    let off = |v: u64| {
        if v == 0 {
            "off".to_string()
        } else {
            v.to_string()
        }
    };
    state.log(&[
        &format!("lw-model-proxy: listening on {addr}:{port}, forwarding"),
        &routes.join(", "),
        "to",
        &cfg.upstream,
        "max-request",
        &cfg.max_request.to_string(),
        &format!("max-rpm {}", off(caps.rpm)),
        &format!("max-tokens-hour {}", off(caps.tokens_hour)),
        &format!("max-tokens-run {}", off(caps.tokens_run)),
    ]);
    loop {
        let Ok((sock, _)) = srv.accept().await else {
            // Out of file descriptors, most likely: let one close.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = sock.set_nodelay(true);
        tokio::spawn(connection(state.clone(), sock));
    }
}

const HELP: &str =
    "Forward an agent's model requests to its provider with the real key, within the sandbox's caps

usage: lw-model-proxy            (in the model proxy's image; lw-sandbox starts it)
       lw-model-proxy --help | --version

Settings come from the environment: LW_MODEL_UPSTREAM, LW_MODEL_ENDPOINT,
LW_MODEL_KEY_HEADER (required); LW_MODEL_KIT, LW_MODEL_DIR, LW_MODEL_USAGE,
LW_MODEL_LISTEN, LW_MODEL_NAME, LW_MODEL_PORT, LW_MODEL_MAX_REQUEST,
LW_MODEL_MAX_RPM, LW_MODEL_MAX_TOKENS_HOUR, LW_MODEL_MAX_TOKENS_RUN,
LW_MODEL_MAX_CONNS.  See lw-model-proxy(1).
";

fn main() {
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("--help" | "-h") => {
            print!("{HELP}");
            return;
        }
        Some("--version" | "-V") => {
            println!("lw-model-proxy {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Some(other) => {
            eprintln!("lw-model-proxy: unexpected argument '{other}'; it takes none (see --help)");
            std::process::exit(64);
        }
    }
    let (cfg, caps, usage) = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lw-model-proxy: {e}");
            std::process::exit(78);
        }
    };
    let meter = Meter::new(
        cfg.key_file.parent().map(PathBuf::from).unwrap_or_default(),
        usage,
        cfg.kit.clone(),
        caps,
    );
    let state = Arc::new(State::new(cfg, meter));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            eprintln!("lw-model-proxy: cannot start the runtime: {e}");
            std::process::exit(70);
        });
    if let Err(e) = rt.block_on(listen(state)) {
        eprintln!("lw-model-proxy: {e}");
        std::process::exit(69);
    }
}
