//! [`PostgresWrites`]: the function's own statements, run in the transaction that completes
//! its record ([`IdempotencyStore::complete_with`](crate::store::IdempotencyStore::complete_with)).

use crate::store::writes::StoreWrites;
use std::fmt;
use tokio_postgres::types::ToSql;

/// One parameter of a statement, owned by the writes: they may run again on a retry, so
/// the store only borrows them.
pub type Param = Box<dyn ToSql + Send + Sync>;

/// The function's own statements, run in order in the one transaction that completes its
/// record: all of them and the completion commit together, or nothing does. Give them to
/// [`Idempotency::execute_committing`](crate::Idempotency::execute_committing) in a
/// [`WithWrites`](crate::WithWrites); the transaction first locks the record and checks
/// the claim's lease token, so a worker whose lease was taken over runs none of them
/// ([`Error::LeaseLost`](crate::Error::LeaseLost)), and a completion retried after its
/// answer was lost finds the record completed with its token and runs none of them again.
///
/// A statement that breaks an integrity constraint (SQLSTATE class `23`: a unique key
/// already taken, a foreign key, a check) or, with
/// [`execute_expecting`](Self::execute_expecting), changes other than the rows it
/// expects, refuses them all: [`Error::WritesRefused`](crate::Error::WritesRefused),
/// nothing written, the claim released. Its reason names the statement's index and the
/// SQLSTATE or the row counts, never a parameter's value. Any other error is a store
/// error, retryable as the store's own are.
///
/// Parameters are given as a tuple of owned values (`(id, answer)`, up to 12), or a
/// `Vec<`[`Param`]`>` for more or for a number known only at run time; `()` for none.
/// Each statement is prepared on the store's transaction connection (once per
/// connection, unless [`prepared_statements(false)`](super::PostgresStore::prepared_statements)),
/// so its parameter types are the server's.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use lambda_idempotency::store::postgres::PostgresWrites;
/// use lambda_idempotency::{Idempotency, KeyStrategy, Operation, PostgresStore, WithWrites};
/// use serde_json::json;
///
/// let url = "postgres://worker@localhost/app";
/// let store = PostgresStore::connect(url, "idempotency").await?;
/// // The function's own table, in the same database as the records.
/// // CREATE TABLE answers (request_id text PRIMARY KEY, answer text NOT NULL);
/// let idempotency = Idempotency::new(store);
/// idempotency.check_writes::<PostgresWrites>()?; // at start-up
/// let op = Operation::new("answer", KeyStrategy::field("id"));
/// let request = json!({"id": "r-1", "question": "2+2"});
/// let (answer, _) = idempotency
///     .execute_committing(&op, &request, || async {
///         let answer = "4".to_string();
///         let writes = PostgresWrites::new().execute(
///             // No ON CONFLICT: a second answer for the request is refused, never written.
///             "INSERT INTO answers (request_id, answer) VALUES ($1, $2)",
///             ("r-1".to_string(), answer.clone()),
///         );
///         Ok::<_, std::io::Error>(WithWrites::new(answer, writes))
///     })
///     .await?;
/// assert_eq!(answer, "4");
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct PostgresWrites {
    pub(super) statements: Vec<WriteStatement>,
}

/// One statement of [`PostgresWrites`].
pub(super) struct WriteStatement {
    pub(super) sql: String,
    pub(super) params: Vec<Param>,
    /// The rows it must change, if it was given with `execute_expecting`.
    pub(super) rows: Option<u64>,
}

impl WriteStatement {
    /// The parameters as tokio-postgres takes them.
    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }
}

impl PostgresWrites {
    /// No statements yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `sql` with `params` (`$1`, `$2`, …) in the completion's transaction.
    pub fn execute(self, sql: impl Into<String>, params: impl Params) -> Self {
        self.push(sql.into(), params.into_params(), None)
    }

    /// Runs `sql` with `params`, on condition that it changes exactly `rows` rows (an
    /// `UPDATE … WHERE version = $n` that must find its row, a `DELETE` that must remove
    /// one): otherwise they are all refused ([`Error::WritesRefused`](crate::Error::WritesRefused)).
    pub fn execute_expecting(self, sql: impl Into<String>, params: impl Params, rows: u64) -> Self {
        self.push(sql.into(), params.into_params(), Some(rows))
    }

    fn push(mut self, sql: String, params: Vec<Param>, rows: Option<u64>) -> Self {
        self.statements.push(WriteStatement { sql, params, rows });
        self
    }

    /// How many statements there are.
    pub fn len(&self) -> usize {
        self.statements.len()
    }

    /// Whether there is no statement (the completion is then a plain one).
    pub fn is_empty(&self) -> bool {
        self.statements.is_empty()
    }
}

impl StoreWrites for PostgresWrites {
    const STORE: &'static str = super::BACKEND;

    fn is_empty(&self) -> bool {
        self.statements.is_empty()
    }
}

/// The statements' text and expected rows; never a parameter's value.
impl fmt::Debug for PostgresWrites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for s in &self.statements {
            list.entry(&format_args!(
                "{:?} ({} parameters{})",
                s.sql,
                s.params.len(),
                s.rows
                    .map(|r| format!(", expecting {r} rows"))
                    .unwrap_or_default()
            ));
        }
        list.finish()
    }
}

/// A statement's parameters, owned: a tuple of values (up to 12), `()`, or a
/// `Vec<`[`Param`]`>`.
pub trait Params {
    /// The parameters, boxed, in order.
    fn into_params(self) -> Vec<Param>;
}

impl Params for Vec<Param> {
    fn into_params(self) -> Vec<Param> {
        self
    }
}

impl Params for () {
    fn into_params(self) -> Vec<Param> {
        Vec::new()
    }
}

macro_rules! tuple_params {
    ($($name:ident),+) => {
        impl<$($name: ToSql + Send + Sync + 'static),+> Params for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_params(self) -> Vec<Param> {
                let ($($name,)+) = self;
                vec![$(Box::new($name) as Param),+]
            }
        }
    };
}

tuple_params!(A);
tuple_params!(A, B);
tuple_params!(A, B, C);
tuple_params!(A, B, C, D);
tuple_params!(A, B, C, D, E);
tuple_params!(A, B, C, D, E, F);
tuple_params!(A, B, C, D, E, F, G);
tuple_params!(A, B, C, D, E, F, G, H);
tuple_params!(A, B, C, D, E, F, G, H, I);
tuple_params!(A, B, C, D, E, F, G, H, I, J);
tuple_params!(A, B, C, D, E, F, G, H, I, J, K);
tuple_params!(A, B, C, D, E, F, G, H, I, J, K, L);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_order_and_never_shown_with_values() {
        let writes = PostgresWrites::new()
            .execute("INSERT INTO t VALUES ($1, $2)", ("k".to_string(), 7i64))
            .execute_expecting("UPDATE t SET n = n + 1", (), 1)
            .execute(
                "SELECT $1::text",
                vec![Box::new("secret-value".to_string()) as Param],
            );
        assert_eq!(writes.len(), 3);
        assert!(!writes.is_empty());
        let rows: Vec<_> = writes.statements.iter().map(|s| s.rows).collect();
        assert_eq!(rows, [None, Some(1), None]);
        assert_eq!(writes.statements[0].params().len(), 2);
        let shown = format!("{writes:?}");
        assert!(!shown.contains("secret-value"), "{shown}");
        assert!(shown.contains("expecting 1 rows"), "{shown}");
        assert_eq!(<PostgresWrites as StoreWrites>::STORE, "postgres");
    }
}
