//! Configuration from the environment, checked before any message is touched.

use crate::secret::{self, SECRET_ARN_ENV};
use aws_config::SdkConfig;
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
    /// Redis (`IDEMPOTENCY_STORE=redis`): one node at `REDIS_URL` (`rediss://` for TLS,
    /// credentials in the URL), or a cluster (`IDEMPOTENCY_STORE=redis-cluster`, `REDIS_URL`
    /// a comma-separated list of nodes). Needs the `redis` feature.
    Redis {
        /// The node's URL, or the cluster's nodes.
        urls: Vec<String>,
        /// Whether `urls` are a cluster's nodes.
        cluster: bool,
        /// `IDEMPOTENCY_KEY_PREFIX`: prepended to every record's key (default none).
        key_prefix: String,
    },
    /// PostgreSQL (`IDEMPOTENCY_STORE=postgres`) at `DATABASE_URL`, in the table
    /// `IDEMPOTENCY_TABLE` (default `idempotency`). Needs the `postgres` feature.
    Postgres {
        /// The connection string (`sslmode=require` for TLS).
        url: String,
        /// The table, possibly schema-qualified.
        table: String,
    },
}

/// The store kinds this build of the worker holds (its cargo features).
pub const STORES: &[&str] = &[
    "dynamodb",
    "memory",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "redis")]
    "redis-cluster",
    #[cfg(feature = "postgres")]
    "postgres",
];

