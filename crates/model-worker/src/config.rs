//! Configuration from the environment, checked before any message is touched.

use crate::secret::{self, SECRET_ARN_ENV};
use aws_config::SdkConfig;
use lambda_idempotency::expiry_for_queue;
use std::fmt;
use std::time::Duration;

/// Where idempotency records live. `Debug` redacts the passwords of its URLs.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// A DynamoDB table (`IDEMPOTENCY_TABLE`); region, credentials and `AWS_ENDPOINT_URL`
    /// come from the standard AWS variables. Its key is checked at start-up.
    DynamoDb {
        /// The table name.
        table: String,
        /// `IDEMPOTENCY_TABLE_PARTITION_KEY`: the partition key's name (default `id`).
        partition_key: String,
        /// `IDEMPOTENCY_TABLE_SORT_KEY`: the sort key's name, for a table with a partition
        /// key and a sort key (a single-table design); the stored id goes into it.
        sort_key: Option<String>,
        /// `IDEMPOTENCY_TABLE_PARTITION_VALUE`: with a sort key, the partition key's value
        /// for every record (default `idempotency#<function name>`).
        partition_value: Option<String>,
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
        /// `IDEMPOTENCY_REDIS_NAMESPACE`: prepended to every record's key (default none).
        namespace: String,
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

/// The worker's settings. `Debug` redacts the API key and the passwords of URLs.
#[derive(Clone, PartialEq, Eq)]
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
    /// `ANSWERS_TABLE`: a table of the store's kind (DynamoDB, PostgreSQL, or the
    /// in-memory store's) that receives each answer in the same atomic step as its record.
    /// Not with Redis, which cannot commit it with the record: the start-up fails.
    pub answers_table: Option<String>,
    /// `IDEMPOTENCY_AT_MOST_ONCE=true`: a request whose earlier run crashed mid-call is
    /// never asked of the provider again; it fails for good and waits for an operator
    /// (docs/deploy.md). `false` or unset: the default, a crashed run is taken over.
    pub at_most_once: bool,
    /// `REQUEST_ENVELOPE`: where the request sits in each SQS body: `sns` (a queue
    /// subscribed to an SNS topic, raw message delivery off: the notification's `Message`)
    /// or `eventbridge` (a rule's target queue: the event's `detail`). Unset or `none`:
    /// the body is the request. The key and the payload hash see the request only.
    pub request_envelope: Option<RequestEnvelope>,
}

/// The envelopes the worker's requests arrive in (`REQUEST_ENVELOPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestEnvelope {
    /// SNS → SQS, raw message delivery off.
    Sns,
    /// EventBridge → SQS.
    EventBridge,
}

impl RequestEnvelope {
    /// The library's envelope for it.
    pub fn envelope(self) -> lambda_idempotency::Envelope {
        match self {
            RequestEnvelope::Sns => lambda_idempotency::Envelope::sns(),
            RequestEnvelope::EventBridge => lambda_idempotency::Envelope::eventbridge(),
        }
    }
}

/// What `Debug` shows instead of a secret.
pub const REDACTED: &str = "<redacted>";

/// `url` with its password replaced by [`REDACTED`]: the user-info's (`scheme://user:pw@`,
/// `redis://:pw@`) and any `password=` parameter, in a URL's query or a libpq key-value
/// string (`host=… password=…`, quoted or not).
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(start) = out.find("://").map(|i| i + 3) {
        let rest = &out[start..];
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        if let Some(at) = authority.rfind('@')
            && let Some(colon) = authority[..at].find(':')
        {
            out.replace_range(start + colon + 1..start + at, REDACTED);
        }
    }
    // `password=...` in a query string or a libpq key/value string, where spaces may
    // surround `=` and a quoted value may hold `\'` (libpq's rules).
    let mut from = 0;
    while let Some(found) = out[from..].to_ascii_lowercase().find("password") {
        let after = from + found + "password".len();
        let rest = &out[after..];
        let trimmed = rest.trim_start();
        let Some(value_part) = trimmed.strip_prefix('=') else {
            from = after;
            continue;
        };
        let value = after
            + (rest.len() - value_part.len())
            + (value_part.len() - value_part.trim_start().len());
        let end = match out[value..].strip_prefix('\'') {
            Some(quoted) => {
                let mut escaped = false;
                let close = quoted.char_indices().find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                });
                value + 1 + close.map_or(quoted.len(), |(i, _)| i + 1)
            }
            None => {
                value
                    + out[value..]
                        .find(|c: char| c == '&' || c == '#' || c.is_whitespace())
                        .unwrap_or(out.len() - value)
            }
        };
        out.replace_range(value..end, REDACTED);
        from = value + REDACTED.len();
    }
    out
}

