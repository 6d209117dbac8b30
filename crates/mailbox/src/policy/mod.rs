//! The mediator's policy: how each kind is routed and when a message is held
//! (mailbox-spec.md, "POLICY").
//!
//! The file is `.loopwright/policy` in the project.  It is a line format
//! parsed here rather than TOML: eight directives do not need a grammar
//! library, and a hand parser can name the line and the fix for every error.
//!
//! ```text
//! loopwright-policy 1              # first directive: the format version
//! route contract-change scope      # scope | named | human | asker | hold
//! rate 120/60s                     # hold a sender's messages beyond 120 a minute
//! duplicates 10m                   # hold an exact repeat within 10 minutes
//! hold kind status                 # hold every message of a kind
//! hold sender noisy                # hold everything a sandbox posts
//! held-max 20                      # at most 20 held per sender; more bounce
//! route conflict human              # the radar's kinds route and hold like any other
//! ```
//!
//! A file that does not parse is never half-applied: `Policy::parse` returns
//! every error, and a running mediator keeps its previous policy.

mod read;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::message::Kind;
use base::error::{Error, Exit};
use read::{Reader, version_line};

pub const POLICY_VERSION: u32 = 1;
/// Where the policy lives inside a project.
pub const DEFAULT_PATH: &str = ".loopwright/policy";
/// Largest policy file read.
pub const MAX_POLICY: u64 = 1024 * 1024;

/// Where messages of a kind go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Every registered sandbox whose scope overlaps the message's refs (and
    /// every sandbox that declared no scope), plus the named recipients.
    Scope,
    /// The recipients named in `to`.
    Named,
    /// The human queue.
    Human,
    /// The sender of the message named by `in_reply_to`, plus the named recipients.
    Asker,
    /// The held queue, for an operator to release or drop.
    Hold,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Scope => "scope",
            Route::Named => "named",
            Route::Human => "human",
            Route::Asker => "asker",
            Route::Hold => "hold",
        }
    }
    fn parse(s: &str) -> Option<Route> {
        [
            Route::Scope,
            Route::Named,
            Route::Human,
            Route::Asker,
            Route::Hold,
        ]
        .into_iter()
        .find(|r| r.as_str() == s)
    }
}

/// At most `count` messages per sender in any `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub window: Duration,
}

/// A rule and the line it came from (0 for a built-in default), so that a
/// decision's reason can point at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ruled<T> {
    pub value: T,
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Where it was read from; None for the built-in default.
    pub source: Option<String>,
    routes: Vec<(Kind, Ruled<Route>)>,
    pub rate: Option<Ruled<Rate>>,
    pub duplicates: Option<Ruled<Duration>>,
    pub hold_kinds: Vec<Ruled<Kind>>,
    pub hold_senders: Vec<Ruled<String>>,
    /// Most messages of one sender in the held queue; a post that would be
    /// held beyond it bounces instead (None: no cap).
    pub held_max: Option<Ruled<u32>>,
}

/// The default cap on one sender's held messages.
pub const DEFAULT_HELD_MAX: u32 = 20;

/// One error, at a line of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub msg: String,
}

impl Default for Policy {
    fn default() -> Self {
        let r = |k, route| {
            (
                k,
                Ruled {
                    value: route,
                    line: 0,
                },
            )
        };
        Policy {
            source: None,
            routes: vec![
                r(Kind::ContractChange, Route::Scope),
                r(Kind::Request, Route::Named),
                r(Kind::Handoff, Route::Named),
                r(Kind::Question, Route::Human),
                r(Kind::Answer, Route::Asker),
                r(Kind::Status, Route::Named),
                r(Kind::Conflict, Route::Named),
                r(Kind::ConflictCleared, Route::Named),
            ],
            rate: Some(Ruled {
                value: Rate {
                    count: 120,
                    window: Duration::from_secs(60),
                },
                line: 0,
            }),
            duplicates: Some(Ruled {
                value: Duration::from_secs(600),
                line: 0,
            }),
            hold_kinds: vec![],
            hold_senders: vec![],
            held_max: Some(Ruled {
                value: DEFAULT_HELD_MAX,
                line: 0,
            }),
        }
    }
}

