//! The handler: a batch from SQS, Kinesis or DynamoDB Streams, each record's completion
//! requested at most once.

use crate::answers::AnswersTable;
use crate::config::{StoreChoice, WorkerConfig};
use crate::provider::{ModelClient, ProviderError, refuses_for_good};
use crate::request::ChatRequest;
use crate::startup::{Phases, StoreCheck};
use aws_lambda_events::event::dynamodb::Event as DynamoDbEvent;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_lambda_events::event::streams::{DynamoDbEventResponse, KinesisEventResponse};
use lambda_idempotency::store::Writes;
use lambda_idempotency::store::dynamodb::AttributeNames;
use lambda_idempotency::store::memory::MemoryWrites;
use lambda_idempotency::{
    BatchReport, BatchResponse, DynamoDbStore, DynamoDbStreamBatch, Idempotency, InvalidBody,
    KafkaBatch, KafkaBatchResponse, KafkaEvent, KeyStrategy, KinesisBatch, MemoryStore, Operation,
    Outcome, OutcomeUnknown, PartialBatchResponse, PermanentError, SqsBatch, WithWrites,
    idempotent,
};
use lambda_runtime::{Error, LambdaEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, Instant};
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

/// What the idempotent call stores: the provider's completion, or its refusal of the
/// request. A refusal ([`refuses_for_good`]) is stored like a completion, so a
/// redelivery is refused again from the store instead of asking the provider again; the
/// record still fails, permanently ([`PermanentError`]), and reaches the dead-letter queue or
/// the stream's on-failure destination.
///
/// Stored as the completion itself (records written before refusals were stored read as
/// [`Answer::Completion`]), or as `{"provider_refused": {"status": 400, "body": "..."}}`:
/// exactly that one field, with a status that [`refuses_for_good`], or it reads as a
/// completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum Answer {
    /// The provider refused the request; asking again would get the same answer.
    Refused {
        /// The refusal.
        provider_refused: Refusal,
    },
    /// The provider's JSON response.
    Completion(Value),
}

/// A provider's refusal of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    /// The HTTP status (4xx).
    #[serde(deserialize_with = "refusal_status")]
    pub status: u16,
    /// The start of the answer's body.
    pub body: String,
}

/// A stored status is a refusal only if it is one.
fn refusal_status<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    let status = u16::deserialize(deserializer)?;
    if refuses_for_good(status) {
        Ok(status)
    } else {
        Err(serde::de::Error::custom(format!(
            "{status} is not a refusal"
        )))
    }
}

/// Where a batch came from, read off its first record's `eventSource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `aws:sqs`
    Sqs,
    /// `aws:kinesis`
    Kinesis,
    /// `aws:dynamodb`
    DynamoDbStreams,
    /// `aws:kafka` (Amazon MSK) or `SelfManagedKafka`
    Kafka,
}

impl Source {
    /// The source of `event` (a Lambda event as JSON); `None` for an empty batch, an error
    /// naming what was found for anything else.
    pub fn of(event: &Value) -> Result<Option<Source>, Error> {
        // A Kafka event names its source once, beside a map of partitions.
        if let Some(source @ ("aws:kafka" | "SelfManagedKafka")) =
            event.get("eventSource").and_then(Value::as_str)
        {
            let empty = event
                .get("records")
                .and_then(Value::as_object)
                .is_none_or(|partitions| {
                    partitions
                        .values()
                        .all(|p| p.as_array().is_none_or(Vec::is_empty))
                });
            tracing::debug!(source, "a Kafka event");
            return Ok((!empty).then_some(Source::Kafka));
        }
        let Some(records) = event.get("Records").and_then(Value::as_array) else {
            return Err("model-worker takes SQS, Kinesis, DynamoDB Streams or Kafka events: this event has no `Records` list, and no Kafka `eventSource`".into());
        };
        let Some(first) = records.first() else {
            return Ok(None);
        };
        let source = first
            .get("eventSource")
            .or_else(|| first.get("EventSource"))
            .and_then(Value::as_str)
            .unwrap_or("");
        match source {
            "aws:sqs" => Ok(Some(Source::Sqs)),
            "aws:kinesis" => Ok(Some(Source::Kinesis)),
            "aws:dynamodb" => Ok(Some(Source::DynamoDbStreams)),
            other => Err(format!(
                "model-worker takes SQS, Kinesis, DynamoDB Streams or Kafka events: eventSource {other:?} is none of aws:sqs, aws:kinesis, aws:dynamodb"
            )
            .into()),
        }
    }
}

