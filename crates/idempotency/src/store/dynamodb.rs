//! The DynamoDB store.
//!
//! # Table
//! Partition key `id` (string), no sort key, TTL enabled on `expiration`, on-demand
//! capacity. Attribute names default to Powertools' and can be changed with
//! [`AttributeNames`].
//!
//! # Protocol
//! 1. **Claim**: one `PutItem` of an `INPROGRESS` item with a fresh lease token, conditioned
//!    on [`CLAIM_CONDITION`]: the key is free, or its lease ended, or it expired without a
//!    live lease, or it is this claim's own in-progress record (an earlier attempt was
//!    applied and its answer lost). `ReturnValuesOnConditionCheckFailure = ALL_OLD` lets a
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
//! `dynamodb:GetItem`, `PutItem`, `UpdateItem`, `DeleteItem` on the table.
//!
//! # Limitations
//! DynamoDB's TTL deletes expired items late (often within days), so expiry is decided by
//! the `expiration` timestamp in the claim's condition, never by the item being gone.
//! Items are limited to 400 KB and partition keys to 2048 bytes
//! ([`StoreLimits::DYNAMODB`]).

use super::{BoxFuture, ClaimOutcome, IdempotencyStore, StoreLimits};
use crate::error::Error;
use crate::record::{
    Claim, Record, Status, epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs,
};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use std::collections::HashMap;
use std::time::SystemTime;

const BACKEND: &str = "dynamodb";

/// The claim's condition. `#ipe < :now_ms` is false when the attribute is absent or not a
/// number, so an in-progress record without a lease (absent, or `NULL`, as the store's
/// parser reads both) is held until it expires, exactly as [`Record::is_claimable_at`]
/// says.
pub const CLAIM_CONDITION: &str = "attribute_not_exists(#id) \
    OR (#status = :inprogress AND #ipe < :now_ms) \
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

/// The attribute names of the record, Powertools' by default. Change a field of
/// `AttributeNames::default()` to rename one attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttributeNames {
    /// Partition key. Default `id`.
    pub id: String,
    /// Epoch seconds, the TTL attribute. Default `expiration`.
    pub expiration: String,
    /// Epoch milliseconds. Default `in_progress_expiration`.
    pub in_progress_expiration: String,
    /// Default `status`.
    pub status: String,
    /// Default `data`.
    pub data: String,
    /// Default `validation`.
    pub validation: String,
    /// The fencing token (not in Powertools' schema). Default `lease_token`.
    pub lease_token: String,
}

impl Default for AttributeNames {
    fn default() -> Self {
        Self {
            id: "id".into(),
            expiration: "expiration".into(),
            in_progress_expiration: "in_progress_expiration".into(),
            status: "status".into(),
            data: "data".into(),
            validation: "validation".into(),
            lease_token: "lease_token".into(),
        }
    }
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
}

impl DynamoDbStore {
    /// A store on `table` using `client`.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
            names: AttributeNames::default(),
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

    /// The table name.
    pub fn table(&self) -> &str {
        &self.table
    }

