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

/// The stores that commit an answer with its record, as the kill test uses them: the store
/// (behind the fault wrapper), its answers table, and how to read that table back.
#[allow(clippy::large_enum_variant)]
enum Answers {
    Memory(lambda_idempotency::MemoryStore),
    Postgres(PostgresStore, tokio_postgres::Client, String, String),
    DynamoDb(lambda_idempotency::DynamoDbStore, test_support::TestTable),
}

impl Answers {
    async fn open(kind: &str) -> Answers {
        match kind {
            "memory" => Answers::Memory(lambda_idempotency::MemoryStore::new()),
            "postgres" => {
                let (url, schema) = (postgres_url(), postgres_schema());
                let records = format!("{schema}.idem_{}", unique("kill"));
                let answers = format!("{schema}.answers_{}", unique("kill"));
                let store = PostgresStore::from_url(&url, &records).unwrap();
                store
                    .create_table()
                    .await
                    .expect("PostgreSQL at POSTGRES_TEST_URL");
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                // `applied` counts every write of a row, the upsert's second one included.
                let count = format!("count_{}", unique("kill"));
                client
                    .batch_execute(&format!(
                        "CREATE TABLE {answers} (id text PRIMARY KEY, request_id text, answer jsonb NOT NULL, applied int NOT NULL DEFAULT 0);
                         CREATE FUNCTION {schema}.{count}() RETURNS trigger AS $$
                           BEGIN NEW.applied := COALESCE(OLD.applied, 0) + 1; RETURN NEW; END $$ LANGUAGE plpgsql;
                         CREATE TRIGGER {count} BEFORE INSERT OR UPDATE ON {answers}
                           FOR EACH ROW EXECUTE FUNCTION {schema}.{count}();"
                    ))
                    .await
                    .unwrap();
                Answers::Postgres(store, client, records, answers)
            }
            _ => {
                let records = test_support::TestTable::create("kill").await;
                let answers = test_support::TestTable::create("kill-answers").await;
                let store =
                    lambda_idempotency::DynamoDbStore::new(records.client.clone(), &records.name);
                Answers::DynamoDb(store, answers)
            }
        }
    }

    fn store(&self) -> std::sync::Arc<dyn IdempotencyStore> {
        match self {
            Answers::Memory(s) => std::sync::Arc::new(s.clone()),
            Answers::Postgres(s, ..) => std::sync::Arc::new(s.clone()),
            Answers::DynamoDb(s, ..) => std::sync::Arc::new(s.clone()),
        }
    }

    fn table(&self) -> model_worker::AnswersTable {
        match self {
            Answers::Memory(_) => model_worker::AnswersTable::Memory("answers".into()),
            Answers::Postgres(_, _, _, answers) => {
                model_worker::AnswersTable::Postgres(answers.clone())
            }
            Answers::DynamoDb(_, answers) => {
                model_worker::AnswersTable::DynamoDb(answers.name.clone())
            }
        }
    }

    /// How many times the answers table was written: every application of a write to it
    /// (PostgreSQL, by a trigger; DynamoDB, by the test server's count of transactions
    /// naming it); the in-memory store commits under one lock and has no count.
    async fn applications(&self) -> Option<u64> {
        match self {
            Answers::Memory(_) => None,
            Answers::Postgres(_, client, _, answers) => {
                let row = client
                    .query_one(
                        &format!("SELECT COALESCE(SUM(applied), 0)::int8 FROM {answers}"),
                        &[],
                    )
                    .await
                    .unwrap();
                Some(row.get::<_, i64>(0) as u64)
            }
            Answers::DynamoDb(_, answers) => Some(
                answers
                    .counts()
                    .await
                    .get("TransactWriteItems")
                    .copied()
                    .unwrap_or(0),
            ),
        }
    }

