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

/// Where the worker's process dies, between the provider's answer and the batch's
/// acknowledgement.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// After the provider answered, before the commit reached the store.
    BeforeTheCommit,
    /// While the commit was in flight: the store applies it after the process died.
    DuringTheCommit,
    /// After the commit, before Lambda got the batch's answer.
    BeforeTheAcknowledgement,
}

/// Over the PostgreSQL store (the in-memory one too): a worker killed at each point, then
/// the message delivered again after its lease. The answers table and the records never
/// disagree: one row per request, holding what its completed record stores; the provider
/// is asked again only when the kill lost its answer before the commit.
#[tokio::test]
async fn a_worker_killed_between_the_answer_and_the_acknowledgement_never_leaves_them_disagreeing()
{
    use lambda_idempotency::store::StoreOp;
    use lambda_idempotency::store::faulty::{Fault, FaultyStore};
    use lambda_idempotency::{Idempotency, MemoryStore};
    use model_worker::{AnswersTable, ModelClient};
    use std::time::Duration;

    let (url, schema) = (postgres_url(), postgres_schema());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let single = include_str!("../../../events/single-request.json");
    for kill in [
        Kill::BeforeTheCommit,
        Kill::DuringTheCommit,
        Kill::BeforeTheAcknowledgement,
    ] {
        for over_postgres in [true, false] {
            let provider = ProviderStub::start().await.unwrap();
            let answers = format!("{schema}.answers_{}", unique("kill"));
            let records = format!("{schema}.idem_{}", unique("kill"));
            let memory = MemoryStore::new();
            let postgres = PostgresStore::from_url(&url, &records).unwrap();
            let worker_over = |faulty: &dyn Fn() -> Idempotency| {
                let model = ModelClient::new(&provider.base_url(), None).unwrap();
                Worker::new(faulty(), model)
            };
            let (faulty_pg, faulty_mem) = (
                FaultyStore::new(postgres.clone()),
                FaultyStore::new(memory.clone()),
            );
            let build = || {
                let builder = if over_postgres {
                    Idempotency::builder(faulty_pg.clone())
                } else {
                    Idempotency::builder(faulty_mem.clone())
                };
                builder
                    .lease(Duration::from_secs(1))
                    .store_attempt_timeout(Duration::from_millis(300))
                    .build()
            };
            let table = if over_postgres {
                postgres.create_table().await.unwrap();
                client
                    .batch_execute(&format!(
                        "CREATE TABLE {answers} (id text PRIMARY KEY, request_id text, answer jsonb NOT NULL)"
                    ))
                    .await
                    .unwrap();
                AnswersTable::Postgres(answers.clone())
            } else {
                AnswersTable::Memory("answers".into())
            };
            let worker = worker_over(&build).with_answers(table.clone()).unwrap();
            let faults = |fault| {
                faulty_pg.inject(StoreOp::Complete, fault, 1);
                faulty_mem.inject(StoreOp::Complete, fault, 1);
            };
            // The first delivery, and the process killed where `kill` says.
            match kill {
                Kill::BeforeTheCommit => faults(Fault::Hang),
                Kill::DuringTheCommit => faults(Fault::LateApply(Duration::from_millis(50))),
                Kill::BeforeTheAcknowledgement => {}
            }
            let first =
                tokio::time::timeout(Duration::from_millis(200), worker.process(event(single)))
                    .await;
            match kill {
                Kill::BeforeTheAcknowledgement => assert!(first.is_ok(), "it finished"),
                _ => assert!(first.is_err(), "{kill:?}: killed mid-way"),
            }
            drop(worker);
            // Lambda delivers the message again after the visibility timeout; a new
            // process takes the record over once its lease has ended.
            tokio::time::sleep(Duration::from_millis(1300)).await;
            let worker = worker_over(&build).with_answers(table.clone()).unwrap();
            let again = worker.process(event(single)).await;
            assert!(
                again.records[0].result.is_ok(),
                "{kill:?}: {:?}",
                again.records[0].result
            );

            let rows: Vec<(String, Value)> = if over_postgres {
                client
                    .query(&format!("SELECT id, answer::text FROM {answers}"), &[])
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), serde_json::from_str(r.get::<_, &str>(1)).unwrap()))
                    .collect()
            } else {
                memory
                    .table("answers")
                    .into_iter()
                    .map(|(id, row)| (id, row["answer"].clone()))
                    .collect()
            };
            assert_eq!(
                rows.len(),
                1,
                "{kill:?} over_postgres={over_postgres}: one row"
            );
            let record = if over_postgres {
                postgres.get(&rows[0].0).await.unwrap()
            } else {
                memory.record(&rows[0].0)
            }
            .expect("the row's record");
            assert_eq!(
                serde_json::from_str::<Value>(record.data.as_deref().unwrap()).unwrap(),
                rows[0].1,
                "{kill:?}: the row holds what the record stores"
            );
            let calls = match kill {
                Kill::BeforeTheCommit => 2,
                _ => 1,
            };
            assert_eq!(
                provider.completion_calls(),
                calls,
                "{kill:?} over_postgres={over_postgres}"
            );
            if over_postgres {
                client
                    .batch_execute(&format!("DROP TABLE {answers}; DROP TABLE {records}"))
                    .await
                    .unwrap();
            }
        }
    }
}
