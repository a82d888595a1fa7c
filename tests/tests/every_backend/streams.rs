//! The model worker behind Kinesis and DynamoDB Streams, driven as Lambda's poller drives
//! it against moto's real stream APIs ([`super::poller`]): duplicates of every kind, a
//! worker killed mid-batch, a poison record of each kind with bounded retries. Each test
//! counts the provider's calls per request.

use super::poller::{Aws, Kinesis, RequestsTable, StreamPoller};
use super::redelivery::{Setup, setup};
use lambda_idempotency::store::epoch_millis;
use lambda_runtime::{Context, LambdaEvent};
use provider_stub::ProviderStub;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use test_support::stores::Backend;

/// The retries the deployment guide sets (`MaximumRetryAttempts`).
const MAX_RETRY_ATTEMPTS: u32 = 2;

/// A request whose last message is `content` (unique per request in a test).
fn request(id: &str, content: &str) -> Value {
    json!({"request_id": id, "model": "gpt-4o-mini",
           "messages": [{"role": "user", "content": content}], "max_tokens": 16})
}

/// Chat completion calls per last-message content, in the provider's log.
fn calls(provider: &ProviderStub) -> HashMap<String, usize> {
    let mut calls = HashMap::new();
    for r in provider.requests() {
        let content = r.body["messages"][0]["content"].as_str().unwrap_or("?");
        *calls.entry(content.to_owned()).or_default() += 1;
    }
    calls
}

fn context(deadline: Duration) -> Context {
    let mut context = Context::default();
    context.deadline = epoch_millis(SystemTime::now() + deadline);
    context
}

/// The function as Lambda invokes it: the whole handler, the answer as JSON, an error as
/// `None`.
async fn invoke(s: &Setup, event: Value) -> Option<Value> {
    s.worker
        .handle_any(LambdaEvent::new(event, context(Duration::from_secs(30))))
        .await
        .ok()
}

/// A unique name for a test's stream or table.
fn name(backend: Backend, test: &str) -> String {
    format!("{test}-{backend}-{}", fastrand::u32(..))
}

async fn kinesis_duplicates_of_every_kind_call_the_provider_once(backend: Backend) {
    let s = setup(backend, "kinesis-duplicates").await;
    let aws = Aws::new().await;
    let stream = Kinesis::create(&aws, &name(backend, "dups")).await;
    for i in 1..=5 {
        stream
            .put(
                request(&format!("r{i}"), &format!("request {i}"))
                    .to_string()
                    .as_bytes(),
            )
            .await;
    }
    // The producer's re-put of r2: another record, the same request.
    stream
        .put(request("r2", "request 2").to_string().as_bytes())
        .await;

    let mut poller = StreamPoller::new(MAX_RETRY_ATTEMPTS, 100);
    poller.drain(&stream, |event| invoke(&s, event)).await;
    assert_eq!(poller.invocations.len(), 1, "{:?}", poller.invocations);
    assert_eq!(
        poller.invocations[0].answer,
        Some(json!({"batchItemFailures": []}))
    );

    // Lambda resends the whole batch (its answer was lost): every record is replayed,
    // one store request each.
    s.store.reset_requests();
    poller.rewind();
    poller.drain(&stream, |event| invoke(&s, event)).await;
    let resent = s.store.total_requests();
    assert!(resent <= 6, "{resent} store requests for 6 resent records");

    // A crash after the call: the worker finished r6, its answer never reached Lambda,
    // which invokes the batch again.
    stream
        .put(request("r6", "request 6").to_string().as_bytes())
        .await;
    let crashed = std::sync::atomic::AtomicBool::new(false);
    poller
        .drain(&stream, |event| {
            let first = !crashed.swap(true, std::sync::atomic::Ordering::SeqCst);
            let s = &s;
            async move {
                let answer = invoke(s, event).await;
                if first { None } else { answer }
            }
        })
        .await;
    let calls = calls(&s.provider);
    for i in 1..=6 {
        assert_eq!(calls[&format!("request {i}")], 1, "request {i}: {calls:?}");
    }
    assert!(poller.given_up.is_empty());
}

