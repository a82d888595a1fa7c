//! The start-up check: the store's settings, and the table's key against them.

use super::error::store_error;
use super::names::{KeyElement, KeyRole, KeySchema};
use super::{BACKEND, DynamoDbStore};
use crate::error::Error;
use aws_sdk_dynamodb::types::KeyType;

/// The stored id the check reads. No stored id has this form (`{function}.{operation}#key`
/// has a dot before the first `#`), and the read changes nothing either way.
const PROBE_ID: &str = "lambda-idempotency#check-table";

impl DynamoDbStore {
    /// Checks that the table exists, that this function may read it, and that its key is
    /// the one the store's settings need: call it at start-up, so a wrong table or a
    /// missing sort key setting fails there, not on the first message (where the claim
    /// of a store with a sort key, on a table without one, can even succeed).
    ///
    /// It reads one item that does not exist (`GetItem` on the store's key, in the
    /// store's partition: the permissions the store has anyway, `dynamodb:LeadingKeys`
    /// included). If DynamoDB refuses that key, a `DescribeTable` (when the role may)
    /// says which key the table has:
    ///
    /// ```text
    /// table "app" has key (pk HASH, sk RANGE) but the store was set up for (id HASH): …
    /// ```
    ///
    /// Settings that cannot work on any table (a sort key named like the partition key
    /// or another attribute, an empty partition value, a partition value given without
    /// a sort key) fail before any request. Errors are [`Error::Store`], not retryable
    /// but for the ones a retry may fix (throttling, a timeout).
    pub async fn check_table(&self) -> Result<(), Error> {
        if let Some(problem) = self.layout.problem(&self.names) {
            return Err(Error::store(
                BACKEND,
                false,
                format!(
                    "the DynamoDB store for table {:?} cannot work: {problem}",
                    self.table
                ),
            ));
        }
        match self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(self.layout.key(&self.names, PROBE_ID)))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => Err(self.request_error(err).await),
        }
    }

    /// The table's key, from `DescribeTable`.
    pub(super) async fn describe_key(&self) -> Result<KeySchema, Error> {
        let out = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await
            .map_err(store_error)?;
        let Some(table) = out.table() else {
            return Err(Error::store(
                BACKEND,
                false,
                "DescribeTable answered without the table",
            ));
        };
        let kind = |name: &str| {
            table
                .attribute_definitions()
                .iter()
                .find(|def| def.attribute_name() == name)
                .map_or_else(
                    || "?".into(),
                    |def| def.attribute_type().as_str().to_owned(),
                )
        };
        let mut elements: Vec<KeyElement> = table
            .key_schema()
            .iter()
            .map(|element| KeyElement {
                name: element.attribute_name().to_owned(),
                role: match element.key_type() {
                    KeyType::Hash => KeyRole::Hash,
                    _ => KeyRole::Range,
                },
                kind: kind(element.attribute_name()),
            })
            .collect();
        elements.sort_by_key(|element| element.role == KeyRole::Range);
        Ok(KeySchema(elements))
    }
}
