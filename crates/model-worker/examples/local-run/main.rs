//! Runs the worker's real handler over the sample events in `events/`, on the embedded
//! in-memory store and an in-process stand-in for the model provider, playing each source
//! as Lambda does:
//!
//! - SQS: records a batch reports as failed are delivered again, up to `maxReceiveCount`
//!   times, then left for the dead-letter queue;
//! - Kinesis and DynamoDB Streams: the shard is resent from the lowest reported sequence
//!   number, up to `MaximumRetryAttempts` retries, then the rest of the batch is given to
//!   the on-failure destination and the shard moves on.
//!
//! `cargo run -p model-worker --example local-run`

mod sqs;
mod streams;

use lambda_idempotency::store::Status;
use lambda_idempotency::store::epoch_millis;
use lambda_idempotency::{FailureKind, Idempotency, MemoryStore, Outcome, RecordFailure};
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{AnswersTable, Delivery, ModelClient, Worker};
use provider_stub::ProviderStub;
use std::time::{Duration, SystemTime};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let provider = ProviderStub::start()
        .await
        .expect("start the provider stand-in");
    let model = ModelClient::new(&provider.base_url(), None).expect("model client");
    // The worker's metrics, as its Lambda writes them (CloudWatch embedded metric format).
    let metrics = model_worker::emf::install("model-worker-local").expect("metrics collector");
    let store = MemoryStore::new();
    // Each answer is written to the `answers` table in the same step as its record.
    let worker = Worker::new(Idempotency::new(store.clone()), model)
        .with_answers(AnswersTable::Memory("answers".into()))
        .expect("the in-memory store commits answers with their records");
    println!(
        "model-worker, local run: in-memory idempotency store, provider stand-in at {}",
        provider.base_url()
    );
    let mut tally = Tally::default();
    sqs::play(&worker, &provider, &mut tally).await;
    streams::play(&worker, &provider, &mut tally).await;
    tally.close(&provider);
    show_answers(&store);
    show_metrics(metrics);
}

/// The run's counts as the worker's Lambda logs them after an invocation: one CloudWatch
/// embedded metric format line per label set (here one flush for the whole run).
fn show_metrics(metrics: &metrics_cloudwatch_embedded::Collector) {
    let mut out = Vec::new();
    model_worker::emf::flush(metrics, &mut out);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    println!(
        "\n== the worker's metrics (CloudWatch embedded metric format; {} lines, the outcome counters first):",
        lines.len()
    );
    let mut outcomes: Vec<_> = lines
        .iter()
        .filter(|l| l.get("idempotency_outcomes_total").is_some())
        .collect();
    outcomes.sort_by_key(|l| l["outcome"].as_str().unwrap_or("").to_owned());
    for line in outcomes {
        let mut line = line.clone();
        line["_aws"]["Timestamp"] = serde_json::json!(0);
        println!("{line}");
    }
    println!(
        "... and the batch failures by kind, the store requests and their latency by operation."
    );
}

/// What every delivery did, and what was left for a dead-letter queue or an on-failure
/// destination.
#[derive(Default)]
struct Tally {
    deliveries: usize,
    ran: usize,
    replayed: usize,
    joined: usize,
    failed: usize,
    /// Stream records acknowledged without running (a DynamoDB REMOVE).
    skipped: usize,
    /// Requests the provider refused when asked (a model call, reported failed).
    refused: usize,
    /// SQS messages left for the dead-letter queue: can never succeed, valid never sent,
    /// other.
    dead_permanent: usize,
    dead_valid: Vec<String>,
    dead_other: usize,
    /// Stream records given to the on-failure destination: can never succeed, valid that
    /// had already run (nothing lost), valid never run.
    given_up_permanent: usize,
    given_up_ran: Vec<String>,
    given_up_unrun: Vec<String>,
}

impl Tally {
    /// One line for a record acknowledged without running, counted.
    fn skip_line(&mut self) -> String {
        self.deliveries += 1;
        self.skipped += 1;
        "a removal: acknowledged without running, no model call".to_owned()
    }