impl Policy {
    /// The route for a kind (a file may leave kinds out: they keep the default).
    pub fn route(&self, k: Kind) -> Ruled<Route> {
        self.routes
            .iter()
            .find(|(kind, _)| *kind == k)
            .map(|(_, r)| r.clone())
            .unwrap_or(Ruled {
                value: Route::Named,
                line: 0,
            })
    }

    /// Where a rule came from, for reasons: `policy line 7` or `default policy`.
    pub fn at(&self, line: usize) -> String {
        match (&self.source, line) {
            (_, 0) => "default policy".to_string(),
            (Some(s), n) => format!("{s}:{n}"),
            (None, n) => format!("policy line {n}"),
        }
    }

    /// Parses a policy file's text.  `source` names it in reasons.
    pub fn parse(text: &str, source: Option<String>) -> Result<Policy, Vec<LineError>> {
        let mut r = Reader {
            p: Policy {
                source,
                ..Policy::default()
            },
            routed: Vec::new(),
            rate_line: 0,
            dup_line: 0,
            cap_line: 0,
        };
        let mut errs = Vec::new();
        let mut version_seen = false;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or("");
            let words: Vec<&str> = content.split_whitespace().collect();
            if words.is_empty() {
                continue;
            }
            if !version_seen {
                version_seen = true;
                match version_line(&words) {
                    Ok(()) => continue,
                    Err(msg) => {
                        errs.push(LineError { line, msg });
                        return Err(errs);
                    }
                }
            }
            if let Err(msg) = r.directive(&words, line) {
                errs.push(LineError { line, msg });
            }
        }
        if !version_seen {
            errs.push(LineError {
                line: 1,
                msg: format!(
                    "empty policy: the first directive must be 'loopwright-policy {POLICY_VERSION}'"
                ),
            });
        }
        if errs.is_empty() { Ok(r.p) } else { Err(errs) }
    }

    /// Reads and parses a file.  Errors are `FILE:LINE: message`, exit 78.
    pub fn load(path: &Path) -> Result<Policy, Error> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read policy", path, e))?;
        if !meta.is_file() {
            return Err(Error::config(format!(
                "policy '{}' is not a regular file",
                path.display()
            )));
        }
        if meta.len() > MAX_POLICY {
            return Err(Error::config(format!(
                "policy '{}' is {} bytes; the limit is {MAX_POLICY}",
                path.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read policy", path, e))?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|e| Error::config(format!("policy '{}' is not UTF-8: {e}", path.display())))?;
        let name = path.display().to_string();
        Policy::parse(text, Some(name.clone())).map_err(|errs| {
            let mut msg = String::new();
            for (i, e) in errs.iter().enumerate() {
                if i > 0 {
                    msg.push('\n');
                }
                let _ = write!(msg, "{name}:{}: {}", e.line, e.msg);
            }
            Error::config(msg)
        })
    }

    /// The policy in the file format (what `lw-mediate policy show` prints).
    pub fn render(&self) -> String {
        let mut s = format!("loopwright-policy {POLICY_VERSION}\n");
        let mut routes = self.routes.clone();
        routes.sort_by_key(|(k, _)| *k);
        for (k, r) in routes {
            let _ = writeln!(s, "route {} {}", k.as_str(), r.value.as_str());
        }
        match &self.rate {
            Some(r) => {
                let _ = writeln!(
                    s,
                    "rate {}/{}",
                    r.value.count,
                    render_duration(r.value.window)
                );
            }
            None => s.push_str("rate off\n"),
        }
        match &self.duplicates {
            Some(d) => {
                let _ = writeln!(s, "duplicates {}", render_duration(d.value));
            }
            None => s.push_str("duplicates off\n"),
        }
        for k in &self.hold_kinds {
            let _ = writeln!(s, "hold kind {}", k.value.as_str());
        }
        for n in &self.hold_senders {
            let _ = writeln!(s, "hold sender {}", n.value);
        }
        match &self.held_max {
            Some(c) => {
                let _ = writeln!(s, "held-max {}", c.value);
            }
            None => s.push_str("held-max off\n"),
        }
        s
    }
}

fn routable_kinds() -> String {
    crate::message::KINDS
        .iter()
        .filter(|k| k.routable())
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_rate(spec: &str) -> Result<Rate, String> {
    let (n, w) = spec
        .split_once('/')
        .ok_or_else(|| format!("rate '{spec}' must be COUNT/DURATION, e.g. 120/60s"))?;
    let count: u32 = n
        .parse()
        .ok()
        .filter(|c| *c > 0)
        .ok_or_else(|| format!("rate count '{n}' must be a whole number above 0"))?;
    let window = parse_duration(w).map_err(|m| format!("rate: {m}"))?;
    Ok(Rate { count, window })
}

/// `90s`, `10m`, `2h`, `1d`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "duration '{s}' has unknown unit '{unit}'; use s, m, h or d"
            ));
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("duration '{s}' must be a whole number and a unit, e.g. 60s"))?;
    if n == 0 || n > 366 * 86_400 {
        return Err(format!("duration '{s}' must be above 0 and at most a year"));
    }
    Ok(Duration::from_secs(n * mult))
}

