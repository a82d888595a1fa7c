//! The table: its DDL (written once, for [`PostgresStore::create_table`], the module docs
//! and the tests), its name's checks and quoting, and its index's name.

#[cfg(doc)]
use super::PostgresStore;
use crate::error::Error;

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
            "    id                     text   PRIMARY KEY,\n",
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
        assert_eq!(table.create_table_sql().replace('"', ""), DDL_EXAMPLE);
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
