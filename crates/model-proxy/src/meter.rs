//! Requests a minute and tokens an hour and a run, kept across restarts in
//! `usage.json` (read by lw-sandbox ls and run through crates/agent/src/proxy.rs).
//!
//! An episode of a cap starts with a refusal after a forward, unless the
//! same cap refused within its window (a minute for max-rpm, an hour for
//! max-tokens-hour, the same run for max-tokens-run): under steady traffic
//! a request slips through each time the window frees one, and that is not
//! news.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::answer::Refuse;

/// The caps, 0 meaning none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caps {
    pub rpm: u64,
    pub tokens_hour: u64,
    pub tokens_run: u64,
}

pub struct Meter {
    usage_dir: PathBuf,
    caps_file: PathBuf,
    run_file: PathBuf,
    kit: String,
    env_caps: Caps,
    /// Times of forwards in the last minute.
    starts: VecDeque<Instant>,
    /// Minute (unix time / 60) to tokens.
    minutes: BTreeMap<i64, u64>,
    run: String,
    run_tokens: u64,
    total: u64,
    forwarded: u64,
    refused: u64,
    capped: bool,
    episodes: Vec<Value>,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn int(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_f64().map(|f| f as u64))
        .unwrap_or(0)
}

impl Meter {
    pub fn new(key_dir: PathBuf, usage_dir: PathBuf, kit: String, env_caps: Caps) -> Meter {
        let mut m = Meter {
            usage_dir,
            caps_file: key_dir.join("caps"),
            run_file: key_dir.join("run"),
            kit,
            env_caps,
            starts: VecDeque::new(),
            minutes: BTreeMap::new(),
            run: String::new(),
            run_tokens: 0,
            total: 0,
            forwarded: 0,
            refused: 0,
            capped: false,
            episodes: Vec::new(),
        };
        m.load();
        m
    }

    fn load(&mut self) {
        let Ok(text) = std::fs::read(self.usage_dir.join("usage.json")) else {
            return;
        };
        let Ok(u) = serde_json::from_slice::<Value>(&text) else {
            return;
        };
        if let Some(ms) = u["minutes"].as_array() {
            self.minutes = ms
                .iter()
                .filter_map(|p| Some((p[0].as_i64()?, int(&p[1]))))
                .collect();
        }
        self.run = u["run"].as_str().unwrap_or_default().to_string();
        self.run_tokens = int(&u["tokens_run"]);
        self.total = int(&u["tokens_total"]);
        self.forwarded = int(&u["forwarded"]);
        self.refused = int(&u["refused"]);
        if let Some(caps) = u["caps"].as_array() {
            self.episodes = caps[caps.len().saturating_sub(20)..].to_vec();
        }
    }

