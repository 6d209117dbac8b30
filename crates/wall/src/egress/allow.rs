//! The egress allow-list: which host names and ports a sandbox may reach.
//!
//! An entry is `HOST:PORT`:
//!
//! ```text
//! api.example.com:443       exactly that name, that port
//! *.example.com:443         any name ending in `.example.com` (not
//!                           `example.com` itself), that port
//! ```
//!
//! Names are DNS names in ASCII (an internationalised name is written in its
//! `xn--` form), compared without regard to case; one trailing dot is
//! dropped.  The port is a decimal number from 1 to 65535 and is never
//! implied.  Entries are separated by white space or commas.
//!
//! Refused, with exit 78 and the entry named: anything that is not that
//! grammar; a URL (`https://...`); an IP address literal (the proxy matches
//! names only, and an address is how one reaches the host or another
//! sandbox); `localhost`; and every wildcard but a leading `*.` before a
//! name of at least two labels — `*`, `*:*`, `*.*`, `*.com`, `host:*` would
//! each quietly allow far more than anyone means, which is how allow-lists
//! fail open.
//!
//! An empty list allows nothing.  There is no entry that means everything;
//! a sandbox that needs that asks for the bridge network, openly.

use std::fmt;

use base::error::{Error, Result};

/// Longest DNS name, in characters, without the trailing dot.
const MAX_NAME: usize = 253;
/// Longest DNS label.
const MAX_LABEL: usize = 63;

/// Which names an entry matches.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostPattern {
    /// Exactly this name (lower case).
    Exact(String),
    /// Any name ending in `.` + this name (lower case): `*.example.com` is
    /// `Subdomains("example.com")`.
    Subdomains(String),
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(h) => f.write_str(h),
            HostPattern::Subdomains(h) => write!(f, "*.{h}"),
        }
    }
}

/// One `HOST:PORT` entry.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Entry {
    pub host: HostPattern,
    pub port: u16,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Entry {
    /// Parses one entry; the error says what is wrong and how to write it.
    pub fn parse(text: &str) -> Result<Entry> {
        let bad = |why: &str| Error::config(format!("invalid egress entry '{text}': {why}"));
        let s = text.trim();
        if s.is_empty() {
            return Err(bad("empty"));
        }
        let head = s.rsplit_once(':').map_or(s, |(h, _)| h);
        if head.contains('*') && head.chars().all(|c| c == '*' || c == '.') {
            return Err(bad(
                "a wildcard for every host is not allowed; list the hosts (e.g. 'api.example.com:443')",
            ));
        }
        if s.contains("://") || s.contains('/') {
            return Err(bad(
                "write HOST:PORT, not a URL (e.g. 'api.example.com:443')",
            ));
        }
        if s.starts_with('[') || s.matches(':').count() > 1 {
            return Err(bad(
                "IP address literals are not allowed; name the host (e.g. 'api.example.com:443')",
            ));
        }
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(bad("no port; write HOST:PORT (e.g. 'api.example.com:443')"));
        };
        if port == "*" {
            return Err(bad("a wildcard port is not allowed; list each port"));
        }
        if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
        let port: u16 = match port.parse() {
            Ok(p) if p > 0 => p,
            _ => return Err(bad("the port must be a number from 1 to 65535")),
        };
        let lower = host.to_ascii_lowercase();
        let host = lower.strip_suffix('.').unwrap_or(&lower);
        if host.is_empty() {
            return Err(bad("no host name"));
        }
        let everything =
            "a wildcard for every host is not allowed; list the hosts (e.g. 'api.example.com:443')";
        let (pattern, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        if name.contains('*') || (!pattern && host.contains('*')) {
            return Err(if name.chars().all(|c| c == '*' || c == '.') {
                bad(everything)
            } else {
                bad("'*' is allowed only as a whole first label, as in '*.example.com:443'")
            });
        }
        if pattern && !name.contains('.') {
            return Err(bad(&format!(
                "'*.{name}' is a wildcard for a whole top-level domain; name at least two labels after '*.'"
            )));
        }
        check_name(name).map_err(|why| bad(&why))?;
        if is_address_like(name) {
            return Err(bad(
                "IP address literals are not allowed; name the host (e.g. 'api.example.com:443')",
            ));
        }
        if name == "localhost" || name.ends_with(".localhost") {
            return Err(bad(
                "'localhost' names the proxy itself, never a host a sandbox may reach",
            ));
        }
        let host = if pattern {
            HostPattern::Subdomains(name.to_string())
        } else {
            HostPattern::Exact(name.to_string())
        };
        Ok(Entry { host, port })
    }

    /// True when a request for `host` (any case, optional trailing dot) on
    /// `port` matches this entry.  This is the meaning the proxy's rules
    /// carry; the tests hold the two together.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        if port != self.port {
            return false;
        }
        let lower = host.to_ascii_lowercase();
        let host = lower.strip_suffix('.').unwrap_or(&lower);
        match &self.host {
            HostPattern::Exact(h) => host == h,
            HostPattern::Subdomains(h) => {
                host.len() > h.len() + 1
                    && host.ends_with(h.as_str())
                    && host.as_bytes()[host.len() - h.len() - 1] == b'.'
            }
        }
    }
}

