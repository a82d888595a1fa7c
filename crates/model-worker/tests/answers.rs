//! The answers table (`ANSWERS_TABLE`): each answer written in the same step as its record,
//! once, over a store that commits writes with a completion, as the worker is configured
//! by its environment. The in-memory store's is in tests/handler.rs.
#![cfg(feature = "postgres")]

use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::store::postgres::PostgresStore;
use lambda_runtime::{Context, LambdaEvent};
use model_worker::{Worker, WorkerConfig};
use provider_stub::ProviderStub;
use serde_json::Value;
use test_support::servers::{postgres_schema, postgres_url, unique};

fn event(fixture: &str) -> LambdaEvent<SqsEvent> {
    LambdaEvent::new(serde_json::from_str(fixture).unwrap(), Context::default())
}

#[tokio::test]
async fn over_postgres_each_answer_is_committed_with_its_record_once() {
    let provider = ProviderStub::start().await.unwrap();
    let (url, schema) = (postgres_url(), postgres_schema());
    let records = format!("{schema}.idem_{}", unique("answers"));
    let answers = format!("{schema}.answers_{}", unique("answers"));
    let store = PostgresStore::from_url(&url, &records).unwrap();
    store
        .create_table()
        .await
        .expect("PostgreSQL at POSTGRES_TEST_URL");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "CREATE TABLE {answers} (id text PRIMARY KEY, request_id text, answer jsonb NOT NULL)"
        ))
        .await
        .unwrap();
    let vars = [
        ("IDEMPOTENCY_STORE", "postgres".to_owned()),
        ("DATABASE_URL", url.clone()),
        ("IDEMPOTENCY_TABLE", records.clone()),
        ("ANSWERS_TABLE", answers.clone()),
        ("MODEL_BASE_URL", provider.base_url()),
    ];
    let config = WorkerConfig::from_lookup(|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    let worker = Worker::from_config(&config).await.unwrap();
    let single = include_str!("../../../events/single-request.json");
    for _ in 0..3 {
        let report = worker.process(event(single)).await;
        assert!(
            report.records[0].result.is_ok(),
            "{:?}",
            report.records[0].result
        );
    }
    assert_eq!(provider.completion_calls(), 1, "one provider call");
    let rows = client
        .query(&format!("SELECT id, answer::text FROM {answers}"), &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one answer row");
    let (id, answer): (String, String) = (rows[0].get(0), rows[0].get(1));
    let record = store.get(&id).await.unwrap().expect("the row's record");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).unwrap(),
        serde_json::from_str::<Value>(record.data.as_deref().unwrap()).unwrap(),
        "the row holds what the record stores"
    );
    client
        .batch_execute(&format!("DROP TABLE {answers}; DROP TABLE {records}"))
        .await
        .unwrap();
}
