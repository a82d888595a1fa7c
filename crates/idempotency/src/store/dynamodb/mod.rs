//! The DynamoDB store.
//!
//! # Table
//! Partition key `id` (string), no sort key, TTL enabled on `expiration`, on-demand
//! capacity. Attribute names default to Powertools' and can be changed with
//! [`AttributeNames`].
//!
//! Or a table of the application's, with a partition key and a sort key (a single-table
//! design), as Powertools offers it: with [`DynamoDbStore::sort_key_attr`], the partition
//! key holds one static value for all of this store's records
//! ([`DynamoDbStore::partition_key_value`], by default `idempotency#<function name>`) and
//! the sort key holds the stored id. Every request addresses that composite key; the
//! item and the requests are otherwise the same. [`DynamoDbStore::check_table`] refuses
//! a table whose key is not the one the settings need.
//!
//! # Protocol
//! 1. **Claim**: one `PutItem` of an `INPROGRESS` item with a fresh lease token, conditioned
//!    on [`CLAIM_CONDITION`]: the key is free, or its lease ended, or it expired without a
//!    live lease, or it is this claim's own in-progress record (an earlier attempt was
//!    applied and its answer lost); an at-most-once claim is conditioned on
//!    [`CLAIM_CONDITION_AT_MOST_ONCE`], which never takes over a lapsed lease.
//!    `ReturnValuesOnConditionCheckFailure = ALL_OLD` lets a
//!    duplicate learn the live record from the same request. Only if a conflict comes back
//!    without the item does the store make one consistent `GetItem`.
//! 2. **Complete**: one `UpdateItem` to `COMPLETED` with the result, conditioned on the
//!    lease token.
//! 3. **Release**: one `DeleteItem`, conditioned on the lease token.
//!
//! A first delivery costs two requests; a duplicate costs one.
//!
//! # Retries and timeouts
//! The engine owns retries: it knows the lease and the invocation's deadline. Give this
//! store a client with the SDK's retries off and attempt timeouts set, as
//! [`DynamoDbStore::from_env`] does ([`client_config`]); otherwise the SDK's own retries
//! multiply the engine's (up to nine `PutItem`s per claim under throttling).
//!
//! # IAM
//! `dynamodb:GetItem`, `PutItem`, `UpdateItem`, `DeleteItem` on the table
//! ([`check_table`](DynamoDbStore::check_table) reads with `GetItem` too; with
//! `dynamodb:DescribeTable` its error names the table's key). With a sort key, a
//! `dynamodb:LeadingKeys` condition on the partition value keeps the function to its own
//! items.
//!
//! # Limitations
//! DynamoDB's TTL deletes expired items late (often within days), so expiry is decided by
//! the `expiration` timestamp in the claim's condition, never by the item being gone.
//! Items are limited to 400 KB and partition keys to 2048 bytes
//! ([`StoreLimits::DYNAMODB`]); with a sort key, stored ids to 1024 bytes (DynamoDB's
//! limit on a sort key).

mod error;
mod item;
mod names;
mod operator;
mod requests;
mod table;
mod writes;

pub use names::AttributeNames;
pub use writes::DynamoDbWrites;

use super::{
    BoxFuture, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, RecordPage, StoreLimits,
    Writes,
};
use crate::error::Error;
use crate::record::{Claim, Record};
use aws_sdk_dynamodb::Client;
use names::KeyLayout;
use std::time::SystemTime;

const BACKEND: &str = "dynamodb";

/// The claim's condition. `#ipe < :now_ms` is false when the attribute is absent or not a
/// number, so an in-progress record without a lease (absent, or `NULL`, as the store's
/// parser reads both) is held until it expires, exactly as [`Record::is_claimable_at`]
/// says. `#id` is the partition key: with a sort key too, every item has both, so
/// `attribute_not_exists(#id)` still means "no record at this key".
pub const CLAIM_CONDITION: &str = "attribute_not_exists(#id) \
    OR (#status = :inprogress AND #ipe < :now_ms) \
    OR (#status = :inprogress AND #tok = :tok) \
    OR (#exp < :now_s AND NOT (#status = :inprogress AND attribute_type(#ipe, :number)))";

/// The condition of an [at-most-once](Claim::at_most_once) claim: [`CLAIM_CONDITION`]
/// without the takeover of a lapsed lease, which frees the key only once the record
/// has expired too. Same names and values, so the request is otherwise the same.
pub const CLAIM_CONDITION_AT_MOST_ONCE: &str = "attribute_not_exists(#id) \
    OR (#status = :inprogress AND #ipe < :now_ms AND #exp < :now_s) \
    OR (#status = :inprogress AND #tok = :tok) \
    OR (#exp < :now_s AND NOT (#status = :inprogress AND attribute_type(#ipe, :number)))";

