//! The function's own writes, committed with the completion in one `TransactWriteItems`
//! ([`DynamoDbWrites`]), and how the transaction's answer is read: the completion is item
//! 0, the function's writes follow in their order.

use super::{BACKEND, DynamoDbStore};
use crate::error::Error;
use crate::record::{Claim, Status};
use crate::store::{StoreWrites, Writes};
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, ConditionCheck, Delete, Put,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use std::collections::HashMap;
use std::fmt;
use std::time::SystemTime;

/// DynamoDB's limit on the items of one transaction, the completion included.
const MAX_TRANSACTION_ITEMS: usize = 100;
/// DynamoDB's limit on the aggregate size of a transaction's items.
const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;

/// The function's own writes to DynamoDB, committed in one `TransactWriteItems` with its
/// idempotency record's completion: all of them and the completion, or nothing. Each is a
/// `TransactWriteItem` of the SDK (a `Put`, `Update`, `Delete` or `ConditionCheck`), on any
/// table of the account and region, the store's own included (but not the record's own
/// item: DynamoDB refuses two operations on one item in a transaction).
///
/// At most [`MAX_ITEMS`](Self::MAX_ITEMS) (DynamoDB takes 100 items in a transaction, and
/// the completion is one) and 4 MB in all, estimated from the request before it is sent;
/// more is refused before any request ([`Error::WritesRefused`]). A write whose own
/// condition fails refuses them all ([`Error::WritesRefused`], naming the write's index and
/// table, never its values), and the claim is released.
///
/// ```
/// use aws_sdk_dynamodb::types::{AttributeValue, Put};
/// use lambda_idempotency::store::dynamodb::DynamoDbWrites;
///
/// let answer = Put::builder()
///     .table_name("answers")
///     .item("id", AttributeValue::S("r-1".into()))
///     .item("answer", AttributeValue::S("4".into()))
///     .condition_expression("attribute_not_exists(id)")
///     .build()
///     .unwrap();
/// let writes = DynamoDbWrites::new().put(answer);
/// assert_eq!(writes.len(), 1);
/// ```
///
/// IAM: each item is authorized by its own action on its table (`dynamodb:PutItem`,
/// `UpdateItem`, `DeleteItem`, `ConditionCheckItem`); there is no `TransactWriteItems`
/// action. The completion needs `dynamodb:UpdateItem` on the store's table, as without
/// writes.
#[derive(Debug, Clone, Default)]
pub struct DynamoDbWrites {
    items: Vec<TransactWriteItem>,
}

impl DynamoDbWrites {
    /// The most writes one completion takes: DynamoDB's 100 items in a transaction, less
    /// the completion.
    pub const MAX_ITEMS: usize = MAX_TRANSACTION_ITEMS - 1;

    /// No writes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `item`, after the ones already added.
    pub fn item(mut self, item: TransactWriteItem) -> Self {
        self.items.push(item);
        self
    }

    /// Adds a `Put`.
    pub fn put(self, put: Put) -> Self {
        self.item(TransactWriteItem::builder().put(put).build())
    }

    /// Adds an `Update`.
    pub fn update(self, update: Update) -> Self {
        self.item(TransactWriteItem::builder().update(update).build())
    }

    /// Adds a `Delete`.
    pub fn delete(self, delete: Delete) -> Self {
        self.item(TransactWriteItem::builder().delete(delete).build())
    }

    /// Adds a `ConditionCheck`: writes nothing, refuses them all if its condition fails.
    pub fn condition_check(self, check: ConditionCheck) -> Self {
        self.item(TransactWriteItem::builder().condition_check(check).build())
    }

    /// The writes, in order.
    pub fn items(&self) -> &[TransactWriteItem] {
        &self.items
    }

    /// How many writes.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl From<Vec<TransactWriteItem>> for DynamoDbWrites {
    fn from(items: Vec<TransactWriteItem>) -> Self {
        Self { items }
    }
}

