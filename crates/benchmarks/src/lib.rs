//! Shared parts of the benchmarks: a typical request body and a mock Lambda Runtime API.

/// The mock Lambda Runtime API, shared with the tests.
pub use test_support::runtime_api;

use serde_json::{Value, json};

/// A typical queued model request body (about 600 bytes).
pub fn typical_body(request_id: Option<&str>) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You are a support assistant. Answer in two sentences, politely, citing the order number."},
            {"role": "user", "content": "My order 4471 arrived with a cracked screen protector. Can I get a replacement before Friday? I already sent photos to the courier."},
            {"role": "assistant", "content": "I am sorry about order 4471. I can send a replacement today."},
            {"role": "user", "content": "Great, please use the same address."}
        ],
        "temperature": 0.2,
        "max_tokens": 64,
        "submitted_at": "2026-11-29T10:00:00Z"
    });
    if let Some(id) = request_id {
        body["request_id"] = json!(id);
    }
    body
}

/// An OpenAI-style completion like the provider stub's (about 400 bytes).
pub fn typical_completion() -> Value {
    json!({
        "id": "chatcmpl-stub-1",
        "object": "chat.completion",
        "created": 1_764_460_800u64,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "A replacement for order 4471 ships today to the same address; you will get tracking by email."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 96, "completion_tokens": 24, "total_tokens": 120}
    })
}

/// An SQS event with one record per body, as Lambda delivers it.
pub fn sqs_event(bodies: &[Value]) -> Value {
    let records: Vec<Value> = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            json!({
                "messageId": format!("bench-{i}-{}", body["request_id"].as_str().unwrap_or("x")),
                "receiptHandle": "AQEB",
                "body": body.to_string(),
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:bench",
                "awsRegion": "us-east-1"
            })
        })
        .collect();
    json!({ "Records": records })
}

/// Deletes the keys matching each of `patterns` on the Redis node at `url` (one node of a
/// cluster at a time), in batches: a benchmark leaves no records behind in a Redis it
/// shares with the tests, whose listings walk the whole keyspace.
pub async fn purge_redis(url: &str, patterns: &[&str]) -> Result<u64, redis::RedisError> {
    let script = redis::Script::new(
        r"
        local found = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', 10000)
        for _, key in ipairs(found[2]) do redis.call('UNLINK', key) end
        return {found[1], #found[2]}
        ",
    );
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let mut deleted = 0;
    for pattern in patterns {
        let mut cursor = "0".to_owned();
        loop {
            let (next, n): (String, u64) = script
                .arg(&cursor)
                .arg(*pattern)
                .invoke_async(&mut connection)
                .await?;
            deleted += n;
            if next == "0" {
                break;
            }
            cursor = next;
        }
    }
    Ok(deleted)
}