/// The worker: an idempotency handle and a model client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Worker {
    idempotency: Idempotency,
    model: ModelClient,
    sqs: SqsBatch,
    kinesis: KinesisBatch,
    dynamodb: DynamoDbStreamBatch,
    kafka: KafkaBatch,
    answers: Option<AnswersTable>,
    check: StoreCheck,
}

impl Worker {
    /// A worker over `idempotency`, calling `model`.
    pub fn new(idempotency: Idempotency, model: ModelClient) -> Self {
        Self {
            idempotency,
            model,
            sqs: SqsBatch::new(),
            kinesis: KinesisBatch::new(),
            dynamodb: DynamoDbStreamBatch::new(),
            kafka: KafkaBatch::new(),
            answers: None,
            check: StoreCheck::passed(),
        }
    }

    /// This worker, each claim waiting until `check` passed (one atomic load once it
    /// has): the store's start-up check that runs beside the rest of start-up
    /// ([`idempotency_starting`]). If it fails, no record is claimed: each fails with the
    /// check's error (the binary has exited with status 2 by then).
    pub fn checked_by(mut self, check: StoreCheck) -> Self {
        self.check = check;
        self
    }

    /// This worker, taking each request out of `envelope` (an SNS notification, an
    /// EventBridge event) in its SQS messages: what a queue subscribed to a topic, or a
    /// rule's target queue, receives. Stream records carry the request as they are.
    pub fn with_envelope(mut self, envelope: lambda_idempotency::Envelope) -> Self {
        self.sqs = self.sqs.envelope(envelope);
        self
    }

