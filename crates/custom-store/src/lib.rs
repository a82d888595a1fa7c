//! A store written outside `lambda-idempotency`, with nothing but its public API: the
//! shape a third-party backend takes. Records are kept as flat text, as a key-value
//! service would hold them, so every read goes through the same parse a real backend's
//! does (epoch numbers, the status's stored form, optional fields).
//!
//! `tests/conformance.rs` runs the library's whole conformance suite over it.

use lambda_idempotency::Error;
use lambda_idempotency::store::{
    BoxFuture, Claim, ClaimOutcome, Forgotten, IdempotencyStore, ListRequest, Record, RecordPage,
    Status, epoch_millis, epoch_secs, from_epoch_millis, from_epoch_secs,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

const NAME: &str = "text";

/// Records as lines of text in a map: a stand-in for any key-value service whose one
/// request can check and write a key atomically (here, under one lock).
#[derive(Debug, Clone, Default)]
pub struct TextStore {
    lines: Arc<Mutex<BTreeMap<String, String>>>,
}

impl TextStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lines(&self) -> MutexGuard<'_, BTreeMap<String, String>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self, id: &str) -> Result<Option<Record>, Error> {
        self.lines().get(id).map(|line| parse(id, line)).transpose()
    }
}

/// `status \t expiration(s) \t lease end(ms) \t token \t validation \t data`, empty
/// fields for `None`.
fn format(record: &Record) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    [
        record.status.as_str().to_owned(),
        epoch_secs(record.expiration).to_string(),
        record
            .in_progress_expiration
            .map(|t| epoch_millis(t).to_string())
            .unwrap_or_default(),
        opt(&record.lease_token),
        opt(&record.validation),
        opt(&record.data),
    ]
    .join("\t")
}

fn parse(id: &str, line: &str) -> Result<Record, Error> {
    let malformed = |what: &str| Error::store(NAME, false, format!("record {id:?}: {what}"));
    let fields: Vec<&str> = line.splitn(6, '\t').collect();
    let [status, expiration, lease, token, validation, data] = fields[..] else {
        return Err(malformed("not six fields"));
    };
    let status: Status = status.parse().map_err(|e| Error::store(NAME, false, e))?;
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| malformed("a number is not one"))
    };
    let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    let mut record = Record::new(id, status, from_epoch_secs(number(expiration)?));
    record.in_progress_expiration = match lease {
        "" => None,
        ms => Some(from_epoch_millis(number(ms)?)),
    };
    record.lease_token = some(token);
    record.validation = some(validation);
    record.data = some(data);
    Ok(record)
}

impl IdempotencyStore for TextStore {
    fn name(&self) -> &'static str {
        NAME
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(async move {
            let mut lines = self.lines();
            let previous = lines
                .get(&claim.id)
                .map(|line| parse(&claim.id, line))
                .transpose()?;
            match previous {
                Some(live) if !live.is_claimable_by(claim) => Ok(ClaimOutcome::Exists(live)),
                previous => {
                    lines.insert(claim.id.clone(), format(&claim.to_record()));
                    Ok(ClaimOutcome::Claimed { previous })
                }
            }
        })
    }

    fn complete<'a>(
        &'a self,
        claim: &'a Claim,
        data: Option<&'a str>,
        expiration: SystemTime,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut lines = self.lines();
            let mut record = match lines.get(&claim.id) {
                Some(line) => parse(&claim.id, line)?,
                None => {
                    return Err(Error::LeaseLost {
                        key: claim.id.clone(),
                    });
                }
            };
            if record.lease_token.as_deref() != Some(claim.lease_token.as_str()) {
                return Err(Error::LeaseLost {
                    key: claim.id.clone(),
                });
            }
            record.status = Status::Completed;
            record.data = data.map(str::to_owned);
            record.expiration = expiration;
            lines.insert(claim.id.clone(), format(&record));
            Ok(())
        })
    }

    fn release<'a>(&'a self, claim: &'a Claim) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let mut lines = self.lines();
            let owned = match lines.get(&claim.id) {
                Some(line) => {
                    parse(&claim.id, line)?.lease_token.as_deref()
                        == Some(claim.lease_token.as_str())
                }
                None => false,
            };
            if !owned {
                return Err(Error::LeaseLost {
                    key: claim.id.clone(),
                });
            }
            lines.remove(&claim.id);
            Ok(())
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async move { self.read(id) })
    }

    fn forget<'a>(&'a self, read: &'a Record) -> BoxFuture<'a, Result<Forgotten, Error>> {
        Box::pin(async move {
            let mut lines = self.lines();
            let Some(line) = lines.get(&read.id) else {
                return Ok(Forgotten::Absent);
            };
            if !parse(&read.id, line)?.is_as_read(read) {
                return Ok(Forgotten::Changed);
            }
            lines.remove(&read.id);
            Ok(Forgotten::Deleted)
        })
    }

    /// In id order (the map's), after the last id of the page before.
    fn list<'a>(&'a self, request: &'a ListRequest) -> BoxFuture<'a, Result<RecordPage, Error>> {
        Box::pin(async move {
            let lines = self.lines();
            let after = request.cursor.as_deref();
            let mut matching = lines.iter().filter(|(id, _)| {
                id.starts_with(&request.prefix) && after.is_none_or(|a| id.as_str() > a)
            });
            let mut records = Vec::new();
            for (id, line) in matching.by_ref().take(request.limit) {
                records.push(parse(id, line)?);
            }
            let next = matching
                .next()
                .and(records.last().map(|r: &Record| r.id.clone()));
            Ok(RecordPage::new(records, next))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn a_record_survives_its_text_form() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let claim = Claim::new("fn#op#k", now, now + Duration::from_secs(30), "token")
            .expires_at(now + Duration::from_secs(3600))
            .validation("hash");
        let record = claim.to_record();
        let back = parse(&record.id, &format(&record)).unwrap();
        assert_eq!(back.in_progress_expiration, record.in_progress_expiration);
        assert_eq!(back.lease_token, record.lease_token);
        assert_eq!(back.validation.as_deref(), Some("hash"));
        assert_eq!(back.status, Status::InProgress);
        assert!(parse("x", "BOGUS\t1\t\t\t\t").is_err());
    }
}
