//! Envelopes: the request inside what carried it (an SNS notification, an EventBridge
//! event, an S3 notification, an HTTP body), taken out before anything else sees it, so
//! the key, the payload hash and a typed body see the request only, never the fields a
//! carrier changes on every publish (`MessageId`, `Timestamp`, `Signature`).

mod steps;

pub use steps::Step;
#[cfg(feature = "dynamodb-streams")]
pub(crate) use steps::shape;

use serde_json::Value;
use std::fmt;

/// How to take the request out of a record's body: a list of [`Step`]s applied in order
/// (a JSON pointer, a string holding JSON, base64, gzip), and the carrier's own messages
/// that are acknowledged without running (an S3 `s3:TestEvent`).
///
/// Built-in envelopes for the shapes Lambda delivers (the names of Powertools'):
///
/// | envelope | the request is | skipped |
/// |---|---|---|
/// | [`sns`](Self::sns) | `Message` of an SNS notification (an SQS queue subscribed with raw message delivery off), parsed from its string | |
/// | [`eventbridge`](Self::eventbridge) | `detail` of an EventBridge event (a rule's target queue) | |
/// | [`s3`](Self::s3) | `Records[0].s3` of an S3 event notification (through SQS) | `s3:TestEvent` |
/// | [`s3_sns`](Self::s3_sns) | the same, inside an SNS notification (S3 → SNS → SQS) | `s3:TestEvent` |
/// | [`cloudwatch_logs`](Self::cloudwatch_logs) | the decoded `awslogs.data` of a CloudWatch Logs subscription (base64, gzip, JSON) | `CONTROL_MESSAGE` |
/// | [`http_body`](Self::http_body) | `body` of an API Gateway or function URL event, base64-decoded when `isBase64Encoded` | |
///
/// Others are composed: `Envelope::new().pointer("/payload").json_string()`. A pointer is
/// an RFC 6901 pointer, unchanged: every character is legal in a key, so parsing is a
/// step of its own, never a mark inside a pointer.
///
/// A body the envelope does not open (not JSON, no field at the pointer, bad base64 or
/// gzip) is refused for good: a batch reports it
/// [`MalformedBody`](crate::FailureKind::MalformedBody), with the reason.
///
/// ```
/// use lambda_idempotency::envelope::{Envelope, Opened};
/// use serde_json::json;
///
/// let notification = json!({
///     "Type": "Notification",
///     "MessageId": "5f1c…",
///     "Timestamp": "2026-12-05T07:00:00.000Z",
///     "Message": "{\"request_id\": \"r-1\", \"prompt\": \"hi\"}",
/// });
/// let opened = Envelope::sns().open(notification.to_string().as_bytes()).unwrap();
/// assert_eq!(opened, Opened::Request(json!({"request_id": "r-1", "prompt": "hi"})));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Envelope {
    name: &'static str,
    steps: Vec<Step>,
}

/// What an envelope found in a body.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Opened {
    /// The request.
    Request(Value),
    /// A message of the carrier's own, not a request: acknowledged without running.
    Skip {
        /// Why, for the batch report and the log.
        reason: String,
    },
}

/// Why a body did not open: it will not next time either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeError {
    /// The envelope's name (`sns`, `custom`, …).
    pub envelope: &'static str,
    /// What was wrong.
    pub reason: String,
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} envelope did not open: {}",
            self.envelope, self.reason
        )
    }
}

impl std::error::Error for EnvelopeError {}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("name", &self.name)
            .field("steps", &self.steps)
            .finish()
    }
}

impl Default for Envelope {
    fn default() -> Self {
        Self::new()
    }
}

/// `pointer`, if it is an RFC 6901 pointer; a panic naming it otherwise.
fn checked(pointer: String) -> String {
    assert!(
        pointer.is_empty() || pointer.starts_with('/'),
        "envelope pointer {pointer:?} does not start with '/' (RFC 6901: write \"/{pointer}\")"
    );
    pointer
}

/// What S3 sends once when a notification is set up: no `Records`.
const S3_TEST_EVENT: &str = "s3:TestEvent";

impl Envelope {
    /// No steps yet: the body is the request. Add steps to compose an envelope.
    pub fn new() -> Self {
        Self {
            name: "custom",
            steps: Vec::new(),
        }
    }

    /// SNS → SQS (raw message delivery off): the request is the notification's
    /// `Message`, a string holding JSON. SNS's own messages on the queue (a
    /// `SubscriptionConfirmation` or `UnsubscribeConfirmation`, sent when a queue in
    /// another account subscribes) are skipped, and logged with their reason.
    ///
    /// Not Powertools' `SNS`, which reads `Records[0].Sns.Message` of SNS invoking a
    /// function directly: for that, `Envelope::new().pointer("/Records/0/Sns/Message").json_string()`.
    pub fn sns() -> Self {
        let own =
            "an SNS message of its own, not a notification (confirm or ignore the subscription)";
        Self::new()
            .skip_when("/Type", "SubscriptionConfirmation", own)
            .skip_when("/Type", "UnsubscribeConfirmation", own)
            .pointer("/Message")
            .json_string()
            .named("sns")
    }

