//! Batches from fixture events, as Lambda delivers them: SQS (standard and FIFO), Kinesis
//! and DynamoDB Streams, through the machinery they share.

mod cloudwatch_logs;
mod compile;
mod envelope;
mod kafka;
mod sqs;
mod streams;

use lambda_idempotency::store::IdempotencyStore;
use lambda_idempotency::{
    ExecuteError, Idempotency, KeyStrategy, MemoryStore, Operation, Outcome, PermanentError,
};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[derive(Deserialize)]
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) action: String,
}

/// A per-message handler: idempotent on `id`, acting as `action` says.
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) idempotency: Idempotency,
    pub(crate) calls: Arc<AtomicU32>,
}

impl Handler {
    pub(crate) fn new() -> Self {
        Self::over(MemoryStore::new())
    }

    pub(crate) fn over(store: impl IdempotencyStore + 'static) -> Self {
        Self {
            idempotency: Idempotency::new(store),
            calls: Arc::default(),
        }
    }

    pub(crate) async fn handle(&self, job: Job) -> Result<Outcome, lambda_runtime::Error> {
        let op = Operation::new("job", KeyStrategy::field("id"));
        let payload = json!({"id": job.id});
        let calls = &self.calls;
        if job.action == "late" {
            // A copy that arrives after its twin's call has ended.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let result = self
            .idempotency
            .execute(&op, &payload, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                match job.action.as_str() {
                    "fail" => Err(format!("job {} failed", job.id).into()),
                    "refuse" | "refuse-then-linger" => {
                        Err(PermanentError::new(format!("job {} refused", job.id)).into())
                    }
                    "slow-fail" => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err(format!("job {} failed", job.id).into())
                    }
                    "panic" => panic!("job {} panicked", job.id),
                    "slow-panic" => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        panic!("job {} panicked", job.id)
                    }
                    "slow-refuse" => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err(PermanentError::new(format!("job {} refused", job.id)).into())
                    }
                    "slow" => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok(())
                    }
                    _ => Ok::<(), lambda_runtime::Error>(()),
                }
            })
            .await;
        if job.action == "refuse-then-linger" {
            // The handler goes on a while after its call failed, before it answers.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        match result {
            Ok((_, outcome)) => Ok(outcome),
            Err(ExecuteError::Idempotency(e)) => Err(e.into()),
            Err(ExecuteError::Function(e)) => Err(e),
        }
    }
}
