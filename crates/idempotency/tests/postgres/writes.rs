//! The function's writes committed with the completion (`PostgresWrites`, one transaction
//! on the store's transaction connection): a transaction cut off by the request timeout,
//! refusals and what they say, other errors, another store's writes, and concurrent
//! completions sharing the connection. The contract itself is in the conformance runs.

use super::{TestTable, claim};
use lambda_idempotency::store::memory::MemoryWrites;
use lambda_idempotency::store::postgres::PostgresWrites;
use lambda_idempotency::store::{IdempotencyStore, Status, Writes};
use lambda_idempotency::{Error, Idempotency, KeyStrategy, Operation, Outcome, WithWrites};
use serde_json::json;
use std::time::{Duration, Instant, SystemTime};

/// `INSERT` into the writes table `t`.
fn insert(t: &str, key: &str, value: &str) -> PostgresWrites {
    PostgresWrites::new().execute(
        format!("INSERT INTO {t} (key, value) VALUES ($1, $2)"),
        (key.to_owned(), value.to_owned()),
    )
}

/// A transaction cut off by the request timeout (a statement that sleeps past it): an
/// error, retryable, nothing written, the record still in progress; the server's statement
/// is cancelled, so the record's row lock is free at once and the next completion works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_cut_off_by_the_request_timeout_writes_nothing() {
    let table = TestTable::new("writes_timeout").await;
    let kit = table.writes_kit().await;
    let store = table.store().request_timeout(Duration::from_secs(1));
    let now = SystemTime::now();
    let c = claim("cut-off", now, "t1");
    store.claim(&c).await.unwrap();
    let slow = Writes::new(insert(&kit.quoted, "a", "first").execute("SELECT pg_sleep(30)", ()));
    let started = Instant::now();
    let answer = store.complete_with(&c, Some("1"), now, &slow).await;
    assert!(
        matches!(
            answer,
            Err(Error::Store {
                backend: "postgres",
                retryable: true,
                ..
            })
        ),
        "{answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "cut off at the bound"
    );
    assert_eq!(kit.read_value("a").await, None, "nothing written");
    let record = store.get(&c.id).await.unwrap().unwrap();
    assert_eq!(record.status, Status::InProgress, "not completed");

    // The next completion, on the same record: the cut-off transaction's lock is gone well
    // before its 30 s sleep would have ended.
    let writes = Writes::new(insert(&kit.quoted, "a", "second"));
    store
        .complete_with(&c, Some("2"), now, &writes)
        .await
        .expect("the next completion works");
    assert_eq!(kit.read_value("a").await.as_deref(), Some("second"));
    let record = store.get(&c.id).await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.data.as_deref()),
        (Status::Completed, Some("2"))
    );
    // The server's sleeping statement was cancelled, not left to run.
    let mut sleeping = 1;
    for _ in 0..100 {
        sleeping = table
            .admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                 AND query LIKE '%pg_sleep(30)%' AND state = 'active'",
                &[&table.name],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        if sleeping == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sleeping, 0,
        "the cut-off statement still runs on the server"
    );
    table.drop_table().await;
}

