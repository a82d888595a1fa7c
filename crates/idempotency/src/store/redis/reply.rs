//! The scripts' and `HGETALL`'s replies, read into records and outcomes; an unexpected
//! reply is an error that names its shape, never its content.

use super::BACKEND;
use crate::error::Error;
use crate::record::{Record, Status, from_epoch_millis, from_epoch_secs};
use crate::store::ClaimOutcome;
use redis::Value;
use std::fmt;

/// The claim script's answer: `{1, old}` written, `{0, old}` refused, `old` the hash
/// that was there (empty when none was).
pub(super) fn claim_outcome(id: &str, reply: Value) -> Result<ClaimOutcome, Error> {
    let (written, old) = match reply {
        Value::Array(parts) => match <[Value; 2]>::try_from(parts) {
            Ok([written, old]) => (written, old),
            Err(parts) => return Err(unexpected(id, &Value::Array(parts))),
        },
        other => return Err(unexpected(id, &other)),
    };
    let old = fields(id, old)?;
    match written {
        // A record we replaced that we cannot read is no reason to fail the claim; an
        // empty hash (no record was there) does not parse either.
        Value::Int(1) => Ok(ClaimOutcome::Claimed {
            previous: parse(id, old).ok(),
        }),
        // Refused: a live record holds the key. It cannot be empty (that is claimable).
        Value::Int(0) => Ok(ClaimOutcome::Exists(parse(id, old)?)),
        other => Err(unexpected(id, &other)),
    }
}

/// A completion's or release's answer: 1 done, 0 the lease token no longer matches.
pub(super) fn fenced(id: &str, reply: Value) -> Result<(), Error> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(Error::LeaseLost { key: id.to_owned() }),
        other => Err(unexpected(id, &other)),
    }
}

/// The record's fields in a hash, by name.
const NAMES: [&str; 6] = [
    "status",
    "expiration",
    "in_progress_expiration",
    "data",
    "validation",
    "lease_token",
];

/// A hash's fields that make a record, each value moved out of the reply, not copied, and
/// no name turned into a string: this is the replay path, run for every duplicate. Other
/// fields are counted, not kept (a hash holding only those is no record, not an absent
/// one), and not read: a field that is not ours, even one that is not UTF-8 text, does
/// not make the record malformed.
#[derive(Debug, Default)]
pub(super) struct Fields {
    values: [Option<String>; NAMES.len()],
    count: usize,
}

impl Fields {
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn slot(name: &str) -> usize {
        NAMES
            .iter()
            .position(|n| *n == name)
            .expect("one of the record's field names")
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values[Self::slot(name)].as_deref()
    }

    /// Moves a value out (a hash holds each field once).
    fn take(&mut self, name: &str) -> Option<String> {
        self.values[Self::slot(name)].take()
    }

    /// Keeps `value` if `name` is one of the record's fields.
    fn insert(&mut self, id: &str, name: &[u8], value: Value) -> Result<(), Error> {
        self.count += 1;
        let Some(slot) = NAMES.iter().position(|n| n.as_bytes() == name) else {
            return Ok(());
        };
        let text = match value {
            Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
            Value::SimpleString(s) => Some(s),
            _ => None,
        };
        match text {
            Some(text) => {
                self.values[slot] = Some(text);
                Ok(())
            }
            None => Err(malformed(id, "a field or value is not UTF-8 text")),
        }
    }

    #[cfg(test)]
    fn of(pairs: &[(&str, &str)]) -> Self {
        let mut fields = Self::default();
        for (k, v) in pairs {
            fields
                .insert("k", k.as_bytes(), Value::BulkString(v.as_bytes().to_vec()))
                .unwrap();
        }
        fields
    }
}

/// A hash's fields, from `HGETALL` or a script (a flat array in RESP2, a map in RESP3).
pub(super) fn fields(id: &str, value: Value) -> Result<Fields, Error> {
    fn name<'v>(id: &str, v: &'v Value) -> Result<&'v [u8], Error> {
        match v {
            Value::BulkString(bytes) => Ok(bytes.as_slice()),
            Value::SimpleString(s) => Ok(s.as_bytes()),
            _ => Err(malformed(id, "a field or value is not UTF-8 text")),
        }
    }
    let mut out = Fields::default();
    match value {
        Value::Nil => {}
        Value::Map(pairs) => {
            for (k, v) in pairs {
                out.insert(id, name(id, &k)?, v)?;
            }
        }
        Value::Array(flat) if flat.len() % 2 == 0 => {
            let mut it = flat.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.insert(id, name(id, &k)?, v)?;
            }
        }
        other => return Err(unexpected(id, &other)),
    }
    Ok(out)
}

/// `HMGET key` with [`NAMES`] in order: the record's fields, and nothing else of the
/// hash (a listing meets other applications' hashes, some with a million fields, which
/// `HGETALL` would read whole).
pub(super) fn hmget(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(key).arg(&NAMES[..]);
    cmd
}

