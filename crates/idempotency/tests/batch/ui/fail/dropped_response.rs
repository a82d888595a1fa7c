//! A handler that drops the partial batch response answers `null`: Lambda then deletes
//! the whole batch, failed records included. It must not compile, for any batch type.
#![deny(unused_must_use)]

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::sqs::SqsEvent;
use lambda_idempotency::{DynamoDbStreamBatch, KinesisBatch, SqsBatch};
use lambda_runtime::{Error, LambdaEvent};
use serde_json::Value;

async fn sqs(event: LambdaEvent<SqsEvent>) -> Result<(), Error> {
    SqsBatch::new()
        .run_json(event, |_: Value, _| async { Ok::<_, Error>(()) })
        .await?;
    Ok(())
}

async fn sqs_run(event: LambdaEvent<SqsEvent>) -> Result<(), Error> {
    SqsBatch::new()
        .run(event, |_| async { Ok::<_, Error>(()) })
        .await?;
    Ok(())
}

async fn kinesis(event: LambdaEvent<KinesisEvent>) -> Result<(), Error> {
    KinesisBatch::new()
        .run_json(event, |_: Value, _| async { Ok::<_, Error>(()) })
        .await?;
    Ok(())
}

async fn dynamodb(event: LambdaEvent<Event>) -> Result<(), Error> {
    DynamoDbStreamBatch::new()
        .run(event, |_| async { Ok::<_, Error>(()) })
        .await?;
    Ok(())
}

async fn report(event: LambdaEvent<SqsEvent>) -> Result<(), Error> {
    let report = SqsBatch::new()
        .report(event, |_| async { Ok::<_, Error>(()) })
        .await;
    report.into_response()?;
    Ok(())
}

fn main() {
    let _ = (sqs, sqs_run, kinesis, dynamodb, report);
}