/// Refusals (a unique key taken, a statement that changed other than the rows it
/// expected) write nothing and say which statement and why, never a parameter's value;
/// other errors are store errors, and the transaction connection is reused after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_errors_write_nothing_and_show_no_values() {
    let table = TestTable::new("writes_refused").await;
    let kit = table.writes_kit().await;
    for prepared in [true, false] {
        let t = &kit.quoted;
        let store = table.store().prepared_statements(prepared);
        let now = SystemTime::now();
        let taken = format!("taken-{prepared}");
        let first = claim(&format!("first-{prepared}"), now, "t0");
        store.claim(&first).await.unwrap();
        let writes = Writes::new(insert(t, &taken, "v"));
        store
            .complete_with(&first, None, now, &writes)
            .await
            .unwrap();

        let c = claim(&format!("refused-{prepared}"), now, "t1");
        store.claim(&c).await.unwrap();
        let fresh = format!("fresh-{prepared}");
        let cases = [
            (
                insert(t, &fresh, "secret-one").execute(
                    format!("INSERT INTO {t} (key, value) VALUES ($1, $2)"),
                    (taken.clone(), "secret-two".to_string()),
                ),
                "statement 1: SQLSTATE 23505",
            ),
            (
                insert(t, &fresh, "secret-one").execute_expecting(
                    format!("UPDATE {t} SET value = $1 WHERE key = $2"),
                    ("secret-two".to_string(), "missing".to_string()),
                    1,
                ),
                "statement 1 changed 0 rows, expected 1",
            ),
        ];
        for (writes, says) in cases {
            let answer = store
                .complete_with(&c, Some("1"), now, &Writes::new(writes))
                .await;
            let Err(Error::WritesRefused { key, reason, .. }) = &answer else {
                panic!("prepared {prepared}: refused, got {answer:?}");
            };
            assert_eq!(key, &c.id);
            assert!(reason.starts_with(says), "prepared {prepared}: {reason}");
            let text = lambda_idempotency::report(answer.as_ref().unwrap_err());
            assert!(!text.contains("secret"), "prepared {prepared}: {text}");
            assert_eq!(kit.read_value(&fresh).await, None, "nothing written");
            assert_eq!(kit.read_value(&taken).await.as_deref(), Some("v"));
            let record = store.get(&c.id).await.unwrap().unwrap();
            assert_eq!(record.status, Status::InProgress);
        }

        // A statement on a missing table: a permanent store error naming the statement,
        // not the idempotency table; nothing written.
        let missing = insert(t, &fresh, "x").execute("INSERT INTO no_such_table VALUES (1)", ());
        let err = store
            .complete_with(&c, Some("1"), now, &Writes::new(missing))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Store {
                    backend: "postgres",
                    retryable: false,
                    ..
                }
            ),
            "{err:?}"
        );
        let text = lambda_idempotency::report(&err);
        assert!(
            text.contains("statement 1 of the function's writes") && !text.contains("create_table"),
            "{text}"
        );
        assert_eq!(kit.read_value(&fresh).await, None);

        // Another store's writes: refused, the record unchanged.
        let memory = Writes::new(MemoryWrites::new().put("t", "k", json!(1)));
        let answer = store.complete_with(&c, Some("1"), now, &memory).await;
        assert!(
            matches!(
                answer,
                Err(Error::WritesUnsupported {
                    store: "postgres",
                    writes: "memory"
                })
            ),
            "{answer:?}"
        );

        // After all that, the connection is still good: the completion commits.
        store
            .complete_with(&c, Some("1"), now, &Writes::new(insert(t, &fresh, "ok")))
            .await
            .unwrap();
        assert_eq!(kit.read_value(&fresh).await.as_deref(), Some("ok"));
        assert_eq!(
            store.get(&c.id).await.unwrap().unwrap().status,
            Status::Completed
        );
    }
    table.drop_table().await;
}

/// Concurrent completions with writes on one store take the transaction connection in
/// turn, beside claims on the shared one: every answer written once, each with its record,
/// and a duplicate writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_completions_with_writes_each_commit_once() {
    let table = TestTable::new("writes_concurrent").await;
    let kit = table.writes_kit().await;
    let idempotency = Idempotency::new(table.store());
    idempotency.check_writes::<PostgresWrites>().unwrap();
    assert!(idempotency.check_writes::<MemoryWrites>().is_err());
    let op = Operation::new("answer", KeyStrategy::field("id"));
    let t = &kit.quoted;
    let run = |i: usize| {
        let (idempotency, op) = (&idempotency, &op);
        async move {
            idempotency
                .execute_committing(op, &json!({"id": i}), || async move {
                    let answer = format!("answer-{i}");
                    let writes = insert(t, &i.to_string(), &answer);
                    Ok::<_, std::io::Error>(WithWrites::new(answer, writes))
                })
                .await
        }
    };
    for round in [Outcome::Executed, Outcome::Replayed] {
        let answers = futures_util::future::join_all((0..16).map(run)).await;
        for (i, answer) in answers.into_iter().enumerate() {
            let (value, outcome) = answer.unwrap_or_else(|e| panic!("{i}: {e:?}"));
            assert_eq!((value, outcome), (format!("answer-{i}"), round));
        }
    }
    let rows: i64 = table
        .admin
        .query_one(&format!("SELECT count(*) FROM {t}"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 16, "each answer written once");
    table.drop_table().await;
}

