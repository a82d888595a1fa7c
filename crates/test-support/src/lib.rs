//! What the end-to-end tests, the benchmarks and the stand-ins share.
//!
//! - [`http`]: one small HTTP/1.1 server and client on hyper, under the provider stand-in
//!   (`provider-stub`), the benchmarks' Lambda Runtime API mock, and the control requests
//!   below.
//! - With the `dynamodb` feature (on by default): the local DynamoDB test server
//!   (`tests/servers/dynamodb_server.py`): [`endpoint`], [`client`], and [`TestTable`] with
//!   the server's control API (request counts, reset, fault injection).
//! - With the `stores` feature (on by default): [`stores::TestStore`], every idempotency
//!   store on its test server, so one test runs over each.

pub mod http;
#[cfg(feature = "stores")]
pub mod stores;

#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "dynamodb")]
pub use dynamodb::{ENDPOINT_ENV, TestTable, client, endpoint};
