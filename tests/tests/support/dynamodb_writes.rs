//! The conformance suite's writes kit for the DynamoDB store: the function's writes go to
//! a second table of the test's own (partition key `id`), read back with a consistent
//! `GetItem`.

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use lambda_idempotency::store::conformance::writes::{KitWrite, WritesKit};
use lambda_idempotency::store::dynamodb::DynamoDbWrites;
use lambda_idempotency::store::{BoxFuture, Writes};
use test_support::TestTable;

/// Writes to `table` (key `id`, the value in `value`).
pub(crate) struct DynamoDbKit {
    pub(crate) table: TestTable,
}

impl DynamoDbKit {
    /// A kit over a fresh table named after `test` on `emulator`.
    pub(crate) async fn create(emulator: test_support::Emulator, test: &str) -> Self {
        let table = TestTable::create_keyed(emulator, &format!("{test}-writes"), "id", None).await;
        Self { table }
    }
}

impl WritesKit for DynamoDbKit {
    fn writes(&self, writes: &[KitWrite]) -> Writes {
        let put = |key: &str, value: &str| {
            Put::builder()
                .table_name(&self.table.name)
                .item("id", AttributeValue::S(key.to_owned()))
                .item("value", AttributeValue::S(value.to_owned()))
        };
        let writes = writes.iter().fold(DynamoDbWrites::new(), |w, write| {
            let put = match write {
                KitWrite::Put(k, v) => put(k, v),
                KitWrite::PutNew(k, v) => put(k, v)
                    .condition_expression("attribute_not_exists(#id)")
                    .expression_attribute_names("#id", "id"),
                other => panic!("no DynamoDB form for {other:?}"),
            };
            w.put(put.build().expect("a Put with a table and an item"))
        });
        Writes::new(writes)
    }

    fn read<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let item = self.table.get_raw(key).await?;
            item.get("value")
                .and_then(|v| v.as_s().ok())
                .map(|v| v.to_owned())
        })
    }
}
