//! The table: its DDL (written once, for [`PostgresStore::create_table`], the module docs
//! and the tests), its name's checks and quoting, and its index's name.

use super::{BACKEND, PostgresStore};
use crate::error::Error;
use tokio_postgres::types::Type;

/// PostgreSQL's longest identifier (`NAMEDATALEN - 1`); it cuts longer ones.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// The table's DDL as a string literal, for the table `$table` and its expiration index
/// `$index` as they stand in the SQL: one row per record, typed columns, the status
/// checked by the table. `data` is `text`, not `jsonb`: `jsonb` rewrites the JSON (key
/// order, spaces). A macro, so the module docs can show it (`concat!`) and
/// [`Table::create_table_sql`] fill in the names (`format!`) from the same text.
macro_rules! ddl {
    ($table:literal, $index:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS ", $table, " (\n",
            "    id                     text   COLLATE \"C\" PRIMARY KEY, -- byte order: a prefix is a range\n",
            "    status                 text   NOT NULL CHECK (status IN ('INPROGRESS', 'COMPLETED')),\n",
            "    expiration             bigint NOT NULL, -- epoch seconds\n",
            "    in_progress_expiration bigint,          -- epoch milliseconds, the lease end\n",
            "    data                   text,            -- the result as JSON, byte for byte\n",
            "    validation             text,\n",
            "    lease_token            text\n",
            ");\n",
            "CREATE INDEX IF NOT EXISTS ", $index, " ON ", $table, " (expiration);\n",
        )
    };
}
pub(super) use ddl;

/// The DDL for the table `idempotency`, as the module docs show it.
#[cfg(test)]
const DDL_EXAMPLE: &str = ddl!("idempotency", "idempotency_expiration_idx");

/// A table name as given, and its quoted forms.
#[derive(Clone, Debug)]
pub(super) struct Table {
    /// As given: `table` or `schema.table`.
    pub(super) name: String,
    /// Quoted, each part as given (so case-sensitive): for the SQL.
    pub(super) quoted: String,
    /// The expiration index's name, quoted.
    pub(super) index: String,
}

impl Table {
    /// Checks `name` (`table` or `schema.table`, split at the first dot): no part empty,
    /// no NUL, no part longer than PostgreSQL keeps (two long names differing after the
    /// 63rd byte would share one table). A refused name is [`Error::InvalidName`]
    /// (`what`: `"table name"`), raised when the store is built.
    pub(super) fn new(name: String) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidName {
            what: "table name",
            name: name.clone(),
            reason,
        };
        let empty_part = name
            .split_once('.')
            .is_some_and(|(a, b)| a.is_empty() || b.is_empty());
        if name.is_empty() || empty_part {
            return Err(invalid(
                "it or a part of it is empty; write `table` or `schema.table`".into(),
            ));
        }
        if name.contains('\0') {
            return Err(invalid(
                "it holds a NUL byte, which PostgreSQL identifiers cannot".into(),
            ));
        }
        let parts = match name.split_once('.') {
            Some((schema, table)) => [("schema", schema), ("table", table)].to_vec(),
            None => [("table", name.as_str())].to_vec(),
        };
        for (what, part) in parts {
            if part.len() > MAX_IDENTIFIER_BYTES {
                return Err(invalid(format!(
                    "the {what} name {part:?} is {} bytes; PostgreSQL identifiers are at most {MAX_IDENTIFIER_BYTES} bytes (it cuts longer ones, so two long names could share one table)",
                    part.len()
                )));
            }
        }
        let (quoted, index) = match name.split_once('.') {
            Some((schema, table)) => (
                format!("{}.{}", quote_ident(schema), quote_ident(table)),
                quote_ident(&index_name(table)),
            ),
            None => (quote_ident(&name), quote_ident(&index_name(&name))),
        };
        Ok(Self {
            name,
            quoted,
            index,
        })
    }

    /// The DDL ([`ddl!`]) for this table, quoted.
    pub(super) fn create_table_sql(&self) -> String {
        format!(
            ddl!("{table}", "{index}"),
            table = self.quoted,
            index = self.index
        )
    }
}

