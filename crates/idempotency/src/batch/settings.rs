//! What every batch type shares, written once: its settings and their setters, and its
//! entry points (`run`, `run_json`, `report_json`, `report`: where a batch enters the call
//! context and opens its records' envelope).

use crate::clock::{Clock, SystemClock};
use crate::envelope::Envelope;
use std::sync::Arc;
use std::time::Duration;

/// Records (or FIFO groups) processed at once by default: an SQS batch's default size.
pub(crate) const DEFAULT_MAX_CONCURRENCY: usize = 10;

/// How long before the invocation's deadline the batch stops waiting for unfinished
/// records and answers Lambda: a response Lambda never gets fails every record of the
/// batch, finished ones included.
pub(crate) const DEFAULT_DEADLINE_MARGIN: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub(super) max_concurrency: usize,
    pub(super) fail_invocation_when_all_fail: bool,
    pub(super) deadline_margin: Duration,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) stop_at_permanent_failures: bool,
    /// Streams and Kafka: run the shard (partition) in order, stopping where a retry could
    /// fix a failure.
    pub(super) in_order: bool,
    /// Streams: wait for a key in progress elsewhere if its lease ends this long before the
    /// batch must answer.
    pub(super) time_to_run_after_a_wait: Option<Duration>,
    /// Where the request sits in each record's body (`run_json`, `report_json`).
    pub(super) envelope: Option<Arc<Envelope>>,
}

/// Streams wait for a key in progress elsewhere only when its lease ends this long before
/// the batch must answer: enough for a model call, so the wait is not thrown away by the
/// deadline.
pub(crate) const DEFAULT_TIME_TO_RUN_AFTER_A_WAIT: Duration = Duration::from_secs(10);

impl Default for Settings {
    fn default() -> Self {
        Self {
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            fail_invocation_when_all_fail: false,
            deadline_margin: DEFAULT_DEADLINE_MARGIN,
            clock: Arc::new(SystemClock),
            stop_at_permanent_failures: false,
            in_order: true,
            time_to_run_after_a_wait: Some(DEFAULT_TIME_TO_RUN_AFTER_A_WAIT),
            envelope: None,
        }
    }
}

/// The setters every batch type has, on a type with a `settings: Settings` field.
macro_rules! batch_setters {
    ($ty:ident, $group:literal) => {
        impl $ty {
            /// Answers this long before the invocation's deadline, reporting records that
            /// have not finished as [`FailureKind::Unfinished`](crate::FailureKind::Unfinished).
            /// Default: 500 ms. Store retries inside the batch stop before it answers,
            /// whatever the margin, so a result that was computed but could not be stored
            /// is reported as such rather than as unfinished.
            pub fn deadline_margin(mut self, margin: std::time::Duration) -> Self {
                self.settings.deadline_margin = margin;
                self
            }

            /// Where the batch reads the time to find how long it may wait
            /// ([`TestClock`](crate::clock::TestClock) in tests; give the handle the same one).
            pub fn clock(mut self, clock: impl crate::clock::Clock + 'static) -> Self {
                self.settings.clock = std::sync::Arc::new(clock);
                self
            }

            #[doc = concat!("At most `n` ", $group, " at once. 1 processes one at a time.")]
            pub fn max_concurrency(mut self, n: usize) -> Self {
                self.settings.max_concurrency = n.max(1);
                self
            }

            /// Fails the invocation when every record failed, instead of reporting each. Holds
            /// however the response is built: `run`, `run_json`, or
            /// [`BatchReport::into_response`](crate::BatchReport::into_response) on a report.
            /// A record acknowledged without running (a DynamoDB Streams `REMOVE`) did not
            /// fail: a batch that has one never fails whole.
            pub fn fail_invocation_when_all_fail(mut self, yes: bool) -> Self {
                self.settings.fail_invocation_when_all_fail = yes;
                self
            }

            /// Stops an ordered group at a permanent failure too
            /// ([`FailureKind::is_permanent`](crate::FailureKind::is_permanent)), not only at
            /// one a retry can fix: for work where even a record that can never succeed must
            /// block the records after it until a person acts. **With bounded retries this
            /// gives up the records after it**: a FIFO group's later messages reach the
            /// dead-letter queue with the poison one; a stream gives the rest of the batch to
            /// its on-failure destination when `MaximumRetryAttempts` runs out, unrun.
            /// Default: off.
            pub fn stop_at_permanent_failures(mut self, yes: bool) -> Self {
                self.settings.stop_at_permanent_failures = yes;
                self
            }

            /// Takes the request out of each record's body before `run_json` parses it
            /// ([`Envelope::sns`](crate::Envelope::sns), [`eventbridge`](crate::Envelope::eventbridge),
            /// …): the typed body, and so the key, the payload hash and the validation, see
            /// the request only. A body that does not open is a
            /// [`MalformedBody`](crate::FailureKind::MalformedBody) failure; a carrier's own
            /// message (an S3 test event) is acknowledged without running, in
            /// [`BatchReport::skipped`](crate::BatchReport::skipped). `run` and `report` hand
            /// the handler the record as it came.
            pub fn envelope(mut self, envelope: crate::Envelope) -> Self {
                self.settings.envelope = Some(std::sync::Arc::new(envelope));
                self
            }
        }
    };
}

