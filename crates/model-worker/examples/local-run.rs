//! Runs the worker's real handler over the sample events in `events/`, on the embedded
//! in-memory store and an in-process stand-in for the model provider, playing SQS:
//! records a batch reports as failed are delivered again, up to `maxReceiveCount` times,
//! then left for the dead-letter queue.
//!
//! `cargo run -p model-worker --example local-run`

use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use lambda_idempotency::store::epoch_millis;
use lambda_idempotency::{FailureKind, Idempotency, MemoryStore, Outcome};
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{ModelClient, Worker};
use provider_stub::ProviderStub;
use std::time::{Duration, SystemTime};

/// The redrive policy's `maxReceiveCount`: 3 here to keep the output short (every receive
/// of a failed record prints a line); the SAM template's default is 5.
const MAX_RECEIVE_COUNT: u32 = 3;

const EVENTS: [(&str, &str); 6] = [
    ("single-request.json", "a single request"),
    (
        "same-message-twice.json",
        "SQS delivers the same message again",
    ),
    (
        "producer-duplicate-send.json",
        "the producer sent one request twice (two messageIds, one request_id)",
    ),
    (
        "hash-alike-retry.json",
        "no request_id: a retry with another submitted_at and 0.70 for 0.7",
    ),
    (
        "poison-batch-of-ten.json",
        "a batch of ten with one body that is not JSON",
    ),
    (
        "fifo-two-groups.json",
        "a FIFO batch, two message groups, one request that cannot be sent",
    ),
];

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let provider = ProviderStub::start()
        .await
        .expect("start the provider stand-in");
    let model = ModelClient::new(&provider.base_url(), None).expect("model client");
    let worker = Worker::new(Idempotency::new(MemoryStore::new()), model);
    println!(
        "model-worker, local run: in-memory idempotency store, provider stand-in at {}",
        provider.base_url()
    );

    let events_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../events");
    let mut deliveries = 0;
    // What each delivery did, and what was left for the dead-letter queue.
    let (mut ran, mut replayed, mut joined, mut failed) = (0, 0, 0, 0);
    let mut dead_permanent = 0;
    let mut dead_behind_poison = Vec::new();
    let mut dead_other = 0;
    for (file, what) in EVENTS {
        let text = std::fs::read_to_string(format!("{events_dir}/{file}"))
            .unwrap_or_else(|e| panic!("read events/{file}: {e}"));
        let event: SqsEvent =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("events/{file}: {e}"));
        println!("\n== events/{file}: {what}");
        let mut records = event.records;
        let mut receive = 1;
        while !records.is_empty() {
            if receive > 1 {
                println!(
                    "   -- SQS delivers the {} failed record(s) again (receive {receive})",
                    records.len()
                );
            }
            let before = provider.completion_calls();
            let report = worker.process(invocation(records.clone())).await;
            deliveries += records.len();
            let mut again = Vec::new();
            for (record, message) in report.records.iter().zip(&records) {
                let what = match &record.result {
                    Ok(d) if d.called_model => {
                        ran += 1;
                        format!("called the model: {}", answer(&d.completion))
                    }
                    Ok(d) if d.outcome == Outcome::Joined => {
                        joined += 1;
                        format!(
                            "waited for its twin in this batch, no model call: {}",
                            answer(&d.completion)
                        )
                    }
                    Ok(d) => {
                        replayed += 1;
                        format!(
                            "replayed the stored result, no model call: {}",
                            answer(&d.completion)
                        )
                    }
                    Err(f) => {
                        failed += 1;
                        let next = if receive >= MAX_RECEIVE_COUNT {
                            if f.kind.is_permanent() {
                                dead_permanent += 1;
                            } else if f.kind == FailureKind::SkippedAfterGroupFailure {
                                dead_behind_poison.push(request_label(message));
                            } else {
                                dead_other += 1;
                            }
                            "-> left for the dead-letter queue"
                        } else {
                            again.push(message.clone());
                            "-> handed back to SQS"
                        };
                        match f.kind {
                            FailureKind::InProgress => {
                                format!("in progress in another worker {next}")
                            }
                            _ => format!("failed ({:?}): {} {next}", f.kind, f.reason),
                        }
                    }
                };
                println!(
                    "   {:<8} {:<22} {what}",
                    short(message),
                    request_label(message)
                );
            }
            println!(
                "   batchItemFailures: {}, model calls in this invocation: {}",
                report.failures().count(),
                provider.completion_calls() - before
            );
            records = again;
            receive += 1;
        }
    }
    let dead = dead_permanent + dead_behind_poison.len() + dead_other;
    let mut dead_letters = vec![format!("{dead_permanent} that can never succeed")];
    if !dead_behind_poison.is_empty() {
        dead_letters.push(format!(
            "{} valid ({}) never sent, held back behind its FIFO group's poison message",
            dead_behind_poison.len(),
            dead_behind_poison.join(", ")
        ));
    }
    if dead_other > 0 {
        dead_letters.push(format!("{dead_other} that kept failing"));
    }
    println!(
        "\n{deliveries} deliveries: {ran} requests ran (the provider saw {} model calls), {replayed} replayed a stored result, {joined} joined a twin in its batch, {failed} failed; {dead} messages left for the dead-letter queue: {}.",
        provider.completion_calls(),
        dead_letters.join(", ")
    );
    println!(
        "maxReceiveCount is {MAX_RECEIVE_COUNT} here to keep this output short (each receive of a failed record prints a line); template.yaml's MaxReceiveCount defaults to 5, more receives before a deployed worker dead-letters a message for a passing failure (a provider's 429)."
    );
}

fn invocation(records: Vec<SqsMessage>) -> LambdaEvent<SqsEvent> {
    let mut event = SqsEvent::default();
    event.records = records;
    let mut context = Context::default();
    context.request_id = format!("local-{}", epoch_millis(SystemTime::now()));
    context.deadline = epoch_millis(SystemTime::now() + Duration::from_secs(60));
    LambdaEvent::new(event, context)
}

fn short(message: &SqsMessage) -> String {
    message
        .message_id
        .as_deref()
        .unwrap_or("?")
        .chars()
        .take(8)
        .collect()
}

fn request_label(message: &SqsMessage) -> String {
    let body: serde_json::Value = message
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or_default();
    match body.get("request_id").and_then(|v| v.as_str()) {
        Some(id) => id.to_owned(),
        None if body.is_object() => "(no request_id)".to_owned(),
        None => "(not JSON)".to_owned(),
    }
}

fn answer(completion: &serde_json::Value) -> String {
    let text = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("?");
    let mut short: String = text.chars().take(48).collect();
    if short.len() < text.len() {
        short.push_str("...");
    }
    format!("{short:?}")
}
