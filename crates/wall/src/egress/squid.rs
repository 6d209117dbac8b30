//! The proxy's side: an allow-list rendered as squid rules, and squid's
//! access log read back as records.
//!
//! Each entry becomes one `http_access allow` line that holds three ACLs,
//! evaluated left to right and short-circuited: the name (`dstdomain -n` for
//! an exact name, an anchored `dstdom_regex -n` for `*.name`), the port, and
//! last the destination address, which must not be loopback or link-local.
//! Because the address check comes last, squid resolves a name only once it
//! is known to be allowed: a request for an unlisted name is refused without
//! any DNS lookup, so the DNS cannot carry data out either.  `-n` stops squid
//! from turning an IP literal into a name by a reverse lookup, so an address
//! never matches a name.  The last rule denies everything.

use super::allow::{AllowList, HostPattern};

/// The configuration template; `@ALLOW@` is replaced by the rules.
pub const TEMPLATE: &str = include_str!("../../../../runtime/egress/squid.conf.in");

/// The port squid listens on inside the proxy container.
pub const PORT: u16 = 3128;

/// Renders the squid configuration for `allow`.
pub fn render(allow: &AllowList) -> String {
    let mut rules = String::new();
    if allow.is_empty() {
        rules.push_str("# The allow-list is empty: nothing is allowed.\n");
    }
    for (i, e) in allow.entries().iter().enumerate() {
        let n = i + 1;
        rules.push_str(&format!("# {e}\n"));
        match &e.host {
            HostPattern::Exact(h) => {
                rules.push_str(&format!("acl lw_allow_{n}_host dstdomain -n {h}\n"))
            }
            HostPattern::Subdomains(h) => {
                // Names are letters, digits, '-' and '.': only the dot needs escaping.
                let re = h.replace('.', "\\.");
                rules.push_str(&format!(
                    "acl lw_allow_{n}_host dstdom_regex -n -i ^([a-z0-9-]+\\.)+{re}$\n"
                ));
            }
        }
        rules.push_str(&format!("acl lw_allow_{n}_port port {}\n", e.port));
        rules.push_str(&format!(
            "http_access allow lw_allow_{n}_host lw_allow_{n}_port !lw_unsafe_dst\n"
        ));
    }
    let out = TEMPLATE.replace("@ALLOW@", rules.trim_end());
    debug_assert!(
        !out.contains('@'),
        "every placeholder of squid.conf.in is filled"
    );
    out
}

/// One line of the proxy's access log.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Request {
    /// Seconds since the epoch, with milliseconds.
    pub time: String,
    /// The sandbox's address as the proxy saw it.
    pub client: String,
    /// Squid's result code: `TCP_DENIED`, `TCP_TUNNEL`, `TCP_MISS`, ...
    pub result: String,
    /// The HTTP status sent to the sandbox (403 for a denial).
    pub status: u16,
    pub method: String,
    pub host: String,
    pub port: u16,
    /// Bytes received from the sandbox and sent back to it.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Request {
    /// True when the proxy refused the request by its rules.
    pub fn denied(&self) -> bool {
        self.result.starts_with("TCP_DENIED")
    }
}

/// Parses the log lines squid writes with the `lw` format; other lines
/// (squid's own diagnostics) are skipped.
pub fn parse_log(text: &str) -> Vec<Request> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Request> {
    let rest = line.trim_end().strip_prefix("lw-egress ")?;
    let f: Vec<&str> = rest.split(' ').collect();
    if f.len() != 8 {
        return None;
    }
    let (result, status) = f[2].split_once('/')?;
    Some(Request {
        time: f[0].to_string(),
        client: f[1].to_string(),
        result: result.to_string(),
        status: status.parse().unwrap_or(0),
        method: f[3].to_string(),
        host: f[4].to_string(),
        port: f[5].parse().unwrap_or(0),
        bytes_in: f[6].parse().unwrap_or(0),
        bytes_out: f[7].parse().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_entry_becomes_one_allow_line_before_deny_all() {
        let l = AllowList::parse("api.example.com:443 *.pkg.example:80", "t").unwrap();
        let c = render(&l);
        assert!(
            c.contains(
                "acl lw_allow_1_host dstdomain -n api.example.com\nacl lw_allow_1_port port 443\n"
            ),
            "{c}"
        );
        assert!(
            c.contains("http_access allow lw_allow_1_host lw_allow_1_port !lw_unsafe_dst\n"),
            "{c}"
        );
        assert!(
            c.contains("acl lw_allow_2_host dstdom_regex -n -i ^([a-z0-9-]+\\.)+pkg\\.example$\n"),
            "{c}"
        );
        let allow = c.find("http_access allow").unwrap();
        let deny = c.find("http_access deny all").unwrap();
        assert!(allow < deny);
        assert_eq!(c.matches("http_access").count(), 3, "{c}");
        assert!(!c.contains('@'));
    }

    #[test]
    fn an_empty_list_renders_deny_all_only() {
        let c = render(&AllowList::none());
        assert_eq!(c.matches("http_access").count(), 1, "{c}");
        assert!(c.contains("http_access deny all"));
        assert!(c.contains("nothing is allowed"));
    }

    #[test]
    fn access_log_lines_parse_and_squid_noise_is_skipped() {
        let log = "2026/11/30 17:38:48| Accepting HTTP Socket connections\n\
                   lw-egress 1764523128.123 172.20.0.3 TCP_DENIED/403 CONNECT forbidden.example 443 210 3900\n\
                   lw-egress 1764523129.004 172.20.0.3 TCP_TUNNEL/200 CONNECT api.example.com 443 800 5000\n";
        let r = parse_log(log);
        assert_eq!(r.len(), 2);
        assert!(r[0].denied());
        assert_eq!(
            (
                r[0].method.as_str(),
                r[0].host.as_str(),
                r[0].port,
                r[0].status
            ),
            ("CONNECT", "forbidden.example", 443, 403)
        );
        assert!(!r[1].denied());
        assert_eq!(r[1].bytes_out, 5000);
    }
}
