use lambda_idempotency::idempotent;

#[idempotent(key = "id")]
async fn f(id: String) -> Result<String, lambda_idempotency::Error> {
    Ok(id)
}

fn main() {}
