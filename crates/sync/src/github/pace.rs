//! Pacing: the limits GitHub documents, the budget that carries them across
//! runs, the clock they are measured on (injected, so their tests do not
//! sleep), and the client's waits for a blocked window or a write slot.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Client;
use super::INTERVAL_ENV;
use super::client::Reply;
use base::error::{Error, Exit, Result};

/// Pacing limits (GitHub, "Best practices for using the REST API" and
/// "Rate limits for the REST API": secondary limits).
#[derive(Clone, Debug)]
pub struct Limits {
    pub min_write_interval: Duration,
    /// Content-creating requests allowed per `minute` (GitHub: no more than 80).
    pub per_minute: usize,
    /// ... and per `hour` (GitHub: no more than 500).
    pub per_hour: usize,
    pub minute: Duration,
    pub hour: Duration,
    /// The longest wait done in place; a longer one fails with exit 75.
    pub max_wait: Duration,
    /// Attempts for a read that meets 5xx or a dropped connection.
    pub read_attempts: u32,
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait for any read of an answer (its headers, each part of
    /// its body); an exchange as a whole gets connect + 2 x read.
    pub read_timeout: Duration,
    /// Attempts for a read that timed out (each costs a read timeout).
    pub timeout_attempts: u32,
}

/// Default connect timeout (lw-sync(1), --connect-timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default read timeout (lw-sync(1), --read-timeout).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Time as the rate-limit logic sees it, so that its tests need not sleep.
pub trait Clock {
    /// Milliseconds since the epoch.
    fn now_ms(&self) -> u64;
    fn sleep(&self, d: Duration);
}

/// The real clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        base::time::now_ms()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
}

/// Called with the budget whenever it holds a blocked window that is not
/// yet on disk, before any wait: the caller writes it durably, so that a run
/// killed while waiting leaves the window to the next run.
pub type Persist = Box<dyn FnMut(&Budget) -> Result<()>>;

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            min_write_interval: Duration::from_secs(1),
            per_minute: 79,
            per_hour: 499,
            minute: Duration::from_secs(60),
            hour: Duration::from_secs(3600),
            max_wait: Duration::from_secs(300),
            read_attempts: 4,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            timeout_attempts: 2,
        }
    }
}

impl Limits {
    /// The defaults, with the testing knob applied when set.
    pub fn from_env() -> Result<Limits> {
        let mut l = Limits::default();
        if let Ok(v) = std::env::var(INTERVAL_ENV) {
            let ms: u64 = v.trim().parse().map_err(|_| {
                Error::config(format!(
                    "{INTERVAL_ENV}='{}' is not a number of milliseconds",
                    v.escape_debug()
                ))
            })?;
            l.scale(ms);
        }
        Ok(l)
    }

    /// Testing only: writes `ms` apart, windows scaled by `ms / 1000`, so the
    /// counts per window stay GitHub's while the test runs faster.
    pub fn scale(&mut self, ms: u64) {
        let f = ms as f64 / 1000.0;
        self.min_write_interval = Duration::from_millis(ms);
        self.minute = Duration::from_secs_f64(60.0 * f);
        self.hour = Duration::from_secs_f64(3600.0 * f);
    }

    /// The base of backoffs (secondary limit without headers, 5xx on reads):
    /// one second, scaled like the windows.
    pub(super) fn unit(&self) -> Duration {
        self.minute / 60
    }
}

/// What must survive between runs for the limits to hold: recent write times
/// and the end of any blocked window (milliseconds since the epoch).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Budget {
    #[serde(default)]
    pub writes: Vec<u64>,
    #[serde(default)]
    pub blocked_until: u64,
    /// Consecutive secondary-limit answers without a `retry-after`.
    #[serde(default)]
    pub strikes: u32,
}

impl Client {
    /// Hands a blocked window that is not on disk yet to `persist`.
    pub(super) fn persist_window(&mut self) -> Result<()> {
        if self.budget.blocked_until > self.persisted_until
            && let Some(p) = self.persist.as_mut()
        {
            p(&self.budget)?;
            self.persisted_until = self.budget.blocked_until;
        }
        Ok(())
    }

    /// Fails when the run's time budget would be spent before `wait` ends.
    pub(super) fn check_deadline(&self, wait: Duration) -> Result<()> {
        if let Some(d) = self.deadline
            && self.clock.now_ms() + wait.as_millis() as u64 >= d
        {
            return Err(Error::new(
                Exit::TempFail,
                "the run's time limit (--time-limit) is spent; the next run goes on from here",
            ));
        }
        Ok(())
    }

