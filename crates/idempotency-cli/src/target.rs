//! Which store: a `--store` URL, or the worker's own variables, read with the same names
//! the worker reads so the tool points where the function does.

use lambda_idempotency::Idempotency;
#[cfg(feature = "redis")]
use lambda_idempotency::store::redis::RedisStore;
#[cfg(feature = "postgres")]
use lambda_idempotency::store::{IdempotencyStore, postgres::PostgresStore};
#[cfg(feature = "dynamodb")]
use lambda_idempotency::{DynamoDbStore, store::dynamodb::AttributeNames};

/// The store's URL: `--store`, else the worker's `IDEMPOTENCY_STORE` with its
/// `IDEMPOTENCY_TABLE`, `REDIS_URL` or `DATABASE_URL`.
pub(crate) fn url(
    store: Option<String>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    if env("IDEMPOTENCY_KEY_PREFIX").is_some() {
        // The worker refuses it at start-up; read without it, every id would be "none".
        return Err("IDEMPOTENCY_KEY_PREFIX was renamed IDEMPOTENCY_REDIS_NAMESPACE: set that (same value) and remove the old one".into());
    }
    if let Some(url) = store {
        return Ok(url);
    }
    let need =
        |name: &str| env(name).ok_or_else(|| format!("--store is not given and {name} is not set"));
    match env("IDEMPOTENCY_STORE").as_deref() {
        None | Some("dynamodb") => Ok(format!("dynamodb://{}", need("IDEMPOTENCY_TABLE")?)),
        // As the worker reads it: `redis` takes the first URL of a list, `redis-cluster`
        // every one (and a single node of a cluster is found to be one either way).
        Some("redis") => Ok(need("REDIS_URL")?
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()),
        Some("redis-cluster") => need("REDIS_URL"),
        Some("postgres") => need("DATABASE_URL"),
        Some("memory") => Err("IDEMPOTENCY_STORE=memory lives inside the worker's process: there is nothing to read from outside".into()),
        Some(other) => Err(format!("IDEMPOTENCY_STORE={other:?} is not one of dynamodb, redis, redis-cluster, postgres")),
    }
}

/// Why a store could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The URL or a setting cannot work.
    Setting(String),
    /// The store did not answer.
    #[cfg_attr(
        not(any(feature = "dynamodb", feature = "redis", feature = "postgres")),
        allow(dead_code)
    )]
    Unreachable(String),
}

/// A handle on the store at `url`, with the worker's settings from `env`, checked with
/// one request: credentials the server refuses, or a table that is not the worker's, fail
/// here as a setting, before any record is asked for.
pub(crate) async fn open(
    url: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Idempotency, OpenError> {
    if let Some(table) = url.strip_prefix("dynamodb://") {
        if table.is_empty() || table.contains('/') {
            return Err(OpenError::Setting(format!(
                "{url:?}: dynamodb://TABLE names one table"
            )));
        }
        dynamodb(url, table, env).await
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        redis(url, env).await
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        postgres(url, env).await
    } else {
        Err(OpenError::Setting(format!(
            "{}: not a store URL (dynamodb://TABLE, redis://, rediss://, postgres://)",
            redacted(url)
        )))
    }
}

/// The store's error as a reason not to open it: one that may pass later (refused, timed
/// out) is unreachable; one that never will (a URL that does not parse, a password or
/// role refused) is a setting to fix, and `fix` says where it is set.
#[cfg(any(feature = "dynamodb", feature = "redis", feature = "postgres"))]
fn named(url: &str, fix: &str, e: lambda_idempotency::Error) -> OpenError {
    let text = format!("{}: {}", redacted(url), lambda_idempotency::report(&e));
    if matches!(
        e,
        lambda_idempotency::Error::Store {
            retryable: true,
            ..
        }
    ) {
        OpenError::Unreachable(text)
    } else {
        OpenError::Setting(format!("{text} ({fix})"))
    }
}

/// A store this build left out, and how to install one that has it.
#[cfg_attr(
    all(feature = "dynamodb", feature = "redis", feature = "postgres"),
    allow(dead_code)
)]
fn not_built(store: &str, feature: &str) -> OpenError {
    OpenError::Setting(format!(
        "this lambda-idempotency was built without {store} (its feature `{feature}`): \
         install it with the feature: cargo install --locked --path crates/idempotency-cli \
         --features {feature} (the default builds every store)"
    ))
}

