//! The store's four requests: the claim (`PutItem`), the completion (`UpdateItem`), the
//! release (`DeleteItem`) and the read (`GetItem`), each on the record's primary key. The
//! completion with the function's writes (`TransactWriteItems`) is in `writes.rs`.

use super::item::{millis, secs};
use super::{CLAIM_CONDITION, CLAIM_CONDITION_AT_MOST_ONCE, DynamoDbStore};
use crate::error::Error;
use crate::record::{Claim, Record, Status};
use crate::store::ClaimOutcome;
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use std::collections::HashMap;
use std::time::SystemTime;

/// The completion's parts ([`DynamoDbStore::completion_parts`]).
pub(super) struct CompletionParts {
    pub(super) key: HashMap<String, AttributeValue>,
    pub(super) update_expression: &'static str,
    pub(super) names: HashMap<String, String>,
    pub(super) values: HashMap<String, AttributeValue>,
}

impl DynamoDbStore {
    pub(super) async fn send_claim(&self, claim: &Claim) -> Result<ClaimOutcome, Error> {
        let n = &self.names;
        let item = self.to_item(&claim.to_record());
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression(if claim.at_most_once {
                CLAIM_CONDITION_AT_MOST_ONCE
            } else {
                CLAIM_CONDITION
            })
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
                        Ok(previous) => Some(self.same_record(claim, previous).await?),
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
                        Some(old) if !old.is_empty() => Ok(ClaimOutcome::Exists(
                            self.same_record(claim, self.parse(old)?).await?,
                        )),
                        // Some DynamoDB-compatible servers omit ALL_OLD: read once.
                        _ => Ok(match self.read_record(&claim.id).await? {
                            Some(record) => ClaimOutcome::Exists(record),
                            None => ClaimOutcome::Vanished,
                        }),
                    }
                }
                _ => Err(self.request_error(err).await),
            },
        }
    }

    /// `record`, found at `claim`'s key, if it is `claim`'s record. Another record's id
    /// there means the table's key leaves out the attribute that holds the id (a store
    /// with a sort key on a table without one, where every record shares one item): an
    /// error, never another key's record or result.
    async fn same_record(&self, claim: &Claim, record: Record) -> Result<Record, Error> {
        if record.id == claim.id {
            return Ok(record);
        }
        Err(self.key_mismatch(
            self.describe_key().await.ok(),
            format!(
                "the item at the key of {:?} holds the record {:?}: the table's key does not include {:?}",
                claim.id,
                record.id,
                self.layout.id_attribute(&self.names)
            ),
        ))
    }

    /// The completion's key, update expression, names and values: one `UpdateItem` on
    /// its own, or item 0 of a `TransactWriteItems` with the function's writes.
    pub(super) fn completion_parts(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> CompletionParts {
        let n = &self.names;
        let names = [
            ("#tok", &n.lease_token),
            ("#status", &n.status),
            ("#exp", &n.expiration),
            ("#data", &n.data),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
        let mut values: HashMap<String, AttributeValue> = [
            (":tok", AttributeValue::S(claim.lease_token.clone())),
            (
                ":completed",
                AttributeValue::S(Status::Completed.as_str().into()),
            ),
            (":exp", secs(expiration)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let update_expression = match data {
            Some(data) => {
                values.insert(":data".into(), AttributeValue::S(data.to_owned()));
                "SET #status = :completed, #exp = :exp, #data = :data"
            }
            None => "SET #status = :completed, #exp = :exp REMOVE #data",
        };
        CompletionParts {
            key: self.layout.key(n, &claim.id),
            update_expression,
            names,
            values,
        }
    }

    pub(super) async fn send_completion(
        &self,
        claim: &Claim,
        data: Option<&str>,
        expiration: SystemTime,
    ) -> Result<(), Error> {
        let parts = self.completion_parts(claim, data, expiration);
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(parts.key))
            .condition_expression("#tok = :tok")
            .update_expression(parts.update_expression)
            .set_expression_attribute_names(Some(parts.names))
            .set_expression_attribute_values(Some(parts.values));
        match update.send().await {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => {
                    Err(Error::LeaseLost {
                        key: claim.id.clone(),
                    })
                }
                _ => Err(self.request_error(err).await),
            },
        }
    }

    pub(super) async fn send_release(&self, claim: &Claim) -> Result<(), Error> {
        let (id, token) = (claim.id.as_str(), claim.lease_token.as_str());
        let n = &self.names;
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.layout.key(n, id)))
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
                _ => Err(self.request_error(err).await),
            },
        }
    }

    pub(super) async fn read_record(&self, id: &str) -> Result<Option<Record>, Error> {
        let result = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.layout.key(&self.names, id)))
            .consistent_read(true)
            .send()
            .await;
        let out = match result {
            Ok(out) => out,
            Err(err) => return Err(self.request_error(err).await),
        };
        out.item.as_ref().map(|item| self.parse(item)).transpose()
    }
}
