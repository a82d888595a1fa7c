//! What is stored of a response, and the request's fingerprint.
//!
//! A response is stored as JSON in the record's `data`: its status, the headers the layer
//! replays, and its body byte for byte (as text when it is UTF-8, as base64 otherwise).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A response as the record holds it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) headers: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body_base64: Option<String>,
}

impl StoredResponse {
    /// `status`, the `keep` headers of `headers` (values that are not visible ASCII are
    /// left out), and `body`.
    pub(crate) fn new(
        status: StatusCode,
        headers: &HeaderMap,
        keep: &[HeaderName],
        body: &Bytes,
    ) -> Self {
        let headers = keep
            .iter()
            .flat_map(|name| {
                headers.get_all(name).iter().filter_map(move |value| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
            })
            .collect();
        let (body, body_base64) = match std::str::from_utf8(body) {
            Ok(text) => (Some(text.to_owned()), None),
            Err(_) => (None, Some(BASE64.encode(body))),
        };
        StoredResponse {
            status: status.as_u16(),
            headers,
            body,
            body_base64,
        }
    }

    /// The response to replay, or why the record cannot be one.
    pub(crate) fn to_response<B: From<Vec<u8>>>(&self) -> Result<Response<B>, &'static str> {
        let status = StatusCode::from_u16(self.status).map_err(|_| "its status is invalid")?;
        let body = match (&self.body, &self.body_base64) {
            (Some(text), None) => text.clone().into_bytes(),
            (None, Some(encoded)) => BASE64
                .decode(encoded)
                .map_err(|_| "its body is not valid base64")?,
            (None, None) => Vec::new(),
            (Some(_), Some(_)) => return Err("it holds two bodies"),
        };
        let mut response = Response::new(B::from(body));
        *response.status_mut() = status;
        for (name, value) in &self.headers {
            let name =
                HeaderName::try_from(name.as_str()).map_err(|_| "a header name is invalid")?;
            let value = HeaderValue::try_from(value.as_str()).map_err(|_| "a header is invalid")?;
            response.headers_mut().append(name, value);
        }
        Ok(response)
    }
}