    fn save(&mut self) {
        let now = now() as i64;
        self.minutes.retain(|m, _| *m > now / 60 - 60);
        let keep = self.episodes.len().saturating_sub(20);
        self.episodes.drain(..keep);
        let doc = json!({"version": 1, "updated": now, "run": self.run,
            "tokens_run": self.run_tokens, "tokens_hour": self.hour(now as f64),
            "tokens_total": self.total, "forwarded": self.forwarded, "refused": self.refused,
            "minutes": self.minutes.iter().map(|(m, t)| json!([m, t])).collect::<Vec<_>>(),
            "caps": self.episodes});
        let tmp = self.usage_dir.join(".usage.json.tmp");
        if std::fs::write(&tmp, doc.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, self.usage_dir.join("usage.json"));
        }
    }

    fn hour(&self, now: f64) -> u64 {
        let from = (now as i64) / 60 - 60;
        self.minutes.range(from + 1..).map(|(_, t)| t).sum()
    }

    /// The caps: /run/lw-agent/caps when it exists, else the environment's.
    pub fn caps(&self) -> Caps {
        let Ok(text) = std::fs::read(&self.caps_file) else {
            return self.env_caps;
        };
        let Ok(c) = serde_json::from_slice::<Value>(&text) else {
            return self.env_caps;
        };
        let get = |k: &str, d: u64| c.get(k).map(int).unwrap_or(d);
        Caps {
            rpm: get("max-rpm", self.env_caps.rpm),
            tokens_hour: get("max-tokens-hour", self.env_caps.tokens_hour),
            tokens_run: get("max-tokens-run", self.env_caps.tokens_run),
        }
    }

    fn current_run(&mut self) {
        let run = std::fs::read_to_string(&self.run_file)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        if run != self.run {
            self.run = run;
            self.run_tokens = 0;
        }
    }

    /// Counts a forward, or refuses it with the 429 of the first cap reached.
    pub fn admit(&mut self) -> Result<(), Refuse> {
        self.current_run();
        let caps = self.caps();
        let (mono, now) = (Instant::now(), now());
        while self
            .starts
            .front()
            .is_some_and(|t| mono.duration_since(*t).as_secs_f64() >= 60.0)
        {
            self.starts.pop_front();
        }
        let over = if caps.rpm > 0 && self.starts.len() as u64 >= caps.rpm {
            let first = self.starts[0];
            let wait = 60.0 - mono.duration_since(first).as_secs_f64();
            Some(("max-rpm", caps.rpm, "requests in a minute", wait.ceil()))
        } else if caps.tokens_hour > 0 && self.hour(now) >= caps.tokens_hour {
            let (mut left, mut wait) = (self.hour(now), 60.0);
            let from = (now as i64) / 60 - 60;
            for (m, t) in self.minutes.range(from + 1..) {
                left -= t;
                wait = ((m + 61) * 60) as f64 - now;
                if left < caps.tokens_hour {
                    break;
                }
            }
            Some((
                "max-tokens-hour",
                caps.tokens_hour,
                "tokens in an hour",
                wait.ceil(),
            ))
        } else if caps.tokens_run > 0 && self.run_tokens >= caps.tokens_run {
            Some((
                "max-tokens-run",
                caps.tokens_run,
                "tokens in this run (the next lw-sandbox run starts again at 0)",
                3600.0,
            ))
        } else {
            None
        };
        let Some((cap, limit, what, retry)) = over else {
            self.starts.push_back(mono);
            self.forwarded += 1;
            self.capped = false;
            self.save();
            return Ok(());
        };
        let retry = (retry as u64).max(1);
        self.refused += 1;
        let at = now as i64;
        if !self.capped {
            self.capped = true;
            if !self.told(cap, at) {
                let n = self.episodes.last().map(|e| int(&e["n"]) + 1).unwrap_or(1);
                self.episodes
                    .push(json!({"cap": cap, "limit": limit, "at": at,
                    "retry_after": retry, "run": self.run, "n": n}));
            }
        }
        if let Some(ep) = self.episodes.iter_mut().rev().find(|e| e["cap"] == cap) {
            ep["last"] = json!(at);
        }
        self.save();
        Err(Refuse::new(
            429,
            "rate_limit_error",
            format!(
                "over the sandbox's cap agent.{}.{cap}: {limit} {what}; try again in {retry} s",
                self.kit
            ),
        )
        .retry(retry))
    }

    /// True when an episode of `cap` is still open: its last refusal is
    /// within the cap's window (for the run cap, in this run).
    fn told(&self, cap: &str, now: i64) -> bool {
        let Some(ep) = self.episodes.iter().rev().find(|e| e["cap"] == cap) else {
            return false;
        };
        if cap == "max-tokens-run" {
            return ep["run"].as_str() == Some(self.run.as_str());
        }
        let window = if cap == "max-rpm" { 60 } else { 3600 };
        let last = ep
            .get("last")
            .or_else(|| ep.get("at"))
            .map(int)
            .unwrap_or(0);
        now - (last as i64) < window
    }

    /// Counts `n` tokens the provider reported.
    pub fn charge(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.current_run();
        self.run_tokens += n;
        self.total += n;
        *self.minutes.entry(now() as i64 / 60).or_default() += n;
        self.save();
    }
}