impl fmt::Debug for StoreChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreChoice::DynamoDb {
                table,
                partition_key,
                sort_key,
                partition_value,
            } => f
                .debug_struct("DynamoDb")
                .field("table", table)
                .field("partition_key", partition_key)
                .field("sort_key", sort_key)
                .field("partition_value", partition_value)
                .finish(),
            StoreChoice::Memory => f.write_str("Memory"),
            StoreChoice::Redis {
                urls,
                cluster,
                namespace,
            } => f
                .debug_struct("Redis")
                .field(
                    "urls",
                    &urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
                )
                .field("cluster", cluster)
                .field("namespace", namespace)
                .finish(),
            StoreChoice::Postgres { url, table } => f
                .debug_struct("Postgres")
                .field("url", &redact_url(url))
                .field("table", table)
                .finish(),
        }
    }
}

impl fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("store", &self.store)
            .field("model_base_url", &redact_url(&self.model_base_url))
            .field(
                "model_api_key",
                &self.model_api_key.as_ref().map(|_| REDACTED),
            )
            .field("model_api_key_secret_arn", &self.model_api_key_secret_arn)
            .field("expires_after", &self.expires_after)
            .field("at_most_once", &self.at_most_once)
            .field("request_envelope", &self.request_envelope)
            .finish()
    }
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
        // A renamed setting fails the start-up: read under its old name no more, it would
        // leave every stored record under keys the worker no longer looks at.
        if get("IDEMPOTENCY_KEY_PREFIX").is_some() {
            problems.push("IDEMPOTENCY_KEY_PREFIX was renamed IDEMPOTENCY_REDIS_NAMESPACE: set that (same value) and remove the old one".into());
        }
        let key_settings = [
            "IDEMPOTENCY_TABLE_PARTITION_KEY",
            "IDEMPOTENCY_TABLE_SORT_KEY",
            "IDEMPOTENCY_TABLE_PARTITION_VALUE",
        ];
        let store_kind = get("IDEMPOTENCY_STORE");
        if !matches!(store_kind.as_deref(), None | Some("dynamodb")) {
            for name in key_settings.iter().filter(|name| get(name).is_some()) {
                problems.push(format!(
                    "{name} is set but IDEMPOTENCY_STORE is {:?}: the table's key settings are for the DynamoDB store",
                    store_kind.as_deref().unwrap_or_default()
                ));
            }
        }
        let store = match store_kind.as_deref() {
            Some("memory") => Some(StoreChoice::Memory),
            None | Some("dynamodb") => match get("IDEMPOTENCY_TABLE") {
                Some(table) => {
                    let partition_key =
                        get("IDEMPOTENCY_TABLE_PARTITION_KEY").unwrap_or_else(|| "id".into());
                    let sort_key = get("IDEMPOTENCY_TABLE_SORT_KEY");
                    let partition_value = get("IDEMPOTENCY_TABLE_PARTITION_VALUE");
                    if sort_key.as_deref() == Some(partition_key.as_str()) {
                        problems.push(format!(
                            "IDEMPOTENCY_TABLE_SORT_KEY and IDEMPOTENCY_TABLE_PARTITION_KEY are both {partition_key:?}: a table's sort key is another attribute than its partition key"
                        ));
                    }
                    if partition_value.is_some() && sort_key.is_none() {
                        problems.push("IDEMPOTENCY_TABLE_PARTITION_VALUE is set without IDEMPOTENCY_TABLE_SORT_KEY: the partition value is only used with a sort key (the stored id goes into the sort key); set the sort key's name too".into());
                    }
                    if partition_value.as_ref().is_some_and(|v| v.len() > 2048) {
                        problems.push("IDEMPOTENCY_TABLE_PARTITION_VALUE is longer than DynamoDB's 2048 bytes for a partition key".into());
                    }
                    Some(StoreChoice::DynamoDb {
                        table,
                        partition_key,
                        sort_key,
                        partition_value,
                    })
                }
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
                    namespace: get("IDEMPOTENCY_REDIS_NAMESPACE").unwrap_or_default(),
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
                    "MODEL_BASE_URL={:?} is not an http:// or https:// URL",
                    redact_url(&url)
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
        let at_most_once = match get("IDEMPOTENCY_AT_MOST_ONCE").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                problems.push(format!(
                    "IDEMPOTENCY_AT_MOST_ONCE={other:?} is neither true nor false"
                ));
                false
            }
        };
        let request_envelope = match get("REQUEST_ENVELOPE").as_deref() {
            None | Some("none") => None,
            Some("sns") => Some(RequestEnvelope::Sns),
            Some("eventbridge") => Some(RequestEnvelope::EventBridge),
            Some(other) => {
                problems.push(format!(
                    "REQUEST_ENVELOPE={other:?} is not one of: sns, eventbridge, none"
                ));
                None
            }
        };
        let answers_table = get("ANSWERS_TABLE");
        if let (Some(table), Some(store)) = (&answers_table, &store)
            && let Some(problem) = answers_table_problem(store, table)
        {
            problems.push(problem);
        }
        match (store, model_base_url) {
            (Some(store), Some(model_base_url)) if problems.is_empty() => Ok(Self {
                store,
                model_base_url,
                model_api_key,
                model_api_key_secret_arn,
                expires_after,
                answers_table,
                at_most_once,
                request_envelope,
            }),
            _ => Err(ConfigError(problems)),
        }
    }
}