    /// One line for one delivery of one record, counted.
    fn line(&mut self, result: &Result<Delivery, RecordFailure>, next: &str) -> String {
        self.deliveries += 1;
        match result {
            Ok(d) if d.called_model => {
                self.ran += 1;
                format!("called the model: {}", answer(&d.completion))
            }
            Ok(d) if d.outcome == Outcome::Joined => {
                self.joined += 1;
                format!(
                    "waited for its twin in this batch, no model call: {}",
                    answer(&d.completion)
                )
            }
            Ok(d) => {
                self.replayed += 1;
                format!(
                    "replayed the stored result, no model call: {}",
                    answer(&d.completion)
                )
            }
            Err(f) => {
                self.failed += 1;
                // The worker's words for a refusal it just received (not a stored one).
                if f.kind == FailureKind::Permanent && f.reason.contains(" now with HTTP") {
                    self.refused += 1;
                }
                match f.kind {
                    FailureKind::InProgress => format!("in progress in another worker {next}"),
                    FailureKind::SkippedAfterGroupFailure => {
                        format!("not run: {} {next}", f.reason)
                    }
                    _ if f.kind.is_permanent() => {
                        format!("failed for good ({:?}): {} {next}", f.kind, f.reason)
                    }
                    _ => format!("failed ({:?}): {} {next}", f.kind, f.reason),
                }
            }
        }
    }

    fn close(&self, provider: &ProviderStub) {
        let dead = self.dead_permanent + self.dead_valid.len() + self.dead_other;
        let mut dead_letters = vec![format!("{} that can never succeed", self.dead_permanent)];
        if !self.dead_valid.is_empty() {
            dead_letters.push(format!(
                "{} valid ({}) never sent",
                self.dead_valid.len(),
                self.dead_valid.join(", ")
            ));
        }
        if self.dead_other > 0 {
            dead_letters.push(format!("{} that kept failing", self.dead_other));
        }
        let given_up =
            self.given_up_permanent + self.given_up_ran.len() + self.given_up_unrun.len();
        let mut destination = vec![format!(
            "{} that can never succeed",
            self.given_up_permanent
        )];
        destination.push(format!(
            "{} valid that had already run, nothing lost",
            self.given_up_ran.len()
        ));
        if !self.given_up_unrun.is_empty() {
            destination.push(format!(
                "{} valid never run ({})",
                self.given_up_unrun.len(),
                self.given_up_unrun.join(", ")
            ));
        }
        println!(
            "\n{} deliveries: {} requests ran and {} was refused by the provider (which saw {} model calls), {} replayed a stored result, {} joined a twin in its batch, {} removals acknowledged without running, {} failed; {dead} SQS messages left for the dead-letter queue: {}; {given_up} stream records given to the on-failure destination: {}.",
            self.deliveries,
            self.ran,
            self.refused,
            provider.completion_calls(),
            self.replayed,
            self.joined,
            self.skipped,
            self.failed,
            dead_letters.join(", "),
            destination.join(", "),
        );
        println!(
            "maxReceiveCount is {} here to keep this output short (each receive of a failed record prints a line); template.yaml's MaxReceiveCount defaults to 5, more receives before a deployed worker dead-letters a message for a passing failure (a provider's 429). Streams are resent {} times here for the same reason; the deployment guide's example mapping sets MaximumRetryAttempts 10.",
            sqs::MAX_RECEIVE_COUNT,
            streams::MAX_RETRY_ATTEMPTS
        );
    }
}

/// A context whose invocation ends in a minute.
fn context() -> Context {
    let mut context = Context::default();
    context.request_id = format!("local-{}", epoch_millis(SystemTime::now()));
    context.deadline = epoch_millis(SystemTime::now() + Duration::from_secs(60));
    context
}

fn invocation<E>(event: E) -> LambdaEvent<E> {
    LambdaEvent::new(event, context())
}

/// The `request_id` of a request body, or what the body is instead.
fn request_label(body: Option<&serde_json::Value>) -> String {
    match body {
        Some(body) => match body.get("request_id").and_then(|v| v.as_str()) {
            Some(id) => id.to_owned(),
            None if body.is_object() => "(no request_id)".to_owned(),
            None => "(not JSON)".to_owned(),
        },
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

/// The answers table beside the records: one row per request that ran, each written in the
/// same step as its completed record.
fn show_answers(store: &MemoryStore) {
    let answers = store.table("answers");
    let with_record = answers
        .keys()
        .filter(|id| {
            store
                .record(id)
                .is_some_and(|r| r.status == Status::Completed)
        })
        .count();
    println!(
        "\n== the answers table: {} rows, {with_record} of them beside their completed record: each was written in the same step as its record (ANSWERS_TABLE)",
        answers.len()
    );
}
