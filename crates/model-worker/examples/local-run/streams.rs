//! Kinesis and DynamoDB Streams: the shard resent from the lowest reported record until
//! `MaximumRetryAttempts`, then the rest of the batch given to the on-failure destination.

use super::{Tally, invocation, request_label};
use aws_lambda_events::event::dynamodb::{Event as DynamoDbEvent, EventRecord};
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use lambda_idempotency::{BatchReport, FailureKind, RecordReport};
use model_worker::{Delivery, Worker};
use provider_stub::ProviderStub;
use serde::de::DeserializeOwned;
use std::future::Future;

/// The event source mapping's `MaximumRetryAttempts`, as the deployment guide sets it.
pub(super) const MAX_RETRY_ATTEMPTS: u32 = 2;

pub(super) async fn play(worker: &Worker, provider: &ProviderStub, tally: &mut Tally) {
    let file = "kinesis-batch.json";
    println!(
        "\n== events/{file}: a Kinesis shard: a producer's re-put, data that is not UTF-8, a request the provider refuses (HTTP 400)"
    );
    let event: KinesisEvent = read(file);
    let shard = Shard {
        seq: |r: &KinesisEventRecord| r.kinesis.sequence_number.clone(),
        label: |r: &KinesisEventRecord| {
            request_label(serde_json::from_slice(&r.kinesis.data.0).ok().as_ref())
        },
    };
    shard
        .play(event.records, provider, tally, |records| async move {
            let mut event = KinesisEvent::default();
            event.records = records;
            aligned(worker.process_kinesis(invocation(event)).await)
        })
        .await;

    let file = "dynamodb-stream-batch.json";
    println!(
        "\n== events/{file}: a DynamoDB stream of a requests table: a MODIFY that changed nothing, an item that is no request, a REMOVE (an expiry: acknowledged, not run)"
    );
    let event: DynamoDbEvent = read(file);
    let shard = Shard {
        seq: |r: &EventRecord| r.change.sequence_number.clone().unwrap_or_default(),
        label: |r: &EventRecord| {
            let keys = serde_json::to_value(&r.change.keys).unwrap_or_default();
            let id = keys["request_id"]["S"].as_str().unwrap_or("?");
            format!("{id} ({})", r.event_name)
        },
    };
    shard
        .play(event.records, provider, tally, |records| async move {
            let mut event = DynamoDbEvent::default();
            event.records = records;
            aligned(worker.process_dynamodb(invocation(event)).await)
        })
        .await;
}

/// How to name a shard's records.
struct Shard<R> {
    seq: fn(&R) -> String,
    label: fn(&R) -> String,
}

impl<R: Clone> Shard<R> {
    /// Invokes over the shard from its checkpoint, as Lambda's poller does.
    async fn play<F, Fut>(
        &self,
        records: Vec<R>,
        provider: &ProviderStub,
        tally: &mut Tally,
        invoke: F,
    ) where
        F: Fn(Vec<R>) -> Fut,
        Fut: Future<Output = Vec<Option<RecordReport<Delivery>>>>,
    {
        let (mut start, mut retries) = (0, 0);
        while start < records.len() {
            if retries > 0 {
                println!(
                    "   -- Lambda resends the shard from sequence number {} (retry {retries} of {MAX_RETRY_ATTEMPTS})",
                    (self.seq)(&records[start])
                );
            }
            let before = provider.completion_calls();
            let batch = records[start..].to_vec();
            let aligned = invoke(batch.clone()).await;
            let lowest = aligned
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.result.is_err()));
            let give_up = lowest.is_some() && retries >= MAX_RETRY_ATTEMPTS;
            for (report, record) in aligned.iter().zip(&batch) {
                let Some(report) = report else {
                    let line = tally.skip_line();
                    println!(
                        "   {:>6} {:<28} {line}",
                        tail((self.seq)(record)),
                        (self.label)(record)
                    );
                    continue;
                };
                let next = match (&report.result, give_up) {
                    (Ok(_), _) => "",
                    (Err(_), true) => "-> given to the on-failure destination",
                    (Err(_), false) => "-> reported",
                };
                let line = tally.line(&report.result, next);
                println!(
                    "   {:>6} {:<28} {line}",
                    tail((self.seq)(record)),
                    (self.label)(record)
                );
            }
            println!(
                "   batchItemFailures: {}, model calls in this invocation: {}",
                aligned
                    .iter()
                    .flatten()
                    .filter(|r| r.result.is_err())
                    .count(),
                provider.completion_calls() - before
            );
            let Some(lowest) = lowest else { break };
            if give_up {
                // The whole resent range goes to the destination; the shard moves past it.
                for (report, record) in aligned.iter().zip(&batch).skip(lowest) {
                    let Some(report) = report else { continue };
                    match &report.result {
                        Err(f) if f.kind.is_permanent() => tally.given_up_permanent += 1,
                        Ok(_) => tally.given_up_ran.push((self.label)(record)),
                        Err(f) if f.kind == FailureKind::SkippedAfterGroupFailure => {
                            tally.given_up_unrun.push((self.label)(record))
                        }
                        Err(_) => tally.given_up_unrun.push((self.label)(record)),
                    }
                }
                break;
            }
            retries = if lowest == 0 { retries + 1 } else { 1 };
            start += lowest;
        }
    }
}

/// A batch's reports by the record's place in the event; `None` for one acknowledged
/// without running (a REMOVE).
fn aligned<R>(report: BatchReport<Delivery, R>) -> Vec<Option<RecordReport<Delivery>>> {
    let len = report.records.len() + report.skipped.len();
    let mut aligned: Vec<Option<RecordReport<Delivery>>> = (0..len).map(|_| None).collect();
    let skipped: Vec<usize> = report.skipped.iter().map(|s| s.index).collect();
    let places = (0..len).filter(|i| !skipped.contains(i));
    for (place, record) in places.zip(report.records) {
        aligned[place] = Some(record);
    }
    aligned
}

/// The last digits of a sequence number, enough to tell a batch's records apart.
fn tail(seq: String) -> String {
    seq[seq.len().saturating_sub(6)..].to_owned()
}

/// A sample event from `events/`.
pub(super) fn read<E: DeserializeOwned>(file: &str) -> E {
    let path = format!("{}/../../events/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read events/{file}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("events/{file}: {e}"))
}
