//! Records run in groups that keep their order: FIFO message groups, Kafka partitions.

use aws_lambda_events::event::sqs::SqsMessage;
use std::collections::HashMap;

/// Splits records into groups run one after another: FIFO message groups, or one group
/// per record on a standard queue.
pub(super) fn group_records(records: Vec<SqsMessage>) -> Vec<Vec<(usize, SqsMessage)>> {
    let fifo = records
        .first()
        .and_then(|r| r.event_source_arn.as_deref())
        .is_some_and(|arn| arn.ends_with(".fifo"));
    if !fifo {
        return records.into_iter().enumerate().map(|r| vec![r]).collect();
    }
    group_by(records, |record| {
        record
            .attributes
            .get("MessageGroupId")
            .cloned()
            .unwrap_or_default()
    })
}

/// `records` grouped by `key`, each record with its index in the event, groups in the
/// order their first record comes.
pub(super) fn group_by<R>(records: Vec<R>, key: impl Fn(&R) -> String) -> Vec<Vec<(usize, R)>> {
    let mut order: Vec<Vec<(usize, R)>> = Vec::new();
    let mut by_group: HashMap<String, usize> = HashMap::new();
    for (index, record) in records.into_iter().enumerate() {
        let slot = *by_group.entry(key(&record)).or_insert_with(|| {
            order.push(Vec::new());
            order.len() - 1
        });
        order[slot].push((index, record));
    }
    order
}
