//! One record: its body parsed, its handler run with panics caught, its failure named.

use super::report::{FailureKind, InvalidBody, RecordFailure, RecordReport};
use crate::error::{BoxError, Error, report};
use aws_lambda_events::event::sqs::SqsMessage;
use futures_util::FutureExt;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use tracing::{Instrument, info, info_span, warn};

pub(super) async fn run_group<T, E, F, Fut>(
    group: Vec<(usize, SqsMessage)>,
    handler: &F,
    slots: &Mutex<Vec<Option<RecordReport<T>>>>,
) where
    F: Fn(SqsMessage) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    let mut failed_before: Option<String> = None;
    for (index, message) in group {
        let message_id = message.message_id.clone();
        let id_text = message_id.clone().unwrap_or_default();
        let result = match &failed_before {
            Some(earlier) => {
                let reason =
                    format!("not run: earlier message {earlier} of its FIFO message group failed");
                warn!(message_id = %id_text, "{reason}");
                Err(RecordFailure {
                    kind: FailureKind::SkippedAfterGroupFailure,
                    reason,
                    error: None,
                })
            }
            None => {
                let span = info_span!("sqs_record", message_id = %id_text);
                run_record(message, handler).instrument(span).await
            }
        };
        if result.is_err() && failed_before.is_none() {
            failed_before = Some(id_text);
        }
        let report = RecordReport { message_id, result };
        slots.lock().unwrap_or_else(|p| p.into_inner())[index] = Some(report);
    }
}

async fn run_record<T, E, F, Fut>(message: SqsMessage, handler: &F) -> Result<T, RecordFailure>
where
    F: Fn(SqsMessage) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    match AssertUnwindSafe(async move { handler(message).await })
        .catch_unwind()
        .await
    {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => {
            let error: BoxError = err.into();
            let kind = failure_kind(error.as_ref());
            let reason = report(error.as_ref());
            match kind {
                FailureKind::InProgress => info!(%reason, "handed back to SQS for redelivery"),
                _ if kind.is_permanent() => {
                    warn!(%reason, ?kind, "record failed for good: no redelivery can fix it, it will reach the dead-letter queue")
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
/// may wrap an [`Error`] or an [`InvalidBody`].
fn failure_kind(error: &(dyn std::error::Error + 'static)) -> FailureKind {
    let mut layer = Some(error);
    while let Some(e) = layer {
        if let Some(e) = e.downcast_ref::<Error>() {
            return match e {
                Error::AlreadyInProgress { .. } => FailureKind::InProgress,
                e if e.is_permanent() => FailureKind::Rejected,
                _ => FailureKind::Error,
            };
        }
        if e.is::<InvalidBody>() {
            return FailureKind::MalformedBody;
        }
        layer = e.source();
    }
    FailureKind::Error
}

pub(super) fn unfinished<T>(message_id: Option<String>) -> RecordReport<T> {
    let reason = "not finished before the invocation's deadline; its claim stays until its lease ends, then a redelivery takes it over".to_owned();
    warn!(
        message_id = message_id.as_deref().unwrap_or_default(),
        "{reason}"
    );
    RecordReport {
        message_id,
        result: Err(RecordFailure {
            kind: FailureKind::Unfinished,
            reason,
            error: None,
        }),
    }
}

/// Parses a message body as JSON, with a clear error naming the message.
pub(super) fn json_body<B: DeserializeOwned>(message: &SqsMessage) -> Result<B, InvalidBody> {
    let id = message.message_id.as_deref().unwrap_or("<no messageId>");
    let body = message.body.as_deref().ok_or_else(|| InvalidBody {
        message_id: id.to_owned(),
        reason: "the message has no body".into(),
    })?;
    serde_json::from_str(body).map_err(|e| InvalidBody {
        message_id: id.to_owned(),
        reason: e.to_string(),
    })
}
