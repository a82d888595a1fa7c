use lambda_idempotency::{Idempotency, idempotent};

struct Request {
    id: String,
}

#[idempotent(handle = handle, payload = request, key = "id")]
async fn f(handle: &Idempotency, request: Request) -> Result<String, lambda_idempotency::Error> {
    Ok(request.id)
}

fn main() {}