/// The request's fingerprint: SHA-256 (hex) over its method, path, query parameters (in
/// sorted order), the named headers (each value, in order) and its body. Each part is length-prefixed, so no two
/// different requests share the bytes hashed.
pub(crate) fn fingerprint(
    parts: &http::request::Parts,
    headers: &[HeaderName],
    body: &[u8],
) -> String {
    let mut hash = Sha256::new();
    let mut part = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    part(parts.method.as_str().as_bytes());
    part(parts.uri.path().as_bytes());
    // The query's parameters in sorted order: lambda_http rebuilds a REST API's or an
    // ALB's query from a map, in an order that changes from event to event.
    let mut query: Vec<&str> = (parts.uri.query().unwrap_or("").split('&'))
        .filter(|p| !p.is_empty())
        .collect();
    query.sort_unstable();
    part(&(query.len() as u64).to_be_bytes());
    for parameter in query {
        part(parameter.as_bytes());
    }
    for name in headers {
        part(name.as_str().as_bytes());
        for value in parts.headers.get_all(name) {
            part(value.as_bytes());
        }
        part(b"");
    }
    part(body);
    let digest = hash.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether a response with `status` is stored by default: success, redirects and the
/// client errors that the same request meets again. `408`, `425` and `429` say "try
/// again", `401` and `403` change when the caller's credentials or rights do, and every
/// `5xx` may heal: their claims are released, so a retry runs the handler again (Stripe
/// stores its `500`s; we do not, since a provider that recovers should be called).
pub fn store_by_default(status: StatusCode) -> bool {
    match status.as_u16() {
        401 | 403 | 408 | 425 | 429 => false,
        200..=499 => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_round_trips_byte_for_byte_text_or_binary() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("image/png"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("x-kept", HeaderValue::from_static("1"));
        headers.append("x-kept", HeaderValue::from_static("2"));
        headers.insert("x-bytes", HeaderValue::from_bytes(b"\xff").unwrap());
        let keep = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("x-kept"),
            HeaderName::from_static("x-bytes"),
        ];
        for body in [&b"\x89PNG\r\n\x1a\n\x00\xff"[..], b"plain text", b""] {
            let stored =
                StoredResponse::new(StatusCode::CREATED, &headers, &keep, &Bytes::from(body));
            let json = serde_json::to_string(&stored).unwrap();
            let back: StoredResponse = serde_json::from_str(&json).unwrap();
            let response: Response<Vec<u8>> = back.to_response().unwrap();
            assert_eq!(response.status(), StatusCode::CREATED);
            assert_eq!(response.body(), body);
            assert_eq!(response.headers()["content-type"], "image/png");
            let kept: Vec<_> = response.headers().get_all("x-kept").iter().collect();
            assert_eq!(kept, ["1", "2"]);
            assert!(!response.headers().contains_key("set-cookie"));
            assert!(!response.headers().contains_key("x-bytes"));
        }
    }

    #[test]
    fn a_damaged_record_is_refused_not_replayed_wrong() {
        let bad = |json: &str| {
            let stored: StoredResponse = serde_json::from_str(json).unwrap();
            stored.to_response::<Vec<u8>>().unwrap_err()
        };
        assert_eq!(bad(r#"{"status":1000}"#), "its status is invalid");
        assert_eq!(
            bad(r#"{"status":200,"body_base64":"%%"}"#),
            "its body is not valid base64"
        );
        assert_eq!(
            bad(r#"{"status":200,"body":"","body_base64":""}"#),
            "it holds two bodies"
        );
    }

    #[test]
    fn the_fingerprint_changes_with_every_part() {
        let parts = |method: &str, uri: &str, header: Option<&str>| {
            let mut r = http::Request::builder().method(method).uri(uri);
            if let Some(v) = header {
                r = r.header("x-model", v);
            }
            r.body(()).unwrap().into_parts().0
        };
        let named = [HeaderName::from_static("x-model")];
        let base = fingerprint(&parts("POST", "/a?x=1", Some("m")), &named, b"{}");
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            fingerprint(&parts("POST", "/a?x=1", Some("m")), &named, b"{}")
        );
        for other in [
            fingerprint(&parts("PUT", "/a?x=1", Some("m")), &named, b"{}"),
            fingerprint(&parts("POST", "/b?x=1", Some("m")), &named, b"{}"),
            fingerprint(&parts("POST", "/a?x=2", Some("m")), &named, b"{}"),
            fingerprint(&parts("POST", "/a?x=1&y=2", Some("m")), &named, b"{}"),
            fingerprint(&parts("POST", "/a?x=1&x=1", Some("m")), &named, b"{}"),
            fingerprint(&parts("POST", "/a?x=1", Some("n")), &named, b"{}"),
            fingerprint(&parts("POST", "/a?x=1", None), &named, b"{}"),
            fingerprint(&parts("POST", "/a?x=1", Some("m")), &named, b"{ }"),
        ] {
            assert_ne!(base, other);
        }
        // The parameters' order does not count (lambda_http rebuilds some queries from a
        // map); their values and repetitions do.
        assert_eq!(
            fingerprint(&parts("POST", "/a?x=1&y=2", None), &[], b""),
            fingerprint(&parts("POST", "/a?y=2&x=1", None), &[], b"")
        );
        // A header not named does not count.
        assert_eq!(
            fingerprint(&parts("POST", "/a", Some("m")), &[], b""),
            fingerprint(&parts("POST", "/a", Some("n")), &[], b"")
        );
    }

    #[test]
    fn the_default_rule_stores_what_a_retry_would_meet_again() {
        let stored = |s: u16| store_by_default(StatusCode::from_u16(s).unwrap());
        for s in [200, 201, 204, 301, 400, 404, 409, 410, 422] {
            assert!(stored(s), "{s}");
        }
        for s in [401, 403, 408, 425, 429, 500, 502, 503, 504, 100] {
            assert!(!stored(s), "{s}");
        }
    }
}
