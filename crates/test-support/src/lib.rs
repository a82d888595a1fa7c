//! What the tests, the benchmarks and the stand-ins share.
//!
//! - [`http`]: one small HTTP/1.1 server and client on hyper, under the provider stand-in
//!   (`provider-stub`), the benchmarks' Lambda Runtime API mock, and the control requests
//!   below.
//! - [`servers`]: where the test servers are (their URLs, the run's key prefix and
//!   schema); [`redis_server`]: a private `redis-server`, the only launcher (also behind
//!   the `private-redis` binary `scripts/test` uses); [`proxy`]: a TCP proxy that freezes,
//!   slows or redirects connections; [`certs`]: test certificates.
//! - With the `dynamodb` feature (on by default): the local DynamoDB test server
//!   (`tests/servers/dynamodb_server.py`): [`endpoint`], [`client`], and [`TestTable`] with
//!   the server's control API (request counts, reset, fault injection); tables with a sort
//!   key, and on the second emulator, dynalite ([`Emulator`]).
//! - With the `stores` feature (on by default): [`stores::TestStore`], every idempotency
//!   store on its test server, and [`every_backend!`], which runs a test once per store.

pub mod certs;
pub mod http;
pub mod proxy;
pub mod redis_server;
pub mod runtime_api;
pub mod servers;
#[cfg(feature = "stores")]
pub mod stores;

#[cfg(feature = "dynamodb")]
mod dynamodb;
#[cfg(feature = "dynamodb")]
pub use dynamodb::{DYNALITE_ENDPOINT_ENV, ENDPOINT_ENV, Emulator, TestTable, client, endpoint};