/// [`hmget`]'s reply, read as [`fields`] reads a hash. `None` when the hash has no
/// `status`, which every record of ours has: another application's hash under the same
/// prefix (not listed as an unreadable record), or a key deleted since the `SCAN`.
pub(super) fn hmget_fields(id: &str, reply: Value) -> Result<Option<Fields>, Error> {
    let Value::Array(values) = reply else {
        return Err(unexpected(id, &reply));
    };
    if values.len() != NAMES.len() {
        return Err(unexpected(id, &Value::Array(values)));
    }
    let mut out = Fields::default();
    for (name, value) in NAMES.iter().zip(values) {
        if value != Value::Nil {
            out.insert(id, name.as_bytes(), value)?;
        }
    }
    Ok(out.get("status").is_some().then_some(out))
}

/// The record in a hash, or a non-retryable [`Error::Store`] if it is malformed.
pub(super) fn parse(id: &str, mut fields: Fields) -> Result<Record, Error> {
    // Times past the year 2500 are no record of ours: malformed, not a panic later.
    let number = |name: &str, max: u64| -> Result<Option<u64>, Error> {
        fields
            .get(name)
            .map(|v| {
                v.parse::<u64>().ok().filter(|n| *n <= max).ok_or_else(|| {
                    malformed(id, &format!("{name} is not a whole number up to {max}"))
                })
            })
            .transpose()
    };
    let far_secs = crate::clock::FAR_FUTURE_SECS;
    let status: Status = fields
        .get("status")
        .ok_or_else(|| malformed(id, "no status"))?
        .parse()
        .map_err(|e: crate::record::UnknownStatus| malformed(id, &e.to_string()))?;
    let expiration =
        number("expiration", far_secs)?.ok_or_else(|| malformed(id, "no expiration"))?;
    let mut record = Record::new(id, status, from_epoch_secs(expiration));
    record.in_progress_expiration =
        number("in_progress_expiration", far_secs * 1000)?.map(from_epoch_millis);
    record.data = fields.take("data");
    record.validation = fields.take("validation");
    record.lease_token = fields.take("lease_token");
    Ok(record)
}

pub(super) fn malformed(id: &str, what: &str) -> Error {
    Error::store(
        BACKEND,
        false,
        format!("malformed idempotency record {id:?}: {what}"),
    )
}

/// A reply of a shape the store does not expect: named by its type and size, never its
/// content (it may hold a stored result, which must not land in logs).
pub(super) fn unexpected(id: &str, reply: &Value) -> Error {
    Error::store(
        BACKEND,
        false,
        format!(
            "unexpected reply for idempotency record {id:?}: {}",
            ReplyShape(reply)
        ),
    )
}

/// A reply's type and size, without its content.
struct ReplyShape<'a>(&'a Value);

