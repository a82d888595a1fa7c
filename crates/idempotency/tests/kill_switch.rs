//! The `POWERTOOLS_IDEMPOTENCY_DISABLED` kill switch, read from the environment. The test
//! runs itself again as a child process with the variable set, so no other test's handle
//! ever sees it.

use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation, Outcome};
use serde_json::json;

const SWITCH: &str = "POWERTOOLS_IDEMPOTENCY_DISABLED";

#[tokio::test]
async fn the_kill_switch_in_the_environment_runs_every_call() {
    if std::env::var_os(SWITCH).is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "the_kill_switch_in_the_environment_runs_every_call",
            ])
            .env(SWITCH, "true")
            .status()
            .expect("the test binary runs again");
        assert!(status.success(), "the run with {SWITCH}=true failed");
        return;
    }
    let store = MemoryStore::new();
    let idempotency = Idempotency::new(store.clone());
    let op = Operation::new("job", KeyStrategy::field("id"));
    for _ in 0..2 {
        let (_, outcome) = idempotency
            .execute(&op, &json!({"id": "a"}), || async {
                Ok::<_, std::io::Error>(1)
            })
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Disabled);
    }
    assert!(store.is_empty(), "nothing was stored");
}
