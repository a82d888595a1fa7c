//! CPU the library adds per message: key derivation, record encoding, and one message
//! through the engine over the in-memory store next to the bare function.
//!
//! `cargo bench -p benchmarks --bench library`

use benchmarks::{typical_body, typical_completion};
use criterion::{Criterion, criterion_group, criterion_main};
use lambda_idempotency::store::Record;
use lambda_idempotency::store::Status;
use lambda_idempotency::{DynamoDbStore, Idempotency, KeyStrategy, MemoryStore, Operation};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

const CANONICAL: [&str; 4] = ["model", "messages", "temperature", "max_tokens"];

fn keys(c: &mut Criterion) {
    let with_id = typical_body(Some("req-4471-v9"));
    let without_id = typical_body(None);
    let by_field = KeyStrategy::field("request_id");
    let by_hash = KeyStrategy::field("request_id").or(KeyStrategy::hash(CANONICAL));
    let validation = KeyStrategy::hash(CANONICAL).allow_missing_fields();
    let mut g = c.benchmark_group("key");
    g.bench_function("field request_id", |b| {
        b.iter(|| by_field.derive(black_box(&with_id)).unwrap())
    });
    g.bench_function("hash of 4 fields (JCS + SHA-256)", |b| {
        b.iter(|| by_hash.derive(black_box(&without_id)).unwrap())
    });
    g.bench_function("validation hash of 4 fields", |b| {
        b.iter(|| validation.derive(black_box(&with_id)).unwrap())
    });
    g.bench_function("parse body (serde_json, for scale)", |b| {
        let text = with_id.to_string();
        b.iter(|| serde_json::from_str::<serde_json::Value>(black_box(&text)).unwrap())
    });
    g.finish();
}

fn records(c: &mut Criterion) {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
        .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
        .build();
    let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::from_conf(config), "bench");
    let completion = typical_completion();
    let mut record = Record::new(
        "model-worker.chat_completion#req-4471-v9",
        Status::Completed,
        SystemTime::now() + Duration::from_secs(86400),
    );
    record.in_progress_expiration = Some(SystemTime::now() + Duration::from_secs(60));
    record.data = Some(completion.to_string());
    record.validation = Some("9f".repeat(32));
    record.lease_token = Some("ab".repeat(20));
    let item = store.to_item(&record);
    let mut g = c.benchmark_group("record");
    g.bench_function("encode to a DynamoDB item", |b| {
        b.iter(|| store.to_item(black_box(&record)))
    });
    g.bench_function("decode from a DynamoDB item", |b| {
        b.iter(|| store.from_item(black_box(&item)).unwrap())
    });
    g.bench_function("serialize the result (JSON)", |b| {
        b.iter(|| serde_json::to_string(black_box(&completion)).unwrap())
    });
    g.bench_function("deserialize the stored result (JSON)", |b| {
        let data = record.data.clone().unwrap();
        b.iter(|| serde_json::from_str::<serde_json::Value>(black_box(&data)).unwrap())
    });
    g.finish();
}

fn engine(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let completion = typical_completion();
    let op = Operation::new(
        "chat_completion",
        KeyStrategy::field("request_id").or(KeyStrategy::hash(CANONICAL)),
    )
    .validate(CANONICAL);
    let idem = Idempotency::new(MemoryStore::new());
    let cached = Idempotency::builder(MemoryStore::new())
        .local_cache(1 << 16)
        .build();
    let counter = AtomicU64::new(0);
    let mut g = c.benchmark_group("one message");
    g.bench_function("bare function (no idempotency)", |b| {
        b.to_async(&runtime).iter(|| async {
            let body = typical_body(Some("bare"));
            let result: Result<serde_json::Value, String> = async { Ok(completion.clone()) }.await;
            black_box((body, result))
        })
    });
    g.bench_function("first delivery (in-memory store)", |b| {
        b.to_async(&runtime).iter(|| async {
            let id = format!("first-{}", counter.fetch_add(1, Ordering::Relaxed));
            let body = typical_body(Some(&id));
            idem.execute(&op, &body, || async { Ok::<_, String>(completion.clone()) })
                .await
                .unwrap()
        })
    });
    let replay_body = typical_body(Some("replay"));
    runtime.block_on(async {
        idem.execute(&op, &replay_body, || async {
            Ok::<_, String>(completion.clone())
        })
        .await
        .unwrap();
        cached
            .execute(&op, &replay_body, || async {
                Ok::<_, String>(completion.clone())
            })
            .await
            .unwrap();
    });
    g.bench_function("completed duplicate (in-memory store)", |b| {
        b.to_async(&runtime).iter(|| async {
            let body = typical_body(Some("replay"));
            idem.execute(&op, &body, || async { Ok::<_, String>(completion.clone()) })
                .await
                .unwrap()
        })
    });
    g.bench_function("local cache hit", |b| {
        b.to_async(&runtime).iter(|| async {
            let body = typical_body(Some("replay"));
            cached
                .execute(&op, &body, || async { Ok::<_, String>(completion.clone()) })
                .await
                .unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, keys, records, engine);
criterion_main!(benches);
