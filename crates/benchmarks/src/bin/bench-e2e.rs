//! Store requests per message on each path, and the wall time of a batch of ten with a
//! 50 ms provider, concurrent and one record at a time. Needs the DynamoDB test server
//! (`scripts/bench` starts it).

use aws_lambda_events::event::sqs::SqsEvent;
use benchmarks::{sqs_event, typical_body};
use lambda_idempotency::{DynamoDbStore, Idempotency, IdempotencyBuilder, Outcome};
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{ChatRequest, ModelClient};
use provider_stub::ProviderStub;
use std::time::{Duration, Instant};
use test_support::TestTable;

const RUNS: usize = 7;

#[tokio::main]
async fn main() {
    let provider = ProviderStub::start().await.unwrap();
    let model = ModelClient::new(&provider.base_url(), None).unwrap();
    let table = TestTable::create("bench").await;
    let store = DynamoDbStore::new(table.client.clone(), &table.name);
    let op = model_worker::Worker::operation();
    let build = |b: IdempotencyBuilder| b.build();
    let plain = build(Idempotency::builder(store.clone()));
    let cached = build(Idempotency::builder(store.clone()).local_cache(1024));

    let call = |idem: &Idempotency, id: &str| {
        let (idem, op, model, body) = (
            idem.clone(),
            op.clone(),
            model.clone(),
            typical_body(Some(id)),
        );
        async move {
            let request: ChatRequest = serde_json::from_value(body.clone()).unwrap();
            idem.execute(&op, &body, || async {
                model.complete(&request, None).await
            })
            .await
            .map(|(_, outcome)| outcome)
        }
    };

    println!("## Store requests per message (DynamoDB test server's counters)\n");
    println!("| path | requests | operations |\n|---|---|---|");
    let row = |path: &str, counts: std::collections::HashMap<String, u64>| {
        let total: u64 = counts
            .iter()
            .filter(|(k, _)| k.ends_with("Item"))
            .map(|(_, v)| v)
            .sum();
        let mut ops: Vec<_> = counts
            .into_iter()
            .filter(|(k, _)| k.ends_with("Item"))
            .collect();
        ops.sort();
        let ops: Vec<String> = ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "| {path} | {total} | {} |",
            if ops.is_empty() {
                "none".into()
            } else {
                ops.join(", ")
            }
        );
    };
    table.reset().await;
    assert_eq!(call(&plain, "first").await.unwrap(), Outcome::Executed);
    row("first delivery", table.counts().await);
    table.reset().await;
    assert_eq!(call(&plain, "first").await.unwrap(), Outcome::Replayed);
    row("completed duplicate", table.counts().await);
    provider.set_delay(Duration::from_millis(400));
    let slow = tokio::spawn(call(&plain, "slow"));
    provider.wait_for_requests(2).await;
    table.reset().await;
    assert!(call(&plain, "slow").await.is_err());
    row("in-progress duplicate", table.counts().await);
    slow.await.unwrap().unwrap();
    provider.set_delay(Duration::ZERO);
    call(&cached, "cached").await.unwrap();
    table.reset().await;
    assert_eq!(
        call(&cached, "cached").await.unwrap(),
        Outcome::ReplayedFromCache
    );
    row("local cache hit", table.counts().await);

    println!("\n## A batch of ten with a 50 ms provider (median of {RUNS} runs)\n");
    provider.set_delay(Duration::from_millis(50));
    let mut n = 0;
    let memory = Idempotency::new(lambda_idempotency::MemoryStore::new());
    let mut time_batch = |idem: &Idempotency, size: usize, concurrency: usize| {
        let bodies: Vec<_> = (0..size)
            .map(|_| {
                n += 1;
                typical_body(Some(&format!("batch-{concurrency}-{n}")))
            })
            .collect();
        let event: SqsEvent = serde_json::from_value(sqs_event(&bodies)).unwrap();
        let (idem, model) = (idem.clone(), model.clone());
        async move {
            let batch = lambda_idempotency::SqsBatch::new().max_concurrency(concurrency);
            let started = Instant::now();
            let op = lambda_idempotency::Operation::new(
                "chat_completion",
                lambda_idempotency::KeyStrategy::field("request_id"),
            );
            let report = batch
                .report_json(
                    LambdaEvent::new(event, Context::default()),
                    |body: serde_json::Value, _| {
                        let (idem, op, model) = (&idem, &op, &model);
                        async move {
                            let request: ChatRequest = serde_json::from_value(body.clone())?;
                            idem.execute(op, &body, || async {
                                model.complete(&request, None).await
                            })
                            .await
                            .map(|_| ())
                            .map_err(|e| -> lambda_runtime::Error { e.to_string().into() })
                        }
                    },
                )
                .await;
            assert_eq!(report.failures().count(), 0);
            started.elapsed()
        }
    };
    let mut single = Vec::new();
    let mut concurrent = Vec::new();
    let mut sequential = Vec::new();
    let mut memory_single = Vec::new();
    let mut memory_concurrent = Vec::new();
    for _ in 0..RUNS {
        single.push(time_batch(&plain, 1, 10).await);
        concurrent.push(time_batch(&plain, 10, 10).await);
        sequential.push(time_batch(&plain, 10, 1).await);
        memory_single.push(time_batch(&memory, 1, 10).await);
        memory_concurrent.push(time_batch(&memory, 10, 10).await);
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (one, conc, seq) = (
        median(&mut single),
        median(&mut concurrent),
        median(&mut sequential),
    );
    let (m_one, m_conc) = (median(&mut memory_single), median(&mut memory_concurrent));
    println!("| batch | wall time | ratio |\n|---|---|---|");
    println!(
        "| one record (the slowest record's floor) | {:.1} ms | 1.00 |",
        ms(one)
    );
    println!(
        "| ten records, concurrent (default) | {:.1} ms | {:.2} x one record |",
        ms(conc),
        ratio(conc, one)
    );
    println!(
        "| ten records, one at a time | {:.1} ms | {:.2} x one record |",
        ms(seq),
        ratio(seq, one)
    );
    println!(
        "| in-memory store: one record | {:.1} ms | 1.00 |",
        ms(m_one)
    );
    println!(
        "| in-memory store: ten records, concurrent | {:.1} ms | {:.2} x one record |",
        ms(m_conc),
        ratio(m_conc, m_one)
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}
