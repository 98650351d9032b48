//! The canonical request shared by AWS Signature Version 4 and Google's V4 signing (the same
//! scheme under other names): URI encoding, the canonical query string and headers, and the
//! URL a signature is appended to.
//!
//! Owns only string building; must not know keys or algorithms (`sigv4`, `gcs` do).

/// AWS's `UriEncode`: every byte but `A-Z a-z 0-9 - _ . ~` as `%XX` (upper case); `/` kept
/// when `keep_slash` (object paths), encoded otherwise (query names and values).
pub(crate) fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A request to sign: method, scheme, host (with a non-default port), the path as sent
/// (already encoded), the query parameters (not encoded) and the headers it must carry
/// besides `host`.
pub(crate) struct Canonical<'a> {
    pub method: &'a str,
    pub scheme: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub query: Vec<(String, String)>,
    pub headers: &'a [(String, String)],
}

impl Canonical<'_> {
    /// Header names signed, lower case, sorted, `;`-joined (always with `host`).
    pub(crate) fn signed_headers(&self) -> String {
        let mut names: Vec<String> = self.headers.iter().map(|(k, _)| k.to_ascii_lowercase()).collect();
        names.push("host".into());
        names.sort();
        names.dedup();
        names.join(";")
    }

    /// The canonical query string: names and values encoded, sorted by name then value.
    pub(crate) fn query_string(&self) -> String {
        let mut pairs: Vec<(String, String)> =
            self.query.iter().map(|(k, v)| (uri_encode(k, false), uri_encode(v, false))).collect();
        pairs.sort();
        pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
    }

    /// The canonical request with an unsigned payload.
    pub(crate) fn request(&self) -> String {
        self.request_with_payload("UNSIGNED-PAYLOAD")
    }

    /// The canonical request ending in `payload_hash` (hex SHA-256 of the body, or
    /// `UNSIGNED-PAYLOAD` where S3 allows it).
    pub(crate) fn request_with_payload(&self, payload_hash: &str) -> String {
        let mut headers: Vec<(String, String)> =
            self.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), canonical_value(v))).collect();
        headers.push(("host".into(), self.host.to_string()));
        headers.sort();
        let mut canonical_headers = String::new();
        for (k, v) in &headers {
            canonical_headers.push_str(&format!("{k}:{v}\n"));
        }
        format!(
            "{}\n{}\n{}\n{}\n{}\n{payload_hash}",
            self.method,
            self.path,
            self.query_string(),
            canonical_headers,
            self.signed_headers()
        )
    }

    /// The URL with its query and the signature parameter last.
    pub(crate) fn url(&self, signature_name: &str, signature: &str) -> String {
        format!("{}://{}{}?{}&{signature_name}={signature}", self.scheme, self.host, self.path, self.query_string())
    }
}

/// A header value trimmed, its inner runs of spaces and tabs made one space.
fn canonical_value(v: &str) -> String {
    v.split([' ', '\t']).filter(|p| !p.is_empty()).collect::<Vec<_>>().join(" ")
}

/// `host[:port]` of `scheme://host[:port][/...]`, without the scheme's default port, and the
/// scheme; `None` when `url` is not http(s).
pub(crate) fn split_endpoint(url: &str) -> Option<(&'static str, String, String)> {
    let (scheme, rest) = if let Some(r) = url.strip_prefix("https://") {
        ("https", r)
    } else if let Some(r) = url.strip_prefix("http://") {
        ("http", r)
    } else {
        return None;
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return None;
    }
    Some((scheme, strip_default_port(scheme, authority), path.to_string()))
}

/// `host:443` for https and `host:80` for http are sent as `host`.
pub(crate) fn strip_default_port(scheme: &str, authority: &str) -> String {
    let default = if scheme == "https" { ":443" } else { ":80" };
    authority.strip_suffix(default).unwrap_or(authority).to_string()
}