/// The SDK client settings this store expects: no SDK retries (the engine retries within
/// the lease) and bounded connects and attempts (a stalled request must not hold the
/// invocation until Lambda kills it).
#[cfg(feature = "aws-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "aws-config")))]
pub fn client_config(loader: aws_config::ConfigLoader) -> aws_config::ConfigLoader {
    use aws_config::retry::RetryConfig;
    use aws_config::timeout::TimeoutConfig;
    use std::time::Duration;
    loader.retry_config(RetryConfig::disabled()).timeout_config(
        TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(1))
            .operation_attempt_timeout(crate::config::DEFAULT_STORE_ATTEMPT_TIMEOUT)
            .build(),
    )
}

/// An [`IdempotencyStore`] on a DynamoDB table.
///
/// ```no_run
/// # async fn f() {
/// use lambda_idempotency::{DynamoDbStore, Idempotency};
/// // Region, credentials and AWS_ENDPOINT_URL come from the environment.
/// let store = DynamoDbStore::from_env("idempotency").await;
/// let idempotency = Idempotency::new(store);
/// # let _ = idempotency;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    client: Client,
    table: String,
    names: AttributeNames,
    layout: KeyLayout,
}

impl DynamoDbStore {
    /// A store on `table` using `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            names: AttributeNames::default(),
            layout: KeyLayout::new(),
        }
    }

    /// A store on `table` with a client configured from the environment (region,
    /// credentials, `AWS_ENDPOINT_URL`), as `aws_config::load_defaults` does, with the
    /// SDK's retries off and attempt timeouts set ([`client_config`]): the engine retries.
    #[cfg(feature = "aws-config")]
    #[cfg_attr(docsrs, doc(cfg(feature = "aws-config")))]
    pub async fn from_env(table: impl Into<String>) -> Self {
        Self::from_loader(
            aws_config::defaults(aws_config::BehaviorVersion::latest()),
            table,
        )
        .await
    }

    /// Like [`from_env`](Self::from_env), from a loader you set up (a profile, a region,
    /// an endpoint): [`client_config`] is applied on top.
    #[cfg(feature = "aws-config")]
    #[cfg_attr(docsrs, doc(cfg(feature = "aws-config")))]
    pub async fn from_loader(loader: aws_config::ConfigLoader, table: impl Into<String>) -> Self {
        let config = client_config(loader).load().await;
        Self::new(Client::new(&config), table)
    }

    /// Uses other attribute names.
    pub fn attribute_names(mut self, names: AttributeNames) -> Self {
        self.names = names;
        self
    }

    /// Keeps the records in a table with a sort key (a single-table design), as
    /// Powertools' `sort_key_attr`: the sort key `name` holds the stored id, the partition
    /// key ([`AttributeNames::id`]) holds [`partition_key_value`](Self::partition_key_value).
    /// Both keys are strings. Without this setting the table has no sort key and the
    /// partition key holds the stored id.
    pub fn sort_key_attr(mut self, name: impl Into<String>) -> Self {
        self.layout.sort_key = Some(name.into());
        self
    }

    /// The partition key's value for every record of this store, with a sort key
    /// ([`sort_key_attr`](Self::sort_key_attr)); Powertools' `static_pk_value`. By default
    /// `idempotency#<function name>`, the name read from `AWS_LAMBDA_FUNCTION_NAME` when
    /// the store is made (`idempotency#local` outside Lambda). Set it when an IAM policy
    /// names it (`dynamodb:LeadingKeys`), so a renamed function keeps its records and
    /// its permissions. Two stores with different values never see each other's records.
    #[doc(alias = "static_pk_value")]
    pub fn partition_key_value(mut self, value: impl Into<String>) -> Self {
        self.layout.partition_value = value.into();
        self.layout.partition_value_given = true;
        self
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

impl IdempotencyStore for DynamoDbStore {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn commits_writes(&self, writes: &'static str) -> bool {
        writes == <DynamoDbWrites as crate::store::StoreWrites>::STORE
    }

    fn limits(&self) -> StoreLimits {
        let n = &self.names;
        let names = n.id.len()
            + n.record_attributes()
                .iter()
                .map(|(_, name)| name.len())
                .sum::<usize>();
        StoreLimits {
            max_id_bytes: self.layout.max_id_bytes(),
            // DynamoDB counts every attribute name in the item's size: numbers and the
            // status take under 64 bytes, names what they are; a sort key adds its name
            // and the partition value.
            record_overhead_bytes: 64 + names + self.layout.overhead_bytes(),
            ..StoreLimits::DYNAMODB
        }
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(self.send_claim(claim))
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_completion(claim, data, expiration))
    }

    /// One `TransactWriteItems`: the completion, then the writes ([`DynamoDbWrites`]).
    fn complete_with<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
        writes: &'a Writes,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_completion_with(claim, data, expiration, writes))
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_release(claim))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read_record(id))
    }

    fn forget<'a>(&'a self, record: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        Box::pin(self.send_forget(record))
    }

    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        Box::pin(self.send_list(request))
    }
}
