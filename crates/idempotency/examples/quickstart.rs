//! Delivers the same request three times over the in-memory store: the work runs once.
//!
//! `cargo run -p lambda-idempotency --example quickstart`

use lambda_idempotency::store::faulty::FaultyStore;
use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation};
use serde_json::json;
use std::sync::atomic::{AtomicU32, Ordering};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = FaultyStore::new(MemoryStore::new());
    let idempotency = Idempotency::new(store.clone());
    let op =
        Operation::new("send_email", KeyStrategy::field("request_id")).validate(["to", "body"]);
    let sends = AtomicU32::new(0);

    let message =
        json!({"request_id": "r-1", "to": "ada@example.com", "body": "hello", "sent_at": 1});
    for delivery in 1..=3 {
        let (receipt, outcome) = idempotency
            .execute(&op, &message, || async {
                let n = sends.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, std::io::Error>(format!("email #{n} sent"))
            })
            .await
            .expect("delivery");
        println!("delivery {delivery}: {outcome:?} -> {receipt}");
    }
    println!(
        "emails sent: {}, store requests: {}",
        sends.load(Ordering::SeqCst),
        store.total_requests()
    );
}
