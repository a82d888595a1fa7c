//! Idempotency keys: where they come from in the payload, and how they are hashed.
//!
//! The key must come from whoever decided the work: a caller-supplied id, a natural key,
//! or a hash of a documented, canonical subset of the payload. Never the broker's message
//! id: it is stable across redeliveries and different for a producer's duplicate send.
//!
//! When hashing, leave volatile fields (timestamps such as `submitted_at`, request or
//! trace ids) out of the subset: if they differ between the original and the retry the
//! hashes differ and deduplication silently does nothing.

mod canonical;

use crate::error::{BoxError, Error};
use canonical::write_canonical;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;

type KeyFn = dyn Fn(&Value) -> Result<Option<String>, BoxError> + Send + Sync;

/// Where the idempotency key comes from in a payload.
///
/// ```
/// use lambda_idempotency::KeyStrategy;
/// use serde_json::json;
///
/// // The caller's id when present, otherwise a hash of the fields that define the work.
/// let key = KeyStrategy::field("request_id")
///     .or(KeyStrategy::hash(["model", "messages", "temperature", "max_tokens"]));
///
/// let with_id = json!({"request_id": "r-1", "model": "m", "messages": []});
/// assert_eq!(key.derive(&with_id).unwrap(), "r-1");
///
/// let a = json!({"model": "m", "messages": [], "temperature": 0.7, "max_tokens": 8, "submitted_at": 1});
/// let b = json!({"model": "m", "messages": [], "temperature": 0.70, "max_tokens": 8, "submitted_at": 2});
/// assert_eq!(key.derive(&a).unwrap(), key.derive(&b).unwrap());
/// ```
#[derive(Clone)]
pub struct KeyStrategy(Source);

#[derive(Clone)]
enum Source {
    Pointer(String),
    /// A top-level field: read through its pointer, named as written.
    Field {
        name: String,
        pointer: String,
    },
    Hash {
        fields: Vec<String>,
        allow_missing: bool,
    },
    Custom(Arc<KeyFn>),
    FirstOf(Vec<KeyStrategy>),
}

impl KeyStrategy {
    /// The value at a JSON pointer (RFC 6901), e.g. `/order/id`. Strings are used as they
    /// are; numbers, objects and arrays in their canonical JSON form. Absent, `null`, `""`,
    /// `[]` and `{}` are [`Error::KeyMissing`].
    ///
    /// # Panics
    ///
    /// If `pointer` is not a JSON pointer: it must start with `/` (`"request_id"` is
    /// [`field`](Self::field)'s argument, `"/request_id"` the pointer), and each `~` must be
    /// `~0` or `~1`. Build strategies at start-up, so that a typo fails the init phase
    /// instead of every message.
    pub fn pointer(pointer: impl Into<String>) -> Self {
        Self::pointer_unchecked(pointer.into()).or_panic()
    }

    /// Like [`pointer`](Self::pointer), returning [`Error::InvalidName`] instead of
    /// panicking: for a pointer read at run time.
    pub fn try_pointer(pointer: impl Into<String>) -> Result<Self, Error> {
        let strategy = Self::pointer_unchecked(pointer.into());
        strategy.check()?;
        Ok(strategy)
    }

    pub(crate) fn pointer_unchecked(pointer: String) -> Self {
        KeyStrategy(Source::Pointer(pointer))
    }

    /// A top-level field, e.g. `request_id`, whatever its name holds (`order/id` is a
    /// field so named, not a nested one: that is [`pointer`](Self::pointer)`("/order/id")`).
    /// A missing key is named as written here.
    pub fn field(name: &str) -> Self {
        KeyStrategy(Source::Field {
            name: name.to_owned(),
            pointer: field_pointer(name),
        })
    }

    /// SHA-256 (hex) of the canonical JSON (RFC 8785) of the named fields: top-level names
    /// or JSON pointers. Every field must be present unless
    /// [`allow_missing_fields`](Self::allow_missing_fields) is set.
    ///
    /// # Panics
    ///
    /// If a field that starts with `/` is not a valid JSON pointer (a `~` not followed by
    /// `0` or `1`).
    pub fn hash<I, S>(fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::hash_unchecked(fields.into_iter().map(Into::into).collect()).or_panic()
    }

    /// Like [`hash`](Self::hash), returning [`Error::InvalidName`] instead of panicking.
    pub fn try_hash<I, S>(fields: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let strategy = Self::hash_unchecked(fields.into_iter().map(Into::into).collect());
        strategy.check()?;
        Ok(strategy)
    }