impl StoreWrites for DynamoDbWrites {
    const STORE: &'static str = BACKEND;

    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// One write's operation, table and key, as errors name them (never its values).
struct Target<'a> {
    verb: &'static str,
    table: &'a str,
    /// The key, or for a `Put` the whole item.
    key: &'a HashMap<String, AttributeValue>,
}

fn target(item: &TransactWriteItem) -> Option<Target<'_>> {
    if let Some(put) = item.put() {
        return Some(Target {
            verb: "Put",
            table: put.table_name(),
            key: put.item(),
        });
    }
    if let Some(update) = item.update() {
        return Some(Target {
            verb: "Update",
            table: update.table_name(),
            key: update.key(),
        });
    }
    if let Some(delete) = item.delete() {
        return Some(Target {
            verb: "Delete",
            table: delete.table_name(),
            key: delete.key(),
        });
    }
    item.condition_check().map(|check| Target {
        verb: "ConditionCheck",
        table: check.table_name(),
        key: check.key(),
    })
}

/// An over-estimate of what `item` adds to the transaction's size: every name, value
/// and expression it carries, each attribute with a few bytes more than DynamoDB counts.
/// (An `Update` counts the item it leaves, which may be larger than the request: DynamoDB
/// refuses such a transaction itself, with a `ValidationException`.)
pub(super) fn estimated_bytes(item: &TransactWriteItem) -> usize {
    fn values(map: Option<&HashMap<String, AttributeValue>>) -> usize {
        map.map_or(0, |m| m.iter().map(|(k, v)| k.len() + value_bytes(v)).sum())
    }
    fn names(map: Option<&HashMap<String, String>>) -> usize {
        map.map_or(0, |m| m.iter().map(|(k, v)| k.len() + v.len()).sum())
    }
    let opt = |s: Option<&str>| s.map_or(0, str::len);
    if let Some(put) = item.put() {
        put.table_name().len()
            + values(Some(put.item()))
            + opt(put.condition_expression())
            + names(put.expression_attribute_names())
            + values(put.expression_attribute_values())
    } else if let Some(u) = item.update() {
        u.table_name().len()
            + values(Some(u.key()))
            + u.update_expression().len()
            + opt(u.condition_expression())
            + names(u.expression_attribute_names())
            + values(u.expression_attribute_values())
    } else if let Some(d) = item.delete() {
        d.table_name().len()
            + values(Some(d.key()))
            + opt(d.condition_expression())
            + names(d.expression_attribute_names())
            + values(d.expression_attribute_values())
    } else if let Some(c) = item.condition_check() {
        c.table_name().len()
            + values(Some(c.key()))
            + c.condition_expression().len()
            + names(c.expression_attribute_names())
            + values(c.expression_attribute_values())
    } else {
        0
    }
}

/// An attribute value's size, over-estimated: DynamoDB counts a number at about one byte
/// per two digits, and a list or map at three bytes plus a byte per element.
fn value_bytes(value: &AttributeValue) -> usize {
    4 + match value {
        AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Ss(v) | AttributeValue::Ns(v) => v.iter().map(|s| s.len() + 1).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len() + 1).sum(),
        AttributeValue::L(v) => v.iter().map(value_bytes).sum(),
        AttributeValue::M(m) => m.iter().map(|(k, v)| k.len() + value_bytes(v)).sum(),
        _ => 1,
    }
}

/// The transaction's `ClientRequestToken`: the same for every attempt of one claim's
/// completion (so DynamoDB answers a repeat after a lost answer, within its ten minutes,
/// without applying it again), different for every claim (its random lease token). 32 hex
/// characters of a SHA-256 (DynamoDB takes at most 36).
pub(super) fn request_token(claim: &Claim) -> String {
    let mut token = crate::key::sha256_hex(
        format!("lambda-idempotency\n{}\n{}", claim.id, claim.lease_token).as_bytes(),
    );
    token.truncate(32);
    token
}

