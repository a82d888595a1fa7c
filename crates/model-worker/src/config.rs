//! Configuration from the environment, checked before any message is touched.

use lambda_idempotency::expiry_for_queue;
use std::fmt;
use std::time::Duration;

/// Where idempotency records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// A DynamoDB table (`IDEMPOTENCY_TABLE`); region, credentials and `AWS_ENDPOINT_URL`
    /// come from the standard AWS variables.
    DynamoDb {
        /// The table name.
        table: String,
    },
    /// The embedded in-memory store (`IDEMPOTENCY_STORE=memory`): local runs only, records
    /// die with the process.
    Memory,
}

/// The worker's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The idempotency store.
    pub store: StoreChoice,
    /// `MODEL_BASE_URL`, e.g. `https://api.openai.com` (no trailing `/v1`).
    pub model_base_url: String,
    /// `MODEL_API_KEY`, sent as a bearer token when set.
    pub model_api_key: Option<String>,
    /// Record expiry: `IDEMPOTENCY_EXPIRES_AFTER_SECONDS`, or derived from the queue's
    /// settings (`IDEMPOTENCY_QUEUE_RETENTION_SECONDS`, `IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT`,
    /// `IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS`, as the SAM template passes them):
    /// retention + max receives x visibility timeout. Default: the library's 15 days.
    pub expires_after: Option<Duration>,
}

/// Every problem with the environment, reported at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub Vec<String>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid configuration: {}", self.0.join("; "))
    }
}

impl std::error::Error for ConfigError {}

impl WorkerConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `get`, for tests.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut problems = Vec::new();
        let store = match get("IDEMPOTENCY_STORE").as_deref() {
            Some("memory") => Some(StoreChoice::Memory),
            None | Some("dynamodb") => match get("IDEMPOTENCY_TABLE") {
                Some(table) => Some(StoreChoice::DynamoDb { table }),
                None => {
                    problems.push("IDEMPOTENCY_TABLE is not set (the DynamoDB table for idempotency records; or set IDEMPOTENCY_STORE=memory for a local run)".into());
                    None
                }
            },
            Some(other) => {
                problems.push(format!(
                    "IDEMPOTENCY_STORE={other:?} is not one of: dynamodb, memory"
                ));
                None
            }
        };
        let model_base_url = match get("MODEL_BASE_URL") {
            Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                Some(url.trim_end_matches('/').to_owned())
            }
            Some(url) => {
                problems.push(format!(
                    "MODEL_BASE_URL={url:?} is not an http:// or https:// URL"
                ));
                None
            }
            None => {
                problems.push("MODEL_BASE_URL is not set (the provider's base URL, e.g. https://api.openai.com)".into());
                None
            }
        };
        let mut number = |name: &str| match get(name) {
            None => None,
            Some(s) => match s.parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    problems.push(format!("{name}={s:?} is not a positive whole number"));
                    None
                }
            },
        };
        let explicit = number("IDEMPOTENCY_EXPIRES_AFTER_SECONDS");
        let queue = [
            number("IDEMPOTENCY_QUEUE_RETENTION_SECONDS"),
            number("IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT"),
            number("IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS"),
        ];
        let expires_after = match (explicit, queue) {
            (Some(secs), _) => Some(Duration::from_secs(secs)),
            (None, [Some(retention), Some(receives), Some(visibility)]) => Some(expiry_for_queue(
                Duration::from_secs(retention),
                u32::try_from(receives).unwrap_or(u32::MAX),
                Duration::from_secs(visibility),
            )),
            (None, [None, None, None]) => None,
            (None, _) => {
                problems.push("set all three of IDEMPOTENCY_QUEUE_RETENTION_SECONDS, IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT and IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS, or none".into());
                None
            }
        };
        match (store, model_base_url) {
            (Some(store), Some(model_base_url)) if problems.is_empty() => Ok(Self {
                store,
                model_base_url,
                model_api_key: get("MODEL_API_KEY"),
                expires_after,
            }),
            _ => Err(ConfigError(problems)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<WorkerConfig, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        WorkerConfig::from_lookup(|k| vars.get(k).cloned())
    }

    #[test]
    fn a_complete_environment() {
        let c = config(&[
            ("IDEMPOTENCY_TABLE", "idem"),
            ("MODEL_BASE_URL", "https://models.example/"),
            ("MODEL_API_KEY", "sk-1"),
            ("IDEMPOTENCY_EXPIRES_AFTER_SECONDS", "1209600"),
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreChoice::DynamoDb {
                table: "idem".into()
            }
        );
        assert_eq!(c.model_base_url, "https://models.example");
        assert_eq!(c.model_api_key.as_deref(), Some("sk-1"));
        assert_eq!(c.expires_after, Some(Duration::from_secs(1_209_600)));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let err = config(&[
            ("MODEL_BASE_URL", "models.example"),
            ("IDEMPOTENCY_EXPIRES_AFTER_SECONDS", "-1"),
        ])
        .unwrap_err();
        assert_eq!(err.0.len(), 3, "{err}");
        assert!(
            err.to_string().contains("IDEMPOTENCY_TABLE is not set"),
            "{err}"
        );
        let err = config(&[
            ("IDEMPOTENCY_STORE", "redis"),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("not one of: dynamodb, memory"),
            "{err}"
        );
    }

    #[test]
    fn expiry_is_derived_from_the_queue_settings() {
        let c = config(&[
            ("IDEMPOTENCY_TABLE", "idem"),
            ("MODEL_BASE_URL", "http://x"),
            ("IDEMPOTENCY_QUEUE_RETENTION_SECONDS", "345600"),
            ("IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT", "5"),
            ("IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS", "360"),
        ])
        .unwrap();
        assert_eq!(
            c.expires_after,
            Some(Duration::from_secs(345_600 + 5 * 360))
        );
        let partial = config(&[
            ("IDEMPOTENCY_TABLE", "idem"),
            ("MODEL_BASE_URL", "http://x"),
            ("IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT", "5"),
        ]);
        assert!(partial.unwrap_err().to_string().contains("all three"));
    }

    #[test]
    fn memory_store_needs_no_table() {
        let c = config(&[
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://127.0.0.1:9"),
        ])
        .unwrap();
        assert_eq!(c.store, StoreChoice::Memory);
    }
}
