//! DynamoDB's typed attribute values (`{"S": "a"}`, `{"N": "1.5"}`, ...) as plain JSON, so
//! a stream record's image is keyed and validated as an SQS body is.
//!
//! | DynamoDB | JSON |
//! |---|---|
//! | `S` | string |
//! | `N` | number: an integer when it is one that fits 64 bits, else the nearest double; a number no double holds (beyond ±1.8e308) is an error |
//! | `BOOL` | `true` / `false` |
//! | `NULL` | `null` |
//! | `M` | object |
//! | `L` | array |
//! | `SS`, `NS` | array of strings, array of numbers (as `N`), in the order the record holds them |
//! | `B`, `BS` | base64 string, array of base64 strings (as the record holds them) |

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
        ("SS" | "BS", Value::Array(items)) => items
            .iter()
            .map(|s| {
                s.as_str()
                    .map(|s| Value::String(s.to_owned()))
                    .ok_or_else(|| format!("{tag} holds a non-string"))
            })
            .collect::<Result<_, _>>()
            .map(Value::Array),
        ("NS", Value::Array(items)) => items
            .iter()
            .map(|n| {
                n.as_str()
                    .ok_or_else(|| "NS holds a non-string".to_owned())
                    .and_then(number)
            })
            .collect::<Result<_, _>>()
            .map(Value::Array),
        _ => Err(format!("unknown or ill-formed attribute type {tag}")),
    }
}

fn number(text: &str) -> Result<Value, String> {
    if let Ok(i) = text.parse::<i64>() {
        return Ok(Value::Number(i.into()));
    }
    if let Ok(u) = text.parse::<u64>() {
        return Ok(Value::Number(u.into()));
    }
    text.parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map(Value::Number)
        .ok_or_else(|| {
            format!(
                "an N value ({} characters) that is not a number JSON can hold",
                text.len()
            )
        })
}

/// What a value looks like, without its content (it may be personal data).
fn shape(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object that is not one {type: value} pair",
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
            "negative": {"N": "-3"},
            "temperature": {"N": "0.70"},
            "ok": {"BOOL": true},
            "nothing": {"NULL": true},
            "messages": {"L": [{"M": {"role": {"S": "user"}, "content": {"S": "hi"}}}]},
            "tags": {"SS": ["a", "b"]},
            "scores": {"NS": ["1", "2.5"]},
            "blob": {"B": "AAEC"},
            "blobs": {"BS": ["AAEC"]},
        });
        let plain = item_to_json(item.as_object().unwrap()).unwrap();
        assert_eq!(
            plain,
            json!({
                "request_id": "r-1", "max_tokens": 64, "big": 18446744073709551615u64,
                "negative": -3, "temperature": 0.7, "ok": true, "nothing": null,
                "messages": [{"role": "user", "content": "hi"}],
                "tags": ["a", "b"], "scores": [1, 2.5], "blob": "AAEC", "blobs": ["AAEC"],
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
