//! Batch processing with partial batch responses: SQS, Kinesis and DynamoDB Streams.
//!
//! **The event source mapping must enable `ReportBatchItemFailures`**
//! (`FunctionResponseTypes: [ReportBatchItemFailures]` in SAM or CloudFormation).
//! Without it Lambda ignores the `batchItemFailures` these return: an SQS batch that
//! returns successfully is deleted whole, failed records included, and a stream moves its
//! checkpoint past them.
//!
//! One machinery serves every source (this module): records run in groups that keep their
//! order (a FIFO message group, a stream shard) or one by one; a group stops at a failure a
//! retry can fix and goes on past a permanent one ([`FailureKind::is_permanent`]); the
//! batch answers before the invocation's deadline whatever hangs. Each source says what a
//! record's id is (`record::BatchRecord`), how its records are grouped, how a record
//! becomes the handler's JSON input (`json_input`, `skip_reason`: the envelope), and its
//! response type (`BatchResponse`, in `report.rs`).

mod cloudwatch_logs;
#[cfg(feature = "dynamodb-streams")]
mod dynamodb_json;
#[cfg(feature = "dynamodb-streams")]
mod dynamodb_streams;
mod envelope;
mod fifo;
mod kafka;
mod kafka_event;
#[cfg(feature = "kinesis")]
mod kinesis;
mod record;
mod report;
mod settings;
mod sqs;

pub use cloudwatch_logs::{
    AwsLogs, CloudWatchLogsBatch, CloudWatchLogsEvent, LogEvent, NoResponse,
};
#[cfg(feature = "dynamodb-streams")]
pub use dynamodb_streams::{DynamoDbStreamBatch, StreamChange};
pub use kafka::KafkaBatch;
pub use kafka_event::{
    KafkaBatchItemFailure, KafkaBatchResponse, KafkaEvent, KafkaItemIdentifier, KafkaRecord,
};
#[cfg(feature = "kinesis")]
pub use kinesis::KinesisBatch;
pub use report::{
    BatchError, BatchReport, BatchResponse, FailureKind, InvalidBody, PartialBatchResponse,
    PermanentError, RecordFailure, RecordReport, SkippedRecord,
};
pub use sqs::SqsBatch;

use crate::context::invocation::Invocation;
use crate::context::twins::InFlight;
use crate::context::{CallContext, WithCallContext};
use crate::error::BoxError;
use crate::record::lease;
use futures_util::StreamExt;
use record::{BatchRecord, GroupRule};
use settings::Settings;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Mutex;
use std::time::SystemTime;
use tracing::warn;

/// Runs `handler` on `groups` (each group in order, groups concurrently) within an
/// invocation that ends at `deadline`, and reports every record in the event's order.
async fn run_groups<R, T, E, F, Fut, Resp>(
    settings: &Settings,
    groups: Vec<Vec<(usize, R)>>,
    rule: GroupRule,
    deadline: Option<SystemTime>,
    handler: F,
) -> BatchReport<T, Resp>
where
    R: BatchRecord + Clone,
    F: Fn(R) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    // By the record's index in the event; `None` for one not run (a skipped record).
    let mut item_ids: Vec<Option<Option<String>>> = Vec::new();
    for (index, record) in groups.iter().flatten() {
        if item_ids.len() <= *index {
            item_ids.resize(index + 1, None);
        }
        item_ids[*index] = Some(record.item_id());
    }
    let handler = &handler;
    // Each record's report lands as soon as it is known, so a stuck record never turns
    // its finished group-mates into unfinished ones when the deadline cuts in.
    let slots: Mutex<Vec<Option<RecordReport<T>>>> =
        Mutex::new(item_ids.iter().map(|_| None).collect());
    let work = futures_util::stream::iter(groups)
        .map(|group| record::run_group(group, handler, rule, settings.clock.as_ref(), &slots))
        .buffer_unordered(settings.max_concurrency)
        .for_each(|()| std::future::ready(()));
    // Twins (two records with one key) meet within this invocation, not in the store.
    let invocation = deadline.map(|deadline| Invocation {
        deadline,
        answer_by: lease::answer_by(deadline, settings.deadline_margin),
    });
    let cx = CallContext::current()
        .with_invocation(invocation)
        .with_twins(std::sync::Arc::new(InFlight::for_batch()));
    let work = work.with_call_context(cx);
    match invocation {
        Some(invocation) => {
            let left = crate::clock::until(settings.clock.now(), invocation.answer_by);
            if tokio::time::timeout(left, work).await.is_err() {
                warn!(
                    margin = ?settings.deadline_margin,
                    "the invocation's deadline is near: answering now, unfinished records are reported as failures"
                );
            }
        }
        None => work.await,
    }
    BatchReport {
        fail_invocation_when_all_fail: settings.fail_invocation_when_all_fail,
        records: slots
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .zip(item_ids)
            .filter_map(|(slot, item_id)| {
                let item_id = item_id?;
                Some(slot.unwrap_or_else(|| record::unfinished(item_id)))
            })
            .collect(),
        skipped: Vec::new(),
        response: PhantomData,
    }
}

/// A stream batch's groups: the whole batch in order (Lambda sends one shard per batch),
/// or, when order does not matter, every record on its own.
#[cfg(any(feature = "kinesis", feature = "dynamodb-streams"))]
fn stream_groups<R>(
    records: impl IntoIterator<Item = (usize, R)>,
    in_order: bool,
) -> Vec<Vec<(usize, R)>> {
    let records = records.into_iter();
    if in_order {
        vec![records.collect()]
    } else {
        records.map(|r| vec![r]).collect()
    }
}
