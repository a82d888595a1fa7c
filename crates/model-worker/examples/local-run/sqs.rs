//! SQS: failed records are delivered again until `maxReceiveCount`, then dead-lettered.

use super::{Tally, invocation, request_label};
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use model_worker::Worker;
use provider_stub::ProviderStub;

/// The redrive policy's `maxReceiveCount`: 3 here to keep the output short (every receive
/// of a failed record prints a line); the SAM template's default is 5.
pub(super) const MAX_RECEIVE_COUNT: u32 = 3;

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

pub(super) async fn play(worker: &Worker, provider: &ProviderStub, tally: &mut Tally) {
    for (file, what) in EVENTS {
        let event: SqsEvent = super::streams::read(file);
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
            let mut event = SqsEvent::default();
            event.records = records.clone();
            let report = worker.process(invocation(event)).await;
            let mut again = Vec::new();
            for (record, message) in report.records.iter().zip(&records) {
                let last = receive >= MAX_RECEIVE_COUNT;
                let next = match (&record.result, last) {
                    (Ok(_), _) => "",
                    (Err(_), true) => "-> left for the dead-letter queue",
                    // Permanent: no receive will succeed, but SQS decides when to stop.
                    (Err(f), false) if f.kind.is_permanent() => {
                        "-> reported as a batch item failure: SQS delivers it again until maxReceiveCount sends it to the dead-letter queue"
                    }
                    (Err(_), false) => "-> reported as a batch item failure: SQS delivers it again",
                };
                let line = tally.line(&record.result, next);
                match &record.result {
                    Err(f) if last => {
                        if f.kind.is_permanent() {
                            tally.dead_permanent += 1;
                        } else if f.kind
                            == lambda_idempotency::FailureKind::SkippedAfterGroupFailure
                        {
                            tally.dead_valid.push(label(message));
                        } else {
                            tally.dead_other += 1;
                        }
                    }
                    Err(_) => again.push(message.clone()),
                    Ok(_) => {}
                }
                println!("   {:<8} {:<22} {line}", short(message), label(message));
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

fn label(message: &SqsMessage) -> String {
    let body = message
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok());
    request_label(body.as_ref())
}
