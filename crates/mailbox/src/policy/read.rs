//! Reading a policy file: the version line, then one directive per line,
//! each checked with a message naming what is wrong (mailbox-spec.md,
//! "POLICY").

use super::{POLICY_VERSION, Policy, Route, Ruled, parse_duration, parse_rate, routable_kinds};
use crate::message::Kind;

/// The first directive: `loopwright-policy VERSION`.
pub(super) fn version_line(words: &[&str]) -> Result<(), String> {
    match words {
        ["loopwright-policy", v] if *v == POLICY_VERSION.to_string() => Ok(()),
        ["loopwright-policy", v] => Err(format!(
            "unsupported policy version '{v}'; this mediator reads version {POLICY_VERSION}"
        )),
        _ => Err(format!(
            "the first directive must be 'loopwright-policy {POLICY_VERSION}', found '{}'",
            words.join(" ")
        )),
    }
}

/// What `Policy::parse` has read so far: the policy, and where each
/// directive that may appear once was first seen.
pub(super) struct Reader {
    pub(super) p: Policy,
    pub(super) routed: Vec<(Kind, usize)>,
    pub(super) rate_line: usize,
    pub(super) dup_line: usize,
    pub(super) cap_line: usize,
}

impl Reader {
    /// One directive after the version line; Err is that line's one error.
    pub(super) fn directive(&mut self, words: &[&str], line: usize) -> Result<(), String> {
        match words {
            ["route", kind, target] => self.route(kind, target, line),
            ["rate", "off"] => {
                self.p.rate = None;
                self.rate_line = line;
                Ok(())
            }
            ["rate", spec] => {
                let r = parse_rate(spec)?;
                if self.rate_line != 0 {
                    return Err(format!(
                        "rate is set twice (first on line {})",
                        self.rate_line
                    ));
                }
                self.p.rate = Some(Ruled { value: r, line });
                self.rate_line = line;
                Ok(())
            }
            ["duplicates", "off"] => {
                self.p.duplicates = None;
                self.dup_line = line;
                Ok(())
            }
            ["duplicates", spec] => {
                let d = parse_duration(spec).map_err(|m| format!("duplicates: {m}"))?;
                if self.dup_line != 0 {
                    return Err(format!(
                        "duplicates is set twice (first on line {})",
                        self.dup_line
                    ));
                }
                self.p.duplicates = Some(Ruled { value: d, line });
                self.dup_line = line;
                Ok(())
            }
            ["held-max", ..] => self.held_max(words, line),
            ["hold", ..] => self.hold(words, line),
            ["route", ..] => Err("expected 'route KIND ROUTE'".into()),
            ["rate", ..] => {
                Err("expected 'rate COUNT/DURATION' (e.g. 120/60s) or 'rate off'".into())
            }
            ["duplicates", ..] => {
                Err("expected 'duplicates DURATION' (e.g. 10m) or 'duplicates off'".into())
            }
            ["loopwright-policy", ..] => Err("the version line may appear only once, first".into()),
            [word, ..] => Err(format!(
                "unknown directive '{word}'; expected route, rate, duplicates, hold or held-max"
            )),
            [] => Ok(()),
        }
    }

    /// `route KIND ROUTE`, once per kind.
    fn route(&mut self, kind: &str, target: &str, line: usize) -> Result<(), String> {
        let Some(k) = Kind::parse(kind) else {
            return Err(format!(
                "unknown kind '{kind}'; expected one of {}",
                routable_kinds()
            ));
        };
        if !k.routable() {
            return Err(format!(
                "kind '{kind}' is the mediator's own and cannot be routed"
            ));
        }
        let Some(r) = Route::parse(target) else {
            return Err(format!(
                "unknown route '{target}'; expected scope, named, human, asker or hold"
            ));
        };
        if let Some((_, first)) = self.routed.iter().find(|(kk, _)| *kk == k) {
            return Err(format!(
                "kind '{kind}' is routed twice (first on line {first}); keep one route line"
            ));
        }
        self.routed.push((k, line));
        self.p.routes.retain(|(kk, _)| *kk != k);
        self.p.routes.push((k, Ruled { value: r, line }));
        Ok(())
    }

    /// `held-max COUNT` or `held-max off`, once.
    fn held_max(&mut self, words: &[&str], line: usize) -> Result<(), String> {
        match words {
            ["held-max", _] if self.cap_line != 0 => Err(format!(
                "held-max is set twice (first on line {})",
                self.cap_line
            )),
            ["held-max", "off"] => {
                self.p.held_max = None;
                self.cap_line = line;
                Ok(())
            }
            ["held-max", n] => match n.parse::<u32>() {
                Ok(v) if v > 0 => {
                    self.p.held_max = Some(Ruled { value: v, line });
                    self.cap_line = line;
                    Ok(())
                }
                _ => Err(format!(
                    "held-max '{n}' is not a count of messages; expected 'held-max COUNT' (at least 1) or 'held-max off'"
                )),
            },
            _ => Err("expected 'held-max COUNT' (e.g. 20) or 'held-max off'".into()),
        }
    }

    /// `hold kind KIND` or `hold sender NAME`.
    fn hold(&mut self, words: &[&str], line: usize) -> Result<(), String> {
        match words {
            ["hold", "kind", kind] => match Kind::parse(kind) {
                Some(k) if k.routable() => {
                    self.p.hold_kinds.push(Ruled { value: k, line });
                    Ok(())
                }
                _ => Err(format!(
                    "unknown kind '{kind}'; expected one of {}",
                    routable_kinds()
                )),
            },
            ["hold", "sender", name] if crate::message::valid_party(name) => {
                self.p.hold_senders.push(Ruled {
                    value: name.to_string(),
                    line,
                });
                Ok(())
            }
            ["hold", "sender", name] => Err(format!("'{name}' is not a valid sender name")),
            _ => Err("expected 'hold kind KIND' or 'hold sender NAME'".into()),
        }
    }
}
