//! Lambda's Kafka event (Amazon MSK and self-managed Kafka) and its partial batch response,
//! as Lambda sends and reads them. Our own types: aws_lambda_events 1.2 has no Kafka
//! response, refuses `headers: null`, and keeps `records` in a map that iterates in
//! random order.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A Kafka event: `{eventSource: "aws:kafka" | "SelfManagedKafka", eventSourceArn,
/// bootstrapServers, records: {"<topic>-<partition>": [record, …]}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KafkaEvent {
    /// `aws:kafka` (Amazon MSK) or `SelfManagedKafka`.
    #[serde(default)]
    pub event_source: Option<String>,
    /// The MSK cluster's ARN (absent for self-managed Kafka).
    #[serde(default)]
    pub event_source_arn: Option<String>,
    /// The brokers, comma-separated.
    #[serde(default)]
    pub bootstrap_servers: Option<String>,
    /// Every record, partition after partition (the event's `records` map flattened, in
    /// the order of its keys; each record keeps its key in
    /// [`partition_key`](KafkaRecord::partition_key)). Serializes back as the map.
    #[serde(default, with = "partitions")]
    pub records: Vec<KafkaRecord>,
}

/// One Kafka record as Lambda delivers it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KafkaRecord {
    /// The key of the event's `records` map it came under (`<topic>-<partition>`): what
    /// a batch item failure names.
    #[serde(skip)]
    pub partition_key: String,
    /// The topic.
    #[serde(default)]
    pub topic: String,
    /// The partition's number.
    pub partition: i64,
    /// Its offset in the partition: a 64-bit integer, exact past 2^53.
    pub offset: i64,
    /// When it was produced or appended (epoch milliseconds, per `timestampType`).
    #[serde(default)]
    pub timestamp: i64,
    /// `CREATE_TIME` or `LOG_APPEND_TIME`.
    #[serde(default)]
    pub timestamp_type: Option<String>,
    /// The record's key, base64; `None` for a record without one.
    #[serde(default)]
    pub key: Option<String>,
    /// The record's value, base64; `None` for a tombstone.
    #[serde(default)]
    pub value: Option<String>,
    /// The headers as Lambda sends them (a list of `{name: [byte, …]}`); `None` when
    /// `null` or absent. Read one with [`header`](Self::header).
    #[serde(default)]
    pub headers: Option<Value>,
}

impl KafkaRecord {
    /// The value's bytes; `None` for a tombstone.
    pub fn value_bytes(&self) -> Result<Option<Vec<u8>>, base64::DecodeError> {
        decode(self.value.as_deref())
    }

    /// The key's bytes; `None` for a record without one.
    pub fn key_bytes(&self) -> Result<Option<Vec<u8>>, base64::DecodeError> {
        decode(self.key.as_deref())
    }

    /// The first header called `name`, as bytes.
    pub fn header(&self, name: &str) -> Option<Vec<u8>> {
        let headers = self.headers.as_ref()?.as_array()?;
        headers.iter().find_map(|h| {
            let bytes = h.get(name)?.as_array()?;
            // Lambda writes each byte as a number, signed (Java's bytes) or not.
            bytes.iter().map(|b| b.as_i64().map(|b| b as u8)).collect()
        })
    }

    /// The partition's key: as Lambda sent it, or `<topic>-<partition>` for a record
    /// built by hand.
    pub(super) fn partition_name(&self) -> String {
        if self.partition_key.is_empty() {
            format!("{}-{}", self.topic, self.partition)
        } else {
            self.partition_key.clone()
        }
    }
}

fn decode(text: Option<&str>) -> Result<Option<Vec<u8>>, base64::DecodeError> {
    text.map(|t| base64::engine::general_purpose::STANDARD.decode(t))
        .transpose()
}

/// The event's `records` map, flattened and back.
mod partitions {
    use super::KafkaRecord;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<KafkaRecord>, D::Error> {
        let map: Option<BTreeMap<String, Vec<KafkaRecord>>> = Option::deserialize(deserializer)?;
        let mut records = Vec::new();
        for (key, partition) in map.unwrap_or_default() {
            records.extend(partition.into_iter().map(|mut record| {
                record.partition_key = key.clone();
                record
            }));
        }
        Ok(records)
    }

    pub(super) fn serialize<S: Serializer>(
        records: &[KafkaRecord],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map: BTreeMap<String, Vec<&KafkaRecord>> = BTreeMap::new();
        for record in records {
            map.entry(record.partition_name()).or_default().push(record);
        }
        map.serialize(serializer)
    }
}

/// The partial batch response for a Kafka event: each failure names its partition (the
/// key Lambda sent) and the offset to resume from, `{"batchItemFailures":
/// [{"itemIdentifier": {"partition": "orders-0", "offset": 15}}]}`. One failure per
/// partition, its lowest failed offset: Lambda resumes the partition there.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KafkaBatchResponse {
    /// The partitions to resume, each at its lowest failed offset.
    pub batch_item_failures: Vec<KafkaBatchItemFailure>,
}

/// One partition to resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct KafkaBatchItemFailure {
    /// Where.
    pub item_identifier: KafkaItemIdentifier,
}

/// A partition and the offset to resume it from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KafkaItemIdentifier {
    /// The partition's key as Lambda sent it (`<topic>-<partition>`).
    pub partition: String,
    /// The lowest failed offset.
    pub offset: i64,
}

impl KafkaBatchResponse {
    /// Reports `offset` of `partition` failed; a partition already reported keeps the
    /// lower offset.
    pub fn add_failure(&mut self, partition: &str, offset: i64) {
        match self
            .batch_item_failures
            .iter_mut()
            .find(|f| f.item_identifier.partition == partition)
        {
            Some(failure) => {
                failure.item_identifier.offset = failure.item_identifier.offset.min(offset)
            }
            None => self.batch_item_failures.push(KafkaBatchItemFailure {
                item_identifier: KafkaItemIdentifier {
                    partition: partition.to_owned(),
                    offset,
                },
            }),
        }
    }
}

/// A record's item id in a [`BatchReport`](crate::BatchReport): `<partition key>@<offset>`
/// (a topic's name holds no `@`).
pub(super) fn item_id(record: &KafkaRecord) -> String {
    format!("{}@{}", record.partition_name(), record.offset)
}

/// The partition and offset of an item id made by [`item_id`].
pub(super) fn parse_item_id(item_id: &str) -> Option<(&str, i64)> {
    let (partition, offset) = item_id.rsplit_once('@')?;
    Some((partition, offset.parse().ok()?))
}