    /// EventBridge → SQS: the request is the event's `detail`.
    pub fn eventbridge() -> Self {
        Self::new().pointer("/detail").named("eventbridge")
    }

    /// S3 → SQS: the request is the first record's `s3` (bucket, object key, size, ETag,
    /// `sequencer`). S3's `s3:TestEvent` is skipped. Key on
    /// `/object/key` and `/object/sequencer` (or the version id): a re-upload of the same
    /// key is new work, a redelivery of one notification is not.
    pub fn s3() -> Self {
        Self::new()
            .skip_when(
                "/Event",
                S3_TEST_EVENT,
                "an S3 test event (s3:TestEvent), not an object notification",
            )
            .pointer("/Records/0/s3")
            .named("s3")
    }

    /// S3 → SNS → SQS: [`s3`](Self::s3) inside an SNS notification.
    pub fn s3_sns() -> Self {
        let mut envelope = Self::sns();
        envelope.steps.extend(Self::s3().steps);
        envelope.named("s3_sns")
    }

    /// A CloudWatch Logs subscription's event: `awslogs.data`, base64 of gzip of JSON (the
    /// log group, stream and `logEvents`). The subscription's `CONTROL_MESSAGE` (sent to
    /// check the destination) is skipped. [`CloudWatchLogsBatch`](crate::CloudWatchLogsBatch)
    /// opens it and runs each log event.
    pub fn cloudwatch_logs() -> Self {
        Self::new()
            .pointer("/awslogs/data")
            .base64()
            .gzip()
            .skip_when(
                "/messageType",
                "CONTROL_MESSAGE",
                "a CloudWatch Logs control message (the subscription checking its destination)",
            )
            .named("cloudwatch_logs")
    }

    /// API Gateway (REST or HTTP API) or a function URL, invoked directly: the request is
    /// the event's `body`, base64-decoded first when `isBase64Encoded` is true.
    pub fn http_body() -> Self {
        Self {
            name: "http_body",
            steps: vec![Step::HttpBody],
        }
    }

    /// Takes the value at an RFC 6901 `pointer` (`/detail`, `/Records/0/s3`). Missing: the
    /// body is refused.
    ///
    /// # Panics
    /// When `pointer` is neither empty nor starts with `/` (`detail` for `/detail`): it
    /// would refuse every body, so it fails where the envelope is built, at start-up.
    pub fn pointer(mut self, pointer: impl Into<String>) -> Self {
        self.steps.push(Step::Pointer(checked(pointer.into())));
        self
    }

    /// The value is a string holding JSON (SNS's `Message`, an escaped payload): parses it.
    pub fn json_string(mut self) -> Self {
        self.steps.push(Step::JsonString);
        self
    }

    /// The value is base64 (standard alphabet, padded): decodes it into bytes, which the
    /// next step (or the end) parses as JSON.
    pub fn base64(mut self) -> Self {
        self.steps.push(Step::Base64);
        self
    }

    /// The bytes are gzip: inflates them.
    pub fn gzip(mut self) -> Self {
        self.steps.push(Step::Gzip);
        self
    }

    /// Skips the body when the string at `pointer` equals `value`: a carrier's own
    /// message (a subscription's confirmation, a test event), acknowledged without
    /// running. Checked where it stands among the steps.
    ///
    /// # Panics
    /// As [`pointer`](Self::pointer), for a pointer that does not start with `/`.
    pub fn skip_when(
        mut self,
        pointer: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        self.steps.push(Step::SkipWhen {
            pointer: checked(pointer.into()),
            value: value.into(),
            reason: reason.into(),
        });
        self
    }

    fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The envelope's name: a built-in's (`sns`, `eventbridge`, …) or `custom`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether any step can skip a body: a batch then checks every body before running.
    pub(crate) fn can_skip(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, Step::SkipWhen { .. }))
    }

    /// The request in `body` (raw bytes: an SQS body, a Kinesis record's data).
    pub fn open(&self, body: &[u8]) -> Result<Opened, EnvelopeError> {
        steps::run(&self.steps, steps::Carried::Bytes(body.to_vec()))
            .map_err(|reason| self.error(reason))
    }

    /// The request in `value` (a body already parsed: a stream's image, an invocation's
    /// payload).
    pub fn open_value(&self, value: Value) -> Result<Opened, EnvelopeError> {
        steps::run(&self.steps, steps::Carried::Json(value)).map_err(|reason| self.error(reason))
    }

    fn error(&self, reason: String) -> EnvelopeError {
        EnvelopeError {
            envelope: self.name,
            reason,
        }
    }
}
