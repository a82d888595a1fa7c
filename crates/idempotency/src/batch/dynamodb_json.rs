//! DynamoDB's typed attribute values (`{"S": "a"}`, `{"N": "1.5"}`, ...) as plain JSON, so
//! a stream record's image is keyed and validated as an SQS body is.
//!
//! | DynamoDB | JSON |
//! |---|---|
//! | `S` | string |
//! | `N` | number: an integer when it is a whole number that fits 64 bits; else a double when it has at most 15 significant digits (so the double holds it exactly, as written); else a **string**, exactly as the record holds it, so two different numbers never become one |
//! | `BOOL` | `true` / `false` |
//! | `NULL` | `null` |
//! | `M` | object |
//! | `L` | array |
//! | `SS`, `NS` | array of strings, array of numbers (as `N`), **sorted** (strings by their bytes, numbers by value): DynamoDB keeps no order in a set, so the same set always converts alike |
//! | `B`, `BS` | base64 string, array of base64 strings, sorted |

use serde_json::{Map, Number, Value};

/// An item (`{"name": {"S": "a"}, ...}`) as a plain JSON object.
pub(super) fn item_to_json(item: &Map<String, Value>) -> Result<Value, String> {
    let mut object = Map::with_capacity(item.len());
    for (name, value) in item {
        let plain = attribute_to_json(value).map_err(|e| format!("attribute `{name}`: {e}"))?;
        object.insert(name.clone(), plain);
    }
    Ok(Value::Object(object))
}

fn attribute_to_json(value: &Value) -> Result<Value, String> {
    let Some((tag, inner)) = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.iter().next())
    else {
        return Err(format!("not a typed attribute value: {}", shape(value)));
    };
    match (tag.as_str(), inner) {
        ("S" | "B", Value::String(s)) => Ok(Value::String(s.clone())),
        ("N", Value::String(n)) => number(n),
        ("BOOL", Value::Bool(b)) => Ok(Value::Bool(*b)),
        ("NULL", _) => Ok(Value::Null),
        ("M", Value::Object(map)) => item_to_json(map),
        ("L", Value::Array(items)) => items
            .iter()
            .map(attribute_to_json)
            .collect::<Result<_, _>>()
            .map(Value::Array),
        ("SS" | "BS", Value::Array(items)) => {
            let mut strings = items
                .iter()
                .map(|s| {
                    s.as_str()
                        .ok_or_else(|| format!("{tag} holds a non-string"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            strings.sort_unstable();
            let strings = strings.into_iter().map(|s| Value::String(s.to_owned()));
            Ok(Value::Array(strings.collect()))
        }
        ("NS", Value::Array(items)) => {
            let mut numbers = items
                .iter()
                .map(|n| {
                    let text = n
                        .as_str()
                        .ok_or_else(|| "NS holds a non-string".to_owned())?;
                    let value: f64 = text.parse().map_err(|_| not_a_number(text))?;
                    Ok((value, text, number(text)?))
                })
                .collect::<Result<Vec<_>, String>>()?;
            numbers.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
            Ok(Value::Array(
                numbers.into_iter().map(|(_, _, n)| n).collect(),
            ))
        }
        _ => Err(format!("unknown or ill-formed attribute type {tag}")),
    }
}

/// An `N` as JSON: exact, or a string (see the module's table).
fn number(text: &str) -> Result<Value, String> {
    if let Ok(i) = text.parse::<i64>() {
        return Ok(Value::Number(i.into()));
    }
    if let Ok(u) = text.parse::<u64>() {
        return Ok(Value::Number(u.into()));
    }
    let value: f64 = text.parse().map_err(|_| not_a_number(text))?;
    if !value.is_finite() {
        return Err(not_a_number(text));
    }
    if significant_digits(text) > 15 {
        return Ok(Value::String(text.to_owned()));
    }
    // A whole number written another way (`1E+2`) is the integer, as `100` is.
    if value.fract() == 0.0 && value.abs() < 9_007_199_254_740_992.0 {
        return Ok(Value::Number((value as i64).into()));
    }
    Number::from_f64(value)
        .map(Value::Number)
        .ok_or_else(|| not_a_number(text))
}

/// The digits of a decimal's mantissa between its first and last non-zero digit.
fn significant_digits(text: &str) -> usize {
    let mantissa = text.split(['e', 'E']).next().unwrap_or(text);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    digits.trim_start_matches('0').trim_end_matches('0').len()
}

fn not_a_number(text: &str) -> String {
    format!(
        "an N value ({} characters) that is not a number JSON can hold",
        text.len()
    )
}

/// What a value looks like, without its content (it may be personal data).
fn shape(value: &Value) -> &'static str {
    match value {
        Value::Object(_) => "an object that is not one {type: value} pair",
        other => crate::envelope::shape(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_attribute_type_has_its_plain_form() {
        let item = json!({
            "request_id": {"S": "r-1"},
            "max_tokens": {"N": "64"},
            "big": {"N": "18446744073709551615"},
            "huge": {"N": "123456789012345678901234567890"},
            "precise": {"N": "0.10000000000000000001"},
            "hundred": {"N": "1E+2"},
            "negative": {"N": "-3"},
            "temperature": {"N": "0.70"},
            "ok": {"BOOL": true},
            "nothing": {"NULL": true},
            "messages": {"L": [{"M": {"role": {"S": "user"}, "content": {"S": "hi"}}}]},
            "tags": {"SS": ["b", "a"]},
            "scores": {"NS": ["2.5", "-1", "1"]},
            "blob": {"B": "AAEC"},
            "blobs": {"BS": ["AQ==", "AAEC"]},
        });
        let plain = item_to_json(item.as_object().unwrap()).unwrap();
        assert_eq!(
            plain,
            json!({
                "request_id": "r-1", "max_tokens": 64, "big": 18446744073709551615u64,
                "huge": "123456789012345678901234567890", "precise": "0.10000000000000000001",
                "hundred": 100,
                "negative": -3, "temperature": 0.7, "ok": true, "nothing": null,
                "messages": [{"role": "user", "content": "hi"}],
                "tags": ["a", "b"], "scores": [-1, 1, 2.5], "blob": "AAEC", "blobs": ["AAEC", "AQ=="],
            })
        );
    }

    #[test]
    fn an_ill_formed_value_is_an_error_naming_the_attribute_not_its_content() {
        for (item, needle) in [
            (
                json!({"a": {"X": "secret-1"}}),
                "attribute `a`: unknown or ill-formed attribute type X",
            ),
            (
                json!({"a": "secret-1"}),
                "attribute `a`: not a typed attribute value: a string",
            ),
            (
                json!({"a": {"N": "secret-1"}}),
                "attribute `a`: an N value (8 characters)",
            ),
            (
                json!({"a": {"M": {"b": {"S": 1}}}}),
                "attribute `a`: attribute `b`: unknown or ill-formed",
            ),
            (
                json!({"a": {"S": "x", "N": "1"}}),
                "not a typed attribute value",
            ),
        ] {
            let err = item_to_json(item.as_object().unwrap()).unwrap_err();
            assert!(err.contains(needle), "{err}");
            assert!(!err.contains("secret-1"), "{err}");
        }
    }
}
