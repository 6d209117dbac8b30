//! What the proxy forwards: the kit's endpoints, a `{model}` in a path
//! standing for one model name (never a '/', '?', ':' or '%'), and the
//! query without the agent's key.

/// One endpoint: its method and its path, cut at each `{model}`.
pub struct Route {
    pub method: String,
    pieces: Vec<String>,
}

impl Route {
    /// The endpoints of `LW_MODEL_ENDPOINT`: `METHOD PATH[,METHOD PATH...]`.
    pub fn parse_all(spec: &str) -> Vec<Route> {
        spec.split(',')
            .filter_map(|e| {
                let mut w = e.split_whitespace();
                let (m, p) = (w.next()?, w.next()?);
                Some(Route {
                    method: m.to_string(),
                    pieces: p.split("{model}").map(String::from).collect(),
                })
            })
            .collect()
    }

    pub fn path(&self) -> String {
        self.pieces.join("{model}")
    }

    pub fn matches(&self, method: &str, path: &str) -> bool {
        method == self.method && fits(&self.pieces, path)
    }
}

fn fits(pieces: &[String], path: &str) -> bool {
    let Some(rest) = path.strip_prefix(pieces[0].as_str()) else {
        return false;
    };
    if pieces.len() == 1 {
        return rest.is_empty();
    }
    let first = rest.as_bytes().first();
    if !first.is_some_and(u8::is_ascii_alphanumeric) {
        return false;
    }
    let name = rest
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || b"._-".contains(b))
        .count();
    (1..=name).any(|n| fits(&pieces[1..], &rest[n..]))
}

/// `target` without a `key=` or `api_key=` query parameter (Google takes an
/// API key there too); a name is compared decoded, as the upstream reads it
/// (`%6Bey` is `key`).
pub(crate) fn without_key(target: &str) -> String {
    let Some((path, query)) = target.split_once('?') else {
        return target.to_string();
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| {
            let name = decode(p.split('=').next().unwrap_or_default());
            let name = name.trim().to_lowercase();
            !matches!(name.as_str(), "key" | "api_key" | "")
        })
        .collect();
    if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    }
}

/// Percent-decoding with '+' as space, as Python's `unquote_plus`.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_one_name_and_the_key_leaves_the_query() {
        let r = Route::parse_all("POST /v1beta/models/{model}:generateContent, POST /v1/messages");
        assert!(r[0].matches("POST", "/v1beta/models/gemini-2.5-pro:generateContent"));
        for bad in [
            "/v1beta/models/a/b:generateContent",
            "/v1beta/models/:generateContent",
            "/v1beta/models/..%2fx:generateContent",
            "/v1beta/models/-a:generateContent",
        ] {
            assert!(!r[0].matches("POST", bad), "{bad}");
        }
        assert!(r[1].matches("POST", "/v1/messages"));
        assert!(!r[1].matches("GET", "/v1/messages"));
        assert!(!r[1].matches("POST", "/v1/messages/x"));
        assert_eq!(
            without_key("/p?key=a&alt=sse&%6Bey=b&API_KEY=c&+key=d&k%65y"),
            "/p?alt=sse"
        );
        assert_eq!(without_key("/p?key=a"), "/p");
        assert_eq!(without_key("/p?x=%zz"), "/p?x=%zz");
    }
}