fn render_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// True when a glob matches a path (crates/base/src/glob.rs has the one semantics).
pub fn glob_match(pat: &str, text: &str) -> bool {
    base::glob::matches(pat, text)
}

/// Refuses a scope entry that is not a valid glob (64, naming it and the
/// glob error): one would match only its own text and so take its sandbox
/// out of contract-change routing and the radar's overlap check unseen.
pub fn check_scope(scope: &str) -> Result<(), Error> {
    let why = if scope.is_empty() {
        Some("it is empty".to_string())
    } else {
        base::glob::check(scope)
    };
    match why {
        None => Ok(()),
        Some(why) => Err(Error::usage(format!(
            "invalid scope '{}': {why}; a scope is a path glob or a named contract \
             (mailbox-spec.md, Scopes); write a literal '[', '{{' or '*' as '\\[', '\\{{', '\\*'",
            scope.escape_debug()
        ))),
    }
}

/// True when a scope entry and a ref concern the same thing: either matches
/// the other as a glob, or one is a directory holding the other.
pub fn overlaps(scope: &str, r: &str) -> bool {
    let scope_t = scope.trim_end_matches('/');
    let ref_t = r.trim_end_matches('/');
    let under = |dir: &str, path: &str| {
        path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
    };
    let literal = |s: &str| !base::glob::is_pattern(s);
    glob_match(scope_t, ref_t)
        || glob_match(ref_t, scope_t)
        || (literal(scope_t) && under(scope_t, ref_t))
        || (literal(ref_t) && under(ref_t, scope_t))
        || {
            // A ref `src/api` overlaps a scope `src/api/**`: compare the
            // scope's literal directory prefix with the ref.
            let prefix = scope_t
                .split(['*', '?', '['])
                .next()
                .unwrap_or("")
                .trim_end_matches('/');
            !prefix.is_empty() && literal(ref_t) && (ref_t == prefix || under(ref_t, prefix))
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_scope_refuses_what_is_not_a_glob() {
        assert!(check_scope("src/api/**").is_ok());
        assert!(check_scope("schema:users").is_ok());
        for bad in ["[[", "", "src/{a,b", "x[!]"] {
            let e = check_scope(bad).expect_err(bad);
            assert_eq!(e.exit, Exit::Usage, "{bad}");
            assert!(e.msg.contains("invalid scope"), "{}", e.msg);
        }
    }

    #[test]
    fn default_policy_round_trips_through_render() {
        let d = Policy::default();
        let p = Policy::parse(&d.render(), None).unwrap();
        assert_eq!(p.render(), d.render());
        assert_eq!(d.route(Kind::Question).value, Route::Human);
        assert_eq!(d.route(Kind::Answer).value, Route::Asker);
    }

    #[test]
    fn held_max_sets_off_and_refuses_nonsense() {
        let p = |t: &str| Policy::parse(&format!("loopwright-policy 1\n{t}"), None);
        assert_eq!(Policy::default().held_max.unwrap().value, DEFAULT_HELD_MAX);
        assert_eq!(p("held-max 5\n").unwrap().held_max.unwrap().value, 5);
        assert_eq!(p("held-max off\n").unwrap().held_max, None);
        assert!(
            p("held-max off\n")
                .unwrap()
                .render()
                .contains("held-max off")
        );
        for bad in [
            "held-max 0\n",
            "held-max x\n",
            "held-max\n",
            "held-max 3\nheld-max 4\n",
        ] {
            let errs = p(bad).unwrap_err();
            assert!(errs[0].msg.contains("held-max"), "{bad}: {errs:?}");
        }
    }

    #[test]
    fn parses_every_directive() {
        let text = "# comment\n\nloopwright-policy 1\nroute status hold # later\nrate 3/10s\nduplicates off\nhold kind request\nhold sender noisy\n";
        let p = Policy::parse(text, Some("p".into())).unwrap();
        assert_eq!(
            p.route(Kind::Status),
            Ruled {
                value: Route::Hold,
                line: 4
            }
        );
        assert_eq!(
            p.route(Kind::Request).value,
            Route::Named,
            "unlisted kinds keep their default"
        );
        assert_eq!(
            p.rate.as_ref().unwrap().value,
            Rate {
                count: 3,
                window: Duration::from_secs(10)
            }
        );
        assert_eq!(p.duplicates, None);
        assert_eq!(p.hold_kinds[0].value, Kind::Request);
        assert_eq!(
            p.hold_senders[0],
            Ruled {
                value: "noisy".into(),
                line: 8
            }
        );
        assert_eq!(p.at(5), "p:5");
    }

    #[test]
    fn errors_point_at_their_lines() {
        let text = "loopwright-policy 1\nroute gossip named\nroute request nowhere\nrate 0/1s\nfrobnicate\nroute request named\nroute request human\nhold kind bounce\n";
        let errs = Policy::parse(text, None).unwrap_err();
        let lines: Vec<_> = errs.iter().map(|e| e.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 7, 8], "{errs:?}");
        assert!(errs[0].msg.contains("unknown kind 'gossip'"));
        assert!(errs[4].msg.contains("routed twice (first on line 6)"));
        let v = Policy::parse("loopwright-policy 2\n", None).unwrap_err();
        assert!(v[0].msg.contains("unsupported policy version"));
        assert!(
            Policy::parse("route request named\n", None).unwrap_err()[0]
                .msg
                .contains("first directive")
        );
        assert!(
            Policy::parse("# nothing\n", None).unwrap_err()[0]
                .msg
                .contains("empty policy")
        );
    }

    #[test]
    fn globs_and_overlaps() {
        assert!(glob_match("src/api/**", "src/api/v1/user.rs"));
        assert!(glob_match("src/**/*.rs", "src/a/b/c.rs"));
        assert!(glob_match("src/**/*.rs", "src/c.rs"));
        assert!(!glob_match("src/*.rs", "src/a/c.rs"));
        assert!(glob_match("*.proto", "user.proto"));
        assert!(glob_match("schema:users", "schema:users"));
        assert!(!glob_match("schema:users", "schema:orders"));
        assert!(overlaps("src/api/**", "src/api"));
        assert!(overlaps("src/api", "src/api/user.rs"));
        assert!(overlaps("src/api/user.rs", "src/api/**"));
        assert!(!overlaps("src/web/**", "src/api/user.rs"));
        assert!(!overlaps("src/api/**", "src/apiv2/x"));
    }

    #[test]
    fn the_radars_kinds_route_and_hold_but_bounce_does_not() {
        let d = Policy::default();
        assert_eq!(d.route(Kind::Conflict).value, Route::Named);
        assert_eq!(d.route(Kind::ConflictCleared).value, Route::Named);
        let p = Policy::parse(
            "loopwright-policy 1\nroute conflict human\nhold kind conflict-cleared\n",
            None,
        )
        .unwrap();
        assert_eq!(p.route(Kind::Conflict).value, Route::Human);
        assert_eq!(p.hold_kinds[0].value, Kind::ConflictCleared);
        let errs = Policy::parse("loopwright-policy 1\nroute bounce named\n", None).unwrap_err();
        assert!(errs[0].msg.contains("mediator's own"), "{errs:?}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("0s").is_err());
    }
}