pub(super) use batch_setters;

/// The setters of stream batches (Kinesis, DynamoDB Streams, Kafka).
macro_rules! stream_setters {
    ($ty:ident) => {
        impl $ty {
            /// Runs every record, up to [`max_concurrency`](Self::max_concurrency) at once,
            /// and reports each failure, for work that does not care about the shard's
            /// order. Lambda resends from the lowest failure, so the records after it come
            /// again and are answered from the store (a read each, no second call). Default:
            /// off (the shard's order is kept).
            pub fn continue_past_failures(mut self, yes: bool) -> Self {
                self.settings.in_order = !yes;
                self
            }

            /// A record whose key is in progress elsewhere waits for the other worker's
            /// lease to end, then runs, when that leaves at least `time_to_run` before the
            /// batch must answer: the shard is blocked by it anyway, and a report spends one
            /// of the mapping's bounded retries. Otherwise it is reported
            /// ([`InProgress`](crate::FailureKind::InProgress)). Set it to what one record
            /// can take (default: 10 s); `None` never waits.
            pub fn wait_for_in_progress(
                mut self,
                time_to_run: Option<std::time::Duration>,
            ) -> Self {
                self.settings.time_to_run_after_a_wait = time_to_run;
                self
            }
        }
    };
}

pub(super) use stream_setters;

/// `run`, `run_json`, `report_json` and `report` of a batch type, written once: each type
/// gives its event, record, response and JSON input types, and defines
/// `json_input(record) -> Result<(B, $input), InvalidBody>` (how a record becomes the
/// handler's parsed input) and `report_records` (how its records are grouped).
macro_rules! batch_entry_points {
    ($ty:ident, $event:ty, $record:ty, $input:ty, $response:ty, $json_doc:literal) => {
        impl $ty {
            /// Runs `handler` on every record and builds the partial batch response.
            pub async fn run<T, E, F, Fut>(
                &self,
                event: lambda_runtime::LambdaEvent<$event>,
                handler: F,
            ) -> Result<crate::PartialBatchResponse<$response>, crate::BatchError>
            where
                F: Fn($record) -> Fut,
                Fut: std::future::Future<Output = Result<T, E>>,
                E: Into<crate::BoxError>,
            {
                self.report(event, handler).await.into_response()
            }

            #[doc = concat!("Like [`run`](Self::run), with ", $json_doc, " first: one that does not parse is a [`MalformedBody`](crate::FailureKind::MalformedBody) failure, and the handler does not run.")]
            pub async fn run_json<B, T, E, F, Fut>(
                &self,
                event: lambda_runtime::LambdaEvent<$event>,
                handler: F,
            ) -> Result<crate::PartialBatchResponse<$response>, crate::BatchError>
            where
                B: serde::de::DeserializeOwned,
                F: Fn(B, $input) -> Fut,
                Fut: std::future::Future<Output = Result<T, E>>,
                E: Into<crate::BoxError>,
            {
                self.report_json(event, handler).await.into_response()
            }

            /// Like [`run_json`](Self::run_json), returning what happened to each record.
            pub async fn report_json<B, T, E, F, Fut>(
                &self,
                event: lambda_runtime::LambdaEvent<$event>,
                handler: F,
            ) -> crate::BatchReport<T, $response>
            where
                B: serde::de::DeserializeOwned,
                F: Fn(B, $input) -> Fut,
                Fut: std::future::Future<Output = Result<T, E>>,
                E: Into<crate::BoxError>,
            {
                let mut event = event;
                let envelope = self.settings.envelope.clone();
                let envelope = envelope.as_deref();
                let skipped = super::envelope::take_skipped(
                    &mut event.payload.records,
                    |record: &$record| skip_reason(record, envelope),
                );
                let handler = &handler;
                let report = self
                    .report(event, move |record: $record| async move {
                        let (body, input) = json_input::<B>(record, envelope)?;
                        handler(body, input).await.map_err(Into::into)
                    })
                    .await;
                skipped.into_report(report)
            }

            /// Runs `handler` on every record and returns what happened to each.
            pub async fn report<T, E, F, Fut>(
                &self,
                event: lambda_runtime::LambdaEvent<$event>,
                handler: F,
            ) -> crate::BatchReport<T, $response>
            where
                F: Fn($record) -> Fut,
                Fut: std::future::Future<Output = Result<T, E>>,
                E: Into<crate::BoxError>,
            {
                let now = self.settings.clock.now();
                let deadline = crate::context::invocation::context_deadline_at(&event.context, now);
                // The tenant keys every record's ids; a nested `with_deadline` keeps it.
                let from_lambda = crate::context::invocation::from_lambda(&event.context);
                let records = self.report_records(event.payload.records, deadline, handler);
                let cx = crate::context::CallContext::current().with_lambda(from_lambda);
                crate::context::WithCallContext::with_call_context(records, cx).await
            }
        }
    };
}

pub(super) use batch_entry_points;
