//! Tests only: `tests/renamed.rs` uses `#[idempotent(crate = "idem")]` where
//! `lambda-idempotency` is the dependency `idem`, so any generated `::lambda_idempotency`
//! path would not compile.
