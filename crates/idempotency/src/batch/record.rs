//! One record: its handler run with panics caught, its failure named; and a group of
//! records run in order, stopping where a retry could fix the failure.

use super::report::{FailureKind, InvalidBody, PermanentError, RecordFailure, RecordReport};
use crate::clock::Clock;
use crate::context::record_scope::RecordScope;
use crate::context::{CallContext, WithCallContext};
use crate::error::{BoxError, Error, report};
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{Instrument, info, info_span, warn};

/// What the shared machinery needs of one source's record.
pub(super) trait BatchRecord {
    /// The batch item failure's identifier (message id, sequence number), if it has one.
    fn item_id(&self) -> Option<String>;
}

/// How a group of records (a FIFO message group, a stream shard) keeps its order.
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupRule {
    /// What a group is, for the reason given to the records not run.
    pub(super) noun: &'static str,
    /// Stop at a permanent failure too, not only at one a retry can fix.
    pub(super) stop_at_permanent: bool,
    /// Wait for a key in progress elsewhere when its lease ends at least this long before
    /// the batch must answer, and run the record then, instead of reporting it: a stream's
    /// shard is blocked by it anyway, and every report costs one of its bounded retries.
    /// `None`: never wait.
    pub(super) wait_for_in_progress: Option<Duration>,
}

/// How many times a record waits for a key in progress elsewhere before it is reported.
const MAX_WAITS: u32 = 3;

impl GroupRule {
    /// Whether the group's later records wait for a redelivery after this failure: a
    /// failure a retry can fix must come again before them, in order; a permanent one
    /// never succeeds, so holding them back would only lose them with it.
    fn stops_at(self, kind: FailureKind) -> bool {
        !kind.is_permanent() || self.stop_at_permanent
    }
}

pub(super) async fn run_group<R, T, E, F, Fut>(
    group: Vec<(usize, R)>,
    handler: &F,
    rule: GroupRule,
    clock: &dyn Clock,
    slots: &Mutex<Vec<Option<RecordReport<T>>>>,
) where
    R: BatchRecord + Clone,
    F: Fn(R) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    let mut stopped_at: Option<String> = None;
    for (index, record) in group {
        let item_id = record.item_id();
        let id_text = item_id.clone().unwrap_or_default();
        let result = match &stopped_at {
            Some(earlier) => {
                let noun = rule.noun;
                let reason = format!(
                    "not run: earlier record {earlier} of its {noun} failed and comes again first"
                );
                warn!(item_id = %id_text, "{reason}");
                Err(RecordFailure {
                    kind: FailureKind::SkippedAfterGroupFailure,
                    reason,
                    error: None,
                })
            }
            None => {
                let span = info_span!("batch_record", item_id = %id_text);
                let (mut result, mut attempt) = run_record(record.clone(), handler)
                    .instrument(span.clone())
                    .await;
                let mut waits = 0;
                while let Some(time_to_run) = rule.wait_for_in_progress
                    && waits < MAX_WAITS
                {
                    let Some(wait) = result
                        .as_ref()
                        .err()
                        .and_then(|f| wait_for(f, time_to_run, clock))
                    else {
                        break;
                    };
                    info!(item_id = %id_text, ?wait, "key in progress elsewhere: waiting for its lease, then running the record again");
                    tokio::time::sleep(wait).await;
                    let earlier = attempt;
                    (result, attempt) = run_record(record.clone(), handler)
                        .instrument(span.clone())
                        .await;
                    earlier.carry_outcomes_into(&attempt);
                    waits += 1;
                }
                // Counted once: the attempt that gives the record its answer, with what
                // the attempts before it ran (never their `in_progress`).
                attempt.flush_outcomes();
                result
            }
        };
        if let Err(failure) = &result
            && stopped_at.is_none()
            && rule.stops_at(failure.kind)
        {
            stopped_at = Some(id_text);
        }
        if let Err(failure) = &result {
            crate::metrics::batch_failure(failure.kind.as_str());
        }
        let report = RecordReport { item_id, result };
        slots.lock().unwrap_or_else(|p| p.into_inner())[index] = Some(report);
    }
}

/// How long to wait before running again a record whose key is in progress elsewhere:
/// until its lease ends, when that leaves `time_to_run` before the batch must answer.
fn wait_for(failure: &RecordFailure, time_to_run: Duration, clock: &dyn Clock) -> Option<Duration> {
    if failure.kind != FailureKind::InProgress {
        return None;
    }
    let mut layer: Option<&(dyn std::error::Error + 'static)> = Some(failure.error.as_deref()?);
    let lease_expires = loop {
        let e = layer?;
        if let Some(Error::AlreadyInProgress { lease_expires, .. }) = e.downcast_ref::<Error>() {
            break *lease_expires;
        }
        layer = e.source();
    };
    let claimable = crate::clock::add(lease_expires, Duration::from_millis(1));
    let answer_by = CallContext::read(|cx| cx.invocation)?.answer_by;
    // Checked: a `time_to_run` of `Duration::MAX` never fits, and never overflows.
    let fits = claimable
        .checked_add(time_to_run)
        .is_some_and(|ready| ready <= answer_by);
    fits.then(|| crate::clock::until(clock.now(), claimable))
}

/// Runs one attempt at `record`; the attempt's scope keeps the outcomes it counted, for
/// the batch to emit or drop, and settles the twins of its calls with the record's class.
async fn run_record<R, T, E, F, Fut>(
    record: R,
    handler: &F,
) -> (Result<T, RecordFailure>, Arc<RecordScope>)
where
    F: Fn(R) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    let scope = Arc::new(RecordScope::default());
    let cx = CallContext::current().with_record(scope.clone());
    let attempt = async move { handler(record).await }.with_call_context(cx);
    let result = classify(AssertUnwindSafe(attempt).catch_unwind().await);
    scope.settle_failures(result.as_ref().err().map(|f| f.kind));
    (result, scope)
}