/// Checks `name` is a DNS name of letters, digits and hyphens.
fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.len() > MAX_NAME {
        return Err(format!(
            "the host name is longer than {MAX_NAME} characters"
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("the host name has an empty label ('..' or a leading dot)".into());
        }
        if label.len() > MAX_LABEL {
            return Err(format!(
                "a label of the host name is longer than {MAX_LABEL} characters"
            ));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(
                "a host name holds only letters, digits, '-' and '.' (write an internationalised name in its xn-- form)"
                    .into(),
            );
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label of the host name may not start or end with '-'".into());
        }
    }
    Ok(())
}

/// Names whose last label is all digits are IPv4 addresses in one of the
/// forms resolvers accept (`10.1.2.3`, `10.1`, `167772161`, `0x0a.1`).
fn is_address_like(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x")
            && last.len() > 2
            && last[2..].bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A validated allow-list, sorted, without duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

impl AllowList {
    /// The empty list: nothing allowed.
    pub fn none() -> AllowList {
        AllowList::default()
    }

    /// Parses entries separated by white space or commas.  `origin` (a file
    /// and key, a flag) is put in front of any error.
    pub fn parse(text: &str, origin: &str) -> Result<AllowList> {
        let mut list = AllowList::none();
        for word in text
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
        {
            let e = Entry::parse(word).map_err(|e| prefix(e, origin))?;
            list.push(e);
        }
        Ok(list)
    }

    /// Parses each of `entries` (e.g. repeated `--allow` flags).
    pub fn from_entries<S: AsRef<str>>(entries: &[S], origin: &str) -> Result<AllowList> {
        let mut list = AllowList::none();
        for s in entries {
            list.push(Entry::parse(s.as_ref()).map_err(|e| prefix(e, origin))?);
        }
        Ok(list)
    }

    fn push(&mut self, e: Entry) {
        if let Err(at) = self.entries.binary_search(&e) {
            self.entries.insert(at, e);
        }
    }

    /// Adds every entry of `other` (a sandbox extending its project's list).
    pub fn extend(&mut self, other: &AllowList) {
        for e in &other.entries {
            self.push(e.clone());
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when some entry allows `host` on `port`.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        self.entries.iter().any(|e| e.allows(host, port))
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

fn prefix(mut e: Error, origin: &str) -> Error {
    if !origin.is_empty() {
        e.msg = format!("{origin}: {}", e.msg);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::error::Exit;

    fn ok(s: &str) -> Entry {
        Entry::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> String {
        let e = Entry::parse(s).expect_err(s);
        assert_eq!(e.exit, Exit::Config, "{s}");
        assert!(
            e.msg.contains(&format!("'{s}'")),
            "the error names the entry: {}",
            e.msg
        );
        e.msg
    }

    #[test]
    fn exact_names_and_subdomain_patterns() {
        assert_eq!(
            ok("api.example.com:443"),
            Entry {
                host: HostPattern::Exact("api.example.com".into()),
                port: 443
            }
        );
        assert_eq!(
            ok("API.Example.COM.:8443").to_string(),
            "api.example.com:8443"
        );
        assert_eq!(
            ok("*.example.com:443").host,
            HostPattern::Subdomains("example.com".into())
        );
        assert_eq!(ok("registry:5000").to_string(), "registry:5000");
        assert_eq!(
            ok("xn--bcher-kva.example:443").to_string(),
            "xn--bcher-kva.example:443"
        );
    }

    #[test]
    fn wildcards_for_everything_are_refused() {
        for s in [
            "*", "*:*", "*:443", "*.*:443", "**:443", "*.:443", "*.*.*:80",
        ] {
            assert!(refused(s).contains("a wildcard for every host"), "{s}");
        }
        assert!(refused("*.com:443").contains("top-level domain"));
        assert!(refused("api.example.com:*").contains("wildcard port"));
        assert!(refused("api.*.com:443").contains("whole first label"));
        assert!(refused("*example.com:443").contains("whole first label"));
    }

    #[test]
    fn malformed_entries_are_refused_with_the_fix() {
        assert!(refused("api.example.com").contains("no port"));
        assert!(refused("https://api.example.com").contains("not a URL"));
        assert!(refused("api.example.com:0").contains("1 to 65535"));
        assert!(refused("api.example.com:65536").contains("1 to 65535"));
        assert!(refused("api.example.com:+443").contains("1 to 65535"));
        assert!(refused("api.example.com:").contains("1 to 65535"));
        assert!(refused(":443").contains("no host"));
        assert!(refused("api..example.com:443").contains("empty label"));
        assert!(refused("-api.example.com:443").contains("'-'"));
        assert!(refused("api_x.example.com:443").contains("only letters"));
        assert!(refused("bücher.example:443").contains("xn--"));
        assert!(refused(&format!("{}.com:443", "a".repeat(64))).contains("longer than 63"));
    }

    #[test]
    fn addresses_and_localhost_are_refused() {
        for s in [
            "10.0.0.1:443",
            "172.17.0.1:80",
            "127.1:80",
            "2130706433:80",
            "0x7f.1:80",
            "[::1]:443",
            "::1:443",
            "fe80::1:80",
        ] {
            assert!(refused(s).contains("IP address"), "{s}");
        }
        assert!(refused("localhost:8080").contains("localhost"));
        assert!(refused("db.localhost:5432").contains("localhost"));
    }

    #[test]
    fn matching_is_exact_on_name_and_port() {
        let e = ok("api.example.com:443");
        assert!(e.allows("api.example.com", 443));
        assert!(e.allows("API.example.com.", 443));
        assert!(!e.allows("api.example.com", 80));
        assert!(!e.allows("api.example.com.evil", 443));
        assert!(!e.allows("evilapi.example.com", 443));
        assert!(!e.allows("x.api.example.com", 443));
        let w = ok("*.example.com:443");
        assert!(w.allows("a.example.com", 443));
        assert!(w.allows("a.b.example.com", 443));
        assert!(!w.allows("example.com", 443));
        assert!(!w.allows("evilexample.com", 443));
        assert!(!w.allows("a.example.com.evil", 443));
    }

    #[test]
    fn lists_sort_dedupe_extend_and_name_their_origin() {
        let mut l = AllowList::parse(
            "b.example:443, a.example:443\n a.example:443",
            "f: egress.allow",
        )
        .unwrap();
        assert_eq!(l.to_string(), "a.example:443 b.example:443");
        l.extend(&AllowList::from_entries(&["c.example:80"], "--allow").unwrap());
        assert_eq!(l.entries().len(), 3);
        let e = AllowList::parse("a.example:443 *", "f: egress.allow").unwrap_err();
        assert_eq!(e.exit, Exit::Config);
        assert!(
            e.msg
                .starts_with("f: egress.allow: invalid egress entry '*'"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn an_empty_list_allows_nothing() {
        let l = AllowList::parse(" , \n", "x").unwrap();
        assert!(l.is_empty());
        assert!(!l.allows("api.example.com", 443));
        assert!(!l.allows("", 0));
    }
}
