use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = order, key = "order/id")]
async fn a(handle: &Idempotency, order: serde_json::Value) -> Result<String, lambda_idempotency::Error> {
    Ok(order.to_string())
}

#[idempotent(handle = handle, payload = order, hash = ["model", "order/lines"])]
async fn b(handle: &Idempotency, order: serde_json::Value) -> Result<String, lambda_idempotency::Error> {
    Ok(order.to_string())
}

#[idempotent(handle = handle, payload = order, key = "id", validate = ["a~b/c"])]
async fn c(handle: &Idempotency, order: serde_json::Value) -> Result<String, lambda_idempotency::Error> {
    Ok(order.to_string())
}

// Allowed: a pointer, and a field name without `/`.
#[idempotent(handle = handle, payload = order, key = "/order/id", validate = ["order_id"])]
async fn d(handle: &Idempotency, order: serde_json::Value) -> Result<String, lambda_idempotency::Error> {
    Ok(order.to_string())
}

fn main() {}