/// The start-up check's one query ([`PostgresStore::check_table`]): for the table `$1`
/// (its quoted name, resolved as the store's statements resolve it), one row per column:
/// the relation's kind (NULL: no such table), the column's name and type, whether it is
/// `NOT NULL`, whether a unique index covers it alone (the claim's `ON CONFLICT (id)`), and
/// whether its collation orders text by bytes (`C`, `POSIX`, the builtin provider's, or the
/// database's default when that is one of them): what makes a prefix a range of the
/// primary key. Plain catalogs, so any role that can see the table can run it.
pub(super) const CHECK_SQL: &str = "\
SELECT c.relkind::text, a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique
        AND i.indnkeyatts = 1 AND i.indkey[0] = a.attnum AND i.indpred IS NULL
        AND i.indexprs IS NULL),
    CASE WHEN a.attcollation = 0 THEN false
        WHEN a.attcollation = 100 THEN (
            SELECT CASE coalesce(to_jsonb(d) ->> 'datlocprovider', 'c')
                WHEN 'b' THEN true WHEN 'c' THEN d.datcollate IN ('C', 'POSIX') ELSE false END
            FROM pg_database d WHERE d.datname = current_database())
        ELSE (
            SELECT CASE co.collprovider
                WHEN 'b' THEN true WHEN 'c' THEN co.collcollate IN ('C', 'POSIX') ELSE false END
            FROM pg_collation co WHERE co.oid = a.attcollation)
    END
FROM (SELECT to_regclass($1) AS oid) AS r
LEFT JOIN pg_class c ON c.oid = r.oid
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped";

/// The columns the store reads and writes: name, the types it accepts (the first is the
/// DDL's), and whether it may hold NULL.
const NEEDED: [(&str, &[&str], bool); 7] = [
    ("id", &["text", "character varying"], false),
    ("status", &["text", "character varying"], false),
    ("expiration", &["bigint"], false),
    ("in_progress_expiration", &["bigint"], true),
    ("data", &["text", "character varying"], true),
    ("validation", &["text", "character varying"], true),
    ("lease_token", &["text", "character varying"], true),
];

/// One column as [`CHECK_SQL`] found it.
pub(super) struct FoundColumn {
    pub(super) name: String,
    pub(super) type_name: String,
    pub(super) not_null: bool,
    pub(super) unique: bool,
    pub(super) byte_ordered: bool,
}

/// What [`CHECK_SQL`] found of the table.
pub(super) enum Found {
    /// No table by that name that this role can see.
    Missing,
    /// A relation of this kind (`pg_class.relkind`) and its columns.
    Relation(String, Vec<FoundColumn>),
}

impl Found {
    /// What makes the table unable to hold the store's records, each in a few words;
    /// none: it works, and whether its `id` column orders by bytes.
    pub(super) fn problems(&self) -> Result<bool, Vec<String>> {
        let Found::Relation(kind, columns) = self else {
            return Err(vec![
                "it does not exist (or this role cannot see it)".into(),
            ]);
        };
        let mut problems = Vec::new();
        if !matches!(kind.as_str(), "r" | "p") {
            problems.push(format!(
                "it is not a table (pg_class.relkind {kind:?}: a view, a sequence, …)"
            ));
        }
        for (name, types, nullable) in NEEDED {
            match columns.iter().find(|c| c.name == name) {
                None => problems.push(format!("it has no column {name}")),
                Some(c) if !types.contains(&c.type_name.as_str()) => problems.push(format!(
                    "its column {name} is {}, not {}",
                    c.type_name, types[0]
                )),
                Some(c) if nullable && c.not_null => problems.push(format!(
                    "its column {name} is NOT NULL, but the store writes NULL there"
                )),
                Some(_) => {}
            }
        }
        let id = columns.iter().find(|c| c.name == "id");
        if id.is_some_and(|id| !id.unique) {
            problems.push(
                "no primary key or unique index is on id alone (the claim's ON CONFLICT (id) needs one)"
                    .into(),
            );
        }
        if problems.is_empty() {
            Ok(id.is_some_and(|id| id.byte_ordered))
        } else {
            Err(problems)
        }
    }
}