/// The worker's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The idempotency store.
    pub store: StoreChoice,
    /// `MODEL_BASE_URL`, e.g. `https://api.openai.com` (no trailing `/v1`).
    pub model_base_url: String,
    /// The bearer token sent to the provider: `MODEL_API_KEY` (local runs), or, once
    /// [`WorkerConfig::read_secrets`] has run, the value of the secret at
    /// `MODEL_API_KEY_SECRET_ARN`.
    pub model_api_key: Option<String>,
    /// `MODEL_API_KEY_SECRET_ARN`: the Secrets Manager secret holding the API key (a
    /// deployed function's way), read once at start-up by [`WorkerConfig::read_secrets`].
    pub model_api_key_secret_arn: Option<String>,
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
            Some(kind @ ("redis" | "redis-cluster" | "postgres")) if !STORES.contains(&kind) => {
                let feature = kind.trim_end_matches("-cluster");
                problems.push(format!(
                    "IDEMPOTENCY_STORE={kind} needs a worker built with the `{feature}` feature (cargo build --features {feature})"
                ));
                None
            }
            Some(kind @ ("redis" | "redis-cluster")) => match get("REDIS_URL") {
                Some(urls) => Some(StoreChoice::Redis {
                    urls: urls.split(',').map(|u| u.trim().to_owned()).collect(),
                    cluster: kind == "redis-cluster",
                    key_prefix: get("IDEMPOTENCY_KEY_PREFIX").unwrap_or_default(),
                }),
                None => {
                    problems.push(format!("REDIS_URL is not set (IDEMPOTENCY_STORE={kind}: the server's redis:// or rediss:// URL)"));
                    None
                }
            },
            Some("postgres") => match get("DATABASE_URL") {
                Some(url) => Some(StoreChoice::Postgres {
                    url,
                    table: get("IDEMPOTENCY_TABLE").unwrap_or_else(|| "idempotency".into()),
                }),
                None => {
                    problems.push("DATABASE_URL is not set (IDEMPOTENCY_STORE=postgres: a postgres:// connection string)".into());
                    None
                }
            },
            Some(other) => {
                problems.push(format!(
                    "IDEMPOTENCY_STORE={other:?} is not one of: {}",
                    STORES.join(", ")
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
        let model_api_key = get("MODEL_API_KEY");
        let model_api_key_secret_arn = get(SECRET_ARN_ENV);
        if let Some(arn) = &model_api_key_secret_arn {
            if !secret::is_secret_arn(arn) {
                problems.push(format!(
                    "{SECRET_ARN_ENV}={arn:?} is not a Secrets Manager secret ARN (arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME)"
                ));
            }
            if model_api_key.is_some() {
                problems.push(format!(
                    "both MODEL_API_KEY and {SECRET_ARN_ENV} are set: MODEL_API_KEY is for local runs, the secret for deployed functions; set one"
                ));
            }
        }
        match (store, model_base_url) {
            (Some(store), Some(model_base_url)) if problems.is_empty() => Ok(Self {
                store,
                model_base_url,
                model_api_key,
                model_api_key_secret_arn,
                expires_after,
            }),
            _ => Err(ConfigError(problems)),
        }
    }
}

impl WorkerConfig {
    /// Reads the API key from Secrets Manager when `MODEL_API_KEY_SECRET_ARN` is set (with
    /// the standard AWS configuration: the function's role, the ARN's region). An
    /// unreadable secret is a configuration problem: the worker does not start.
    pub async fn read_secrets(self) -> Result<Self, ConfigError> {
        if self.model_api_key_secret_arn.is_none() {
            return Ok(self);
        }
        let sdk = secret::sdk_config().await;
        self.read_secrets_with(&sdk).await
    }

    /// [`WorkerConfig::read_secrets`] with a given AWS configuration, for tests.
    pub async fn read_secrets_with(mut self, sdk: &SdkConfig) -> Result<Self, ConfigError> {
        if let Some(arn) = &self.model_api_key_secret_arn {
            let key = secret::read_api_key(sdk, arn)
                .await
                .map_err(|e| ConfigError(vec![e.to_string()]))?;
            self.model_api_key = Some(key);
        }
        Ok(self)
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
            ("IDEMPOTENCY_STORE", "valkey"),
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
    fn the_api_key_comes_from_the_environment_or_a_secret_not_both() {
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:model-key-AbC123";
        let c = config(&[
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://x"),
            ("MODEL_API_KEY_SECRET_ARN", arn),
        ])
        .unwrap();
        assert_eq!(c.model_api_key_secret_arn.as_deref(), Some(arn));
        assert_eq!(
            c.model_api_key, None,
            "read at start-up, not from the environment"
        );
        let err = config(&[
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://x"),
            ("MODEL_API_KEY", "sk-1"),
            ("MODEL_API_KEY_SECRET_ARN", arn),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("set one"), "{err}");
        let err = config(&[
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://x"),
            ("MODEL_API_KEY_SECRET_ARN", "model-key"),
        ])
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("is not a Secrets Manager secret ARN"),
            "{err}"
        );
        // The template passes an empty ARN when no secret is given.
        let c = config(&[
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://x"),
            ("MODEL_API_KEY_SECRET_ARN", ""),
        ])
        .unwrap();
        assert_eq!(c.model_api_key_secret_arn, None);
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

    #[test]
    #[cfg(all(feature = "redis", feature = "postgres"))]
    fn redis_and_postgres_take_their_urls() {
        let c = config(&[
            ("IDEMPOTENCY_STORE", "redis-cluster"),
            ("REDIS_URL", "redis://a:1, redis://b:2"),
            ("IDEMPOTENCY_KEY_PREFIX", "idem:"),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreChoice::Redis {
                urls: vec!["redis://a:1".into(), "redis://b:2".into()],
                cluster: true,
                key_prefix: "idem:".into()
            }
        );
        let c = config(&[
            ("IDEMPOTENCY_STORE", "postgres"),
            ("DATABASE_URL", "postgres://u@h/db"),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreChoice::Postgres {
                url: "postgres://u@h/db".into(),
                table: "idempotency".into()
            }
        );
        for (store, missing) in [("redis", "REDIS_URL"), ("postgres", "DATABASE_URL")] {
            let err = config(&[("IDEMPOTENCY_STORE", store), ("MODEL_BASE_URL", "http://x")])
                .unwrap_err();
            assert!(
                err.to_string().contains(&format!("{missing} is not set")),
                "{err}"
            );
        }
    }

    #[test]
    #[cfg(not(feature = "redis"))]
    fn a_store_left_out_of_the_build_names_its_feature() {
        let err = config(&[
            ("IDEMPOTENCY_STORE", "redis"),
            ("REDIS_URL", "redis://a"),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--features redis"), "{err}");
    }
}
