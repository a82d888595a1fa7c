//! The steps an envelope is made of, and how a body goes through them.

use super::Opened;
use base64::Engine;
use serde_json::Value;
use std::io::Read;

/// One step of an [`Envelope`](super::Envelope).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// The value at an RFC 6901 pointer.
    Pointer(String),
    /// A string holding JSON, parsed.
    JsonString,
    /// Base64 (standard, padded), decoded into bytes.
    Base64,
    /// Gzip bytes, inflated.
    Gzip,
    /// An HTTP event's `body`, base64-decoded when `isBase64Encoded`.
    HttpBody,
    /// Skip the body when the string at `pointer` is `value`.
    SkipWhen {
        /// Where the marker is.
        pointer: String,
        /// What it says on a message to skip.
        value: String,
        /// Why such a message is skipped.
        reason: String,
    },
}

/// The most an inflated gzip body may hold: a body past it is refused, not read into
/// memory whole (a CloudWatch Logs batch holds at most 1 MiB of log events; parsed as
/// JSON, a body grows several times again).
const MAX_INFLATED: u64 = 8 * 1024 * 1024;

/// What a step hands the next: bytes not yet parsed, or JSON.
pub(super) enum Carried {
    Bytes(Vec<u8>),
    Json(Value),
}

impl Carried {
    fn json(self) -> Result<Value, String> {
        match self {
            Carried::Json(value) => Ok(value),
            Carried::Bytes(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| format!("not JSON ({e})"))
            }
        }
    }

    /// A string's bytes (a JSON string, or bytes as they are).
    fn text_bytes(self, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Carried::Bytes(bytes) => Ok(bytes),
            Carried::Json(Value::String(text)) => Ok(text.into_bytes()),
            Carried::Json(other) => Err(format!("{what} needs a string, found {}", shape(&other))),
        }
    }
}

pub(super) fn run(steps: &[Step], mut carried: Carried) -> Result<Opened, String> {
    for step in steps {
        carried = match step {
            Step::Pointer(pointer) => {
                let mut value = carried.json()?;
                match value.pointer_mut(pointer) {
                    Some(found) => Carried::Json(found.take()),
                    None => return Err(format!("nothing at {pointer:?}")),
                }
            }
            Step::JsonString => match carried.json()? {
                Value::String(text) => Carried::Bytes(text.into_bytes()),
                other => {
                    return Err(format!(
                        "expected a string holding JSON, found {}",
                        shape(&other)
                    ));
                }
            },
            Step::Base64 => {
                let text = carried.text_bytes("base64")?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.trim_ascii())
                    .map_err(|e| format!("not base64 ({e})"))?;
                Carried::Bytes(bytes)
            }
            Step::Gzip => {
                let Carried::Bytes(bytes) = carried else {
                    return Err("gzip needs bytes: decode the base64 first".into());
                };
                Carried::Bytes(inflate(&bytes)?)
            }
            Step::HttpBody => {
                let mut event = carried.json()?;
                let encoded = event.get("isBase64Encoded").and_then(Value::as_bool) == Some(true);
                let body = match event.get_mut("body").map(Value::take) {
                    Some(Value::String(body)) => body,
                    Some(Value::Null) | None => return Err("the event has no body".into()),
                    Some(other) => {
                        return Err(format!("the body is {}, not a string", shape(&other)));
                    }
                };
                if encoded {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(body.trim_ascii())
                        .map_err(|e| {
                            format!("isBase64Encoded, but the body is not base64 ({e})")
                        })?;
                    Carried::Bytes(bytes)
                } else {
                    Carried::Bytes(body.into_bytes())
                }
            }
            Step::SkipWhen {
                pointer,
                value,
                reason,
            } => {
                let json = carried.json()?;
                if json.pointer(pointer).and_then(Value::as_str) == Some(value.as_str()) {
                    return Ok(Opened::Skip {
                        reason: reason.clone(),
                    });
                }
                Carried::Json(json)
            }
        };
    }
    Ok(Opened::Request(carried.json()?))
}

fn inflate(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    // Every member: a body of two read as its first would lose the second unrun.
    let mut reader = flate2::read::MultiGzDecoder::new(bytes).take(MAX_INFLATED + 1);
    reader
        .read_to_end(&mut out)
        .map_err(|e| format!("not gzip ({e})"))?;
    if out.len() as u64 > MAX_INFLATED {
        return Err(format!("inflates past {MAX_INFLATED} bytes"));
    }
    Ok(out)
}

/// What a value looks like, without its content (it may be personal data).
pub(crate) fn shape(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