    /// This worker, persisting each answer to `table` in the same atomic step as its
    /// record. Fails when the store cannot commit writes of the table's kind (a table of
    /// another store; Redis cannot): a deployment that cannot work stops at start-up.
    pub fn with_answers(mut self, table: AnswersTable) -> Result<Self, Error> {
        match &table {
            AnswersTable::Memory(_) => self.idempotency.check_writes::<MemoryWrites>()?,
            AnswersTable::DynamoDb(_) => {
                self.idempotency
                    .check_writes::<lambda_idempotency::store::dynamodb::DynamoDbWrites>()?
            }
            #[cfg(feature = "postgres")]
            AnswersTable::Postgres(_) => {
                self.idempotency
                    .check_writes::<lambda_idempotency::store::postgres::PostgresWrites>()?
            }
        }
        self.answers = Some(table);
        Ok(self)
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

    /// A worker as configured by the environment, its store checked first
    /// ([`idempotency_from_config`]).
    pub async fn from_config(config: &WorkerConfig) -> Result<Self, Error> {
        let idempotency = idempotency_from_config(config).await?;
        Self::configured(idempotency, config)
    }

    /// A worker over `idempotency`, with the model client and the answers table `config`
    /// gives (its secret read: the key is the provider's).
    pub fn configured(idempotency: Idempotency, config: &WorkerConfig) -> Result<Self, Error> {
        let model = ModelClient::new(&config.model_base_url, config.model_api_key.clone())?;
        let mut worker = Self::new(idempotency, model);
        if let Some(envelope) = config.request_envelope {
            worker = worker.with_envelope(envelope.envelope());
        }
        match &config.answers_table {
            Some(name) => worker.with_answers(AnswersTable::for_store(&config.store, name)?),
            None => Ok(worker),
        }
    }

    /// The Lambda handler for any of the three sources: the event's `eventSource` decides
    /// which batch runs, so one build can sit behind SQS, Kinesis or DynamoDB Streams. The
    /// answer is the partial batch response (`batchItemFailures`), the same shape for all
    /// three. An event from another source fails the invocation with a message naming it.
    pub async fn handle_any(&self, event: LambdaEvent<Value>) -> Result<Value, Error> {
        let (payload, context) = event.into_parts();
        let response = match Source::of(&payload)? {
            None => serde_json::to_value(SqsBatchResponse::default())?,
            Some(Source::Sqs) => {
                let event = serde_json::from_value(payload)?;
                serde_json::to_value(self.handle(LambdaEvent::new(event, context)).await?)?
            }
            Some(Source::Kinesis) => {
                let event = serde_json::from_value(payload)?;
                let response = self
                    .handle_kinesis(LambdaEvent::new(event, context))
                    .await?;
                serde_json::to_value(response)?
            }
            Some(Source::DynamoDbStreams) => {
                let event = serde_json::from_value(payload)?;
                let response = self
                    .handle_dynamodb(LambdaEvent::new(event, context))
                    .await?;
                serde_json::to_value(response)?
            }
            Some(Source::Kafka) => {
                let event = serde_json::from_value(payload)?;
                let response = self.handle_kafka(LambdaEvent::new(event, context)).await?;
                serde_json::to_value(response)?
            }
        };
        Ok(response)
    }

    /// The Lambda handler for an SQS event.
    pub async fn handle(
        &self,
        event: LambdaEvent<SqsEvent>,
    ) -> Result<PartialBatchResponse<SqsBatchResponse>, Error> {
        done(self.process(event).await)
    }

    /// The Lambda handler for a Kinesis event.
    pub async fn handle_kinesis(
        &self,
        event: LambdaEvent<KinesisEvent>,
    ) -> Result<PartialBatchResponse<KinesisEventResponse>, Error> {
        done(self.process_kinesis(event).await)
    }

    /// The Lambda handler for a Kafka event (Amazon MSK or self-managed).
    pub async fn handle_kafka(
        &self,
        event: LambdaEvent<KafkaEvent>,
    ) -> Result<PartialBatchResponse<KafkaBatchResponse>, Error> {
        done(self.process_kafka(event).await)
    }

    /// The Lambda handler for a DynamoDB Streams event.
    pub async fn handle_dynamodb(
        &self,
        event: LambdaEvent<DynamoDbEvent>,
    ) -> Result<PartialBatchResponse<DynamoDbEventResponse>, Error> {
        done(self.process_dynamodb(event).await)
    }

    /// Processes an SQS batch and says what happened to each record.
    pub async fn process(&self, event: LambdaEvent<SqsEvent>) -> BatchReport<Delivery> {
        self.sqs
            .report_json(event, |request: ChatRequest, message| async move {
                self.deliver(request, message.message_id.as_deref()).await
            })
            .await
    }

    /// Processes a Kinesis batch (each record's data: the same JSON body as an SQS
    /// message's) and says what happened to each record.
    pub async fn process_kinesis(
        &self,
        event: LambdaEvent<KinesisEvent>,
    ) -> BatchReport<Delivery, KinesisEventResponse> {
        self.kinesis
            .report_json(event, |request: ChatRequest, record| async move {
                let seq = record.kinesis.sequence_number;
                self.deliver(request, Some(&seq)).await
            })
            .await
    }

    /// Processes a Kafka batch (each record's value: the same JSON body as an SQS
    /// message's; partitions at once, each in offset order) and says what happened to each
    /// record.
    pub async fn process_kafka(
        &self,
        event: LambdaEvent<KafkaEvent>,
    ) -> BatchReport<Delivery, KafkaBatchResponse> {
        self.kafka
            .report_json(event, |request: ChatRequest, record| async move {
                let at = format!("{}@{}", record.partition_key, record.offset);
                self.deliver(request, Some(&at)).await
            })
            .await
    }

    /// Processes a DynamoDB Streams batch from a requests table (an item's attributes are
    /// the request's fields; an INSERT or a MODIFY is a request, a REMOVE (an expiry) is
    /// acknowledged without running) and says what happened to each record.
    pub async fn process_dynamodb(
        &self,
        event: LambdaEvent<DynamoDbEvent>,
    ) -> BatchReport<Delivery, DynamoDbEventResponse> {
        self.dynamodb
            .report_json(event, |request: ChatRequest, change| async move {
                let seq = change.record.change.sequence_number;
                self.deliver(request, seq.as_deref()).await
            })
            .await
    }

    /// One record's request: refused for good if it cannot be sent, else its completion,
    /// asked once.
    async fn deliver(
        &self,
        request: ChatRequest,
        item_id: Option<&str>,
    ) -> Result<Delivery, Error> {
        let item_id = item_id.unwrap_or_default().to_owned();
        if let Some(problem) = request.problem() {
            // Permanent, as a body that does not parse: `FailureKind::MalformedBody`.
            return Err(InvalidBody {
                item_id,
                reason: format!("it holds a request that cannot be sent: {problem}"),
            }
            .into());
        }
        let request_id = request.request_id.clone();
        // No claim before the store passed its start-up check.
        self.check.wait().await?;
        let (answer, outcome) = self.complete_with_outcome(request).await?;
        match (answer.value, outcome) {
            (Answer::Completion(completion), outcome) => Ok(Delivery {
                called_model: outcome.ran(),
                outcome,
                completion,
            }),
            (Answer::Refused { provider_refused }, outcome) => {
                let when = if outcome.ran() {
                    "now"
                } else {
                    "earlier (stored; not asked again)"
                };
                Err(PermanentError::new(format!(
                    "the model provider refused request {} {when} with HTTP {}: {}",
                    request_id.as_deref().unwrap_or("(no request_id)"),
                    provider_refused.status,
                    provider_refused.body
                ))
                .into())
            }
        }
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
    async fn complete(&self, request: ChatRequest) -> Result<WithWrites<Answer, Writes>, Error> {
        let deadline = lambda_idempotency::current_deadline();
        let answer = match self.model.complete(&request, deadline).await {
            Ok(completion) => Answer::Completion(completion),
            Err(ProviderError::Status { status, body }) if refuses_for_good(status) => {
                Answer::Refused {
                    provider_refused: Refusal { status, body },
                }
            }
            // At most once, a call the provider may have run keeps its claim: a
            // redelivery never asks again (after the lease it is refused, for an operator).
            Err(e) if e.may_have_run() && self.idempotency.is_at_most_once() => {
                return Err(OutcomeUnknown::new(e).into());
            }
            Err(e) => return Err(e.into()),
        };
        // The answer's row commits with its record (`ANSWERS_TABLE`).
        let writes = match &self.answers {
            Some(table) => {
                let id = self
                    .idempotency
                    .idempotency_id(&Self::operation(), &serde_json::to_value(&request)?)?;
                table.writes(&id, request.request_id.as_deref(), &answer)?
            }
            None => Writes::default(),
        };
        Ok(WithWrites::new(answer, writes))
    }
}

/// The partial batch response, after a log line that sums the batch up.
fn done<R: BatchResponse>(
    report: BatchReport<Delivery, R>,
) -> Result<PartialBatchResponse<R>, Error> {
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

/// The idempotency handle the environment configures (`IDEMPOTENCY_STORE` and the rest),
/// its store checked: a missing, mis-keyed or mistyped table, or a server that does not
/// answer, fails here. For tests and tools; the binaries start with [`idempotency_starting`],
/// whose table check runs beside the runtime's first `/next`.
pub async fn idempotency_from_config(config: &WorkerConfig) -> Result<Idempotency, Error> {
    let (idempotency, table) = store_from_config(config, None).await?;
    if let Some(store) = table {
        check_table(store).await?;
    }
    Ok(idempotency)
}

/// The idempotency handle the environment configures, and its store's check still to
/// start.
///
/// The Redis and PostgreSQL connections are made here (a worker without the library makes
/// them at start-up too); the DynamoDB or PostgreSQL table is checked once the check is
/// started ([`TableCheck::start`]), best last, when the rest of start-up is done: its read then
/// runs beside the runtime's first `/next` without slowing init's own work. The phases go
/// into `phases`: `store_client` (the client, its configuration loaded), `store_connect`
/// (the Redis or PostgreSQL connection).
pub async fn idempotency_starting(
    config: &WorkerConfig,
    phases: &Phases,
) -> Result<(Idempotency, TableCheck), Error> {
    let (idempotency, table) = store_from_config(config, Some(phases)).await?;
    Ok((idempotency, TableCheck(table)))
}

/// Start-up's two waits side by side, neither needing the other: the configuration with
/// its secret read (when one is configured: the `secret` phase), and the handle with its
/// table check still to start ([`idempotency_starting`]). Both binaries start this way.
pub async fn secret_and_store(
    config: &WorkerConfig,
    phases: &Phases,
) -> (
    Result<WorkerConfig, crate::ConfigError>,
    Result<(Idempotency, TableCheck), Error>,
) {
    let secret = async {
        match config.model_api_key_secret_arn {
            Some(_) => {
                phases
                    .time_async("secret", config.clone().read_secrets())
                    .await
            }
            None => Ok(config.clone()),
        }
    };
    tokio::join!(secret, idempotency_starting(config, phases))
}

/// The table's start-up check, not started yet: on DynamoDB, is the table there, may this
/// role read it, is it keyed as configured; on PostgreSQL, is the table there with the
/// store's columns and types. Nothing to check for the other stores.
#[derive(Debug)]
#[must_use = "the table is not checked until its check is started"]
pub struct TableCheck(Option<Table>);

/// A store whose table is checked at start-up.
#[derive(Debug, Clone)]
enum Table {
    DynamoDb(Box<DynamoDbStore>),
    #[cfg(feature = "postgres")]
    Postgres(lambda_idempotency::store::postgres::PostgresStore),
}

impl Table {
    fn name(&self) -> &str {
        match self {
            Table::DynamoDb(store) => store.table(),
            #[cfg(feature = "postgres")]
            Table::Postgres(store) => store.table(),
        }
    }

    fn store(&self) -> &'static str {
        match self {
            Table::DynamoDb(_) => "DynamoDB",
            #[cfg(feature = "postgres")]
            Table::Postgres(_) => "PostgreSQL",
        }
    }

    async fn check(&self) -> Result<(), lambda_idempotency::Error> {
        match self {
            Table::DynamoDb(store) => store.check_table().await,
            #[cfg(feature = "postgres")]
            Table::Postgres(store) => store.check_table().await,
        }
    }
}

impl TableCheck {
    /// Starts the check ([`StoreCheck::start`]): the table's key settings are checked
    /// now, and a problem with them is this call's error; the table's read runs in a task
    /// of its own, its connection the one the first claim uses. Give the result to the
    /// worker ([`Worker::checked_by`]): every claim waits for the check to pass. If the
    /// read fails, `on_failure` gets the error, which names the table (the binaries log
    /// it and exit with status 2).
    pub async fn start(
        self,
        on_failure: impl FnOnce(&Error) + Send + 'static,
    ) -> Result<StoreCheck, Error> {
        match self.0 {
            None => Ok(StoreCheck::passed()),
            Some(store) => StoreCheck::start(check_table(store), on_failure).await,
        }
    }
}

/// The table's start-up check ([`DynamoDbStore::check_table`], `PostgresStore::check_table`),
/// tried again (up to [`TABLE_CHECK_ATTEMPTS`] times in all) while it fails in a way a
/// retry may fix; its error names the table.
async fn check_table(store: Table) -> Result<(), Error> {
    let mut attempt = 1;
    loop {
        match store.check().await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_retryable() && attempt < TABLE_CHECK_ATTEMPTS => {
                tracing::warn!(
                    "the {} table {:?} did not answer its start-up check (attempt {attempt} of {TABLE_CHECK_ATTEMPTS}), trying again: {}",
                    store.store(),
                    store.name(),
                    lambda_idempotency::report(&e)
                );
                tokio::time::sleep(Duration::from_millis(50) * attempt).await;
                attempt += 1;
            }
            Err(e) => {
                return Err(TableCheckFailed {
                    table: store.name().to_owned(),
                    source: e,
                }
                .into());
            }
        }
    }
}

/// How many times the table's start-up check is tried while it fails in a way a retry
/// may fix (throttling, a timeout, a connection reset). Not only for a busy table: an
/// environment that Lambda freezes right after init (one initialised ahead of its first
/// invocation) thaws with the check's request long timed out, and must not stop for it.
pub const TABLE_CHECK_ATTEMPTS: u32 = 3;

/// The table failed its start-up check; the store's error says why.
#[derive(Debug)]
struct TableCheckFailed {
    table: String,
    source: lambda_idempotency::Error,
}

impl std::fmt::Display for TableCheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the idempotency table {:?} (IDEMPOTENCY_TABLE) failed its start-up check",
            self.table
        )
    }
}