    async fn send_claim(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let n = &self.names;
        let item = self.to_item(&claim.to_record());
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(CLAIM_CONDITION)
            .expression_attribute_names("#id", &n.id)
            .expression_attribute_names("#tok", &n.lease_token)
            .expression_attribute_names("#exp", &n.expiration)
            .expression_attribute_names("#status", &n.status)
            .expression_attribute_names("#ipe", &n.in_progress_expiration)
            .expression_attribute_values(":now_s", secs(claim.now))
            .expression_attribute_values(":now_ms", millis(claim.now))
            .expression_attribute_values(":number", AttributeValue::S("N".into()))
            .expression_attribute_values(":tok", AttributeValue::S(claim.lease_token.clone()))
            .expression_attribute_values(
                ":inprogress",
                AttributeValue::S(Status::InProgress.as_str().into()),
            )
            // The replaced item on success, the blocking one on conflict: both for free.
            .return_values(ReturnValue::AllOld)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            // The claim is written: an old item we cannot read (a foreign item in a shared
            // table) must not turn it into an error that holds the key until the lease ends.
            Ok(out) => Ok(ClaimOutcome::Claimed {
                previous: match out.attributes {
                    Some(old) if !old.is_empty() => match self.parse(&old) {
                        Ok(previous) => Some(previous),
                        Err(err) => {
                            tracing::warn!(error = %crate::error::report(&err), "claimed over an item that is not an idempotency record");
                            None
                        }
                    },
                    _ => None,
                },
            }),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(conflict)) => {
                    match conflict.item() {
                        Some(old) if !old.is_empty() => Ok(ClaimOutcome::Exists(self.parse(old)?)),
                        // Some DynamoDB-compatible servers omit ALL_OLD: read once.
                        _ => Ok(match self.read_record(&claim.id).await? {
                            Some(record) => ClaimOutcome::Exists(record),
                            None => ClaimOutcome::Vanished,
                        }),
                    }
                }
                _ => Err(store_error(err)),
            },
        }
    }

    async fn send_completion(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let (id, token) = (claim.id.as_str(), claim.lease_token.as_str());
        let n = &self.names;
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(&n.id, AttributeValue::S(id.to_owned()))
            .condition_expression("#tok = :tok")
            .expression_attribute_names("#tok", &n.lease_token)
            .expression_attribute_names("#status", &n.status)
            .expression_attribute_names("#exp", &n.expiration)
            .expression_attribute_names("#data", &n.data)
            .expression_attribute_values(":tok", AttributeValue::S(token.to_owned()))
            .expression_attribute_values(
                ":completed",
                AttributeValue::S(Status::Completed.as_str().into()),
            )
            .expression_attribute_values(":exp", secs(expiration));
        let update = match data {
            Some(data) => update
                .update_expression("SET #status = :completed, #exp = :exp, #data = :data")
                .expression_attribute_values(":data", AttributeValue::S(data.to_owned())),
            None => update.update_expression("SET #status = :completed, #exp = :exp REMOVE #data"),
        };
        match update.send().await {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => {
                    Err(Error::LeaseLost { key: id.to_owned() })
                }
                _ => Err(store_error(err)),
            },
        }
    }

    async fn send_release(&self, claim: &Claim) -> Result<(), Error> {
        let (id, token) = (claim.id.as_str(), claim.lease_token.as_str());
        let n = &self.names;
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .key(&n.id, AttributeValue::S(id.to_owned()))
            .condition_expression("#tok = :tok")
            .expression_attribute_names("#tok", &n.lease_token)
            .expression_attribute_values(":tok", AttributeValue::S(token.to_owned()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => {
                    Err(Error::LeaseLost { key: id.to_owned() })
                }
                _ => Err(store_error(err)),
            },
        }
    }

    async fn read_record(&self, id: &str) -> Result<Option<Record>, Error> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(&self.names.id, AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .map_err(store_error)?;
        out.item.as_ref().map(|item| self.parse(item)).transpose()
    }

    /// The DynamoDB item of a record, under this store's attribute names.
    pub fn to_item(&self, record: &Record) -> HashMap<String, AttributeValue> {
        let n = &self.names;
        let mut item = HashMap::with_capacity(7);
        item.insert(n.id.clone(), AttributeValue::S(record.id.clone()));
        item.insert(
            n.status.clone(),
            AttributeValue::S(record.status.as_str().into()),
        );
        item.insert(n.expiration.clone(), secs(record.expiration));
        let optional = [
            (
                &n.in_progress_expiration,
                record.in_progress_expiration.map(millis),
            ),
            (&n.data, record.data.clone().map(AttributeValue::S)),
            (
                &n.validation,
                record.validation.clone().map(AttributeValue::S),
            ),
            (
                &n.lease_token,
                record.lease_token.clone().map(AttributeValue::S),
            ),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                item.insert(name.clone(), value);
            }
        }
        item
    }

    /// The record in a DynamoDB item, or [`Error::Store`] if the item is malformed. A
    /// test hook (and the benchmarks' way to time the parse).
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn from_item(&self, item: &HashMap<String, AttributeValue>) -> Result<Record, Error> {
        self.parse(item)
    }

    fn parse(&self, item: &HashMap<String, AttributeValue>) -> Result<Record, Error> {
        let n = &self.names;
        let malformed = |what: &str| {
            Error::store(
                BACKEND,
                false,
                format!("malformed idempotency item in {}: {what}", self.table),
            )
        };
        let string = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
        // Times past the year 2500 are no record of ours: malformed, not a panic later.
        let number = |name: &str, max: u64| -> Result<Option<u64>, Error> {
            match item.get(name) {
                None | Some(AttributeValue::Null(_)) => Ok(None),
                Some(v) => v
                    .as_n()
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|n| *n <= max)
                    .map(Some)
                    .ok_or_else(|| malformed(&format!("{name} is not a whole number up to {max}"))),
            }
        };
        let max_secs = epoch_secs(crate::clock::far_future());
        let max_millis = epoch_millis(crate::clock::far_future());
        Ok(Record {
            id: string(&n.id).ok_or_else(|| malformed("no id"))?,
            status: string(&n.status)
                .ok_or_else(|| malformed("no status"))?
                .parse()
                .map_err(|e: crate::record::UnknownStatus| malformed(&e.to_string()))?,
            expiration: from_epoch_secs(
                number(&n.expiration, max_secs)?.ok_or_else(|| malformed("no expiration"))?,
            ),
            in_progress_expiration: number(&n.in_progress_expiration, max_millis)?
                .map(from_epoch_millis),
            data: string(&n.data),
            validation: string(&n.validation),
            lease_token: string(&n.lease_token),
        })
    }
}

