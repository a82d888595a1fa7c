//! A record as a DynamoDB item, and back.

use super::{BACKEND, DynamoDbStore};
use crate::error::Error;
use crate::record::{Record, epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs};
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;
use std::time::SystemTime;

impl DynamoDbStore {
    /// The DynamoDB item of a record, under this store's attribute names and key: the id
    /// in the partition key, or with a sort key, the partition value and the id in the
    /// sort key.
    pub fn to_item(&self, record: &Record) -> HashMap<String, AttributeValue> {
        let n = &self.names;
        let mut item = HashMap::with_capacity(8);
        self.layout.insert_key(n, &record.id, &mut item);
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

    pub(super) fn parse(&self, item: &HashMap<String, AttributeValue>) -> Result<Record, Error> {
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
            id: string(self.layout.id_attribute(n)).ok_or_else(|| malformed("no id"))?,
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

pub(super) fn secs(t: SystemTime) -> AttributeValue {
    AttributeValue::N(epoch_secs(t).to_string())
}

pub(super) fn millis(t: SystemTime) -> AttributeValue {
    AttributeValue::N(epoch_millis(t).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_dynamodb::Client;

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
