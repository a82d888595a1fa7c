//! Where the worker persists each answer: a table of the application's, written in the
//! same atomic step as the answer's idempotency record (`execute_committing`), so the two
//! never disagree: no answer row without a completed record, no completed record without
//! its row, and never a second row for one request.

use crate::config::StoreChoice;
use crate::worker::Answer;
use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::store::Writes;
use lambda_idempotency::store::dynamodb::DynamoDbWrites;
use lambda_idempotency::store::memory::MemoryWrites;
use serde_json::json;

/// The answers table, in the worker's store (`ANSWERS_TABLE`). One row per request, keyed
/// by the request's stored idempotency id, holding its `request_id` (if any) and the
/// answer as stored (a completion or a refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AnswersTable {
    /// A table of the in-memory store (local runs; `MemoryStore::table`).
    Memory(String),
    /// A DynamoDB table with the partition key `id` (a string), written in the same
    /// `TransactWriteItems` as the record's completion.
    DynamoDb(String),
    /// A PostgreSQL table in the records' database, created by the deployment:
    /// `CREATE TABLE answers (id text PRIMARY KEY, request_id text, answer jsonb NOT NULL)`.
    #[cfg(feature = "postgres")]
    Postgres(String),
}

impl AnswersTable {
    /// The writes that persist `answer` for the request stored under `id`.
    pub fn writes(
        &self,
        id: &str,
        request_id: Option<&str>,
        answer: &Answer,
    ) -> Result<Writes, lambda_runtime::Error> {
        let row = json!({"request_id": request_id, "answer": answer});
        Ok(match self {
            AnswersTable::Memory(table) => Writes::new(MemoryWrites::new().put(table, id, row)),
            // A put: a record that expired and ran again rewrites its one item.
            AnswersTable::DynamoDb(table) => {
                let mut put = Put::builder()
                    .table_name(table)
                    .item("id", AttributeValue::S(id.to_owned()))
                    .item("answer", AttributeValue::S(row["answer"].to_string()));
                if let Some(request_id) = request_id {
                    put = put.item("request_id", AttributeValue::S(request_id.to_owned()));
                }
                Writes::new(DynamoDbWrites::new().put(put.build()?))
            }
            // An upsert: a record that expired and ran again rewrites its one row.
            #[cfg(feature = "postgres")]
            AnswersTable::Postgres(table) => Writes::new(
                lambda_idempotency::store::postgres::PostgresWrites::new().execute(
                    format!(
                        "INSERT INTO {} (id, request_id, answer) VALUES ($1, $2, ($3::text)::jsonb) \
                         ON CONFLICT (id) DO UPDATE SET request_id = EXCLUDED.request_id, answer = EXCLUDED.answer",
                        quoted(table)
                    ),
                    (
                        id.to_owned(),
                        request_id.map(str::to_owned),
                        row["answer"].to_string(),
                    ),
                ),
            ),
        })
    }

    /// The answers table `name` for `store`, if that store can commit it with its records.
    pub fn for_store(store: &StoreChoice, name: &str) -> Result<Self, String> {
        match store {
            StoreChoice::Memory => Ok(AnswersTable::Memory(name.to_owned())),
            StoreChoice::DynamoDb { .. } => Ok(AnswersTable::DynamoDb(name.to_owned())),
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres { .. } => Ok(AnswersTable::Postgres(name.to_owned())),
            other => Err(format!(
                "ANSWERS_TABLE cannot be written with the records of {other:?} in this build"
            )),
        }
    }
}

/// `table` (`name` or `schema.name`) as quoted identifiers: a reserved word or another
/// case is the table as written, never SQL.
#[cfg(feature = "postgres")]
fn quoted(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    #[test]
    fn a_table_name_is_quoted_as_written() {
        assert_eq!(super::quoted("user"), r#""user""#);
        assert_eq!(super::quoted("app.Answers"), r#""app"."Answers""#);
        assert_eq!(super::quoted(r#"a"b"#), r#""a""b""#);
    }
}
