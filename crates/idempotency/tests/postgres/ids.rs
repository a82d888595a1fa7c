//! Ids the PostgreSQL store must keep exactly: with a NUL, and long enough that their
//! escaped form is past the 2704-byte limit of an index entry, so they are stored hashed.

use super::*;

/// An id with a NUL character (the key taken verbatim from a JSON string, "\u0000", by
/// `KeyStrategy` pointer) is stored escaped, and claimed.
#[tokio::test]
async fn an_id_with_a_nul_is_claimed() {
    let table = TestTable::new("nul").await;
    let store = table.store();
    let now = SystemTime::now();
    let id = "fn.op#order\u{0}42";
    let outcome = store.claim(&claim(id, now, "t1")).await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "a NUL in the id (valid in a JSON string key): {outcome:?}"
    );
    table.drop_table().await;
}

/// A key: a NUL, then printable ASCII with about a third backslashes (a Windows path, a
/// regex, escaped JSON kept as text), `len` bytes in all.
fn key(len: usize) -> String {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut k = String::from("\0");
    while k.len() < len {
        if rng.f64() < 0.36 {
            k.push('\\');
        } else {
            loop {
                let c = rng.u8(0x21..=0x7e) as char;
                if c != '\\' {
                    k.push(c);
                    break;
                }
            }
        }
    }
    k
}

/// An id the engine accepts (at most 2048 bytes) that holds a NUL and many backslashes:
/// escaped, up to ~4 KB, so it is stored hashed, and claimable.
#[tokio::test]
async fn an_id_within_the_engines_limit_with_a_nul_is_claimed() {
    let table = TestTable::new("long_id").await;
    let store = table.store();

    // The id as the engine builds it, exactly at its limit: accepted.
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("request_id"));
    let prefix_len = "fn.op#".len();
    let id = idempotency
        .idempotency_id(&op, &json!({ "request_id": key(2048 - prefix_len) }))
        .expect("the engine accepts the id");
    assert!(id.len() <= 2048, "{}", id.len());

    let now = SystemTime::now();
    let outcome = store.claim(&claim(&id, now, "t1")).await;
    table.drop_table().await;
    assert!(
        matches!(outcome, Ok(ClaimOutcome::Claimed { .. })),
        "a {}-byte id (the engine's limit is 2048) with a NUL and backslashes must be claimable, got {outcome:?}",
        id.len()
    );
}

/// An id stored hashed reads back as the id the caller used, never its stored form
/// (`"\u{2}<sha256>"`): `get`, a duplicate's claim, the engine's errors and its local
/// cache all name it.
#[tokio::test]
async fn a_hashed_id_reads_back_as_the_id_the_caller_used() {
    let table = TestTable::new("hashed_id").await;
    let store = table.store();
    let idempotency = Idempotency::builder(store.clone())
        .function_name("fn")
        .build();
    let op = Operation::new("op", KeyStrategy::field("request_id"));
    let payload = json!({ "request_id": key(2048 - "fn.op#".len()) });
    let id = idempotency.idempotency_id(&op, &payload).unwrap();

    // In progress elsewhere: the claim's answer, `get` and the engine's error name `id`.
    let now = SystemTime::now();
    let held = claim(&id, now, "t1");
    assert!(matches!(
        store.claim(&held).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let other = claim(&id, now, "t2");
    let existing = match store.claim(&other).await.unwrap() {
        ClaimOutcome::Exists(record) => record,
        outcome => panic!("{outcome:?}"),
    };
    let got = store.get(&id).await.unwrap().expect("the record");
    let busy = idempotency
        .execute(&op, &payload, || async { Ok::<_, Error>(1) })
        .await;
    store.release(&held).await.unwrap();

    // Completed by one worker, replayed by another with a local cache, then answered
    // from that cache without a store request.
    let (_, first) = idempotency
        .execute(&op, &payload, || async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    let counted = FaultyStore::new(store.clone());
    let cached = Idempotency::builder(counted.clone())
        .function_name("fn")
        .local_cache(16)
        .build();
    let (_, replayed) = cached
        .execute(&op, &payload, || async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    let requests = counted.total_requests();
    let (_, again) = cached
        .execute(&op, &payload, || async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    table.drop_table().await;

    let shown = |s: &str| format!("{:?}…", &s[..s.len().min(12)]);
    assert!(
        existing.id == id,
        "a duplicate's claim answers {}",
        shown(&existing.id)
    );
    assert!(got.id == id, "get answers {}", shown(&got.id));
    match busy {
        Err(ExecuteError::Idempotency(Error::AlreadyInProgress { key, .. })) => {
            assert!(key == id, "the error names {}", shown(&key))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (first, replayed, again),
        (
            Outcome::Executed,
            Outcome::Replayed,
            Outcome::ReplayedFromCache
        )
    );
    assert_eq!(
        counted.total_requests(),
        requests,
        "the second duplicate is answered by the local cache"
    );
}

/// A listing under an operation's prefix finds its ids stored escaped (a NUL in the
/// key) as it finds the plain ones: the escaped form starts with a marker, not the
/// prefix, and an operator hunting stuck claims must not miss it.
#[tokio::test]
async fn a_listing_under_a_prefix_finds_ids_stored_escaped() {
    let table = TestTable::new("list_escaped").await;
    let store = table.store();
    let now = SystemTime::now();
    for (id, token) in [
        ("fn.op#plain", "t1"),
        ("fn.op#nul\u{0}here", "t2"),
        ("fn.op#back\\slash\u{0}", "t3"),
        ("fn.other#x", "t4"),
    ] {
        store.claim(&claim(id, now, token)).await.unwrap();
    }
    let mut found = Vec::new();
    let mut request = ListRequest::new("fn.op#", 1);
    loop {
        let page = store.list(&request).await.unwrap();
        assert!(page.unreadable.is_empty(), "{:?}", page.unreadable);
        found.extend(page.records.into_iter().map(|r| r.id));
        match page.next {
            None => break,
            next => request = request.after(next),
        }
    }
    found.sort();
    assert_eq!(
        found,
        [
            "fn.op#back\\slash\u{0}",
            "fn.op#nul\u{0}here",
            "fn.op#plain"
        ]
    );
    table.drop_table().await;
}
