//! Canonical JSON (RFC 8785, JCS) so equal payloads hash alike.
//!
//! Object keys are sorted by UTF-16 code units, strings use JSON's minimal escaping and
//! numbers are written as ECMAScript writes doubles: `0.7`, `0.70` and `7e-1` all become
//! `0.7`, and `1.0` becomes `1`. One deliberate deviation: integers that JSON carried
//! exactly (within `i64`/`u64`) stay exact, so two distinct 64-bit ids never hash alike.
//! Floats must be parsed with correct rounding (serde_json's `float_roundtrip` feature,
//! which this crate enables) or two spellings of one number can differ by one bit.

use serde_json::Value;
use std::fmt::Write;

/// Appends the canonical form of `value` to `out`.
pub(crate) fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
    }
}

/// The canonical form of `value` as a new string.
pub(crate) fn to_canonical_string(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_string(s: &str, out: &mut String) {
    // serde_json's string escaping is JCS's: \" \\ \b \f \n \r \t, other controls as
    // lowercase \u00xx, everything else literal.
    out.push_str(&serde_json::to_string(s).expect("strings always serialize"));
}

fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(f) = n.as_f64() {
        write_double(f, out);
    }
}

/// ECMAScript's Number::toString for a finite double (RFC 8785 section 3.2.2.3): the
/// shortest round-trip digits, an exact tie between two such taking the even digit, and
/// `-0` written as `0`.
fn write_double(f: f64, out: &mut String) {
    if f == 0.0 {
        out.push('0');
        return;
    }
    // serde_json holds no NaN or infinity, so every double here is finite.
    out.push_str(ryu_js::Buffer::new().format_finite(f));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(text: &str) -> String {
        to_canonical_string(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn equal_numbers_in_different_spellings_are_one_form() {
        assert_eq!(canon("0.7"), "0.7");
        assert_eq!(canon("0.70"), "0.7");
        assert_eq!(canon("7e-1"), "0.7");
        assert_eq!(canon("1.0"), "1");
        assert_eq!(canon("-0.0"), "0");
    }

    #[test]
    fn numbers_follow_ecmascript_formatting() {
        // Cases from RFC 8785 appendix B.
        for (input, want) in [
            ("1e+30", "1e+30"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("333333333.33333329", "333333333.3333333"),
            ("5e-324", "5e-324"),
            ("-1.5e-10", "-1.5e-10"),
            ("123.456", "123.456"),
        ] {
            assert_eq!(canon(input), want, "input {input}");
        }
    }

    #[test]
    fn doubles_match_rfc8785_appendix_b() {
        // Every finite IEEE 754 sample of RFC 8785 appendix B, plus 2^53 - 1. Built from
        // the bits so no parser sits between the double and the expected text.
        for (bits, want) in [
            (0x0000000000000000_u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x433fffffffffffff, "9007199254740991"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            // An exact tie between two shortest forms: ECMAScript takes the even digit.
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            let f = f64::from_bits(bits);
            let n = serde_json::Number::from_f64(f).expect("finite");
            assert_eq!(
                to_canonical_string(&Value::Number(n)),
                want,
                "bits {bits:#018x}"
            );
        }
    }

    #[test]
    fn keys_sort_by_utf16_and_whitespace_goes() {
        assert_eq!(
            canon(r#"{ "b": 1, "a": [true, null, "x"], "A": {"z": 0, "y": 1} }"#),
            r#"{"A":{"y":1,"z":0},"a":[true,null,"x"],"b":1}"#
        );
        // U+1F600 sorts after U+E000 in UTF-8 but before it in UTF-16 (a surrogate pair).
        let v = json!({"\u{E000}": 2, "\u{1F600}": 1});
        assert_eq!(to_canonical_string(&v), "{\"\u{1F600}\":1,\"\u{E000}\":2}");
    }

    #[test]
    fn strings_use_minimal_escapes() {
        assert_eq!(
            to_canonical_string(&json!("é\n\u{1}\"/")),
            "\"é\\n\\u0001\\\"/\""
        );
    }

    #[test]
    fn large_integers_stay_exact() {
        assert_eq!(canon("9007199254740993"), "9007199254740993");
    }
}
