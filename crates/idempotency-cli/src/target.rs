//! Which store: a `--store` URL, or the worker's own variables, read with the same names
//! the worker reads so the tool points where the function does.

use lambda_idempotency::DynamoDbStore;
use lambda_idempotency::Idempotency;
use lambda_idempotency::store::dynamodb::AttributeNames;
use lambda_idempotency::store::postgres::PostgresStore;
use lambda_idempotency::store::redis::RedisStore;

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

/// How long the table's check may take: the SDK's own client sets no bound, and an
/// operator's command must not hang.
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Why a store could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The URL or a setting cannot work.
    Setting(String),
    /// The store did not answer.
    Unreachable(String),
}

/// A handle on the store at `url`, with the worker's settings from `env`.
pub(crate) async fn open(
    url: &str,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Idempotency, OpenError> {
    // A store that may answer later (refused, timed out) is unreachable; one that never
    // will (a URL that does not parse, a password refused) is a setting to fix.
    let named = |e: lambda_idempotency::Error| {
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
            OpenError::Setting(text)
        }
    };
    let handle = if let Some(table) = url.strip_prefix("dynamodb://") {
        if table.is_empty() || table.contains('/') {
            return Err(OpenError::Setting(format!(
                "{url:?}: dynamodb://TABLE names one table"
            )));
        }
        let mut names = AttributeNames::default();
        if let Some(key) = env("IDEMPOTENCY_TABLE_PARTITION_KEY") {
            names.id = key;
        }
        // With a sort key every record lives under the worker's partition value, by
        // default `idempotency#{its function name}`: outside Lambda that name is not set,
        // and the store's default (`idempotency#local`) would find none of them.
        let sort_key = env("IDEMPOTENCY_TABLE_SORT_KEY");
        let partition_value = match (&sort_key, env("IDEMPOTENCY_TABLE_PARTITION_VALUE")) {
            (_, Some(value)) => Some(value),
            (Some(_), None) => match env("AWS_LAMBDA_FUNCTION_NAME") {
                Some(function) => Some(format!("idempotency#{function}")),
                None => {
                    return Err(OpenError::Setting(
                        "IDEMPOTENCY_TABLE_SORT_KEY is set without IDEMPOTENCY_TABLE_PARTITION_VALUE: \
                         the worker's records are under idempotency#{its function name}; set \
                         IDEMPOTENCY_TABLE_PARTITION_VALUE, or AWS_LAMBDA_FUNCTION_NAME to the \
                         worker's function name"
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
        // One GetItem: a table whose key is not the one these settings describe fails
        // here, saying which key it has, rather than as "no record" on every id.
        let checked = tokio::time::timeout(CHECK_TIMEOUT, store.check_table())
            .await
            .map_err(|_| {
                OpenError::Unreachable(format!(
                    "{}: DynamoDB did not answer in {} s",
                    redacted(url),
                    CHECK_TIMEOUT.as_secs()
                ))
            })?;
        checked.map_err(|e| match named(e) {
            OpenError::Setting(why) => OpenError::Setting(format!(
                "{why} (the key settings: IDEMPOTENCY_TABLE_PARTITION_KEY, \
                 IDEMPOTENCY_TABLE_SORT_KEY, IDEMPOTENCY_TABLE_PARTITION_VALUE)"
            )),
            unreachable => unreachable,
        })?;
        Idempotency::new(store)
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
        let store = match nodes[..] {
            [one] => {
                // A cluster's configuration endpoint is one URL too: through one node,
                // the tool would miss every other node's keys.
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
        Idempotency::new(store.namespace(env("IDEMPOTENCY_REDIS_NAMESPACE").unwrap_or_default()))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let table = env("IDEMPOTENCY_TABLE").unwrap_or_else(|| "idempotency".into());
        Idempotency::new(PostgresStore::from_url(url, table).map_err(named)?)
    } else {
        return Err(OpenError::Setting(format!(
            "{}: not a store URL (dynamodb://TABLE, redis://, rediss://, postgres://)",
            redacted(url)
        )));
    };
    Ok(handle)
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

    /// With a sort key, every record lives under the worker's partition value, by default
    /// `idempotency#{its function name}`; the tool runs outside Lambda, where that name is
    /// not set, and must not silently look under `idempotency#local`.
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