    pub(crate) fn hash_unchecked(fields: Vec<String>) -> Self {
        KeyStrategy(Source::Hash {
            fields,
            allow_missing: false,
        })
    }

    /// Every pointer of the strategy is one, or the first that is not, as an error.
    pub(crate) fn check(&self) -> Result<(), Error> {
        match &self.0 {
            Source::Pointer(pointer) => check_pointer("key pointer", pointer),
            // Escaped by `field`: always a pointer.
            Source::Field { .. } => Ok(()),
            Source::Hash { fields, .. } => check_fields("key field", fields),
            Source::Custom(_) => Ok(()),
            Source::FirstOf(list) => list.iter().try_for_each(KeyStrategy::check),
        }
    }

    fn or_panic(self) -> Self {
        if let Err(e) = self.check() {
            panic!("{e}");
        }
        self
    }

    /// SHA-256 (hex) of the canonical JSON of the whole payload. Only right when the payload
    /// holds nothing volatile.
    pub fn hash_payload() -> Self {
        Self::hash(Vec::<String>::new())
    }

    /// For [`hash`](Self::hash): hash absent fields as absent instead of failing. At least
    /// one field must still be present, so messages never all share one key.
    pub fn allow_missing_fields(mut self) -> Self {
        if let Source::Hash { allow_missing, .. } = &mut self.0 {
            *allow_missing = true;
        }
        self
    }

    /// A key computed by a closure: `Ok(None)` is a missing key, `Err` an invalid one
    /// ([`Error::InvalidKey`] with the closure's error as its source; `?` converts any error).
    pub fn custom<F>(f: F) -> Self
    where
        F: Fn(&Value) -> Result<Option<String>, BoxError> + Send + Sync + 'static,
    {
        KeyStrategy(Source::Custom(Arc::new(f)))
    }

    /// Falls back to `other` when this strategy finds no key.
    pub fn or(self, other: KeyStrategy) -> Self {
        match self.0 {
            Source::FirstOf(mut list) => {
                list.push(other);
                KeyStrategy(Source::FirstOf(list))
            }
            first => KeyStrategy(Source::FirstOf(vec![KeyStrategy(first), other])),
        }
    }

    /// The key for `payload`.
    pub fn derive(&self, payload: &Value) -> Result<String, Error> {
        match &self.0 {
            Source::Pointer(pointer) => read_key(payload, pointer, pointer),
            // A top-level field of an object, looked up by name: `Value::pointer` would
            // split and unescape the pointer on every message.
            Source::Field { name, pointer } => match payload {
                Value::Object(map) => key_from(map.get(name.as_str()), name),
                _ => read_key(payload, pointer, name),
            },
            Source::Hash {
                fields,
                allow_missing,
            } => {
                if fields.is_empty() {
                    return Ok(hash_value(payload));
                }
                let (subset, missing) = subset(payload, fields);
                if !missing.is_empty() && (!*allow_missing || subset.is_empty()) {
                    return Err(Error::KeyMissing {
                        field: missing.join(", "),
                    });
                }
                Ok(hash_value(&Value::Object(subset)))
            }
            Source::Custom(f) => match f(payload) {
                Ok(Some(key)) if !key.is_empty() => Ok(key),
                Ok(_) => Err(Error::KeyMissing {
                    field: "the custom key function's result".into(),
                }),
                Err(source) => Err(Error::InvalidKey {
                    reason: "the custom key function failed".into(),
                    source: Some(source),
                }),
            },
            Source::FirstOf(list) => {
                let mut missing = Vec::new();
                for strategy in list {
                    match strategy.derive(payload) {
                        Err(Error::KeyMissing { field }) => missing.push(field),
                        other => return other,
                    }
                }
                Err(Error::KeyMissing {
                    field: missing.join(" or "),
                })
            }
        }
    }
}

impl fmt::Debug for KeyStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Pointer(p) => write!(f, "KeyStrategy::pointer({p:?})"),
            Source::Field { name, .. } => write!(f, "KeyStrategy::field({name:?})"),
            Source::Hash {
                fields,
                allow_missing,
            } => write!(
                f,
                "KeyStrategy::hash({fields:?}{})",
                if *allow_missing {
                    ", allow_missing"
                } else {
                    ""
                }
            ),
            Source::Custom(_) => f.write_str("KeyStrategy::custom(..)"),
            Source::FirstOf(list) => f.debug_list().entries(list).finish(),
        }
    }
}