    /// Sleeps on the client's clock, within the run's time budget.
    pub(super) fn pause(&mut self, wait: Duration) -> Result<()> {
        self.check_deadline(wait)?;
        self.clock.sleep(wait);
        Ok(())
    }

    /// Waits out a blocked window (or fails when it is longer than `max_wait`).
    pub(super) fn wait_blocked(&mut self) -> Result<()> {
        let now = self.clock.now_ms();
        if self.budget.blocked_until > now {
            // Durable before any wait: a run killed while waiting leaves the
            // rest of the window to the next run.
            self.persist_window()?;
            let wait = Duration::from_millis(self.budget.blocked_until - now);
            if wait > self.limits.max_wait {
                return Err(Error::new(
                    Exit::TempFail,
                    format!(
                        "GitHub asked to wait until {} ({}s from now); try again later",
                        base::time::rfc3339(Duration::from_millis(self.budget.blocked_until)),
                        wait.as_secs()
                    ),
                ));
            }
            self.pause(wait)?;
        }
        Ok(())
    }

    /// Waits until one more write keeps every pacing limit.
    pub(super) fn wait_write_slot(&mut self) -> Result<()> {
        loop {
            self.wait_blocked()?;
            let now = self.clock.now_ms();
            let hour = self.limits.hour.as_millis() as u64;
            self.budget.writes.retain(|&w| w + hour > now);
            let earliest = next_write_at(&self.limits, &self.budget.writes, now);
            if earliest <= now {
                return Ok(());
            }
            let wait = Duration::from_millis(earliest - now);
            if wait > self.limits.max_wait {
                return Err(Error::new(
                    Exit::TempFail,
                    format!(
                        "the content-creation budget is spent until {}; try again later",
                        base::time::rfc3339(Duration::from_millis(earliest))
                    ),
                ));
            }
            self.pause(wait)?;
        }
    }

    /// Reads the rate-limit headers of any answer.
    pub(super) fn note_headers(&mut self, r: &Reply) {
        let remaining = r
            .header("x-ratelimit-remaining")
            .and_then(|v| v.trim().parse::<u64>().ok());
        let reset = r
            .header("x-ratelimit-reset")
            .and_then(|v| v.trim().parse::<u64>().ok());
        // One second of slack for clock skew, as GitHub's examples do.
        if remaining == Some(0)
            && let Some(reset) = reset
        {
            self.budget.blocked_until = self.budget.blocked_until.max(reset * 1000 + 1000);
        }
    }

    /// For 403/429: is this a rate limit, and how long to wait?  GitHub:
    /// retry-after first; else remaining=0 until reset; else a secondary
    /// limit, at least one minute, growing exponentially.
    pub(super) fn rate_limited(&mut self, r: &Reply) -> Option<u64> {
        if r.status != 403 && r.status != 429 {
            return None;
        }
        let now = self.clock.now_ms();
        if let Some(s) = r
            .header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            self.budget.strikes = 0;
            return Some(now + s * 1000);
        }
        if r.header("x-ratelimit-remaining").map(str::trim) == Some("0")
            && let Some(reset) = r
                .header("x-ratelimit-reset")
                .and_then(|v| v.trim().parse::<u64>().ok())
        {
            return Some((reset * 1000 + 1000).max(now));
        }
        let text = String::from_utf8_lossy(&r.body).to_ascii_lowercase();
        if r.status == 429 || text.contains("rate limit") {
            let unit = self.limits.unit().as_millis() as u64;
            let wait = 60 * unit * (1u64 << self.budget.strikes.min(6));
            self.budget.strikes += 1;
            return Some(now + wait);
        }
        None
    }
}

