//! A batch's envelope: the request taken out of each record's body before it is parsed,
//! and a carrier's own messages acknowledged without running.

use super::record::without_values;
use super::report::{BatchReport, InvalidBody, SkippedRecord};
use crate::envelope::{Envelope, EnvelopeError, Opened};
use serde::de::DeserializeOwned;

/// The records an envelope skipped, taken out of the event before it runs, and where the
/// records left stood in it.
pub(super) struct Skipped {
    records: Vec<SkippedRecord>,
    /// The event's index of each record left to run, in order.
    kept: Vec<usize>,
}

impl Skipped {
    pub(super) fn none() -> Self {
        Self {
            records: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// `report` (of the records left) with the skipped ones added, every index the
    /// event's own.
    pub(super) fn into_report<T, R>(self, mut report: BatchReport<T, R>) -> BatchReport<T, R> {
        if self.records.is_empty() {
            return report;
        }
        for skipped in &mut report.skipped {
            skipped.index = self.kept[skipped.index];
        }
        report.skipped.extend(self.records);
        report.skipped.sort_by_key(|s| s.index);
        report
    }
}

/// Takes out of `records` those the envelope skips (`skip_reason` says why). A batch
/// that skips nothing, the common case, is left as it is and costs no allocation.
pub(super) fn take_skipped<R: super::record::BatchRecord>(
    records: &mut Vec<R>,
    skip_reason: impl Fn(&R) -> Option<String>,
) -> Skipped {
    let Some((first, reason)) = records
        .iter()
        .enumerate()
        .find_map(|(index, record)| skip_reason(record).map(|reason| (index, reason)))
    else {
        return Skipped::none();
    };
    let mut skipped = Skipped {
        records: Vec::new(),
        kept: (0..first).collect(),
    };
    let rest: Vec<R> = records.drain(first..).collect();
    let mut first_reason = Some(reason);
    for (offset, record) in rest.into_iter().enumerate() {
        let index = first + offset;
        let reason = match offset {
            0 => first_reason.take(),
            _ => skip_reason(&record),
        };
        match reason {
            Some(reason) => {
                let item_id = record.item_id();
                tracing::info!(
                    item_id = item_id.as_deref().unwrap_or_default(),
                    "acknowledged without running: {reason}"
                );
                crate::metrics::batch_skipped("envelope");
                skipped.records.push(SkippedRecord {
                    index,
                    item_id,
                    reason,
                });
            }
            None => {
                skipped.kept.push(index);
                records.push(record);
            }
        }
    }
    skipped
}

/// Why the envelope skips this body, if it does (a body that does not open is not
/// skipped: it fails when it runs).
pub(super) fn skip_reason_of(envelope: &Envelope, body: &[u8]) -> Option<String> {
    if !envelope.can_skip() {
        return None;
    }
    match envelope.open(body) {
        Ok(Opened::Skip { reason }) => Some(reason),
        _ => None,
    }
}

/// The request in `body`, through `envelope` when there is one, parsed into `B`.
pub(super) fn parse<B: DeserializeOwned>(
    item_id: Option<&str>,
    body: &[u8],
    envelope: Option<&Envelope>,
) -> Result<B, InvalidBody> {
    match envelope {
        None => super::record::json_from_slice(item_id, body),
        Some(envelope) => request_as(item_id, envelope.open(body)),
    }
}

/// The request in an already parsed `value` (a stream's image), through `envelope`.
#[cfg(feature = "dynamodb-streams")]
pub(super) fn parse_value<B: DeserializeOwned>(
    item_id: Option<&str>,
    value: serde_json::Value,
    envelope: &Envelope,
) -> Result<B, InvalidBody> {
    request_as(item_id, envelope.open_value(value))
}

fn request_as<B: DeserializeOwned>(
    item_id: Option<&str>,
    opened: Result<Opened, EnvelopeError>,
) -> Result<B, InvalidBody> {
    let invalid = |reason: String| InvalidBody {
        item_id: item_id.unwrap_or("<no item id>").to_owned(),
        reason,
    };
    match opened {
        Ok(Opened::Request(request)) => {
            serde_json::from_value(request).map_err(|e| invalid(without_values(&e.to_string())))
        }
        // Only an envelope that skips nothing gets here without its skips taken out first.
        Ok(Opened::Skip { reason }) => Err(invalid(format!("a message to skip ({reason})"))),
        Err(e) => Err(invalid(e.to_string())),
    }
}
