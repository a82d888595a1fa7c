//! Lambda's pollers, played against moto's real Kinesis, DynamoDB Streams and SQS APIs (the
//! local test server serves them beside DynamoDB; its event source mappings need Docker,
//! so the tests poll themselves):
//!
//! - a stream: read the shard from the checkpoint (`GetShardIterator` + `GetRecords`), build
//!   the event Lambda would, invoke, and apply AWS's rules for the answer: an error or an
//!   empty/null `itemIdentifier` fails the whole batch; an empty or null
//!   `batchItemFailures` is success (the checkpoint moves past the batch); otherwise the
//!   shard resumes from the lowest reported sequence number. After `MaximumRetryAttempts`
//!   retries from one record, the batch from there is given to the on-failure destination
//!   and the checkpoint moves past it;
//! - a FIFO queue: `ReceiveMessage` (the queue keeps a group's later messages back while
//!   one is in flight), invoke, delete what succeeded, make what failed visible again; the
//!   queue's redrive policy moves a message to the dead-letter queue after
//!   `maxReceiveCount` receives.

use serde_json::{Value, json};
use std::cmp::Ordering;
use std::future::Future;
use test_support::http;

/// moto's JSON APIs on the local test server (no signature is checked; the credential
/// scope names the service).
#[derive(Debug, Clone)]
pub(crate) struct Aws {
    endpoint: String,
}

impl Aws {
    pub(crate) async fn new() -> Self {
        Self {
            endpoint: test_support::endpoint().await,
        }
    }

    /// One call: `target` as `Service_Version.Operation`, JSON 1.0 or 1.1 by service.
    pub(crate) async fn call(&self, target: &str, body: Value) -> Value {
        let (service, version) = match target.split('.').next().unwrap_or_default() {
            "Kinesis_20131202" => ("kinesis", "1.1"),
            "DynamoDBStreams_20120810" => ("dynamodb", "1.0"),
            "DynamoDB_20120810" => ("dynamodb", "1.0"),
            "AmazonSQS" => ("sqs", "1.0"),
            other => panic!("no service for {other}"),
        };
        let content_type = format!("application/x-amz-json-{version}");
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential=test/20261202/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"
        );
        let headers = [
            ("x-amz-target", target),
            ("content-type", content_type.as_str()),
            ("authorization", authorization.as_str()),
            // Not counted as a store request by the test server.
            ("x-test-uncounted", "1"),
        ];
        let url = format!("{}/", self.endpoint);
        let (status, text) = http::request_with("POST", &url, &headers, Some(&body.to_string()))
            .await
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(status, 200, "{target} {body}: {text}");
        if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{target}: {e}: {text}"))
        }
    }
}

/// Sequence numbers are decimal strings of any length.
pub(crate) fn seq_cmp(a: &str, b: &str) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// Where the next read of a shard starts.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Position {
    TrimHorizon,
    At(String),
    After(String),
}

impl Position {
    fn iterator_args(&self) -> Value {
        match self {
            Position::TrimHorizon => json!({"ShardIteratorType": "TRIM_HORIZON"}),
            Position::At(seq) => {
                json!({"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": seq, "SequenceNumber": seq})
            }
            Position::After(seq) => {
                json!({"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": seq, "SequenceNumber": seq})
            }
        }
    }
}

/// A stream's one shard, read as Lambda reads it.
pub(crate) trait Shard {
    /// Up to `limit` records from `position`, each as Lambda puts it in an event.
    fn read(&self, position: &Value, limit: usize) -> impl Future<Output = Vec<Value>>;
    /// A record's sequence number, as a batch item failure names it.
    fn sequence_number(record: &Value) -> String;
}

/// A Kinesis stream of one shard on the test server.
pub(crate) struct Kinesis {
    aws: Aws,
    name: String,
    arn: String,
}

const SHARD: &str = "shardId-000000000000";

impl Kinesis {
    pub(crate) async fn create(aws: &Aws, name: &str) -> Self {
        aws.call(
            "Kinesis_20131202.CreateStream",
            json!({"StreamName": name, "ShardCount": 1}),
        )
        .await;
        let description = aws
            .call(
                "Kinesis_20131202.DescribeStream",
                json!({"StreamName": name}),
            )
            .await;
        Self {
            aws: aws.clone(),
            name: name.to_owned(),
            arn: description["StreamDescription"]["StreamARN"]
                .as_str()
                .unwrap()
                .to_owned(),
        }
    }

    /// Puts `data` (PutRecord) and returns its sequence number.
    pub(crate) async fn put(&self, data: &[u8]) -> String {
        let mut encoded = aws_lambda_events::encodings::Base64Data::default();
        encoded.0 = data.to_vec();
        let answer = self
            .aws
            .call(
                "Kinesis_20131202.PutRecord",
                json!({"StreamName": self.name, "Data": encoded, "PartitionKey": "requests"}),
            )
            .await;
        answer["SequenceNumber"].as_str().unwrap().to_owned()
    }
}

