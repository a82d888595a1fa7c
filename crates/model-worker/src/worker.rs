//! The handler: an SQS batch, each record's completion requested at most once.

use crate::config::{StoreChoice, WorkerConfig};
use crate::provider::ModelClient;
use crate::request::{ChatRequest, InvalidRequest};
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_idempotency::{
    BatchReport, DynamoDbStore, Idempotency, InvalidBody, KeyStrategy, MemoryStore, Operation,
    Outcome, SqsBatch, idempotent,
};
use lambda_runtime::{Error, LambdaEvent};
use serde_json::Value;
use tracing::info;

/// What one delivery did.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Whether this delivery called the model (false: the stored completion was replayed,
    /// or a twin in the same batch called it).
    pub called_model: bool,
    /// How the delivery was answered.
    pub outcome: Outcome,
    /// The provider's response.
    pub completion: Value,
}

/// The worker: an idempotency handle and a model client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Worker {
    idempotency: Idempotency,
    model: ModelClient,
    batch: SqsBatch,
}

impl Worker {
    /// A worker over `idempotency`, calling `model`.
    pub fn new(idempotency: Idempotency, model: ModelClient) -> Self {
        Self {
            idempotency,
            model,
            batch: SqsBatch::new(),
        }
    }

    /// The worker's idempotent operation, the one `#[idempotent]` builds on `complete`
    /// (name `chat_completion`, key `request_id` or the hash of
    /// [`ChatRequest::CANONICAL_FIELDS`], which are also validated). For tests and
    /// benchmarks that need its stored ids; a test pins that both give the same ids.
    pub fn operation() -> Operation {
        Operation::new(
            "chat_completion",
            KeyStrategy::field("request_id").or(KeyStrategy::hash(ChatRequest::CANONICAL_FIELDS)),
        )
        .validate(ChatRequest::CANONICAL_FIELDS)
    }

    /// A worker as configured by the environment.
    pub async fn from_config(config: &WorkerConfig) -> Result<Self, Error> {
        let builder = match &config.store {
            StoreChoice::DynamoDb { table } => {
                Idempotency::builder(DynamoDbStore::from_env(table.clone()).await)
            }
            StoreChoice::Memory => Idempotency::builder(MemoryStore::new()),
            #[cfg(feature = "redis")]
            StoreChoice::Redis {
                urls,
                cluster,
                namespace,
            } => {
                use lambda_idempotency::store::redis::RedisStore;
                let store = if *cluster {
                    RedisStore::connect_cluster(urls.clone()).await?
                } else {
                    RedisStore::connect(&urls[0]).await?
                };
                Idempotency::builder(store.namespace(namespace.clone()))
            }
            #[cfg(feature = "postgres")]
            StoreChoice::Postgres { url, table } => {
                let store = lambda_idempotency::store::postgres::PostgresStore::from_url(
                    url,
                    table.clone(),
                )?;
                // At start-up: a wrong URL, password or certificate stops the worker before
                // any message, and the first message does not pay for the connection.
                store.ensure_connected().await?;
                Idempotency::builder(store)
            }
            #[allow(unreachable_patterns)]
            other => {
                return Err(format!("this build has no store for {other:?}").into());
            }
        };
        let builder = match config.expires_after {
            Some(expiry) => builder.expires_after(expiry),
            None => builder,
        };
        let model = ModelClient::new(&config.model_base_url, config.model_api_key.clone())?;
        Ok(Self::new(builder.build(), model))
    }

    /// The Lambda handler: a partial batch response for an SQS event.
    pub async fn handle(&self, event: LambdaEvent<SqsEvent>) -> Result<SqsBatchResponse, Error> {
        let report = self.process(event).await;
        let called = report
            .records
            .iter()
            .filter(|r| matches!(&r.result, Ok(d) if d.called_model))
            .count();
        info!(
            records = report.records.len(),
            model_calls = called,
            failures = report.failures().count(),
            "batch done"
        );
        Ok(report.into_response()?)
    }

    /// Processes a batch and says what happened to each record.
    pub async fn process(&self, event: LambdaEvent<SqsEvent>) -> BatchReport<Delivery> {
        self.batch
            .report_json(event, |request: ChatRequest, message| async move {
                if let Some(problem) = request.problem() {
                    // Permanent, as a body that does not parse: `FailureKind::MalformedBody`.
                    let invalid = InvalidRequest {
                        message_id: message.message_id.unwrap_or_default(),
                        problem,
                    };
                    return Err(InvalidBody {
                        reason: invalid.to_string(),
                        message_id: invalid.message_id,
                    }
                    .into());
                }
                let (completion, outcome) = self.complete_with_outcome(request).await?;
                Ok::<_, Error>(Delivery {
                    called_model: outcome.ran(),
                    outcome,
                    completion,
                })
            })
            .await
    }

    /// Asks the model once per request: a duplicate gets the stored completion.
    /// `complete_with_outcome` also says whether this call asked the model.
    #[idempotent(
        handle = self.idempotency,
        payload = request,
        key = "request_id",
        hash = ChatRequest::CANONICAL_FIELDS,
        validate = ChatRequest::CANONICAL_FIELDS,
        operation = "chat_completion",
        with_outcome
    )]
    async fn complete(&self, request: ChatRequest) -> Result<Value, Error> {
        let deadline = lambda_idempotency::current_deadline();
        Ok(self.model.complete(&request, deadline).await?)
    }
}
