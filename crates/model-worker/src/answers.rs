//! Where the worker persists each answer: a table of the application's, written in the
//! same atomic step as the answer's idempotency record (`execute_committing`), so the two
//! never disagree: no answer row without a completed record, no completed record without
//! its row, and never a second row for one request.

use crate::worker::Answer;
use lambda_idempotency::store::Writes;
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
}

impl AnswersTable {
    /// The writes that persist `answer` for the request stored under `id`.
    pub fn writes(&self, id: &str, request_id: Option<&str>, answer: &Answer) -> Writes {
        let row = json!({"request_id": request_id, "answer": answer});
        match self {
            AnswersTable::Memory(table) => Writes::new(MemoryWrites::new().put(table, id, row)),
        }
    }
}