async fn kinesis_a_worker_killed_mid_batch_replays_what_it_finished(backend: Backend) {
    let s = setup(backend, "kinesis-killed").await;
    let aws = Aws::new().await;
    let stream = Kinesis::create(&aws, &name(backend, "killed")).await;
    let slow = "request 3 [[delay_ms=1500]]";
    for (id, content) in [
        ("k1", "request 1"),
        ("k2", "request 2"),
        ("k3", slow),
        ("k4", "request 4"),
    ] {
        stream
            .put(request(id, content).to_string().as_bytes())
            .await;
    }
    let mut poller = StreamPoller::new(20, 100);
    // The first invocation dies while k3's call is under way; its lease (the invocation's
    // deadline) is 2 s.
    let provider = &s.provider;
    poller
        .poll(&stream, |event| async {
            let dying = s
                .worker
                .handle_any(LambdaEvent::new(event, context(Duration::from_secs(2))));
            tokio::select! {
                _ = dying => panic!("the worker was to die before it answered"),
                () = provider.wait_for_requests(3) => None,
            }
        })
        .await;
    assert_eq!(calls(provider).len(), 3, "k1, k2 done, k3 called");

    // Lambda retries at once, with the whole batch: k1 and k2 replay; k3 is in progress
    // until its lease ends, which is before this invocation must answer, so the batch
    // waits for it and takes it over rather than spend one of the shard's retries.
    poller.drain(&stream, |event| invoke(&s, event)).await;
    let calls = calls(provider);
    assert_eq!(
        [
            calls["request 1"],
            calls["request 2"],
            calls[slow],
            calls["request 4"]
        ],
        [1, 1, 2, 1],
        "k1 and k2 replayed; k3 taken over after its lease (the dead worker's call was lost with it); k4 once"
    );
    assert!(poller.given_up.is_empty(), "nothing given up");
    assert_eq!(
        poller.invocations[1].answer,
        Some(json!({"batchItemFailures": []})),
        "no retry spent on k3: {:?}",
        poller.invocations
    );
}

/// The poison records a stream can carry for the worker: (kind, data, a word of its reason).
/// Request ids are the kind's own; `{kind}-v1` is a valid request of the same batch.
fn poisons() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let kinds = [
        ("not JSON", "invalid body"),
        ("not UTF-8", "invalid body"),
        ("a request that cannot be sent", "cannot be sent"),
        ("another payload under a stored request_id", "payload"),
        ("a request the provider refuses", "HTTP 400"),
    ];
    kinds
        .into_iter()
        .map(|(kind, reason)| {
            let data = match kind {
                "not JSON" => b"{\"request_id\": \"p\", ".to_vec(),
                "not UTF-8" => b"\xff\xfe\xfd".to_vec(),
                "a request that cannot be sent" => {
                    json!({"request_id": format!("{kind}-p"), "model": "m", "messages": []})
                        .to_string()
                        .into_bytes()
                }
                "another payload under a stored request_id" => {
                    request(&format!("{kind}-v1"), "not what v1 asked")
                        .to_string()
                        .into_bytes()
                }
                _ => request(&format!("{kind}-p"), "refuse me [[status=400]]")
                    .to_string()
                    .into_bytes(),
            };
            (kind, data, reason)
        })
        .collect()
}