/// A statement that would end or change the completion's transaction or the session
/// (`COMMIT`, `ROLLBACK`, `SET`) is refused before the transaction starts: nothing written,
/// the record unchanged, the connection's session untouched.
#[tokio::test]
async fn transaction_and_session_control_is_refused_before_anything_runs() {
    let table = TestTable::new("writes_control").await;
    let kit = table.writes_kit().await;
    let store = table.store();
    let now = SystemTime::now();
    for (n, control) in [
        "COMMIT",
        "rollback",
        "SET search_path = nowhere",
        "/* hi */ BEGIN",
    ]
    .into_iter()
    .enumerate()
    {
        let c = claim(&format!("control-{n}"), now, "t1");
        store.claim(&c).await.unwrap();
        let writes = Writes::new(insert(&kit.quoted, &format!("k{n}"), "x").execute(control, ()));
        let answer = store.complete_with(&c, Some("1"), now, &writes).await;
        assert!(
            matches!(&answer, Err(Error::WritesInvalid { reason, .. }) if reason.contains("statement 1")),
            "{control}: {answer:?}"
        );
        assert_eq!(kit.read_value(&format!("k{n}")).await, None, "{control}");
        let record = store.get(&c.id).await.unwrap().unwrap();
        assert_eq!(record.status, Status::InProgress, "{control}");
    }
    table.drop_table().await;
}

/// A statement of the function's that turns the transaction connection's protections off
/// for the session (`set_config(…, false)`, which no keyword check can refuse) weakens no
/// later transaction: each one sets `lock_timeout` and
/// `idle_in_transaction_session_timeout` for itself, so the next completion still has
/// them, and still gives up on a record's lock held elsewhere at its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_statement_weakens_the_next_transactions_protections() {
    let table = TestTable::new("writes_protections").await;
    let kit = table.writes_kit().await;
    for prepared in [true, false] {
        let store = table
            .store()
            .prepared_statements(prepared)
            .request_timeout(Duration::from_secs(2));
        let now = SystemTime::now();
        let c = claim(&format!("weakens-{prepared}"), now, "t1");
        store.claim(&c).await.unwrap();
        let weakening = Writes::new(
            insert(&kit.quoted, &format!("w-{prepared}"), "x")
                .execute("SELECT set_config('lock_timeout', '0', false)", ())
                .execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', '0', false)",
                    (),
                ),
        );
        store
            .complete_with(&c, Some("1"), now, &weakening)
            .await
            .expect("the statements run and commit");

        // The next transaction on the same connection: both protections hold in it.
        let c = claim(&format!("checked-{prepared}"), now, "t2");
        store.claim(&c).await.unwrap();
        let checks = Writes::new(
            PostgresWrites::new()
                .execute_expecting(
                    "SELECT 1 WHERE current_setting('lock_timeout') = '2s'",
                    (),
                    1,
                )
                .execute_expecting(
                    "SELECT 1 WHERE current_setting('idle_in_transaction_session_timeout') = '2s'",
                    (),
                    1,
                ),
        );
        let answer = store.complete_with(&c, Some("2"), now, &checks).await;
        assert!(answer.is_ok(), "prepared {prepared}: {answer:?}");

        // And behaves so: a record locked by another session is given up on, not waited
        // for past the bound, and the lock's holder is not blocked behind it.
        let c = claim(&format!("locked-{prepared}"), now, "t3");
        store.claim(&c).await.unwrap();
        let holder = super::admin().await;
        holder.batch_execute("BEGIN").await.unwrap();
        holder
            .execute(
                &format!("SELECT 1 FROM {} WHERE id = $1 FOR UPDATE", table.quoted),
                &[&c.id],
            )
            .await
            .unwrap();
        let started = Instant::now();
        let answer = store
            .complete_with(
                &c,
                Some("3"),
                now,
                &Writes::new(insert(&kit.quoted, &format!("l-{prepared}"), "x")),
            )
            .await;
        assert!(
            matches!(
                answer,
                Err(Error::Store {
                    retryable: true,
                    ..
                })
            ),
            "{answer:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        holder.batch_execute("ROLLBACK").await.unwrap();
    }
    table.drop_table().await;
}