/// A canceled transaction, by its reasons' codes in order (the completion first): the
/// error's source, without the items DynamoDB returned with them.
#[derive(Debug)]
pub(super) struct TransactionCanceled {
    pub(super) codes: Vec<String>,
}

impl fmt::Display for TransactionCanceled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TransactWriteItems was canceled; its reasons, the completion first: [{}]",
            self.codes.join(", ")
        )
    }
}

impl std::error::Error for TransactionCanceled {}

/// The reasons a transaction's item may fail for that a later attempt may not meet.
const RETRYABLE_REASONS: [&str; 4] = [
    "TransactionConflict",
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
    "RequestLimitExceeded",
];

impl DynamoDbStore {
    /// [`complete`](crate::store::IdempotencyStore::complete) with `writes` in one
    /// `TransactWriteItems`.
    pub(super) async fn send_completion_with(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
        writes: &Writes,
    ) -> Result<(), Error> {
        let writes = writes.of::<DynamoDbWrites>()?;
        if writes.is_empty() {
            return self.send_completion(claim, data, expiration).await;
        }
        let completion = self.transact_completion(claim, data, expiration)?;
        self.check_writes_fit(claim, &completion, writes)?;
        let items = std::iter::once(completion)
            .chain(writes.items.iter().cloned())
            .collect();
        let result = self
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(request_token(claim))
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        match err.as_service_error() {
            Some(TransactWriteItemsError::TransactionCanceledException(canceled)) => {
                let reasons = canceled.cancellation_reasons().to_vec();
                self.canceled(claim, writes, &reasons).await
            }
            // An attempt with this token is still under way (an earlier one whose answer
            // was lost): a later attempt gets its outcome.
            Some(TransactWriteItemsError::TransactionInProgressException(_)) => {
                Err(Error::store(BACKEND, true, err))
            }
            // The token was used with other items: no attempt of the engine's does that
            // (it repeats the same completion), so something else reused the claim.
            Some(TransactWriteItemsError::IdempotentParameterMismatchException(_)) => {
                Err(Error::store(BACKEND, false, err))
            }
            Some(service) if service.code() == Some("ValidationException") => {
                // Nothing applied, and the same request would be refused again.
                Err(Error::store(BACKEND, false, err))
            }
            _ => Err(super::error::store_error(err)),
        }
    }