/// SHA-256 hex of the canonical JSON of the named fields, for payload validation.
/// Absent fields are hashed as absent: a field that appears later is a mismatch.
pub(crate) fn validation_hash(payload: &Value, fields: &[String]) -> String {
    if fields.is_empty() {
        return hash_value(payload);
    }
    hash_value(&Value::Object(subset(payload, fields).0))
}

/// SHA-256 hex of the canonical JSON of `value`.
pub(crate) fn hash_value(value: &Value) -> String {
    let mut text = String::with_capacity(256);
    write_canonical(value, &mut text);
    sha256_hex(text.as_bytes())
}

/// SHA-256 of `bytes`, lowercase hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    // sha2's output (a GenericArray) formats as lowercase hex, two digits a byte.
    format!("{:x}", Sha256::digest(bytes))
}

fn subset(payload: &Value, fields: &[String]) -> (Map<String, Value>, Vec<String>) {
    let mut out = Map::new();
    let mut missing = Vec::new();
    for field in fields {
        // A top-level name in an object is looked up as it is, with no pointer built.
        let value = match payload {
            Value::Object(map) if !field.starts_with('/') => map.get(field.as_str()),
            _ if field.starts_with('/') => payload.pointer(field),
            _ => payload.pointer(&field_pointer(field)),
        };
        match value {
            Some(v) => {
                out.insert(field.clone(), v.clone());
            }
            None => missing.push(field.clone()),
        }
    }
    (out, missing)
}

/// `null`, `""`, `[]` or `{}`: no key at all.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

/// A JSON pointer (RFC 6901) as `serde_json::Value::pointer` reads it: empty (the whole
/// document, which a key never is), or `/` then reference tokens in which `~` is always
/// `~0` or `~1`. Anything else finds nothing, which would read as a missing key.
pub(crate) fn check_pointer(what: &'static str, pointer: &str) -> Result<(), Error> {
    let invalid = |reason: String| {
        Err(Error::InvalidName {
            what,
            name: pointer.to_owned(),
            reason,
        })
    };
    if !pointer.starts_with('/') {
        return invalid(format!(
            "a JSON pointer starts with `/`: write \"/{pointer}\", or KeyStrategy::field({pointer:?}) for a top-level field"
        ));
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return invalid(
                "in a JSON pointer `~` must be followed by `0` (for `~`) or `1` (for `/`)".into(),
            );
        }
    }
    Ok(())
}

/// Field lists (for hashes and validation): top-level names, or pointers if they start
/// with `/`.
pub(crate) fn check_fields(what: &'static str, fields: &[String]) -> Result<(), Error> {
    fields
        .iter()
        .filter(|f| f.starts_with('/'))
        .try_for_each(|f| check_pointer(what, f))
}

/// The key at `pointer`; a missing or empty one is [`Error::KeyMissing`] naming `named`.
fn read_key(payload: &Value, pointer: &str, named: &str) -> Result<String, Error> {
    key_from(payload.pointer(pointer), named)
}

/// The key in `value`; a missing or empty one is [`Error::KeyMissing`] naming `named`.
fn key_from(value: Option<&Value>, named: &str) -> Result<String, Error> {
    match value {
        // An empty value would be one key shared by every message that has it.
        None => Err(Error::KeyMissing {
            field: named.to_owned(),
        }),
        Some(v) if is_empty(v) => Err(Error::KeyMissing {
            field: named.to_owned(),
        }),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Ok(canonical::to_canonical_string(other)),
    }
}