/// A record's answer, its failure named.
fn classify<T, E: Into<BoxError>>(
    answer: Result<Result<T, E>, Box<dyn std::any::Any + Send>>,
) -> Result<T, RecordFailure> {
    match answer {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => {
            let error: BoxError = err.into();
            let kind = failure_kind(error.as_ref());
            let reason = report(error.as_ref());
            match kind {
                FailureKind::InProgress => {
                    info!(%reason, "in progress elsewhere: reported as a batch item failure")
                }
                _ if kind.is_permanent() => {
                    warn!(%reason, ?kind, "record failed for good: reported as a batch item failure, and no later delivery can succeed")
                }
                _ => warn!(%reason, ?kind, "record failed"),
            }
            Err(RecordFailure {
                kind,
                reason,
                error: Some(error),
            })
        }
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".into());
            warn!(%reason, "record handler panicked");
            Err(RecordFailure {
                kind: FailureKind::Panicked,
                reason: format!("the handler panicked: {reason}"),
                error: None,
            })
        }
    }
}

/// The kind of the first error in the chain that this crate knows: a handler's error type
/// may wrap an [`Error`], an [`InvalidBody`] or a [`PermanentError`]. The chain is
/// `source()`, and the error inside an `std::io::Error` (whose `source()` skips it).
fn failure_kind(error: &(dyn std::error::Error + 'static)) -> FailureKind {
    let mut layer = Some(error);
    while let Some(e) = layer {
        if e.is::<PermanentError>() {
            return FailureKind::Permanent;
        }
        if let Some(e) = e.downcast_ref::<Error>() {
            return e.failure_kind();
        }
        if e.is::<InvalidBody>() {
            return FailureKind::MalformedBody;
        }
        layer = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    FailureKind::Error
}

pub(super) fn unfinished<T>(item_id: Option<String>) -> RecordReport<T> {
    let reason = "not finished before the invocation's deadline; its claim stays until its lease ends, and a later delivery may take it over then".to_owned();
    warn!(item_id = item_id.as_deref().unwrap_or_default(), "{reason}");
    crate::metrics::batch_failure(FailureKind::Unfinished.as_str());
    RecordReport {
        item_id,
        result: Err(RecordFailure {
            kind: FailureKind::Unfinished,
            reason,
            error: None,
        }),
    }
}

/// Parses `bytes` as JSON into `B`; an error names the record, never a value from it (a
/// body may hold personal data, and the reason is logged). Bytes that are not UTF-8 are
/// refused as such, even where the handler's type would ignore them.
pub(super) fn json_from_slice<B: DeserializeOwned>(
    item_id: Option<&str>,
    bytes: &[u8],
) -> Result<B, InvalidBody> {
    let invalid = |reason: String| InvalidBody {
        item_id: item_id.unwrap_or("<no item id>").to_owned(),
        reason,
    };
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(invalid(format!(
            "it is not UTF-8 (invalid byte at {})",
            e.valid_up_to()
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| invalid(without_values(&e.to_string())))
}

/// A serde error message without the values it quotes: `invalid type: string "4111…",
/// expected u32` becomes `invalid type: string "…", expected u32`. Field names stay.
pub(super) fn without_values(message: &str) -> String {
    const VALUE_BEFORE_BACKTICK: [&str; 4] =
        ["integer ", "floating point ", "unknown variant ", "char "];
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(['"', '`']) {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let quote = from.chars().next().unwrap_or('"');
        let redact = quote == '"' || VALUE_BEFORE_BACKTICK.iter().any(|v| out.ends_with(v));
        let body = &from[1..];
        let end = if quote == '"' {
            closing_quote(body)
        } else {
            body.find('`')
        };
        let Some(end) = end else {
            out.push_str(if redact { "…" } else { from });
            return out;
        };
        out.push(quote);
        out.push_str(if redact { "…" } else { &body[..end] });
        out.push(quote);
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Where a double-quoted string that starts at `body` ends (a `\"` does not end it).
fn closing_quote(body: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parse_error_keeps_field_names_and_drops_values() {
        for (message, expected) in [
            (
                r#"invalid type: string "my card is 4111", expected a sequence at line 1 column 9"#,
                r#"invalid type: string "…", expected a sequence at line 1 column 9"#,
            ),
            (
                "invalid type: integer `4111111111111111`, expected a string",
                "invalid type: integer `…`, expected a string",
            ),
            (
                "missing field `model` at line 1 column 2",
                "missing field `model` at line 1 column 2",
            ),
            (
                r#"unknown variant `secret`, expected `a` or `b`"#,
                r#"unknown variant `…`, expected `a` or `b`"#,
            ),
            (
                r#"invalid value: string "a \" b", expected x"#,
                r#"invalid value: string "…", expected x"#,
            ),
            (r#"cut off "secret"#, r#"cut off …"#),
        ] {
            assert_eq!(without_values(message), expected);
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_are_refused_even_inside_an_ignored_field() {
        let bytes = b"{\"ignored\": \"\xff\", \"n\": 1}";
        let err = json_from_slice::<serde_json::Value>(Some("7"), bytes).unwrap_err();
        assert_eq!(err.reason, "it is not UTF-8 (invalid byte at 13)");
    }
}
