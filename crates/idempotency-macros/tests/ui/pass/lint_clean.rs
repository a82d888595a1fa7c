//! The expansion draws no lint on the user's code: a one-line body once drew
//! `unused_braces`, whose suggested fix did not compile.
#![deny(warnings, unused_braces, unused_qualifications)]
#![deny(clippy::all)]

use lambda_idempotency::{Idempotency, idempotent};

#[idempotent(handle = handle, payload = id, key = "id")]
async fn one_line(handle: &Idempotency, id: String) -> Result<u32, lambda_idempotency::Error> {
    Ok(1)
}

#[idempotent(handle = handle, payload = id, key = "id", with_outcome)]
async fn one_line_with_outcome(
    handle: &Idempotency,
    id: String,
) -> Result<u32, lambda_idempotency::Error> {
    Ok(2)
}

fn main() {
    let _ = (one_line, one_line_with_outcome);
}