impl Shard for Kinesis {
    async fn read(&self, position: &Value, limit: usize) -> Vec<Value> {
        let mut args = position.clone();
        args["StreamName"] = json!(self.name);
        args["ShardId"] = json!(SHARD);
        let iterator = self
            .aws
            .call("Kinesis_20131202.GetShardIterator", args)
            .await;
        let answer = self
            .aws
            .call(
                "Kinesis_20131202.GetRecords",
                json!({"ShardIterator": iterator["ShardIterator"], "Limit": limit}),
            )
            .await;
        answer["Records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let seq = r["SequenceNumber"].as_str().unwrap();
                json!({
                    "kinesis": {
                        "kinesisSchemaVersion": "1.0",
                        "partitionKey": r["PartitionKey"],
                        "sequenceNumber": seq,
                        "data": r["Data"],
                        "approximateArrivalTimestamp": r["ApproximateArrivalTimestamp"],
                    },
                    "eventSource": "aws:kinesis",
                    "eventVersion": "1.0",
                    "eventID": format!("{SHARD}:{seq}"),
                    "eventName": "aws:kinesis:record",
                    "invokeIdentityArn": "arn:aws:iam::123456789012:role/model-worker",
                    "awsRegion": "us-east-1",
                    "eventSourceARN": self.arn,
                })
            })
            .collect()
    }

    fn sequence_number(record: &Value) -> String {
        record["kinesis"]["sequenceNumber"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// A requests table with a stream (new and old images) on the test server.
pub(crate) struct RequestsTable {
    aws: Aws,
    pub(crate) name: String,
    stream_arn: String,
    shard: String,
}

impl RequestsTable {
    pub(crate) async fn create(aws: &Aws, name: &str) -> Self {
        let table = aws
            .call(
                "DynamoDB_20120810.CreateTable",
                json!({
                    "TableName": name,
                    "KeySchema": [{"AttributeName": "request_id", "KeyType": "HASH"}],
                    "AttributeDefinitions": [{"AttributeName": "request_id", "AttributeType": "S"}],
                    "BillingMode": "PAY_PER_REQUEST",
                    "StreamSpecification": {"StreamEnabled": true, "StreamViewType": "NEW_AND_OLD_IMAGES"},
                }),
            )
            .await;
        let stream_arn = table["TableDescription"]["LatestStreamArn"]
            .as_str()
            .unwrap()
            .to_owned();
        let stream = aws
            .call(
                "DynamoDBStreams_20120810.DescribeStream",
                json!({"StreamArn": stream_arn}),
            )
            .await;
        let shards = stream["StreamDescription"]["Shards"].as_array().unwrap();
        assert_eq!(shards.len(), 1, "moto gives a table's stream one shard");
        Self {
            aws: aws.clone(),
            name: name.to_owned(),
            shard: shards[0]["ShardId"].as_str().unwrap().to_owned(),
            stream_arn,
        }
    }

    /// PutItem with typed attributes.
    pub(crate) async fn put(&self, item: Value) {
        self.aws
            .call(
                "DynamoDB_20120810.PutItem",
                json!({"TableName": self.name, "Item": item}),
            )
            .await;
    }

    pub(crate) async fn delete(&self, request_id: &str) {
        self.aws
            .call(
                "DynamoDB_20120810.DeleteItem",
                json!({"TableName": self.name, "Key": {"request_id": {"S": request_id}}}),
            )
            .await;
    }
}

impl Shard for RequestsTable {
    async fn read(&self, position: &Value, limit: usize) -> Vec<Value> {
        let mut args = position.clone();
        args["StreamArn"] = json!(self.stream_arn);
        args["ShardId"] = json!(self.shard);
        let iterator = self
            .aws
            .call("DynamoDBStreams_20120810.GetShardIterator", args)
            .await;
        let answer = self
            .aws
            .call(
                "DynamoDBStreams_20120810.GetRecords",
                json!({"ShardIterator": iterator["ShardIterator"], "Limit": limit}),
            )
            .await;
        answer["Records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut record = r.clone();
                record["eventSourceARN"] = json!(self.stream_arn);
                record
            })
            .collect()
    }

    fn sequence_number(record: &Value) -> String {
        record["dynamodb"]["SequenceNumber"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// What one invocation of a stream batch did.
#[derive(Debug)]
pub(crate) struct Invocation {
    /// The sequence numbers of the batch, in order.
    pub(crate) batch: Vec<String>,
    /// What the function answered (`None`: it failed or died).
    pub(crate) answer: Option<Value>,
}

/// Lambda's poller over one shard.
#[derive(Debug)]
pub(crate) struct StreamPoller {
    position: Position,
    /// `MaximumRetryAttempts`.
    pub(crate) max_retry_attempts: u32,
    /// The batch size.
    pub(crate) batch_size: usize,
    /// Failed invocations from the current start, and that start.
    retries: (u32, Option<String>),
    /// What the on-failure destination received: each given-up batch's sequence numbers.
    pub(crate) given_up: Vec<Vec<String>>,
    /// Every invocation, in order.
    pub(crate) invocations: Vec<Invocation>,
}

impl StreamPoller {
    pub(crate) fn new(max_retry_attempts: u32, batch_size: usize) -> Self {
        Self {
            position: Position::TrimHorizon,
            max_retry_attempts,
            batch_size,
            retries: (0, None),
            given_up: Vec::new(),
            invocations: Vec::new(),
        }
    }

    /// Reads a batch from the checkpoint and invokes `function` with it; `false` when the
    /// shard has nothing more.
    pub(crate) async fn poll<S, F, Fut>(&mut self, shard: &S, function: F) -> bool
    where
        S: Shard,
        F: FnOnce(Value) -> Fut,
        Fut: Future<Output = Option<Value>>,
    {
        let records = shard
            .read(&self.position.iterator_args(), self.batch_size)
            .await;
        if records.is_empty() {
            return false;
        }
        let batch: Vec<String> = records.iter().map(S::sequence_number).collect();
        let answer = function(json!({ "Records": records })).await;
        let resume = match &answer {
            None => Some(batch[0].clone()),
            Some(answer) => lowest_failure(answer, &batch),
        };
        match resume {
            None => {
                self.position = Position::After(batch.last().unwrap().clone());
                self.retries = (0, None);
            }
            Some(from) => {
                let retries = if self.retries.1.as_deref() == Some(&from) {
                    self.retries.0 + 1
                } else {
                    1
                };
                if retries > self.max_retry_attempts {
                    let start = batch.iter().position(|s| *s == from).unwrap();
                    self.given_up.push(batch[start..].to_vec());
                    self.position = Position::After(batch.last().unwrap().clone());
                    self.retries = (0, None);
                } else {
                    self.position = Position::At(from.clone());
                    self.retries = (retries, Some(from));
                }
            }
        }
        self.invocations.push(Invocation { batch, answer });
        true
    }

    /// Polls until the shard has nothing more (at most `limit` invocations).
    pub(crate) async fn drain<S, F, Fut>(&mut self, shard: &S, function: F)
    where
        S: Shard,
        F: Fn(Value) -> Fut,
        Fut: Future<Output = Option<Value>>,
    {
        for _ in 0..100 {
            if !self.poll(shard, &function).await {
                return;
            }
        }
        panic!("the shard never drained: {:?}", self.invocations);
    }

    /// Moves the checkpoint back to the shard's start, as after a lost answer Lambda
    /// resends the batch.
    pub(crate) fn rewind(&mut self) {
        self.position = Position::TrimHorizon;
        self.retries = (0, None);
    }
}

/// AWS's rules: `None` when the batch succeeded, else where the shard resumes.
fn lowest_failure(answer: &Value, batch: &[String]) -> Option<String> {
    let failures = match answer.get("batchItemFailures") {
        None | Some(Value::Null) => return None,
        Some(Value::Array(failures)) if failures.is_empty() => return None,
        Some(Value::Array(failures)) => failures,
        Some(other) => panic!("batchItemFailures is not a list: {other}"),
    };
    let mut lowest: Option<String> = None;
    for failure in failures {
        match failure.get("itemIdentifier").and_then(Value::as_str) {
            // An empty or null itemIdentifier fails the whole batch.
            None | Some("") => return Some(batch[0].clone()),
            Some(id) => {
                assert!(
                    batch.iter().any(|s| s == id),
                    "{id} is not in the batch {batch:?}: Lambda would fail the whole batch"
                );
                if lowest
                    .as_deref()
                    .is_none_or(|l| seq_cmp(id, l) == Ordering::Less)
                {
                    lowest = Some(id.to_owned());
                }
            }
        }
    }
    lowest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_is_read_as_aws_reads_it() {
        let batch: Vec<String> = ["8", "9", "10"].map(String::from).to_vec();
        for (answer, resume) in [
            (json!({}), None),
            (json!({"batchItemFailures": null}), None),
            (json!({"batchItemFailures": []}), None),
            (
                json!({"batchItemFailures": [{"itemIdentifier": "10"}, {"itemIdentifier": "9"}]}),
                Some("9"),
            ),
            (
                json!({"batchItemFailures": [{"itemIdentifier": "10"}, {"itemIdentifier": ""}]}),
                Some("8"),
            ),
            (
                json!({"batchItemFailures": [{"itemIdentifier": null}]}),
                Some("8"),
            ),
        ] {
            assert_eq!(
                lowest_failure(&answer, &batch).as_deref(),
                resume,
                "{answer}"
            );
        }
    }
}