/// The earliest time (ms) the next write keeps the spacing and the minute
/// and hour counts, given the recent write times in order.
pub fn next_write_at(l: &Limits, writes: &[u64], now: u64) -> u64 {
    let (minute, hour) = (l.minute.as_millis() as u64, l.hour.as_millis() as u64);
    let mut earliest = 0u64;
    if let Some(&last) = writes.last() {
        earliest = last + l.min_write_interval.as_millis() as u64;
    }
    let in_minute: Vec<u64> = writes
        .iter()
        .copied()
        .filter(|&w| w + minute > now)
        .collect();
    if in_minute.len() >= l.per_minute {
        earliest = earliest.max(in_minute[in_minute.len() - l.per_minute] + minute);
    }
    let in_hour: Vec<u64> = writes.iter().copied().filter(|&w| w + hour > now).collect();
    if in_hour.len() >= l.per_hour {
        earliest = earliest.max(in_hour[in_hour.len() - l.per_hour] + hour);
    }
    earliest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::github::Token;

    #[test]
    fn pacing_keeps_spacing_and_the_minute_and_hour_counts() {
        let l = Limits::default();
        let now = 10_000_000u64;
        assert_eq!(next_write_at(&l, &[], now), 0);
        assert_eq!(
            next_write_at(&l, &[now - 300], now),
            now + 700,
            "1 s after the last write"
        );
        // 499 writes in the last hour, 2 s apart: the 500th waits for the oldest to age out.
        let hour: Vec<u64> = (0..499).map(|i| now - 998_000 + i * 2000).collect();
        assert_eq!(next_write_at(&l, &hour, now), hour[0] + 3_600_000);
        // 498 leave room: only the spacing applies.
        assert_eq!(next_write_at(&l, &hour[1..], now), hour[498] + 1000);
        // 79 writes in the last minute (only reachable with a shorter spacing).
        let mut fast = l.clone();
        fast.min_write_interval = Duration::from_millis(100);
        let minute: Vec<u64> = (0..79).map(|i| now - 7_900 + i * 100).collect();
        assert_eq!(next_write_at(&fast, &minute, now), minute[0] + 60_000);
    }

    #[test]
    fn scaled_limits_keep_the_counts() {
        let mut l = Limits::default();
        l.scale(10);
        assert_eq!(l.min_write_interval, Duration::from_millis(10));
        assert_eq!(l.minute, Duration::from_millis(600));
        assert_eq!(l.per_minute, 79);
    }

    /// A clock that moves only when slept on, and notes each sleep.
    struct FakeClock {
        now: std::rc::Rc<std::cell::Cell<u64>>,
        log: std::rc::Rc<std::cell::RefCell<Vec<String>>>,
    }

    impl Clock for FakeClock {
        fn now_ms(&self) -> u64 {
            self.now.get()
        }
        fn sleep(&self, d: Duration) {
            self.log
                .borrow_mut()
                .push(format!("sleep {}", d.as_millis()));
            self.now.set(self.now.get() + d.as_millis() as u64);
        }
    }

    type Shared<T> = std::rc::Rc<std::cell::RefCell<T>>;

    fn fake_client(
        now: u64,
    ) -> (
        Client,
        Shared<Vec<String>>,
        std::rc::Rc<std::cell::Cell<u64>>,
    ) {
        let log: Shared<Vec<String>> = Default::default();
        let clock = std::rc::Rc::new(std::cell::Cell::new(now));
        let mut c = Client::new(
            "http://127.0.0.1:9",
            Token::new("t"),
            Limits::default(),
            Budget::default(),
        )
        .unwrap();
        c.clock = Box::new(FakeClock {
            now: clock.clone(),
            log: log.clone(),
        });
        let l = log.clone();
        c.persist = Some(Box::new(move |b: &Budget| {
            l.borrow_mut()
                .push(format!("persist until {}", b.blocked_until));
            Ok(())
        }));
        (c, log, clock)
    }

    #[test]
    fn a_blocked_window_is_persisted_before_the_wait_and_only_once() {
        let (mut c, log, clock) = fake_client(1_000_000);
        c.budget.blocked_until = 1_030_000;
        c.wait_blocked().unwrap();
        assert_eq!(
            *log.borrow(),
            ["persist until 1030000", "sleep 30000"],
            "durable first, then the wait"
        );
        assert_eq!(clock.get(), 1_030_000);
        // Already on disk: a second wait on the same window writes nothing.
        c.budget.blocked_until = 1_040_000;
        c.persisted_until = 1_040_000;
        log.borrow_mut().clear();
        c.wait_blocked().unwrap();
        assert_eq!(*log.borrow(), ["sleep 10000"]);
    }

    #[test]
    fn a_window_longer_than_max_wait_is_persisted_then_refused() {
        let (mut c, log, _) = fake_client(5_000);
        c.budget.blocked_until = 5_000 + 301_000;
        let e = c.wait_blocked().unwrap_err();
        assert_eq!(e.exit, Exit::TempFail);
        assert_eq!(*log.borrow(), ["persist until 306000"], "no sleep");
    }

    #[test]
    fn the_run_budget_stops_a_wait_that_would_outlast_it() {
        let (mut c, log, _) = fake_client(10_000);
        c.deadline = Some(20_000);
        c.budget.blocked_until = 25_000;
        let e = c.wait_blocked().unwrap_err();
        assert!(e.msg.contains("--time-limit"), "{}", e.msg);
        assert_eq!(*log.borrow(), ["persist until 25000"]);
        // The write slot waits on the same clock: 1 s after the last write.
        c.deadline = None;
        c.budget.blocked_until = 0;
        c.budget.writes = vec![25_000];
        log.borrow_mut().clear();
        c.wait_write_slot().unwrap();
        assert_eq!(*log.borrow(), ["sleep 16000"]);
    }
}
