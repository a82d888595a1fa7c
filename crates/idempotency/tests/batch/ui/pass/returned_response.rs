//! Returning the partial batch response stays a one-line handler, for every batch type.
#![deny(unused_must_use, warnings)]

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_lambda_events::event::streams::{DynamoDbEventResponse, KinesisEventResponse};
use lambda_idempotency::{DynamoDbStreamBatch, KinesisBatch, PartialBatchResponse, SqsBatch};
use lambda_runtime::{Error, LambdaEvent};
use serde_json::Value;

async fn sqs(
    event: LambdaEvent<SqsEvent>,
) -> Result<PartialBatchResponse<SqsBatchResponse>, Error> {
    Ok(SqsBatch::new()
        .run_json(event, |_: Value, _| async { Ok::<_, Error>(()) })
        .await?)
}

async fn kinesis(
    event: LambdaEvent<KinesisEvent>,
) -> Result<PartialBatchResponse<KinesisEventResponse>, Error> {
    Ok(KinesisBatch::new()
        .run_json(event, |_: Value, _| async { Ok::<_, Error>(()) })
        .await?)
}

async fn dynamodb(
    event: LambdaEvent<Event>,
) -> Result<PartialBatchResponse<DynamoDbEventResponse>, Error> {
    Ok(DynamoDbStreamBatch::new()
        .run(event, |_| async { Ok::<_, Error>(()) })
        .await?)
}

fn main() {
    // Each is a Lambda handler as `lambda_runtime::service_fn` takes it.
    let _ = lambda_runtime::service_fn(sqs);
    let _ = lambda_runtime::service_fn(kinesis);
    let _ = lambda_runtime::service_fn(dynamodb);
}