async fn a_poison_record_of_each_kind_costs_no_valid_record_and_a_passing_failure_keeps_order(
    backend: Backend,
) {
    let s = setup(backend, "kinesis-poison").await;
    let aws = Aws::new().await;
    for (kind, poison, reason) in poisons() {
        let stream = Kinesis::create(&aws, &name(backend, "poison")).await;
        let mut seqs = Vec::new();
        let mut valid = Vec::new();
        for i in 0..12 {
            let data = match i {
                5 => poison.clone(),
                // A provider error that passes: the first call answers 503.
                8 => {
                    let content = format!("{kind}: request 8 [[status_once=503]]");
                    valid.push((i, content.clone()));
                    request(&format!("{kind}-v8"), &content)
                        .to_string()
                        .into_bytes()
                }
                _ => {
                    let content = format!("{kind}: request {i}");
                    valid.push((i, content.clone()));
                    // v1 is the request the mismatching poison reuses.
                    request(&format!("{kind}-v{i}"), &content)
                        .to_string()
                        .into_bytes()
                }
            };
            seqs.push(stream.put(&data).await);
        }
        let reasons = Mutex::new(Vec::new());
        let mut poller = StreamPoller::new(MAX_RETRY_ATTEMPTS, 100);
        let log_start = s.provider.requests().len();
        s.store.reset_requests();
        poller
            .drain(&stream, |event| {
                let (s, reasons) = (&s, &reasons);
                async move {
                    let event = serde_json::from_value(event).unwrap();
                    s.store.reset_requests();
                    let report = s
                        .worker
                        .process_kinesis(LambdaEvent::new(event, context(Duration::from_secs(30))))
                        .await;
                    for r in report.failures() {
                        let reason = r.result.as_ref().unwrap_err().reason.clone();
                        reasons
                            .lock()
                            .unwrap()
                            .push((r.item_id.clone().unwrap(), reason));
                    }
                    report
                        .into_response()
                        .ok()
                        .map(|r| serde_json::to_value(r).unwrap())
                }
            })
            .await;
        let calls = calls(&s.provider);
        for (i, content) in &valid {
            let expected = if *i == 8 { 2 } else { 1 };
            assert_eq!(calls[content], expected, "{kind}: record {i}: {calls:?}");
        }
        // Given up once, from the poison record on: every valid record in that range had run.
        assert_eq!(poller.given_up, [seqs[5..].to_vec()], "{kind}");
        // Reported with its reason on every delivery: the first and both retries.
        let poison_reports: Vec<_> = reasons
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| *id == seqs[5])
            .cloned()
            .collect();
        assert_eq!(
            poison_reports.len(),
            1 + MAX_RETRY_ATTEMPTS as usize,
            "{kind}"
        );
        for (_, why) in &poison_reports {
            assert!(why.contains(reason), "{kind}: {why}");
        }
        // The passing failure kept the shard's order: records 9-11 ran after record 8 did.
        let log: Vec<String> = s.provider.requests()[log_start..]
            .iter()
            .map(|r| {
                r.body["messages"][0]["content"]
                    .as_str()
                    .unwrap_or("?")
                    .to_owned()
            })
            .collect();
        let last_call = |content: &str| log.iter().rposition(|c| c == content).unwrap();
        let order: Vec<usize> = valid.iter().map(|(_, c)| last_call(c)).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "{kind}: calls out of order: {log:?}"
        );
        // The last retry resent records that had all run: one store request each at most.
        let last = poller.invocations.last().unwrap();
        let resent_requests = s.store.total_requests();
        assert!(
            resent_requests <= last.batch.len() as u64,
            "{kind}: {resent_requests} store requests for {} resent records",
            last.batch.len()
        );
        eprintln!(
            "{backend} {kind}: {} invocations; the last resent {} records for {resent_requests} store requests",
            poller.invocations.len(),
            last.batch.len()
        );
    }
}

/// A requests table item: the request's fields as DynamoDB attributes.
fn item(id: &str, content: &str) -> Value {
    json!({
        "request_id": {"S": id}, "model": {"S": "gpt-4o-mini"},
        "messages": {"L": [{"M": {"role": {"S": "user"}, "content": {"S": content}}}]},
        "temperature": {"N": "0.2"}, "max_tokens": {"N": "16"},
    })
}

async fn a_dynamodb_stream_of_requests_runs_each_once_and_gives_up_only_what_cannot_run(
    backend: Backend,
) {
    let s = setup(backend, "dynamodb-stream").await;
    let aws = Aws::new().await;
    let table = RequestsTable::create(&aws, &name(backend, "requests")).await;
    table.put(item("t1", "table request 1")).await;
    table.put(item("t2", "table request 2")).await;
    // moto streams a MODIFY for a put that changes nothing: the same request again.
    table.put(item("t1", "table request 1")).await;
    let mut not_a_request = item("t3", "table request 3");
    not_a_request["messages"] = json!({"S": "not a list"});
    table.put(not_a_request).await;
    table.delete("t2").await;
    table.put(item("t4", "table request 4")).await;

    let mut poller = StreamPoller::new(MAX_RETRY_ATTEMPTS, 100);
    poller.drain(&table, |event| invoke(&s, event)).await;
    let first = &poller.invocations[0];
    let names: Vec<&str> = ["INSERT", "INSERT", "MODIFY", "INSERT", "REMOVE", "INSERT"].to_vec();
    assert_eq!(first.batch.len(), names.len());
    let calls = calls(&s.provider);
    for i in [1, 2, 4] {
        assert_eq!(calls[&format!("table request {i}")], 1, "{calls:?}");
    }
    assert_eq!(calls.len(), 3);
    // The item that is no request fails for good; given up once, with the REMOVE
    // (acknowledged without running) and t4 (which had run).
    assert_eq!(poller.given_up, [first.batch[3..].to_vec()]);

    // Lambda resends the whole shard: nothing is asked again.
    poller.rewind();
    poller.drain(&table, |event| invoke(&s, event)).await;
    assert_eq!(calls.len(), 3);
    assert_eq!(s.provider.completion_calls(), 3);
}

test_support::every_backend!(
    kinesis_duplicates_of_every_kind_call_the_provider_once,
    kinesis_a_worker_killed_mid_batch_replays_what_it_finished,
    a_poison_record_of_each_kind_costs_no_valid_record_and_a_passing_failure_keeps_order,
    a_dynamodb_stream_of_requests_runs_each_once_and_gives_up_only_what_cannot_run,
);