/// Writes that cannot be made as built (a statement that ends the transaction) are a
/// mistake in the code, not a refusal by their condition: the claim is released, never
/// kept, so the fixed deployment's delivery runs and commits.
#[tokio::test]
async fn writes_invalid_as_built_are_released_for_the_fixed_deployment() {
    let table = TestTable::new("invalid_writes").await;
    let kit = table.writes_kit().await;
    let idempotency = Idempotency::new(table.store());
    let op = Operation::new("invalid_writes", KeyStrategy::field("id"));
    let payload = json!({"id": "m1"});
    let calls = std::sync::atomic::AtomicUsize::new(0);
    // Release 1: a bug, a COMMIT among the statements.
    let answer = idempotency
        .execute_committing(&op, &payload, || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(
                1,
                insert(&kit.quoted, "m1", "x").execute("COMMIT", ()),
            ))
        })
        .await;
    assert!(
        matches!(
            answer,
            Err(lambda_idempotency::ExecuteError::Idempotency(
                Error::WritesInvalid { .. }
            ))
        ),
        "{answer:?}"
    );
    // Release 2, fixed: the redriven message should run and commit.
    let answer = idempotency
        .execute_committing(&op, &payload, || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(1, insert(&kit.quoted, "m1", "x")))
        })
        .await;
    let ran = calls.load(std::sync::atomic::Ordering::SeqCst);
    table.drop_table().await;
    assert!(
        answer.is_ok() && ran == 2,
        "the fixed deployment never runs: {ran} calls, answer {answer:?}"
    );
}

/// A foreign-key violation (the referenced row not there *yet*: a standard queue delivers
/// out of order) releases the claim: the delivery after the parent arrives runs.
#[tokio::test]
async fn a_foreign_key_refusal_heals_when_the_parent_arrives() {
    let table = TestTable::new("fk_refusal").await;
    let kit = table.writes_kit().await;
    let child = format!("{}_child", kit.quoted.trim_end_matches('"'));
    let child = format!("{child}\"");
    table
        .admin
        .batch_execute(&format!(
            "CREATE TABLE {child} (key text PRIMARY KEY, parent text NOT NULL REFERENCES {} (key))",
            kit.quoted
        ))
        .await
        .unwrap();
    let idempotency = Idempotency::new(table.store());
    let op = Operation::new("fk_refusal", KeyStrategy::field("id"));
    let payload = json!({"id": "child-1"});
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let write = || {
        PostgresWrites::new().execute(
            format!("INSERT INTO {child} (key, parent) VALUES ($1, $2)"),
            ("child-1".to_owned(), "parent-1".to_owned()),
        )
    };
    let first = idempotency
        .execute_committing(&op, &payload, || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(1, write()))
        })
        .await;
    // The parent arrives (another message), then the child is redelivered.
    table
        .admin
        .execute(
            &format!(
                "INSERT INTO {} (key, value) VALUES ('parent-1', 'p')",
                kit.quoted
            ),
            &[],
        )
        .await
        .unwrap();
    let second = idempotency
        .execute_committing(&op, &payload, || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, Error>(WithWrites::new(1, write()))
        })
        .await;
    let ran = calls.load(std::sync::atomic::Ordering::SeqCst);
    table
        .admin
        .batch_execute(&format!("DROP TABLE {child}"))
        .await
        .unwrap();
    table.drop_table().await;
    assert!(
        matches!(
            first,
            Err(lambda_idempotency::ExecuteError::Idempotency(
                Error::WritesRefused {
                    retryable: true,
                    ..
                }
            ))
        ),
        "{first:?}"
    );
    assert!(
        second.is_ok(),
        "the redelivery after the parent arrived answers the stored FK refusal ({ran} calls): {second:?}"
    );
}
