//! The model worker behind a real SQS FIFO queue (moto's, with a redrive policy), driven
//! as Lambda's poller drives it ([`super::poller`]): a poison message reaches the
//! dead-letter queue alone, the valid messages behind it in its group run on their first
//! receive, and a passing failure still holds its group back in order.

use super::poller::Aws;
use super::redelivery::setup;
use lambda_idempotency::store::epoch_millis;
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, SystemTime};
use test_support::stores::Backend;

/// The redrive policy's `maxReceiveCount`.
const MAX_RECEIVE_COUNT: u32 = 3;

struct FifoQueue {
    aws: Aws,
    url: String,
    arn: String,
    dead_letters: String,
}

impl FifoQueue {
    async fn create(aws: &Aws, name: &str) -> Self {
        let dlq = aws
            .call(
                "AmazonSQS.CreateQueue",
                json!({"QueueName": format!("{name}-dlq.fifo"), "Attributes": {"FifoQueue": "true"}}),
            )
            .await["QueueUrl"]
            .as_str()
            .unwrap()
            .to_owned();
        let dlq_arn = Self::arn_of(aws, &dlq).await;
        let redrive = json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVE_COUNT});
        let url = aws
            .call(
                "AmazonSQS.CreateQueue",
                json!({"QueueName": format!("{name}.fifo"), "Attributes": {
                    "FifoQueue": "true", "ContentBasedDeduplication": "true",
                    "VisibilityTimeout": "30", "RedrivePolicy": redrive.to_string()}}),
            )
            .await["QueueUrl"]
            .as_str()
            .unwrap()
            .to_owned();
        Self {
            aws: aws.clone(),
            arn: Self::arn_of(aws, &url).await,
            url,
            dead_letters: dlq,
        }
    }

    async fn arn_of(aws: &Aws, url: &str) -> String {
        aws.call(
            "AmazonSQS.GetQueueAttributes",
            json!({"QueueUrl": url, "AttributeNames": ["QueueArn"]}),
        )
        .await["Attributes"]["QueueArn"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn send(&self, group: &str, body: &Value) {
        self.aws
            .call(
                "AmazonSQS.SendMessage",
                json!({"QueueUrl": self.url, "MessageBody": body.to_string(), "MessageGroupId": group}),
            )
            .await;
    }

    async fn receive(&self, url: &str) -> Vec<Value> {
        let answer = self
            .aws
            .call(
                "AmazonSQS.ReceiveMessage",
                json!({"QueueUrl": url, "MaxNumberOfMessages": 10, "AttributeNames": ["All"],
                       "MessageSystemAttributeNames": ["All"]}),
            )
            .await;
        answer["Messages"].as_array().cloned().unwrap_or_default()
    }

    /// Receives and invokes until the queue is empty; returns each request's receive
    /// counts (by `request_id`) when it was delivered.
    async fn drain<F, Fut>(&self, function: F) -> HashMap<String, Vec<u32>>
    where
        F: Fn(Value) -> Fut,
        Fut: std::future::Future<Output = Value>,
    {
        let mut receives: HashMap<String, Vec<u32>> = HashMap::new();
        for _ in 0..20 {
            let messages = self.receive(&self.url).await;
            if messages.is_empty() {
                return receives;
            }
            let records: Vec<Value> = messages
                .iter()
                .map(|m| {
                    let body: Value = serde_json::from_str(m["Body"].as_str().unwrap()).unwrap();
                    let count = m["Attributes"]["ApproximateReceiveCount"].as_str().unwrap();
                    receives
                        .entry(body["request_id"].as_str().unwrap().to_owned())
                        .or_default()
                        .push(count.parse().unwrap());
                    json!({
                        "messageId": m["MessageId"], "receiptHandle": m["ReceiptHandle"],
                        "body": m["Body"], "attributes": m["Attributes"], "messageAttributes": {},
                        "md5OfBody": m["MD5OfBody"], "eventSource": "aws:sqs",
                        "eventSourceARN": self.arn, "awsRegion": "us-east-1",
                    })
                })
                .collect();
            let answer = function(json!({ "Records": records })).await;
            let failed: Vec<&str> = answer["batchItemFailures"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["itemIdentifier"].as_str().unwrap())
                .collect();
            for m in &messages {
                let handle = &m["ReceiptHandle"];
                if failed.contains(&m["MessageId"].as_str().unwrap()) {
                    // Visible again at once (the visibility timeout, shortened for the test).
                    self.aws
                        .call(
                            "AmazonSQS.ChangeMessageVisibility",
                            json!({"QueueUrl": self.url, "ReceiptHandle": handle, "VisibilityTimeout": 0}),
                        )
                        .await;
                } else {
                    self.aws
                        .call(
                            "AmazonSQS.DeleteMessage",
                            json!({"QueueUrl": self.url, "ReceiptHandle": handle}),
                        )
                        .await;
                }
            }
        }
        panic!("the queue never drained: {receives:?}");
    }

    async fn dead_lettered(&self) -> Vec<String> {
        self.receive(&self.dead_letters)
            .await
            .iter()
            .map(|m| {
                let body: Value = serde_json::from_str(m["Body"].as_str().unwrap()).unwrap();
                body["request_id"].as_str().unwrap().to_owned()
            })
            .collect()
    }
}

fn request(id: &str, content: &str, messages: bool) -> Value {
    let messages = if messages {
        json!([{"role": "user", "content": content}])
    } else {
        json!([])
    };
    json!({"request_id": id, "model": "gpt-4o-mini", "messages": messages, "max_tokens": 16})
}

async fn a_fifo_poison_message_reaches_the_dead_letter_queue_alone(backend: Backend) {
    let s = setup(backend, "fifo-queue").await;
    let aws = Aws::new().await;
    let queue = FifoQueue::create(&aws, &format!("poison-{backend}-{}", fastrand::u32(..))).await;
    queue
        .send("customer-17", &request("c17-poison", "", false))
        .await;
    queue
        .send(
            "customer-17",
            &request("c17-1", "customer 17, request 1", true),
        )
        .await;
    queue
        .send(
            "customer-17",
            &request("c17-2", "customer 17, request 2", true),
        )
        .await;
    queue
        .send(
            "customer-42",
            &request("c42-1", "customer 42, request 1", true),
        )
        .await;
    queue
        .send(
            "customer-42",
            &request("c42-2", "customer 42, request 2", true),
        )
        .await;

    let receives = queue
        .drain(|event| async {
            let mut context = Context::default();
            context.deadline = epoch_millis(SystemTime::now() + Duration::from_secs(30));
            s.worker
                .handle_any(LambdaEvent::new(event, context))
                .await
                .unwrap()
        })
        .await;
    assert_eq!(
        queue.dead_lettered().await,
        ["c17-poison"],
        "only the poison message"
    );
    for id in ["c17-1", "c17-2", "c42-1", "c42-2"] {
        assert_eq!(
            receives[id],
            [1],
            "{id} ran on its first receive: {receives:?}"
        );
    }
    assert_eq!(
        receives["c17-poison"],
        [1, 2, 3],
        "received until maxReceiveCount"
    );
    assert_eq!(s.provider.completion_calls(), 4, "every valid request once");
}

async fn a_passing_failure_holds_its_fifo_group_back_in_order(backend: Backend) {
    let s = setup(backend, "fifo-queue-transient").await;
    let aws = Aws::new().await;
    let queue =
        FifoQueue::create(&aws, &format!("transient-{backend}-{}", fastrand::u32(..))).await;
    let flaky = "customer 17, request 1 [[status_once=503]]";
    queue
        .send("customer-17", &request("c17-1", flaky, true))
        .await;
    queue
        .send(
            "customer-17",
            &request("c17-2", "customer 17, request 2", true),
        )
        .await;

    let receives = queue
        .drain(|event| async {
            let mut context = Context::default();
            context.deadline = epoch_millis(SystemTime::now() + Duration::from_secs(30));
            s.worker
                .handle_any(LambdaEvent::new(event, context))
                .await
                .unwrap()
        })
        .await;
    assert!(queue.dead_lettered().await.is_empty());
    assert_eq!(receives["c17-1"], [1, 2]);
    assert_eq!(
        receives["c17-2"],
        [1, 2],
        "held back with its group's first message"
    );
    let asked: Vec<String> = s
        .provider
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"][0]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        asked,
        [flaky, flaky, "customer 17, request 2"],
        "in order, once each after the 503"
    );
}

test_support::every_backend!(
    a_fifo_poison_message_reaches_the_dead_letter_queue_alone,
    a_passing_failure_holds_its_fifo_group_back_in_order,
);