fn field_pointer(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointer_reads_nested_values() {
        let p = json!({"order": {"id": 4471, "v": "9"}});
        assert_eq!(
            KeyStrategy::pointer("/order/id").derive(&p).unwrap(),
            "4471"
        );
        assert_eq!(KeyStrategy::pointer("/order/v").derive(&p).unwrap(), "9");
    }

    #[test]
    fn missing_key_is_an_error_not_a_shared_key() {
        let p = json!({"request_id": null, "other": 1});
        assert!(matches!(
            KeyStrategy::field("request_id").derive(&p),
            Err(Error::KeyMissing { .. })
        ));
        assert!(matches!(
            KeyStrategy::hash(["model", "messages"]).derive(&p),
            Err(Error::KeyMissing { field }) if field == "model, messages"
        ));
        assert!(matches!(
            KeyStrategy::hash(["model"])
                .allow_missing_fields()
                .derive(&p),
            Err(Error::KeyMissing { .. })
        ));
    }

    #[test]
    fn hash_ignores_fields_outside_the_subset_and_number_spelling() {
        let k = KeyStrategy::hash(["model", "temperature"]);
        let a: Value = serde_json::from_str(r#"{"model":"m","temperature":0.7,"at":1}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"at":2,"temperature":7e-1,"model":"m"}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"model":"m","temperature":0.8}"#).unwrap();
        assert_eq!(k.derive(&a).unwrap(), k.derive(&b).unwrap());
        assert_ne!(k.derive(&a).unwrap(), k.derive(&c).unwrap());
        assert_eq!(k.derive(&a).unwrap().len(), 64);
    }

    #[test]
    fn fallback_takes_the_first_key_found() {
        let k = KeyStrategy::field("request_id").or(KeyStrategy::hash(["model"]));
        assert_eq!(
            k.derive(&json!({"request_id": "x", "model": "m"})).unwrap(),
            "x"
        );
        assert_eq!(k.derive(&json!({"model": "m"})).unwrap().len(), 64);
        let err = k.derive(&json!({})).unwrap_err();
        assert!(matches!(err, Error::KeyMissing { field } if field == "request_id or model"));
    }

    /// A missing key names the field as it was written: `field("order/id")` is a
    /// top-level field named `order/id`, and the error says that name, not the pointer
    /// `/order~1id` it is read through.
    #[test]
    fn a_missing_field_is_named_as_written() {
        let missing = |k: KeyStrategy| match k.derive(&json!({"order": {"id": "1"}})) {
            Err(e @ Error::KeyMissing { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        let text = missing(KeyStrategy::field("order/id"));
        assert!(text.contains("at order/id;"), "{text}");
        assert!(!text.contains("~1"), "{text}");
        let text = missing(KeyStrategy::field("a~b"));
        assert!(text.contains("at a~b;"), "{text}");
        // A pointer is named as the pointer it is.
        let text = missing(KeyStrategy::pointer("/order/sku"));
        assert!(text.contains("at /order/sku;"), "{text}");
        assert_eq!(
            format!("{:?}", KeyStrategy::field("order/id")),
            "KeyStrategy::field(\"order/id\")"
        );
        // The field is still read: a top-level name holding `/`.
        assert_eq!(
            KeyStrategy::field("order/id")
                .derive(&json!({"order/id": "7"}))
                .unwrap(),
            "7"
        );
    }

    #[test]
    fn a_custom_key_that_is_empty_is_missing() {
        let k = KeyStrategy::custom(|_| Ok(Some(String::new())));
        assert!(matches!(
            k.derive(&json!({})),
            Err(Error::KeyMissing { .. })
        ));
        let failing = KeyStrategy::custom(|_| Err("no key here".into()));
        match failing.derive(&json!({})) {
            Err(e @ Error::InvalidKey { .. }) => {
                assert!(
                    !e.to_string().contains("no key here"),
                    "Display is one layer: {e}"
                );
                assert!(crate::report(&e).ends_with(": no key here"), "{e}");
                assert!(
                    std::error::Error::source(&e).is_some(),
                    "the closure's error is the source"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            format!("{:?}", KeyStrategy::field("a").or(KeyStrategy::hash(["b"]))),
            r#"[KeyStrategy::field("a"), KeyStrategy::hash(["b"])]"#
        );
    }

    #[test]
    fn custom_keys() {
        let k = KeyStrategy::custom(|v| Ok(v["doc"].as_u64().map(|d| format!("summarise-{d}"))));
        assert_eq!(k.derive(&json!({"doc": 4471})).unwrap(), "summarise-4471");
        assert!(matches!(
            k.derive(&json!({})),
            Err(Error::KeyMissing { .. })
        ));
    }

    #[test]
    fn empty_containers_are_missing_keys_not_shared_ones() {
        // `[]` and `{}` would otherwise be the key of every message that has them.
        let p = json!({"request_id": [], "order": {"id": {}}, "tags": ["a"]});
        for k in [
            KeyStrategy::field("request_id"),
            KeyStrategy::pointer("/order/id"),
        ] {
            assert!(
                matches!(k.derive(&p), Err(Error::KeyMissing { .. })),
                "{k:?}"
            );
        }
        // Non-empty containers are still keys, in canonical form.
        assert_eq!(KeyStrategy::field("tags").derive(&p).unwrap(), r#"["a"]"#);
        // And a fallback moves past an empty one.
        let k = KeyStrategy::field("request_id").or(KeyStrategy::field("tags"));
        assert_eq!(k.derive(&p).unwrap(), r#"["a"]"#);
    }

    /// Stored keys must not change between versions: a change of canonical form or hash
    /// output turns every retry after an upgrade into new work. The hashes below were
    /// computed outside this crate, as `printf '%s' '<canonical text>' | sha256sum`.
    #[test]
    fn stored_key_format_is_pinned() {
        let cases: [(&str, &[&str], &str, &str); 3] = [
            (
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.7,"max_tokens":64}"#,
                &["model", "messages", "temperature", "max_tokens"],
                r#"{"max_tokens":64,"messages":[{"content":"hi","role":"user"}],"model":"m","temperature":0.7}"#,
                "797c46bf1c6811394d960b9b8c47e9b5914ee4c036607ae96e452c43433d83bd",
            ),
            (
                r#"{"order":{"id":4471,"lines":[1,2]},"customer":"c-9","submitted_at":"2024-01-01"}"#,
                &["/order/id", "customer"],
                r#"{"/order/id":4471,"customer":"c-9"}"#,
                "b2b8c260920b0a6fe46861fa1dc03ff838c097efe50bbd756e248688ae1d0e27",
            ),
            (
                // The whole payload: escapes, a float written as an integer, negative
                // zero, and an integer beyond 2^53 kept exact.
                r#"{"n":-0.0,"id":9007199254740993,"b":[1.5e3,true,null],"a":"\u00e9\n"}"#,
                &[],
                r#"{"a":"é\n","b":[1500,true,null],"id":9007199254740993,"n":0}"#,
                "f961273f81d66a9bb3680712109b7dd5760453a004f224ec0c233e649e65b3c5",
            ),
        ];
        for (payload, fields, canonical, sha) in cases {
            let p: Value = serde_json::from_str(payload).unwrap();
            let fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
            let hashed = if fields.is_empty() {
                p.clone()
            } else {
                Value::Object(subset(&p, &fields).0)
            };
            assert_eq!(
                canonical::to_canonical_string(&hashed),
                canonical,
                "{payload}"
            );
            assert_eq!(KeyStrategy::hash(fields.clone()).derive(&p).unwrap(), sha);
            assert_eq!(validation_hash(&p, &fields), sha);
        }
        // An absent field allowed to be missing is left out, not written as null.
        let k = KeyStrategy::hash(["model", "seed"]).allow_missing_fields();
        assert_eq!(
            k.derive(&json!({"model": "m"})).unwrap(),
            // printf '%s' '{"model":"m"}' | sha256sum
            "548f58d1c36c715b44f0863472074a97c448d5b8d18164b92adf55592b127f86"
        );
    }

    #[test]
    fn pointers_are_checked_when_the_strategy_is_built() {
        let err = KeyStrategy::pointer_unchecked("request_id".into())
            .check()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"invalid idempotency key pointer "request_id": a JSON pointer starts with `/`: write "/request_id", or KeyStrategy::field("request_id") for a top-level field"#
        );
        let nested = KeyStrategy::field("id").or(KeyStrategy::hash_unchecked(vec!["/a~2".into()]));
        assert!(
            matches!(nested.check(), Err(Error::InvalidName { what: "key field", name, .. }) if name == "/a~2")
        );
        for good in [
            KeyStrategy::pointer("/a~0b~1c/0"),
            KeyStrategy::field("a/b~c"),
            KeyStrategy::hash(["name", "/x/y"]),
            KeyStrategy::hash_payload(),
            KeyStrategy::custom(|_| Ok(None)),
        ] {
            good.check().unwrap();
        }
        let panic = std::panic::catch_unwind(|| KeyStrategy::pointer("request_id")).unwrap_err();
        assert!(
            panic
                .downcast_ref::<String>()
                .unwrap()
                .contains("starts with `/`"),
            "KeyStrategy::pointer panics with the reason"
        );
        assert!(std::panic::catch_unwind(|| KeyStrategy::hash(["/a~"])).is_err());
        assert!(matches!(
            KeyStrategy::try_pointer("id"),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            KeyStrategy::try_hash(["/a~"]),
            Err(Error::InvalidName { .. })
        ));
        assert!(KeyStrategy::try_pointer("/id").is_ok() && KeyStrategy::try_hash(["a"]).is_ok());
    }

    #[test]
    fn known_sha256() {
        // sha256 of the canonical text `{"a":1}`.
        assert_eq!(
            hash_value(&json!({"a": 1})),
            "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"
        );
    }
}
