//! What every connection shares: the settings from the environment, the
//! meter, the bytes of request bodies held, and the log.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::answer::{Refuse, Shape};
use crate::meter::{Caps, Meter};
use crate::route::Route;

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
    /// The settings, or what is missing or bad.
    pub fn from_env() -> Result<(Config, Caps, PathBuf), String> {
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
    /// Connections open.
    pub conns: AtomicUsize,
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
    pub fn new(cfg: Config, meter: Meter) -> State {
        State {
            cfg,
            meter: Mutex::new(meter),
            conns: AtomicUsize::new(0),
            bodies: Mutex::new(0),
            quiet: Mutex::new(HashMap::new()),
        }
    }

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
        crate::log_line(&format!("{} {}", utc(SystemTime::now()), words.join(" ")));
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

    /// The first endpoint, to name a refusal made before a request is read.
    pub fn default_route(&self) -> (String, String) {
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
