//! Every store (memory, DynamoDB, Redis, a Redis Cluster, PostgreSQL) under the model
//! worker: the redelivery tests, the event sources played through Lambda's pollers against
//! moto's real APIs (Kinesis, DynamoDB Streams, an SQS FIFO queue), durable executions
//! through the SDK's runner and the chaos run, each once per backend, as
//! `<module>::<backend>::<test>`, through `test_support::every_backend!`;
//! and the HTTP example over real HTTP.

mod chaos;
mod durable;
#[path = "../support/dynamodb_writes.rs"]
mod dynamodb_writes;
mod envelopes;
mod fifo_queue;
mod http;
mod kafka;
mod poller;
mod redelivery;
mod streams;

/// A chaos run takes the machine's cores: it runs alone, the other tests share.
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
