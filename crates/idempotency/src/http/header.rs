//! Reading the `Idempotency-Key` header: the draft's structured-field string (`"…"`,
//! RFC 8941 §3.3.3) or the bare form clients sent before the draft (`Idempotency-Key: abc`).

use http::HeaderMap;
use http::header::HeaderName;

/// The draft's header name. Header names are case-insensitive; `http` keeps them lower case,
/// and lambda_http lower-cases the REST API's mixed-case ones, so one lookup finds every form.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The header a replayed response carries, as Stripe names it (the draft has none yet;
/// its issue #46 proposes this one).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The default longest key, in bytes: Stripe's limit, room for any UUID or ULID form.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// Why a key header was refused (a `400`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    Missing,
    Repeated,
    Empty,
    TooLong { len: usize, max: usize },
    Malformed(&'static str),
}

impl KeyProblem {
    pub(crate) fn detail(&self, header: &HeaderName) -> String {
        match self {
            KeyProblem::Missing => format!("this request requires an {header} header"),
            KeyProblem::Repeated => format!("the {header} header appears more than once"),
            KeyProblem::Empty => format!("the {header} header is empty"),
            KeyProblem::TooLong { len, max } => {
                format!("the {header} header is {len} bytes long; at most {max} are accepted")
            }
            KeyProblem::Malformed(why) => format!("the {header} header is malformed: {why}"),
        }
    }
}

/// The key of `headers`, `None` when there is no such header.
pub(crate) fn read_key(
    headers: &HeaderMap,
    name: &HeaderName,
    max_len: usize,
) -> Result<Option<String>, KeyProblem> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Repeated);
    }
    let raw = value.as_bytes();
    // The raw length first, so a huge header is refused before any work on it.
    // Two more for the quotes; saturating, as the longest setting is `usize::MAX`.
    if raw.len() > max_len.saturating_add(2) {
        return Err(KeyProblem::TooLong {
            len: raw.len(),
            max: max_len,
        });
    }
    let key = parse(raw)?;
    if key.is_empty() {
        return Err(KeyProblem::Empty);
    }
    if key.len() > max_len {
        return Err(KeyProblem::TooLong {
            len: key.len(),
            max: max_len,
        });
    }
    Ok(Some(key))
}

/// A structured-field string's content, or the bare value. Either way only visible ASCII
/// and spaces: what a structured-field string may hold.
fn parse(raw: &[u8]) -> Result<String, KeyProblem> {
    let raw = trim(raw);
    match raw {
        [b'"', inner @ .., b'"'] => {
            let mut key = String::with_capacity(inner.len());
            let mut bytes = inner.iter();
            while let Some(&b) = bytes.next() {
                match b {
                    b'\\' => match bytes.next() {
                        Some(&escaped @ (b'"' | b'\\')) => key.push(char::from(escaped)),
                        _ => {
                            return Err(KeyProblem::Malformed(
                                "a backslash in a quoted key escapes only `\"` or `\\`",
                            ));
                        }
                    },
                    b'"' => {
                        return Err(KeyProblem::Malformed(
                            "a quote inside a quoted key must be escaped",
                        ));
                    }
                    0x20..=0x7e => key.push(char::from(b)),
                    _ => {
                        return Err(KeyProblem::Malformed(
                            "a key holds only visible ASCII characters and spaces",
                        ));
                    }
                }
            }
            Ok(key)
        }
        [b'"', ..] | [.., b'"'] => Err(KeyProblem::Malformed("an unterminated quoted string")),
        bare if bare.contains(&b',') => Err(KeyProblem::Malformed(
            "a comma in an unquoted key: the header was sent twice and joined, or the key needs quotes",
        )),
        bare => {
            if bare
                .iter()
                .all(|b| matches!(b, 0x21..=0x7e) && *b != b'"' && *b != b'\\')
            {
                Ok(bare.iter().map(|&b| char::from(b)).collect())
            } else {
                Err(KeyProblem::Malformed(
                    "an unquoted key holds only visible ASCII characters, without quotes, backslashes or spaces",
                ))
            }
        }
    }
}

fn trim(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn key(values: &[&[u8]]) -> Result<Option<String>, KeyProblem> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        read_key(&headers, &IDEMPOTENCY_KEY, 16)
    }

    #[test]
    fn the_structured_field_string_and_the_bare_form_give_the_same_key() {
        assert_eq!(key(&[b"\"8e03-78\""]), Ok(Some("8e03-78".into())));
        assert_eq!(key(&[b"8e03-78"]), Ok(Some("8e03-78".into())));
        assert_eq!(key(&[b"  \"8e03-78\" "]), Ok(Some("8e03-78".into())));
        assert_eq!(key(&[br#""a \"b\" \\c""#]), Ok(Some(r#"a "b" \c"#.into())));
        assert_eq!(key(&[]), Ok(None));
    }

    #[test]
    fn bad_keys_are_refused_with_their_reason() {
        assert_eq!(key(&[b"a", b"a"]), Err(KeyProblem::Repeated));
        assert_eq!(key(&[b"\"\""]), Err(KeyProblem::Empty));
        assert_eq!(key(&[b""]), Err(KeyProblem::Empty));
        assert_eq!(
            key(&[b"12345678901234567"]),
            Err(KeyProblem::TooLong { len: 17, max: 16 })
        );
        // A long header is refused for its length before it is parsed.
        assert_eq!(
            key(&[b"1234567890 1234567890"]),
            Err(KeyProblem::TooLong { len: 21, max: 16 })
        );
        // Quotes do not count against the limit; the key within them does.
        assert_eq!(
            key(&[b"\"1234567890123456\""]),
            Ok(Some("1234567890123456".into()))
        );
        assert_eq!(
            key(&[&[b'a'; 10_240]]),
            Err(KeyProblem::TooLong {
                len: 10_240,
                max: 16
            })
        );
        for bad in [
            &b"\"abc"[..],
            b"abc\"",
            b"\"a\"b\"",
            b"\"a\\nb\"",
            b"a b",
            b"a\\b",
            b"k1,k1",
            b"k1, k1",
            b"\"caf\xc3\xa9\"",
        ] {
            assert!(
                matches!(key(&[bad]), Err(KeyProblem::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn every_reason_names_the_header() {
        for problem in [
            KeyProblem::Missing,
            KeyProblem::Repeated,
            KeyProblem::Empty,
            KeyProblem::TooLong { len: 2, max: 1 },
            KeyProblem::Malformed("x"),
        ] {
            assert!(problem.detail(&IDEMPOTENCY_KEY).contains("idempotency-key"));
        }
    }
}