fn secs(t: SystemTime) -> AttributeValue {
    AttributeValue::N(epoch_secs(t).to_string())
}

fn millis(t: SystemTime) -> AttributeValue {
    AttributeValue::N(epoch_millis(t).to_string())
}

/// Maps an SDK error to [`Error::Store`], marking what a later attempt may fix; the SDK
/// error is the source.
fn store_error<E, R>(err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static + HasStatus,
{
    let retryable = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            service.raw().status_code() >= 500
                || matches!(
                    service.err().code(),
                    Some(
                        "ThrottlingException"
                            | "ProvisionedThroughputExceededException"
                            | "RequestLimitExceeded"
                            | "InternalServerError"
                            | "TransactionConflictException"
                    )
                )
        }
        _ => false,
    };
    // The SDK's own error, boxed: a caller can downcast it (`SdkError<PutItemError, _>`).
    Error::store(BACKEND, retryable, err)
}

/// The HTTP status of a raw response, abstracted so [`store_error`] stays generic.
trait HasStatus {
    fn status_code(&self) -> u16;
}

impl HasStatus for aws_sdk_dynamodb::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

impl IdempotencyStore for DynamoDbStore {
    fn name(&self) -> &'static str {
        BACKEND
    }

    fn limits(&self) -> StoreLimits {
        let n = &self.names;
        let names = [
            &n.id,
            &n.expiration,
            &n.in_progress_expiration,
            &n.status,
            &n.data,
            &n.validation,
            &n.lease_token,
        ];
        StoreLimits {
            // DynamoDB counts every attribute name in the item's size: numbers and the
            // status take under 64 bytes, names what they are.
            record_overhead_bytes: 64 + names.iter().map(|name| name.len()).sum::<usize>(),
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

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.send_release(claim))
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(self.read_record(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> DynamoDbStore {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .build();
        DynamoDbStore::new(Client::from_conf(config), "t")
    }

    #[test]
    fn a_huge_stored_time_is_a_malformed_item_not_a_panic() {
        for (name, value) in [
            ("expiration", "18446744073709551615"),
            ("in_progress_expiration", "18446744073709551615"),
        ] {
            let mut item: HashMap<String, AttributeValue> = [
                ("id", AttributeValue::S("local.op#k".into())),
                ("status", AttributeValue::S("INPROGRESS".into())),
                ("expiration", AttributeValue::N("1".into())),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            item.insert(name.into(), AttributeValue::N(value.into()));
            let parsed = store().from_item(&item);
            assert!(
                matches!(
                    parsed,
                    Err(Error::Store {
                        retryable: false,
                        ..
                    })
                ),
                "{name} = {value}: {parsed:?}"
            );
        }
    }
}