impl std::error::Error for TableCheckFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The handle, and the store whose table is still to be checked (DynamoDB, PostgreSQL).
/// Redis and PostgreSQL connect here.
async fn store_from_config(
    config: &WorkerConfig,
    phases: Option<&Phases>,
) -> Result<(Idempotency, Option<Table>), Error> {
    let mut client_started = Instant::now();
    let record = |phase: &'static str, started: &mut Instant| {
        if let Some(phases) = phases {
            phases.record(phase, started.elapsed());
        }
        *started = Instant::now();
    };
    let mut table = None;
    let builder = match &config.store {
        StoreChoice::DynamoDb {
            table: name,
            partition_key,
            sort_key,
            partition_value,
        } => {
            let mut names = AttributeNames::default();
            names.id = partition_key.clone();
            let mut store = DynamoDbStore::from_env(name.clone())
                .await
                .attribute_names(names);
            if let Some(sort_key) = sort_key {
                store = store.sort_key_attr(sort_key);
            }
            if let Some(value) = partition_value {
                store = store.partition_key_value(value);
            }
            record("store_client", &mut client_started);
            // The table is checked by the caller: a missing table, a role that may not
            // read it, or a key that is not the one configured (a sort key missing from
            // the settings or from the table) stops the worker before any claim.
            table = Some(Table::DynamoDb(Box::new(store.clone())));
            Idempotency::builder(store)
        }
        StoreChoice::Memory => {
            record("store_client", &mut client_started);
            Idempotency::builder(MemoryStore::new())
        }
        #[cfg(feature = "redis")]
        StoreChoice::Redis {
            urls,
            cluster,
            namespace,
        } => {
            use lambda_idempotency::store::redis::RedisStore;
            // The client and its connection are one call: `store_connect` holds both.
            record("store_client", &mut client_started);
            let store = if *cluster {
                RedisStore::connect_cluster(urls.clone()).await?
            } else {
                RedisStore::connect(&urls[0]).await?
            };
            record("store_connect", &mut client_started);
            Idempotency::builder(store.namespace(namespace.clone()))
        }
        #[cfg(feature = "postgres")]
        StoreChoice::Postgres { url, table: name } => {
            let store =
                lambda_idempotency::store::postgres::PostgresStore::from_url(url, name.clone())?;
            record("store_client", &mut client_started);
            // At start-up: a wrong URL, password or certificate stops the worker before
            // any message, and the first message does not pay for the connection.
            store.ensure_connected().await?;
            record("store_connect", &mut client_started);
            // Checked by the caller, as DynamoDB's: a missing table, or one without the
            // store's columns and types, stops the worker before any claim.
            table = Some(Table::Postgres(store.clone()));
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
    // At most once with an expiry no longer than a lease is refused here, at start-up.
    let idempotency = builder.at_most_once(config.at_most_once).try_build()?;
    Ok((idempotency, table))
}