/// How long the table's check may take: the SDK's own client sets no bound, and an
/// operator's command must not hang.
#[cfg(feature = "dynamodb")]
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(feature = "dynamodb")]
async fn dynamodb(
    url: &str,
    table: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Idempotency, OpenError> {
    let mut names = AttributeNames::default();
    if let Some(key) = env("IDEMPOTENCY_TABLE_PARTITION_KEY") {
        names.id = key;
    }
    // With a sort key every record lives under the worker's partition value, by default
    // `idempotency#{its function name}`: outside Lambda that name is not set, and the
    // store's default (`idempotency#local`) would find none of them.
    let sort_key = env("IDEMPOTENCY_TABLE_SORT_KEY");
    let partition_value = match (&sort_key, env("IDEMPOTENCY_TABLE_PARTITION_VALUE")) {
        (_, Some(value)) => Some(value),
        (Some(_), None) => match env("AWS_LAMBDA_FUNCTION_NAME") {
            Some(function) => Some(format!("idempotency#{function}")),
            None => {
                return Err(OpenError::Setting(
                    "IDEMPOTENCY_TABLE_SORT_KEY is set without IDEMPOTENCY_TABLE_PARTITION_VALUE: \
                     the worker's records are under idempotency#{its function name}; set \
                     IDEMPOTENCY_TABLE_PARTITION_VALUE (--partition-value), or \
                     AWS_LAMBDA_FUNCTION_NAME (--function-name) to the worker's function name"
                        .into(),
                ));
            }
        },
        (None, None) => None,
    };
    let mut store = DynamoDbStore::from_env(table).await.attribute_names(names);
    if let Some(sort_key) = sort_key {
        store = store.sort_key_attr(sort_key);
    }
    if let Some(value) = partition_value {
        store = store.partition_key_value(value);
    }
    // One GetItem: a table whose key is not the one these settings describe fails here,
    // saying which key it has, rather than as "no record" on every id; credentials the
    // service refuses fail here too.
    let checked = tokio::time::timeout(CHECK_TIMEOUT, store.check_table())
        .await
        .map_err(|_| {
            OpenError::Unreachable(format!(
                "{}: DynamoDB did not answer in {} s",
                redacted(url),
                CHECK_TIMEOUT.as_secs()
            ))
        })?;
    checked.map_err(|e| {
        named(
            url,
            "the table's key: IDEMPOTENCY_TABLE_PARTITION_KEY, IDEMPOTENCY_TABLE_SORT_KEY, \
             IDEMPOTENCY_TABLE_PARTITION_VALUE; the region and credentials: the AWS variables \
             or profile",
            e,
        )
    })?;
    Ok(Idempotency::new(store))
}

#[cfg(not(feature = "dynamodb"))]
async fn dynamodb(
    _: &str,
    _: &str,
    _: &impl Fn(&str) -> Option<String>,
) -> Result<Idempotency, OpenError> {
    Err(not_built("DynamoDB", "dynamodb"))
}

#[cfg(feature = "redis")]
async fn redis(url: &str, env: &impl Fn(&str) -> Option<String>) -> Result<Idempotency, OpenError> {
    let named = |e| {
        named(
            url,
            "the URL, its user and password: --store, else REDIS_URL",
            e,
        )
    };
    let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
    let store = match nodes[..] {
        [one] => {
            // A cluster's configuration endpoint is one URL too: through one node, the
            // tool would miss every other node's keys.
            let store = RedisStore::connect(one).await.map_err(named)?;
            if store.is_one_node_of_a_cluster().await.map_err(named)? {
                RedisStore::connect_cluster([one]).await
            } else {
                Ok(store)
            }
        }
        _ => RedisStore::connect_cluster(nodes).await,
    }
    .map_err(named)?;
    Ok(Idempotency::new(store.namespace(
        env("IDEMPOTENCY_REDIS_NAMESPACE").unwrap_or_default(),
    )))
}

#[cfg(not(feature = "redis"))]
async fn redis(_: &str, _: &impl Fn(&str) -> Option<String>) -> Result<Idempotency, OpenError> {
    Err(not_built("Redis", "redis"))
}

/// An id no record has, read once to check the table.
#[cfg(feature = "postgres")]
const PROBE_ID: &str = "lambda-idempotency.check#table";

#[cfg(feature = "postgres")]
async fn postgres(
    url: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Idempotency, OpenError> {
    let fix = "the URL, its user and password: --store, else DATABASE_URL; the table: \
               IDEMPOTENCY_TABLE (--table)";
    let table = env("IDEMPOTENCY_TABLE").unwrap_or_else(|| "idempotency".into());
    let store = PostgresStore::from_url(url, table.as_str()).map_err(|e| named(url, fix, e))?;
    // Connected now, as the other stores are: a role or password the server refuses is a
    // setting, not a store that failed on the first read.
    store
        .ensure_connected()
        .await
        .map_err(|e| named(url, fix, e))?;
    // One read: the operator's table must be the worker's, which the command never
    // creates.
    match store.get(PROBE_ID).await {
        Ok(_) => Ok(Idempotency::new(store)),
        Err(e) if is_missing_table(&e) => Err(OpenError::Setting(format!(
            "{}: the table {table:?} does not exist in this database: set IDEMPOTENCY_TABLE \
             (or --table) to the worker's table, the one its own IDEMPOTENCY_TABLE names \
             (the worker's default is idempotency)",
            redacted(url)
        ))),
        Err(e) => Err(named(url, fix, e)),
    }
}

/// Whether the server answered that the table does not exist (`undefined_table`).
#[cfg(feature = "postgres")]
fn is_missing_table(e: &lambda_idempotency::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cause {
        if let Some(pg) = err.downcast_ref::<tokio_postgres::Error>()
            && pg.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
        {
            return true;
        }
        cause = err.source();
    }
    false
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str, _: &impl Fn(&str) -> Option<String>) -> Result<Idempotency, OpenError> {
    Err(not_built("PostgreSQL", "postgres"))
}

/// `url` without what could be secret: the user and password, the path's query. Everything
/// up to the last `@` goes first: a password may hold `?`, `#` or `/` unescaped.
pub(crate) fn redacted(url: &str) -> String {
    url.split(',')
        .map(|one| {
            let Some((scheme, rest)) = one.split_once("://") else {
                return "<not a URL>".to_owned();
            };
            let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            let rest = rest.split(['?', '#']).next().unwrap_or_default();
            format!("{scheme}://{rest}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_never_shows_its_password() {
        assert_eq!(
            redacted("rediss://worker:s3cret@cache:6379,redis://:pw@b:1"),
            "rediss://cache:6379,redis://b:1"
        );
        assert_eq!(
            redacted("postgres://u:p@db/test?password=x&sslmode=require"),
            "postgres://db/test"
        );
        assert_eq!(redacted("host=db password=x"), "<not a URL>");
        for url in [
            "redis://:hun#ter2@127.0.0.1:6379",
            "redis://:hun?ter2@127.0.0.1:6379",
            "redis://:hun/ter2@127.0.0.1:6379",
            "postgres://u:a@b#c?d@db/test",
        ] {
            let shown = redacted(url);
            assert!(!shown.contains("ter2") && !shown.contains("b#c"), "{shown}");
        }
        assert_eq!(
            redacted("redis://:hun#ter2@127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    /// A store this build left out is a setting, naming the feature that builds it.
    #[test]
    fn a_store_left_out_names_its_feature() {
        let OpenError::Setting(e) = not_built("PostgreSQL", "postgres") else {
            panic!("a setting")
        };
        assert!(
            e.contains("without PostgreSQL") && e.contains("--features postgres"),
            "{e}"
        );
    }

    /// With a sort key, every record lives under the worker's partition value, by default
    /// `idempotency#{its function name}`; the tool runs outside Lambda, where that name is
    /// not set, and must not silently look under `idempotency#local`.
    #[cfg(feature = "dynamodb")]
    #[tokio::test]
    async fn a_sort_key_needs_the_worker_s_partition_value() {
        let env = |name: &str| (name == "IDEMPOTENCY_TABLE_SORT_KEY").then(|| "sk".to_owned());
        match open("dynamodb://t", &env).await {
            Err(OpenError::Setting(e)) => assert!(
                e.contains("IDEMPOTENCY_TABLE_PARTITION_VALUE")
                    && e.contains("AWS_LAMBDA_FUNCTION_NAME"),
                "{e}"
            ),
            Err(OpenError::Unreachable(e)) => panic!("not a setting: {e}"),
            Ok(_) => panic!("opened under the partition value idempotency#local"),
        }
    }

    #[test]
    fn the_worker_s_variables_name_the_store() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            url(None, &env(&[("IDEMPOTENCY_TABLE", "t")])).unwrap(),
            "dynamodb://t"
        );
        assert_eq!(
            url(
                None,
                &env(&[("IDEMPOTENCY_STORE", "redis"), ("REDIS_URL", "redis://h")])
            )
            .unwrap(),
            "redis://h"
        );
        assert_eq!(
            url(
                Some("postgres://x".into()),
                &env(&[("DATABASE_URL", "postgres://y")])
            )
            .unwrap(),
            "postgres://x"
        );
        for (vars, says) in [
            (&[][..], "IDEMPOTENCY_TABLE is not set"),
            (&[("IDEMPOTENCY_STORE", "memory")][..], "inside the worker"),
            (&[("IDEMPOTENCY_STORE", "postgres")][..], "DATABASE_URL"),
            (&[("IDEMPOTENCY_STORE", "valkey")][..], "not one of"),
            (
                &[
                    ("IDEMPOTENCY_TABLE", "t"),
                    ("IDEMPOTENCY_KEY_PREFIX", "idem:"),
                ][..],
                "renamed IDEMPOTENCY_REDIS_NAMESPACE",
            ),
        ] {
            let err = url(None, &env(vars)).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