impl PostgresStore {
    /// Checks that the table can hold the store's records: that it exists and this role
    /// can see it, that it has each column the store uses with its type (`NULL` allowed
    /// where the store writes it), and that `id` has a primary key or unique index of its
    /// own. Call it at start-up (it connects first if no connection is open), so a
    /// missing or mistyped table fails there, not on every message;
    /// [`connect`](Self::connect) calls it. One query on the catalogs, one round trip.
    ///
    /// An error is [`Error::Store`], not retryable, naming the table, every problem
    /// found and the fix (the table's DDL, [`create_table_sql`](Self::create_table_sql)):
    ///
    /// ```text
    /// the PostgreSQL table "app.idempotency" cannot hold the store's records: its column expiration is integer, not bigint. Make it as PostgresStore::create_table does: …
    /// ```
    ///
    /// A connection that fails is the connection's error, retryable as the store's are.
    pub async fn check_table(&self) -> Result<(), Error> {
        let name: &str = &self.inner.table.quoted;
        let rows = self
            .query_unprepared(CHECK_SQL, &[(&name, Type::TEXT)])
            .await?;
        let read = |e: tokio_postgres::Error| self.malformed(e);
        let mut kind = None;
        let mut columns = Vec::new();
        for row in &rows {
            kind = row.try_get::<_, Option<String>>(0).map_err(read)?;
            if let Some(name) = row.try_get::<_, Option<String>>(1).map_err(read)? {
                columns.push(FoundColumn {
                    name,
                    type_name: row.try_get(2).map_err(read)?,
                    not_null: row.try_get(3).map_err(read)?,
                    unique: row.try_get(4).map_err(read)?,
                    byte_ordered: row
                        .try_get::<_, Option<bool>>(5)
                        .map_err(read)?
                        .unwrap_or(false),
                });
            }
        }
        let found = match kind {
            None => Found::Missing,
            Some(kind) => Found::Relation(kind, columns),
        };
        match found.problems() {
            Ok(byte_ordered) => {
                let _ = self.inner.byte_ordered_ids.set(byte_ordered);
                Ok(())
            }
            Err(problems) => Err(Error::store(
                BACKEND,
                false,
                format!(
                    "the PostgreSQL table {:?} cannot hold the store's records: {}. Make it as PostgresStore::create_table does:\n{}",
                    self.inner.table.name,
                    problems.join("; "),
                    self.create_table_sql()
                ),
            )),
        }
    }
}

/// The expiration index's name: `{table}_expiration_idx`, or, when that passes
/// PostgreSQL's 63-byte limit (it would be cut, and two long table names could share it),
/// the table name's start and a hash of the whole.
fn index_name(table: &str) -> String {
    let name = format!("{table}_expiration_idx");
    if name.len() <= MAX_IDENTIFIER_BYTES {
        return name;
    }
    let hash = crate::key::sha256_hex(table.as_bytes());
    let mut cut = 36;
    while !table.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{}_expiration_idx", &table[..cut], &hash[..8])
}

/// Quotes one identifier: double quotes, inner ones doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::PostgresStore;

    #[test]
    fn long_table_names_get_distinct_index_names() {
        assert_eq!(index_name("idempotency"), "idempotency_expiration_idx");
        let a = index_name(&format!("{}a", "t".repeat(60)));
        let b = index_name(&format!("{}b", "t".repeat(60)));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        assert!(index_name(&"é".repeat(40)).len() <= 63);
    }

    #[test]
    fn a_table_name_needs_both_parts() {
        let long = "t".repeat(64);
        let long_schema = format!("{long}.t");
        for (bad, says) in [
            ("", "empty"),
            ("schema.", "empty"),
            (".table", "empty"),
            ("t\0", "NUL"),
            (&long, "64 bytes"),
            (&long_schema, "schema name"),
        ] {
            match PostgresStore::from_url("postgres://u@h/db", bad) {
                Err(
                    e @ Error::InvalidName {
                        what: "table name", ..
                    },
                ) => {
                    let text = e.to_string();
                    assert!(text.contains(says), "{bad:?}: {text}");
                }
                other => panic!("{bad:?} is refused as an invalid table name: {other:?}"),
            }
        }
        assert!(PostgresStore::from_url("postgres://u@h/db", "s.t").is_ok());
        assert!(PostgresStore::from_url("postgres://u@h/db", "t".repeat(63)).is_ok());
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        let store = PostgresStore::from_url("postgres://u@h/db", "s\".x.t\"; DROP").unwrap();
        assert_eq!(store.inner.table.quoted, "\"s\"\"\".\"x.t\"\"; DROP\"");
        assert!(PostgresStore::from_url("postgres://u@h/db", "").is_err());
        assert!(matches!(
            PostgresStore::from_url("postgres://u@h:notaport/db", "t"),
            Err(Error::Store {
                retryable: false,
                ..
            })
        ));
    }

    #[test]
    fn the_documented_ddl_is_what_create_table_runs() {
        // The same text, names quoted: the docs show it unquoted for `idempotency`.
        let table = Table::new("idempotency".to_owned()).unwrap();
        assert_eq!(
            table
                .create_table_sql()
                .replace("\"idempotency", "idempotency")
                .replace("idempotency\"", "idempotency")
                .replace("idx\"", "idx"),
            DDL_EXAMPLE
        );
        let table = Table::new("s.t".to_owned()).unwrap();
        let sql = table.create_table_sql();
        assert!(
            sql.starts_with("CREATE TABLE IF NOT EXISTS \"s\".\"t\" (\n"),
            "{sql}"
        );
        assert!(
            sql.ends_with(
                "CREATE INDEX IF NOT EXISTS \"t_expiration_idx\" ON \"s\".\"t\" (expiration);\n"
            ),
            "{sql}"
        );
    }
}
