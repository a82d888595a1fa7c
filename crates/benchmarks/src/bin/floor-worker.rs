//! The floor the model worker is measured against: a bare `lambda_runtime` binary that
//! makes the same two DynamoDB requests (a PutItem, an UpdateItem) and the same provider
//! call per record, with no idempotency: no conditions, no keys, no validation.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use model_worker::{ChatRequest, ModelClient};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let table = std::env::var("IDEMPOTENCY_TABLE")?;
    let base = std::env::var("MODEL_BASE_URL")?;
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = Client::new(&config);
    let model = ModelClient::new(&base, None)?;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let (client, model, table) = (client.clone(), model.clone(), table.clone());
        async move {
            let records = event.payload.records.into_iter().map(|record| {
                let (client, model, table) = (&client, &model, &table);
                async move {
                    let request: ChatRequest =
                        serde_json::from_str(record.body.as_deref().unwrap_or("{}"))?;
                    let id = request.request_id.clone().unwrap_or_default();
                    client
                        .put_item()
                        .table_name(table)
                        .item("id", AttributeValue::S(id.clone()))
                        .item("status", AttributeValue::S("INPROGRESS".into()))
                        .send()
                        .await?;
                    let answer = model.complete(&request, None).await?;
                    client
                        .update_item()
                        .table_name(table)
                        .key("id", AttributeValue::S(id))
                        .update_expression("SET #s = :s, #d = :d")
                        .expression_attribute_names("#s", "status")
                        .expression_attribute_names("#d", "data")
                        .expression_attribute_values(":s", AttributeValue::S("COMPLETED".into()))
                        .expression_attribute_values(":d", AttributeValue::S(answer.to_string()))
                        .send()
                        .await?;
                    Ok::<_, Error>(())
                }
            });
            for result in futures_util::future::join_all(records).await {
                result?;
            }
            Ok::<_, Error>(SqsBatchResponse::default())
        }
    }))
    .await
}