    /// Every row: the record's id and the answer as JSON.
    async fn rows(&self) -> Vec<(String, Value)> {
        match self {
            Answers::Memory(s) => s
                .table("answers")
                .into_iter()
                .map(|(id, row)| (id, row["answer"].clone()))
                .collect(),
            Answers::Postgres(_, client, _, answers) => client
                .query(&format!("SELECT id, answer::text FROM {answers}"), &[])
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), serde_json::from_str(r.get::<_, &str>(1)).unwrap()))
                .collect(),
            Answers::DynamoDb(_, answers) => answers
                .client
                .scan()
                .table_name(&answers.name)
                .consistent_read(true)
                .send()
                .await
                .unwrap()
                .items()
                .iter()
                .map(|item| {
                    let text = |name: &str| item[name].as_s().unwrap().clone();
                    (text("id"), serde_json::from_str(&text("answer")).unwrap())
                })
                .collect(),
        }
    }

    async fn close(self) {
        if let Answers::Postgres(_, client, records, answers) = self {
            client
                .batch_execute(&format!("DROP TABLE {answers}; DROP TABLE {records}"))
                .await
                .unwrap();
        }
    }
}

/// Over every store that commits an answer with its record: a worker killed at each point,
/// then the message delivered again after its lease. The answers table and the records
/// never disagree: one row per request, holding what its completed record stores; the
/// provider is asked again only when the kill lost its answer before the commit.
#[tokio::test]
async fn a_worker_killed_between_the_answer_and_the_acknowledgement_never_leaves_them_disagreeing()
{
    use lambda_idempotency::Idempotency;
    use lambda_idempotency::store::StoreOp;
    use lambda_idempotency::store::faulty::{Fault, FaultyStore};
    use model_worker::ModelClient;
    use std::time::Duration;

    let single = include_str!("../../../events/single-request.json");
    for kind in ["memory", "postgres", "dynamodb"] {
        for kill in [
            Kill::BeforeTheCommit,
            Kill::DuringTheCommit,
            Kill::BeforeTheAcknowledgement,
        ] {
            let provider = ProviderStub::start().await.unwrap();
            let answers = Answers::open(kind).await;
            let faulty = FaultyStore::new(answers.store());
            let worker = || {
                let idempotency = Idempotency::builder(faulty.clone())
                    .lease(Duration::from_secs(1))
                    .store_attempt_timeout(Duration::from_millis(300))
                    .build();
                let model = ModelClient::new(&provider.base_url(), None).unwrap();
                Worker::new(idempotency, model)
                    .with_answers(answers.table())
                    .unwrap()
            };
            // The first delivery, and the process killed where `kill` says.
            match kill {
                Kill::BeforeTheCommit => faulty.inject(StoreOp::Complete, Fault::Hang, 1),
                Kill::DuringTheCommit => faulty.inject(
                    StoreOp::Complete,
                    Fault::LateApply(Duration::from_millis(50)),
                    1,
                ),
                Kill::BeforeTheAcknowledgement => {}
            }
            let first =
                tokio::time::timeout(Duration::from_millis(250), worker().process(event(single)))
                    .await;
            match kill {
                Kill::BeforeTheAcknowledgement => assert!(first.is_ok(), "{kind}: it finished"),
                _ => assert!(first.is_err(), "{kind} {kill:?}: killed mid-way"),
            }
            // Lambda delivers the message again after the visibility timeout; a new
            // process takes the record over once its lease has ended.
            tokio::time::sleep(Duration::from_millis(1300)).await;
            let again = worker().process(event(single)).await;
            assert!(
                again.records[0].result.is_ok(),
                "{kind} {kill:?}: {:?}",
                again.records[0].result
            );
            let rows = answers.rows().await;
            assert_eq!(rows.len(), 1, "{kind} {kill:?}: one row: {rows:?}");
            let record = faulty
                .get(&rows[0].0)
                .await
                .unwrap()
                .expect("the row's record");
            assert_eq!(
                serde_json::from_str::<Value>(record.data.as_deref().unwrap()).unwrap(),
                rows[0].1,
                "{kind} {kill:?}: the row holds what the record stores"
            );
            if let Some(applied) = answers.applications().await {
                assert_eq!(applied, 1, "{kind} {kill:?}: the answer was written once");
            }
            let calls = match kill {
                Kill::BeforeTheCommit => 2,
                _ => 1,
            };
            assert_eq!(provider.completion_calls(), calls, "{kind} {kill:?}");
            answers.close().await;
        }
    }
}
