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
//! (lib/agent/proxy.rs reads them): never a header or a body; refusals at
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
mod upstream;
mod usage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use answer::{Refuse, Shape};
use meter::{Caps, Meter};
use route::Route;

const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Config {
    pub upstream: String,
    pub https: bool,
    pub host: String,
    pub port: u16,
    pub hostport: String,
    pub routes: Vec<Route>,
    pub key_header: String,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
    pub shape: Shape,
    pub kit: String,
    pub max_request: u64,
    pub max_conns: usize,
    pub budget: u64,
}

impl Config {
    fn from_env() -> Result<(Config, Caps, PathBuf), String> {
        let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
        let number = |k: &str, d: u64| match std::env::var(k) {
            Ok(v) if !v.is_empty() => v
                .parse::<u64>()
                .map_err(|_| format!("{k}: '{v}' is not a number")),
            _ => Ok(d),
        };
        let upstream = var("LW_MODEL_UPSTREAM")?;
        let (scheme, rest) = upstream.split_once("://").ok_or_else(|| {
            format!("LW_MODEL_UPSTREAM: '{upstream}' is not http(s)://HOST[:PORT]")
        })?;
        let https = match scheme {
            "https" => true,
            "http" => false,
            _ => {
                return Err(format!(
                    "LW_MODEL_UPSTREAM: '{upstream}' is not http(s)://HOST[:PORT]"
                ));
            }
        };
        let hostport = rest.trim_end_matches('/').to_string();
        let (host, port) = match hostport.split_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse()
                    .map_err(|_| format!("LW_MODEL_UPSTREAM: bad port '{p}'"))?,
            ),
            None => (hostport.clone(), if https { 443 } else { 80 }),
        };
        let routes = Route::parse_all(&var("LW_MODEL_ENDPOINT")?);
        if routes.is_empty() {
            return Err("LW_MODEL_ENDPOINT names no 'METHOD PATH'".into());
        }
        let key_header = var("LW_MODEL_KEY_HEADER")?;
        let dir =
            PathBuf::from(std::env::var("LW_MODEL_DIR").unwrap_or_else(|_| "/run/lw-agent".into()));
        let usage = PathBuf::from(
            std::env::var("LW_MODEL_USAGE").unwrap_or_else(|_| "/run/lw-usage".into()),
        );
        let shape = if routes[0].path().ends_with("/responses") {
            Shape::OpenAi
        } else if key_header == "x-goog-api-key" {
            Shape::Google
        } else {
            Shape::Anthropic
        };
        let max_request = number("LW_MODEL_MAX_REQUEST", 8 << 20)?;
        let caps = Caps {
            rpm: number("LW_MODEL_MAX_RPM", 0)?,
            tokens_hour: number("LW_MODEL_MAX_TOKENS_HOUR", 0)?,
            tokens_run: number("LW_MODEL_MAX_TOKENS_RUN", 0)?,
        };
        let cfg = Config {
            upstream,
            https,
            host,
            port,
            hostport,
            routes,
            key_header,
            key_file: dir.join("key"),
            ca_file: dir.join("ca.pem"),
            shape,
            kit: std::env::var("LW_MODEL_KIT")
                .ok()
                .filter(|k| !k.is_empty())
                .unwrap_or_else(|| "KIT".into()),
            max_request,
            max_conns: number("LW_MODEL_MAX_CONNS", 256)? as usize,
            budget: (4 * max_request).max(32 << 20),
        };
        Ok((cfg, caps, usage))
    }

    /// The upstream's Host header: its port only when not the scheme's.
    pub fn host_header(&self) -> &str {
        if self.port == 80 || self.port == 443 {
            &self.host
        } else {
            &self.hostport
        }
    }
}

pub struct State {
    pub cfg: Config,
    pub meter: Mutex<Meter>,
    conns: AtomicUsize,
    bodies: Mutex<u64>,
    quiet: Mutex<HashMap<String, (Instant, u64)>>,
}

/// Bytes of request bodies held, given back when dropped.
pub struct Held<'a> {
    state: &'a State,
    n: u64,
}

impl Held<'_> {
    pub fn more(&mut self, n: u64) -> Result<(), Refuse> {
        self.state.take(n)?;
        self.n += n;
        Ok(())
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        *self.state.bodies.lock().expect("never poisoned") -= self.n;
    }
}

impl State {
    fn take(&self, n: u64) -> Result<(), Refuse> {
        let mut used = self.bodies.lock().expect("never poisoned");
        if *used + n > self.cfg.budget {
            return Err(Refuse::new(
                503,
                "overloaded_error",
                "too many request bodies at once; try again",
            )
            .retry(1));
        }
        *used += n;
        Ok(())
    }

    pub fn hold(&self, n: u64) -> Result<Held<'_>, Refuse> {
        self.take(n)?;
        Ok(Held { state: self, n })
    }

    pub fn too_large(&self) -> Refuse {
        Refuse::new(
            413,
            "request_too_large",
            format!(
                "the request is larger than agent.{}.max-request ({} bytes)",
                self.cfg.kit, self.cfg.max_request
            ),
        )
    }

    pub fn log(&self, words: &[&str]) {
        eprintln!("{} {}", utc(SystemTime::now()), words.join(" "));
    }

    /// Logs at most one line a second of each kind; says how many it left out.
    pub fn log_quiet(&self, action: &str, words: &[&str]) {
        let key = std::iter::once(action)
            .chain(words.iter().skip(3).copied())
            .collect::<Vec<_>>()
            .join(" ");
        let now = Instant::now();
        let mut quiet = self.quiet.lock().expect("never poisoned");
        let q = quiet
            .entry(key)
            .or_insert((now - Duration::from_secs(10), 0));
        if now.duration_since(q.0) < Duration::from_secs(1) {
            q.1 += 1;
            return;
        }
        let more = (q.1 > 0).then(|| format!("({} more since)", q.1));
        *q = (now, 0);
        drop(quiet);
        let mut all = vec![action];
        all.extend_from_slice(words);
        all.extend(more.as_deref());
        self.log(&all);
    }

    pub fn refusal(&self, method: &str, path: &str, r: &Refuse) {
        let status = r.status.to_string();
        self.log_quiet(
            "refuse",
            &[method, path, &self.cfg.hostport, &status, r.kind],
        );
    }

    fn default_route(&self) -> (String, String) {
        let r = &self.cfg.routes[0];
        (r.method.clone(), r.path())
    }
}

/// `2026-12-07T05:25:50Z`.
fn utc(t: SystemTime) -> String {
    let s = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (s.div_euclid(86400), s.rem_euclid(86400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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
    let state = Arc::new(State {
        cfg,
        meter: Mutex::new(meter),
        conns: AtomicUsize::new(0),
        bodies: Mutex::new(0),
        quiet: Mutex::new(HashMap::new()),
    });
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
