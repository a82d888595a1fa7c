//! The operators' requests: `forget` (a `DeleteItem` conditioned on the record as read)
//! and `list` (a `Scan` of the table, or a `Query` of the partition under a sort key,
//! with a limit).

use super::DynamoDbStore;
use super::item::{millis, secs};
use crate::error::Error;
use crate::record::Record;
use crate::store::{Forgotten, ListRequest, RecordPage};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValuesOnConditionCheckFailure};
use std::collections::HashMap;

impl DynamoDbStore {
    pub(super) async fn send_forget(&self, read: &Record) -> Result<Forgotten, Error> {
        let n = &self.names;
        let mut condition = String::from("#status = :status AND #exp = :exp");
        let mut delete = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(self.layout.key(n, &read.id)))
            .expression_attribute_names("#status", &n.status)
            .expression_attribute_names("#exp", &n.expiration)
            .expression_attribute_names("#ipe", &n.in_progress_expiration)
            .expression_attribute_names("#tok", &n.lease_token)
            .expression_attribute_values(":status", AttributeValue::S(read.status.as_str().into()))
            .expression_attribute_values(":exp", secs(read.expiration))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        match read.in_progress_expiration {
            Some(lease_end) => {
                condition.push_str(" AND #ipe = :ipe");
                delete = delete.expression_attribute_values(":ipe", millis(lease_end));
            }
            None => condition.push_str(" AND attribute_not_exists(#ipe)"),
        }
        match &read.lease_token {
            Some(token) => {
                condition.push_str(" AND #tok = :tok");
                delete =
                    delete.expression_attribute_values(":tok", AttributeValue::S(token.clone()));
            }
            None => condition.push_str(" AND attribute_not_exists(#tok)"),
        }
        match delete.condition_expression(condition).send().await {
            Ok(_) => Ok(Forgotten::Deleted),
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(failed)) => {
                    match failed.item() {
                        Some(item) if !item.is_empty() => Ok(Forgotten::Changed),
                        // Some DynamoDB-compatible servers omit ALL_OLD: read once.
                        _ => Ok(match self.read_record(&read.id).await? {
                            Some(_) => Forgotten::Changed,
                            None => Forgotten::Absent,
                        }),
                    }
                }
                _ => Err(self.request_error(err).await),
            },
        }
    }

    /// A `Query` of the partition (under a sort key: every record shares the partition
    /// value) or a `Scan` of the table; the cursor is the last key read, as JSON.
    pub(super) async fn send_list(&self, request: &ListRequest) -> Result<RecordPage, Error> {
        let n = &self.names;
        let id_attribute = self.layout.id_attribute(n).to_owned();
        let start = request.cursor.as_deref().map(parse_cursor).transpose()?;
        let limit = i32::try_from(request.limit).unwrap_or(i32::MAX);
        let prefix = AttributeValue::S(request.prefix.clone());
        let (items, last, examined) = match &self.layout.sort_key {
            Some(_) => {
                let mut query = self
                    .client
                    .query()
                    .table_name(&self.table)
                    .consistent_read(true)
                    .limit(limit)
                    .set_exclusive_start_key(start)
                    .expression_attribute_names("#pk", &n.id)
                    .expression_attribute_values(
                        ":pk",
                        AttributeValue::S(self.layout.partition_value.clone()),
                    );
                query = if request.prefix.is_empty() {
                    query.key_condition_expression("#pk = :pk")
                } else {
                    // DynamoDB refuses a name the expressions do not use: `#sk` only here.
                    query
                        .key_condition_expression("#pk = :pk AND begins_with(#sk, :prefix)")
                        .expression_attribute_names("#sk", &id_attribute)
                        .expression_attribute_values(":prefix", prefix)
                };
                match query.send().await {
                    Ok(out) => (
                        out.items.unwrap_or_default(),
                        out.last_evaluated_key,
                        out.scanned_count,
                    ),
                    Err(err) => return Err(self.request_error(err).await),
                }
            }
            None => {
                let mut scan = self
                    .client
                    .scan()
                    .table_name(&self.table)
                    .consistent_read(true)
                    .limit(limit)
                    .set_exclusive_start_key(start);
                if !request.prefix.is_empty() {
                    scan = scan
                        .filter_expression("begins_with(#id, :prefix)")
                        .expression_attribute_names("#id", &id_attribute)
                        .expression_attribute_values(":prefix", prefix);
                }
                match scan.send().await {
                    Ok(out) => (
                        out.items.unwrap_or_default(),
                        out.last_evaluated_key,
                        out.scanned_count,
                    ),
                    Err(err) => return Err(self.request_error(err).await),
                }
            }
        };
        let mut page = RecordPage::new(
            Vec::with_capacity(items.len()),
            last.as_ref().map(cursor_of).transpose()?,
        );
        // What the request read before its filter, which a prefix's empty pages still cost.
        page.examined = usize::try_from(examined).unwrap_or(0).max(items.len());
        for item in &items {
            match self.parse(item) {
                Ok(record) => page.records.push(record),
                Err(err) => {
                    let id = match item.get(&id_attribute) {
                        Some(AttributeValue::S(id)) => id.clone(),
                        _ => format!("{:?}", item.keys().collect::<Vec<_>>()),
                    };
                    page.unreadable.push((id, crate::error::report(&err)));
                }
            }
        }
        Ok(page)
    }
}

/// A key's string attributes, as a JSON object: the listing's cursor.
fn cursor_of(key: &HashMap<String, AttributeValue>) -> Result<String, Error> {
    let mut object = serde_json::Map::new();
    for (name, value) in key {
        let AttributeValue::S(text) = value else {
            return Err(Error::store(
                "dynamodb",
                false,
                format!("the key attribute {name:?} is not a string"),
            ));
        };
        object.insert(name.clone(), serde_json::Value::String(text.clone()));
    }
    Ok(serde_json::Value::Object(object).to_string())
}

/// The inverse of [`cursor_of`].
fn parse_cursor(cursor: &str) -> Result<HashMap<String, AttributeValue>, Error> {
    let bad = || {
        Error::store(
            "dynamodb",
            false,
            format!("not a listing cursor: {cursor:?}"),
        )
    };
    let serde_json::Value::Object(object) = serde_json::from_str(cursor).map_err(|_| bad())? else {
        return Err(bad());
    };
    object
        .into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(text) => Ok((name, AttributeValue::S(text))),
            _ => Err(bad()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_a_foreign_one_is_refused() {
        let key: HashMap<String, AttributeValue> = [
            ("pk".to_owned(), AttributeValue::S("idempotency#f".into())),
            ("sk".to_owned(), AttributeValue::S("f.op#\"quoted\"".into())),
        ]
        .into();
        assert_eq!(parse_cursor(&cursor_of(&key).unwrap()).unwrap(), key);
        assert!(parse_cursor("3:17").is_err());
        assert!(parse_cursor(r#"{"id": 3}"#).is_err());
    }
}
