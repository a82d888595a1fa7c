//! Every store (memory, DynamoDB, Redis, a Redis Cluster, PostgreSQL) under the model
//! worker: the redelivery tests and the chaos run, each once per backend, as
//! `<module>::<backend>::<test>`, through `test_support::every_backend!`.

mod chaos;
mod redelivery;

/// A chaos run takes the machine's cores: it runs alone, the other tests share.
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
