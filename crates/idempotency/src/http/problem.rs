//! The layer's own answers, as RFC 9457 problem details (`application/problem+json`), as
//! the draft asks. Each has a `type` under a base the user can point at their own docs.

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{Response, StatusCode};
use serde_json::json;
use std::time::Duration;

/// The default base of every problem's `type`: the section of this project's HTTP guide
/// that explains each one (`#key-missing`, ...).
pub const DEFAULT_PROBLEM_BASE: &str =
    "https://github.com/lambda-idempotency/lambda-idempotency/blob/main/docs/http.md#";

/// What the layer refuses or fails with, and how each is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Problem {
    /// `400`: a required key is missing.
    KeyMissing,
    /// `400`: the key header is repeated, empty, too long or malformed.
    KeyInvalid,
    /// `401`: no caller identity to scope the key with.
    CallerUnidentified,
    /// `422`: the key was used with another request.
    KeyReused,
    /// `409`: the key's first request is still being processed.
    InProgress,
    /// `400`: the request body could not be read.
    BodyUnreadable,
    /// `500`: the handler's response body failed while it was read.
    ResponseUnreadable,
    /// `503`: the store failed in a way a retry may heal (throttling, a timeout).
    StoreUnavailable,
    /// `500`: the store failed, or holds a response this layer cannot read.
    StoreFailed,
    /// `500`: an at-most-once key's earlier run ended without a response; what it did is
    /// unknown, and no retry helps until an operator settles it.
    OutcomeUnknown,
    /// `500`: an at-most-once key's earlier run answered a response too large to store;
    /// it is not run again, and its response cannot be given again.
    ResponseNotStored,
}

impl Problem {
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyInvalid | Problem::BodyUnreadable => {
                StatusCode::BAD_REQUEST
            }
            Problem::CallerUnidentified => StatusCode::UNAUTHORIZED,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InProgress => StatusCode::CONFLICT,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::StoreFailed
            | Problem::ResponseUnreadable
            | Problem::OutcomeUnknown
            | Problem::ResponseNotStored => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The fragment of the problem's `type`.
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Problem::KeyMissing => "key-missing",
            Problem::KeyInvalid => "key-invalid",
            Problem::CallerUnidentified => "caller-unidentified",
            Problem::KeyReused => "key-reused",
            Problem::InProgress => "request-in-progress",
            Problem::BodyUnreadable => "body-unreadable",
            Problem::ResponseUnreadable => "response-unreadable",
            Problem::StoreUnavailable => "store-unavailable",
            Problem::StoreFailed => "store-failed",
            Problem::OutcomeUnknown => "outcome-unknown",
            Problem::ResponseNotStored => "response-not-stored",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency key missing",
            Problem::KeyInvalid => "Idempotency key invalid",
            Problem::CallerUnidentified => "Caller not identified",
            Problem::KeyReused => "Idempotency key reused with another request",
            Problem::InProgress => "A request with this idempotency key is in progress",
            Problem::BodyUnreadable => "Request body unreadable",
            Problem::ResponseUnreadable => "Response body unreadable",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::StoreFailed => "Idempotency store failed",
            Problem::OutcomeUnknown => {
                "The outcome of an earlier request with this idempotency key is unknown"
            }
            Problem::ResponseNotStored => {
                "The response to an earlier request with this idempotency key was not stored"
            }
        }
    }

    /// The answer: the problem as JSON, with `Retry-After` (whole seconds, at least 1) when
    /// given.
    pub(crate) fn response<B: From<Vec<u8>>>(
        self,
        base: &str,
        detail: &str,
        retry_after: Option<Duration>,
    ) -> Response<B> {
        let status = self.status();
        let body = json!({
            "type": format!("{base}{}", self.slug()),
            "title": self.title(),
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = Response::new(B::from(body.to_string().into_bytes()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if self == Problem::CallerUnidentified {
            // RFC 9110 asks a 401 for a challenge.
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(after) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        response
    }
}

/// Whole seconds, rounded up (a client that waits less finds the request still running),
/// at least 1.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    let secs = (after.as_secs()).saturating_add(u64::from(after.subsec_nanos() > 0));
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_is_problem_json_with_its_status_type_and_retry_after() {
        let response: Response<Vec<u8>> = Problem::InProgress.response(
            "https://example.com/p#",
            "detail",
            Some(Duration::from_millis(2_100)),
        );
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(response.headers()[RETRY_AFTER], "3");
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(body["type"], "https://example.com/p#request-in-progress");
        assert_eq!(
            body["title"],
            "A request with this idempotency key is in progress"
        );
        assert!(!response.headers().contains_key(WWW_AUTHENTICATE));
        let unidentified: Response<Vec<u8>> = Problem::CallerUnidentified.response("b#", "d", None);
        assert_eq!(unidentified.headers()[WWW_AUTHENTICATE], "Bearer");
        assert!(!unidentified.headers().contains_key(RETRY_AFTER));
        assert_eq!(body["status"], 409);
        assert_eq!(body["detail"], "detail");
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_of_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }

    #[test]
    fn each_problem_has_its_own_status_and_type() {
        let all = [
            Problem::KeyMissing,
            Problem::KeyInvalid,
            Problem::CallerUnidentified,
            Problem::KeyReused,
            Problem::InProgress,
            Problem::BodyUnreadable,
            Problem::ResponseUnreadable,
            Problem::StoreUnavailable,
            Problem::StoreFailed,
            Problem::OutcomeUnknown,
            Problem::ResponseNotStored,
        ];
        let statuses: Vec<u16> = all.iter().map(|p| p.status().as_u16()).collect();
        assert_eq!(
            statuses,
            [400, 400, 401, 422, 409, 400, 500, 503, 500, 500, 500]
        );
        let mut slugs: Vec<_> = all.iter().map(|p| p.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), all.len());
    }
}