impl fmt::Display for ReplyShape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Value::Nil => f.write_str("nil"),
            Value::Int(_) => f.write_str("an integer"),
            Value::Okay => f.write_str("OK"),
            Value::BulkString(b) => write!(f, "a bulk string of {} bytes", b.len()),
            Value::SimpleString(s) => write!(f, "a simple string of {} bytes", s.len()),
            Value::Array(items) => {
                write!(f, "an array of {} elements", items.len())?;
                let kinds: Vec<String> = items.iter().map(|i| ReplyShape(i).to_string()).collect();
                if !kinds.is_empty() && kinds.len() <= 4 {
                    write!(f, " ({})", kinds.join(", "))?;
                }
                Ok(())
            }
            Value::Map(pairs) => write!(f, "a map of {} entries", pairs.len()),
            Value::Set(items) => write!(f, "a set of {} elements", items.len()),
            Value::ServerError(_) => f.write_str("an error reply"),
            _ => f.write_str("a value of another RESP3 type"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_lands_in_its_own_slot() {
        for (slot, name) in NAMES.iter().enumerate() {
            let mut fields = Fields::default();
            fields
                .insert("k", name.as_bytes(), Value::BulkString(b"v".to_vec()))
                .unwrap();
            assert_eq!(fields.values[slot].as_deref(), Some("v"), "{name}");
            assert_eq!(fields.get(name), Some("v"), "{name}");
        }
        let mut other = Fields::default();
        other
            .insert("k", b"another", Value::BulkString(b"v".to_vec()))
            .unwrap();
        assert!(!other.is_empty() && other.values.iter().all(Option::is_none));
    }

    #[test]
    fn a_malformed_hash_is_a_store_error_not_a_panic() {
        let hash = Fields::of;
        for bad in [
            hash(&[("expiration", "1")]),
            hash(&[("status", "DONE"), ("expiration", "1")]),
            hash(&[("status", "COMPLETED")]),
            hash(&[("status", "COMPLETED"), ("expiration", "-1")]),
            hash(&[("status", "COMPLETED"), ("expiration", "99999999999999999")]),
            hash(&[
                ("status", "INPROGRESS"),
                ("expiration", "1"),
                ("in_progress_expiration", "x"),
            ]),
        ] {
            let shown = format!("{bad:?}");
            match parse("k", bad) {
                Err(Error::Store {
                    backend: "redis",
                    retryable: false,
                    ..
                }) => {}
                other => panic!("{shown} must be a malformed record, got {other:?}"),
            }
        }
        let good = parse(
            "k",
            hash(&[
                ("status", "COMPLETED"),
                ("expiration", "5"),
                ("in_progress_expiration", "4000"),
                ("data", "{\"a\": 1}"),
                ("validation", "v"),
                ("lease_token", "t"),
            ]),
        )
        .unwrap();
        assert_eq!(good.status, Status::Completed);
        assert_eq!(good.expiration, from_epoch_secs(5));
        assert_eq!(good.in_progress_expiration, Some(from_epoch_millis(4_000)));
        assert_eq!(good.data.as_deref(), Some("{\"a\": 1}"));
        assert_eq!(
            (good.validation.as_deref(), good.lease_token.as_deref()),
            (Some("v"), Some("t"))
        );
    }

    #[test]
    fn the_claim_scripts_answers() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let hash = Value::Array(
            ["status", "COMPLETED", "expiration", "5", "data", "1"]
                .map(bulk)
                .to_vec(),
        );
        let answer = |written: i64, old: Value| Value::Array(vec![Value::Int(written), old]);
        assert_eq!(
            claim_outcome("k", answer(1, Value::Array(vec![]))).unwrap(),
            ClaimOutcome::Claimed { previous: None }
        );
        match claim_outcome("k", answer(1, hash.clone())).unwrap() {
            ClaimOutcome::Claimed { previous: Some(r) } => {
                assert_eq!(
                    (r.status, r.data.as_deref()),
                    (Status::Completed, Some("1"))
                )
            }
            other => panic!("{other:?}"),
        }
        match claim_outcome("k", answer(0, hash.clone())).unwrap() {
            ClaimOutcome::Exists(r) => assert_eq!(r.expiration, from_epoch_secs(5)),
            other => panic!("{other:?}"),
        }
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), Value::Array(vec![]), Value::Nil]),
            answer(2, hash.clone()),
            answer(0, Value::Array(vec![])),
        ] {
            assert!(
                matches!(
                    claim_outcome("k", bad.clone()),
                    Err(Error::Store {
                        retryable: false,
                        ..
                    })
                ),
                "{bad:?} is an error"
            );
        }
    }

    #[test]
    fn an_unexpected_reply_names_its_shape_never_the_stored_data() {
        let secret = "the model's stored answer: 4111 1111 1111 1111";
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let hash = Value::Array(
            ["status", "COMPLETED", "expiration", "5", "data", secret]
                .map(bulk)
                .to_vec(),
        );
        let odd = Value::Array(
            ["status", "COMPLETED", "data", secret, "x"]
                .map(bulk)
                .to_vec(),
        );
        let errors = [
            claim_outcome(
                "k",
                Value::Array(vec![Value::Int(1), hash.clone(), Value::Nil]),
            ),
            claim_outcome("k", Value::Array(vec![hash.clone()])),
            claim_outcome("k", bulk(secret)),
            claim_outcome("k", Value::Array(vec![Value::Int(1), odd.clone()])),
            fenced("k", bulk(secret)).map(|()| ClaimOutcome::Vanished),
            fields("k", odd).map(|_| ClaimOutcome::Vanished),
        ];
        for result in errors {
            let err = result.expect_err("an unexpected reply");
            let Error::Store { source, .. } = &err else {
                panic!("{err:?}")
            };
            for text in [source.to_string(), format!("{err:?}")] {
                assert!(!text.contains("4111"), "the stored data leaked: {text}");
                assert!(
                    text.contains("unexpected reply")
                        && (text.contains("an array of") || text.contains("a bulk string of")),
                    "names the reply's type and size: {text}"
                );
            }
        }
    }

    #[test]
    fn unexpected_replies_are_errors() {
        assert!(matches!(fenced("k", Value::Int(1)), Ok(())));
        assert!(matches!(
            fenced("k", Value::Int(0)),
            Err(Error::LeaseLost { .. })
        ));
        assert!(matches!(
            fenced("k", Value::Nil),
            Err(Error::Store {
                retryable: false,
                ..
            })
        ));
        assert!(fields("k", Value::Array(vec![Value::Int(1)])).is_err());
        assert!(fields("k", Value::Nil).unwrap().is_empty());
        // RESP3 answers a map, of simple or bulk strings.
        let map = Value::Map(vec![(
            Value::SimpleString("status".into()),
            Value::BulkString(b"COMPLETED".to_vec()),
        )]);
        assert_eq!(fields("k", map).unwrap().get("status"), Some("COMPLETED"));
        assert!(fields("k", Value::Array(vec![Value::Int(1), Value::Int(2)])).is_err());
    }
}