/// Why `table` cannot be the answers table of `store`, if it cannot.
fn answers_table_problem(store: &StoreChoice, table: &str) -> Option<String> {
    let ident = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && part.len() <= 63
    };
    let records = match store {
        StoreChoice::DynamoDb { table, .. } | StoreChoice::Postgres { table, .. } => Some(table),
        _ => None,
    };
    if records.is_some_and(|records| records == table) {
        return Some(format!(
            "ANSWERS_TABLE={table:?} is the idempotency table itself: give the answers a table of their own"
        ));
    }
    match store {
        StoreChoice::Redis { .. } => Some(
            "ANSWERS_TABLE is set, but the Redis store cannot write an answer in the same step as its record: persist answers with the DynamoDB or PostgreSQL store, or unset ANSWERS_TABLE".into(),
        ),
        StoreChoice::DynamoDb { .. }
            if !(3..=255).contains(&table.len())
                || !table
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) =>
        {
            Some(format!(
                "ANSWERS_TABLE={table:?} is not a DynamoDB table name (3 to 255 of a-z, A-Z, 0-9, _ - .)"
            ))
        }
        StoreChoice::Postgres { .. } if !table.split('.').all(ident) || table.split('.').count() > 2 => {
            Some(format!(
                "ANSWERS_TABLE={table:?} is not a PostgreSQL table name (an identifier of letters, digits and _, optionally schema-qualified)"
            ))
        }
        _ => None,
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
                table: "idem".into(),
                partition_key: "id".into(),
                sort_key: None,
                partition_value: None,
            }
        );
        assert_eq!(c.model_base_url, "https://models.example");
        assert_eq!(c.model_api_key.as_deref(), Some("sk-1"));
        assert_eq!(c.expires_after, Some(Duration::from_secs(1_209_600)));
    }

    #[test]
    fn the_request_envelope_is_sns_eventbridge_or_none_and_a_typo_fails_the_start_up() {
        let with = |value: Option<&str>| {
            let mut vars = vec![
                ("IDEMPOTENCY_TABLE", "idem"),
                ("MODEL_BASE_URL", "https://m.example"),
            ];
            vars.extend(value.map(|v| ("REQUEST_ENVELOPE", v)));
            config(&vars)
        };
        assert_eq!(with(None).unwrap().request_envelope, None);
        assert_eq!(with(Some("none")).unwrap().request_envelope, None);
        assert_eq!(
            with(Some("sns")).unwrap().request_envelope,
            Some(RequestEnvelope::Sns)
        );
        assert_eq!(
            with(Some("eventbridge")).unwrap().request_envelope,
            Some(RequestEnvelope::EventBridge)
        );
        assert_eq!(RequestEnvelope::Sns.envelope().name(), "sns");
        for bad in ["SNS", "event-bridge", "sqs"] {
            let err = with(Some(bad)).unwrap_err().to_string();
            assert!(
                err.contains("REQUEST_ENVELOPE") && err.contains("sns, eventbridge, none"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn at_most_once_is_true_false_or_unset_and_anything_else_fails_the_start_up() {
        let base = [
            ("IDEMPOTENCY_TABLE", "idem"),
            ("MODEL_BASE_URL", "https://m.example"),
        ];
        let with = |value: Option<&str>| {
            let mut vars = base.to_vec();
            vars.extend(value.map(|v| ("IDEMPOTENCY_AT_MOST_ONCE", v)));
            config(&vars)
        };
        assert!(!with(None).unwrap().at_most_once, "off by default");
        assert!(!with(Some("false")).unwrap().at_most_once);
        assert!(with(Some("true")).unwrap().at_most_once);
        for bad in ["yes", "1", "TRUE"] {
            let err = with(Some(bad)).unwrap_err().to_string();
            assert!(err.contains("IDEMPOTENCY_AT_MOST_ONCE"), "{bad}: {err}");
        }
        let both = config(&[
            ("IDEMPOTENCY_AT_MOST_ONCE", "on"),
            ("MODEL_BASE_URL", "ftp://x"),
            ("IDEMPOTENCY_TABLE", "idem"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            both.contains("IDEMPOTENCY_AT_MOST_ONCE") && both.contains("MODEL_BASE_URL"),
            "every problem at once: {both}"
        );
    }

    #[test]
    fn a_single_table_takes_its_keys_and_partition_value() {
        let c = config(&[
            ("IDEMPOTENCY_TABLE", "app"),
            ("IDEMPOTENCY_TABLE_PARTITION_KEY", "pk"),
            ("IDEMPOTENCY_TABLE_SORT_KEY", "sk"),
            (
                "IDEMPOTENCY_TABLE_PARTITION_VALUE",
                "idempotency#model-worker",
            ),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreChoice::DynamoDb {
                table: "app".into(),
                partition_key: "pk".into(),
                sort_key: Some("sk".into()),
                partition_value: Some("idempotency#model-worker".into()),
            }
        );
        // The template passes empty values for settings it was not given.
        let c = config(&[
            ("IDEMPOTENCY_TABLE", "idem"),
            ("IDEMPOTENCY_TABLE_SORT_KEY", " "),
            ("IDEMPOTENCY_TABLE_PARTITION_VALUE", ""),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap();
        assert!(
            matches!(&c.store, StoreChoice::DynamoDb { sort_key: None, partition_value: None, partition_key, .. } if partition_key == "id"),
            "{:?}",
            c.store
        );
    }

    #[test]
    fn single_table_settings_that_cannot_work_fail_the_start_up() {
        for (vars, says) in [
            (
                vec![("IDEMPOTENCY_TABLE_PARTITION_VALUE", "idempotency#w")],
                "IDEMPOTENCY_TABLE_PARTITION_VALUE is set without IDEMPOTENCY_TABLE_SORT_KEY",
            ),
            (
                vec![("IDEMPOTENCY_TABLE_SORT_KEY", "id")],
                "IDEMPOTENCY_TABLE_SORT_KEY and IDEMPOTENCY_TABLE_PARTITION_KEY are both \"id\"",
            ),
            (
                vec![
                    ("IDEMPOTENCY_TABLE_PARTITION_KEY", "PK"),
                    ("IDEMPOTENCY_TABLE_SORT_KEY", "PK"),
                ],
                "are both \"PK\"",
            ),
            (
                vec![
                    ("IDEMPOTENCY_TABLE_SORT_KEY", "sk"),
                    ("IDEMPOTENCY_TABLE_PARTITION_VALUE", &"p".repeat(2049)),
                ],
                "longer than DynamoDB's 2048 bytes",
            ),
            (
                vec![
                    ("IDEMPOTENCY_STORE", "memory"),
                    ("IDEMPOTENCY_TABLE_SORT_KEY", "sk"),
                ],
                "IDEMPOTENCY_TABLE_SORT_KEY is set but IDEMPOTENCY_STORE is \"memory\"",
            ),
        ] {
            let mut all = vec![
                ("IDEMPOTENCY_TABLE", "idem"),
                ("MODEL_BASE_URL", "http://x"),
            ];
            all.extend(vars);
            let err = config(&all).expect_err(says);
            assert!(err.to_string().contains(says), "{err}");
        }
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

    /// Every number setting at its extremes: 0 fails the start-up naming the variable, as
    /// does a number past `u64::MAX`; `u64::MAX` itself is accepted (the library caps
    /// times past the year 2500) and the queue's product saturates, never wraps.
    #[test]
    fn number_settings_at_zero_and_at_their_maximum() {
        let max = u64::MAX.to_string();
        let past_max = "18446744073709551616";
        let base = [
            ("IDEMPOTENCY_STORE", "memory"),
            ("MODEL_BASE_URL", "http://x"),
        ];
        let with = |extra: &[(&str, &str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            config(&all)
        };
        let c = with(&[("IDEMPOTENCY_EXPIRES_AFTER_SECONDS", &max)]).unwrap();
        assert_eq!(c.expires_after, Some(Duration::from_secs(u64::MAX)));
        let c = with(&[
            ("IDEMPOTENCY_QUEUE_RETENTION_SECONDS", &max),
            ("IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT", &max),
            ("IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS", &max),
        ])
        .unwrap();
        assert_eq!(c.expires_after, Some(Duration::MAX));
        for name in [
            "IDEMPOTENCY_EXPIRES_AFTER_SECONDS",
            "IDEMPOTENCY_QUEUE_RETENTION_SECONDS",
            "IDEMPOTENCY_QUEUE_MAX_RECEIVE_COUNT",
            "IDEMPOTENCY_QUEUE_VISIBILITY_TIMEOUT_SECONDS",
        ] {
            for bad in ["0", past_max] {
                let err = with(&[(name, bad)]).unwrap_err();
                assert!(
                    err.to_string()
                        .contains(&format!("{name}={bad:?} is not a positive whole number")),
                    "{err}"
                );
            }
        }
        // The handle takes the longest expiry without overflow.
        let handle =
            lambda_idempotency::Idempotency::builder(lambda_idempotency::MemoryStore::new())
                .expires_after(Duration::from_secs(u64::MAX))
                .try_build();
        assert!(handle.is_ok());
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

    /// Every secret the environment holds, each in a form `Debug` could print.
    const SECRETS: [&str; 4] = [
        "sk-hunter2",
        "redispw-hunter2",
        "pgpw-hunter2",
        "basepw-hunter2",
    ];

    #[test]
    fn debug_never_shows_the_api_key_or_a_password() {
        let base = "https://proxy-user:basepw-hunter2@models.example";
        let mut configs = vec![
            config(&[
                ("IDEMPOTENCY_STORE", "memory"),
                ("MODEL_BASE_URL", base),
                ("MODEL_API_KEY", "sk-hunter2"),
            ])
            .unwrap(),
        ];
        let stores = [
            StoreChoice::Redis {
                urls: vec![
                    "rediss://worker:redispw-hunter2@cache.example:6379".into(),
                    "redis://:redispw-hunter2@cache.example".into(),
                ],
                cluster: true,
                namespace: "idem:".into(),
            },
            StoreChoice::Postgres {
                url: "postgres://worker:pgpw-hunter2@db.example/app?sslmode=require".into(),
                table: "idempotency".into(),
            },
            StoreChoice::Postgres {
                url: "host=db.example user=worker password=pgpw-hunter2 dbname=app".into(),
                table: "idempotency".into(),
            },
            StoreChoice::Postgres {
                url: "postgres://db.example/app?user=worker&password=pgpw-hunter2".into(),
                table: "idempotency".into(),
            },
        ];
        for store in stores {
            let mut c = configs[0].clone();
            c.store = store;
            configs.push(c);
        }
        for c in &configs {
            let store = format!("{:?}", c.store);
            for text in [format!("{c:?}"), format!("{c:#?}"), store.clone()] {
                for secret in SECRETS {
                    assert!(!text.contains(secret), "{secret} in {text}");
                }
            }
            assert!(format!("{c:?}").contains("<redacted>"), "{c:?}");
            if c.store != StoreChoice::Memory {
                assert!(store.contains("<redacted>"), "{store}");
            }
        }
        assert!(
            format!("{:?}", configs[1]).contains("cache.example"),
            "the host stays"
        );
        let err = config(&[
            ("IDEMPOTENCY_STORE", "memory"),
            (
                "MODEL_BASE_URL",
                "ftp://proxy-user:basepw-hunter2@models.example",
            ),
        ])
        .unwrap_err();
        for text in [format!("{err}"), format!("{err:?}")] {
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn redact_url_hides_every_password_form() {
        for (url, redacted) in [
            ("redis://:pw@h:6379", "redis://:<redacted>@h:6379"),
            ("rediss://user:pw@h", "rediss://user:<redacted>@h"),
            ("redis://user@h/0", "redis://user@h/0"),
            (
                "postgres://u:p@w@h1,h2/db?x=1",
                "postgres://u:<redacted>@h1,h2/db?x=1",
            ),
            (
                "postgres://h/db?user=u&password=pw&sslmode=require",
                "postgres://h/db?user=u&password=<redacted>&sslmode=require",
            ),
            (
                "host=h password=pw user=u",
                "host=h password=<redacted> user=u",
            ),
            (
                "host=db user=worker password = pgpw-hunter2 dbname=app",
                "host=db user=worker password = <redacted> dbname=app",
            ),
            (
                r"host=db password='it\'s-hunter2' user=u",
                "host=db password=<redacted> user=u",
            ),
            ("host=db passwordless=yes", "host=db passwordless=yes"),
            (
                "host=h PASSWORD='a b' user=u",
                "host=h PASSWORD=<redacted> user=u",
            ),
            ("https://api.example/v1", "https://api.example/v1"),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
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
            ("IDEMPOTENCY_REDIS_NAMESPACE", "idem:"),
            ("MODEL_BASE_URL", "http://x"),
        ])
        .unwrap();
        assert_eq!(
            c.store,
            StoreChoice::Redis {
                urls: vec!["redis://a:1".into(), "redis://b:2".into()],
                cluster: true,
                namespace: "idem:".into()
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

    #[test]
    fn an_answers_table_the_store_cannot_commit_fails_the_start_up() {
        let base = [("MODEL_BASE_URL", "https://m.example")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut vars = base.to_vec();
            vars.extend_from_slice(extra);
            config(&vars)
        };
        let ok = with(&[
            ("IDEMPOTENCY_STORE", "memory"),
            ("ANSWERS_TABLE", "answers"),
        ])
        .unwrap();
        assert_eq!(ok.answers_table.as_deref(), Some("answers"));
        assert_eq!(
            with(&[("IDEMPOTENCY_STORE", "memory")])
                .unwrap()
                .answers_table,
            None
        );
        for (vars, says) in [
            (
                vec![
                    ("IDEMPOTENCY_STORE", "redis"),
                    ("REDIS_URL", "redis://h:6379"),
                    ("ANSWERS_TABLE", "answers"),
                ],
                "the Redis store cannot write an answer in the same step",
            ),
            (
                vec![("IDEMPOTENCY_TABLE", "idem"), ("ANSWERS_TABLE", "a b")],
                "is not a DynamoDB table name",
            ),
            (
                vec![
                    ("IDEMPOTENCY_STORE", "postgres"),
                    ("DATABASE_URL", "postgres://h/db"),
                    ("ANSWERS_TABLE", "answers; DROP TABLE x"),
                ],
                "is not a PostgreSQL table name",
            ),
            (
                vec![("IDEMPOTENCY_TABLE", "idem"), ("ANSWERS_TABLE", "idem")],
                "is the idempotency table itself",
            ),
        ] {
            // A build without the store's feature refuses it for that reason instead.
            let text = with(&vars).unwrap_err().to_string();
            assert!(
                text.contains(says) || text.contains("is not one of"),
                "{vars:?}: {text}"
            );
        }
        assert!(
            with(&[
                ("IDEMPOTENCY_TABLE", "idem"),
                ("ANSWERS_TABLE", "answers-prod.v2")
            ])
            .is_ok()
        );
    }

    #[test]
    fn the_old_name_of_the_redis_namespace_fails_the_start_up() {
        let env = [
            ("IDEMPOTENCY_STORE", "memory"),
            ("IDEMPOTENCY_KEY_PREFIX", "idem:"),
        ];
        let err = WorkerConfig::from_lookup(|name| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
        .expect_err("the old name is refused");
        assert!(
            err.to_string()
                .contains("renamed IDEMPOTENCY_REDIS_NAMESPACE"),
            "{err}"
        );
    }
}