    /// The completion as item 0 of the transaction: the same key, attributes and values
    /// as the plain completion, conditioned on the record being in progress with our
    /// token (a completed record must refuse it, or a repeat after a lost answer would
    /// apply the writes again), with the old item returned when it fails.
    fn transact_completion(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<TransactWriteItem, Error> {
        let parts = self.completion_parts(claim, data, expiration);
        let mut values = parts.values;
        values.insert(
            ":inprogress".into(),
            AttributeValue::S(Status::InProgress.as_str().into()),
        );
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(parts.key))
            .update_expression(parts.update_expression)
            .condition_expression("#tok = :tok AND #status = :inprogress")
            .set_expression_attribute_names(Some(parts.names))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| Error::store(BACKEND, false, e))?;
        Ok(TransactWriteItem::builder().update(update).build())
    }

    /// Refuses, before any request, writes DynamoDB would refuse whole: too many, too
    /// large, one without an operation, one on the record's own item.
    fn check_writes_fit(
        &self,
        claim: &Claim,
        completion: &TransactWriteItem,
        writes: &DynamoDbWrites,
    ) -> Result<(), Error> {
        let refused = |reason: String| Error::WritesInvalid {
            key: claim.id.clone(),
            reason,
        };
        if writes.len() > DynamoDbWrites::MAX_ITEMS {
            return Err(refused(format!(
                "{} writes, and DynamoDB takes at most {} with the completion in one transaction",
                writes.len(),
                DynamoDbWrites::MAX_ITEMS
            )));
        }
        let record_key = self.layout.key(&self.names, &claim.id);
        let mut bytes = estimated_bytes(completion);
        for (i, item) in writes.items.iter().enumerate() {
            let Some(target) = target(item) else {
                return Err(refused(format!(
                    "write {i} has no operation (a Put, Update, Delete or ConditionCheck)"
                )));
            };
            if target.table == self.table
                && record_key.iter().all(|(k, v)| target.key.get(k) == Some(v))
            {
                return Err(refused(format!(
                    "write {i} ({} on table {:?}) is on this record's own item, which the completion writes: DynamoDB refuses two operations on one item in a transaction",
                    target.verb, target.table
                )));
            }
            bytes += estimated_bytes(item);
        }
        if bytes > MAX_TRANSACTION_BYTES {
            return Err(refused(format!(
                "the writes and the completion come to about {bytes} bytes, and DynamoDB takes at most {MAX_TRANSACTION_BYTES} in one transaction"
            )));
        }
        Ok(())
    }

    /// A canceled transaction's outcome, from its reasons (index 0 the completion).
    async fn canceled(
        &self,
        claim: &Claim,
        writes: &DynamoDbWrites,
        reasons: &[CancellationReason],
    ) -> Result<(), Error> {
        let code = |reason: &CancellationReason| reason.code().unwrap_or("None").to_owned();
        if let Some(completion) = reasons.first()
            && completion.code() == Some("ConditionalCheckFailed")
        {
            return self.completion_refused(claim, completion).await;
        }
        if let Some(i) = reasons
            .iter()
            .skip(1)
            .position(|r| r.code() == Some("ConditionalCheckFailed"))
        {
            let write = i;
            let what = writes
                .items
                .get(write)
                .and_then(target)
                .map_or_else(String::new, |t| {
                    format!(" ({} on table {:?})", t.verb, t.table)
                });
            return Err(Error::WritesRefused {
                key: claim.id.clone(),
                reason: format!("write {write}{what}: its condition failed"),
                retryable: false,
            });
        }
        let codes: Vec<String> = reasons.iter().map(code).collect();
        let retryable = !codes.is_empty()
            && codes
                .iter()
                .all(|c| c == "None" || RETRYABLE_REASONS.contains(&c.as_str()));
        Err(Error::store(
            BACKEND,
            retryable,
            TransactionCanceled { codes },
        ))
    }

    /// The completion's condition failed: the record is no longer in progress with our
    /// token. Completed with our token, an earlier attempt committed (its answer lost):
    /// success, nothing applied again. Otherwise the lease is lost. The old item comes
    /// with the reason; a server that leaves it out costs one consistent `GetItem`.
    async fn completion_refused(
        &self,
        claim: &Claim,
        reason: &CancellationReason,
    ) -> Result<(), Error> {
        let record = match reason.item() {
            Some(old) if !old.is_empty() => self.parse(old).ok(),
            _ => self.read_record(&claim.id).await?,
        };
        match record {
            Some(r)
                if r.id == claim.id
                    && r.status == Status::Completed
                    && r.lease_token.as_deref() == Some(claim.lease_token.as_str()) =>
            {
                Ok(())
            }
            _ => Err(Error::LeaseLost {
                key: claim.id.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Claim;
    use std::time::Duration;

    fn claim(id: &str, token: &str) -> Claim {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        Claim::new(id, now, now + Duration::from_secs(30), token)
    }

    #[test]
    fn the_request_token_is_the_claims_and_fits() {
        let a = request_token(&claim("f.op#k", "t1"));
        assert_eq!(a, request_token(&claim("f.op#k", "t1")));
        assert_ne!(a, request_token(&claim("f.op#k", "t2")));
        assert_ne!(a, request_token(&claim("f.op#j", "t1")));
        assert!(a.len() <= 36, "{a}");
    }

    #[test]
    fn sizes_are_over_estimated() {
        let put = Put::builder()
            .table_name("t")
            .item("id", AttributeValue::S("k".repeat(1000)))
            .build()
            .unwrap();
        let bytes = estimated_bytes(&TransactWriteItem::builder().put(put).build());
        assert!(bytes > 1000 + "id".len() + "t".len(), "{bytes}");
    }
}
