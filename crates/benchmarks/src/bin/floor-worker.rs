//! The floor the model worker is measured against: a bare `lambda_runtime` binary that
//! makes the same kind of store requests (a claim-like write, a completion-like write) and
//! the same provider call per record, with no idempotency: no conditions, no keys, no
//! validation, no library.
//!
//! `IDEMPOTENCY_STORE` picks the store, as the worker's does: `dynamodb` (the default;
//! `IDEMPOTENCY_TABLE`: a PutItem, an UpdateItem), `redis` (`REDIS_URL`,
//! `IDEMPOTENCY_REDIS_NAMESPACE`: two SETs) or `postgres` (`DATABASE_URL`,
//! `IDEMPOTENCY_TABLE`, a table of the store's columns: an INSERT, an UPDATE).
//!
//! Its start-up is a bare worker's natural one, what the worker is compared with in
//! `bench-startup`: the configuration read, the API key read from Secrets Manager when
//! `MODEL_API_KEY_SECRET_ARN` is set, then the store's client: for DynamoDB the SDK
//! client (no request: a bare worker makes none before its first message), for Redis a
//! multiplexed connection, for PostgreSQL a connection with the TLS the library's store
//! uses (`sslmode` from the URL: `disable` plain, `prefer` TLS without checking the
//! certificate, `require` TLS against the system's roots). It logs the same start-up line
//! as the worker (`model_worker::startup::Phases`).

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use aws_sdk_dynamodb::types::AttributeValue;
use lambda_runtime::{Error, LambdaEvent, service_fn};
use model_worker::startup::Phases;
use model_worker::{ChatRequest, ModelClient};
use std::sync::Arc;
use tokio_postgres::config::SslMode;

/// The store's client, made at start-up.
#[derive(Clone)]
enum Store {
    DynamoDb {
        client: aws_sdk_dynamodb::Client,
        table: String,
    },
    Redis {
        connection: redis::aio::MultiplexedConnection,
        namespace: String,
    },
    Postgres {
        client: Arc<tokio_postgres::Client>,
        insert: String,
        update: String,
    },
}

/// The settings, read from the environment.
struct Settings {
    store: String,
    base: String,
    secret_arn: Option<String>,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let phases = Phases::start();
    lambda_runtime::tracing::init_default_subscriber();
    let settings = phases.time("configuration", || {
        Ok::<_, Error>(Settings {
            store: std::env::var("IDEMPOTENCY_STORE").unwrap_or_else(|_| "dynamodb".into()),
            base: std::env::var("MODEL_BASE_URL")?,
            secret_arn: std::env::var("MODEL_API_KEY_SECRET_ARN").ok(),
        })
    })?;
    // One AWS configuration for the secret and DynamoDB, loaded when first needed.
    let mut sdk = None;
    let key = match &settings.secret_arn {
        None => None,
        Some(arn) => Some(
            phases
                .time_async("secret", async {
                    let config =
                        aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
                    let value = aws_sdk_secretsmanager::Client::new(&config)
                        .get_secret_value()
                        .secret_id(arn)
                        .send()
                        .await?
                        .secret_string
                        .ok_or("the secret has no string value")?;
                    sdk = Some(config);
                    Ok::<_, Error>(value.trim().to_owned())
                })
                .await?,
        ),
    };
    let store = match settings.store.as_str() {
        "dynamodb" => {
            let table = std::env::var("IDEMPOTENCY_TABLE")?;
            phases
                .time_async("store_client", async {
                    let config = match sdk {
                        Some(config) => config,
                        None => {
                            aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
                        }
                    };
                    Store::DynamoDb {
                        client: aws_sdk_dynamodb::Client::new(&config),
                        table,
                    }
                })
                .await
        }
        "redis" => {
            let url = std::env::var("REDIS_URL")?;
            let namespace = std::env::var("IDEMPOTENCY_REDIS_NAMESPACE").unwrap_or_default();
            let client = phases.time("store_client", || redis::Client::open(url))?;
            let connection = phases
                .time_async("store_connect", client.get_multiplexed_async_connection())
                .await?;
            Store::Redis {
                connection,
                namespace,
            }
        }
        "postgres" => {
            let url = std::env::var("DATABASE_URL")?;
            let table = std::env::var("IDEMPOTENCY_TABLE").unwrap_or_else(|_| "idempotency".into());
            let config: tokio_postgres::Config = phases.time("store_client", || url.parse())?;
            let client = phases
                .time_async("store_connect", connect_postgres(&config))
                .await?;
            Store::Postgres {
                client: Arc::new(client),
                insert: format!(
                    "INSERT INTO {table} (id, status, expiration) VALUES ($1, 'INPROGRESS', $2) ON CONFLICT (id) DO NOTHING"
                ),
                update: format!("UPDATE {table} SET status = 'COMPLETED', data = $2 WHERE id = $1"),
            }
        }
        other => {
            return Err(format!("IDEMPOTENCY_STORE={other:?}: dynamodb, redis or postgres").into());
        }
    };
    let model = phases.time("worker", || ModelClient::new(&settings.base, key))?;
    phases.log();
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let (store, model) = (store.clone(), model.clone());
        async move {
            let records = event.payload.records.into_iter().map(|record| {
                let (store, model) = (&store, &model);
                async move {
                    let request: ChatRequest =
                        serde_json::from_str(record.body.as_deref().unwrap_or("{}"))?;
                    let id = request.request_id.clone().unwrap_or_default();
                    store.begin(&id).await?;
                    let answer = model.complete(&request, None).await?;
                    store.finish(&id, &answer.to_string()).await
                }
            });
            for result in futures_util::future::join_all(records).await {
                result?;
            }
            Ok::<_, Error>(SqsBatchResponse::default())
        }
    }))
    .await
}

impl Store {
    /// The claim's counterpart: an in-progress mark, unconditional or "if absent".
    async fn begin(&self, id: &str) -> Result<(), Error> {
        match self {
            Store::DynamoDb { client, table } => {
                client
                    .put_item()
                    .table_name(table)
                    .item("id", AttributeValue::S(id.to_owned()))
                    .item("status", AttributeValue::S("INPROGRESS".into()))
                    .send()
                    .await?;
            }
            Store::Redis {
                connection,
                namespace,
            } => {
                let _: Option<String> = redis::cmd("SET")
                    .arg(format!("{namespace}floor:{id}"))
                    .arg("INPROGRESS")
                    .arg("NX")
                    .arg("EX")
                    .arg(3600)
                    .query_async(&mut connection.clone())
                    .await?;
            }
            Store::Postgres { client, insert, .. } => {
                let expiration = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_secs() as i64
                    + 3600;
                client.execute(insert.as_str(), &[&id, &expiration]).await?;
            }
        }
        Ok(())
    }

    /// The completion's counterpart: the answer written.
    async fn finish(&self, id: &str, data: &str) -> Result<(), Error> {
        match self {
            Store::DynamoDb { client, table } => {
                client
                    .update_item()
                    .table_name(table)
                    .key("id", AttributeValue::S(id.to_owned()))
                    .update_expression("SET #s = :s, #d = :d")
                    .expression_attribute_names("#s", "status")
                    .expression_attribute_names("#d", "data")
                    .expression_attribute_values(":s", AttributeValue::S("COMPLETED".into()))
                    .expression_attribute_values(":d", AttributeValue::S(data.to_owned()))
                    .send()
                    .await?;
            }
            Store::Redis {
                connection,
                namespace,
            } => {
                let _: () = redis::cmd("SET")
                    .arg(format!("{namespace}floor:{id}"))
                    .arg(data)
                    .arg("EX")
                    .arg(3600)
                    .query_async(&mut connection.clone())
                    .await?;
            }
            Store::Postgres { client, update, .. } => {
                client.execute(update.as_str(), &[&id, &data]).await?;
            }
        }
        Ok(())
    }
}

/// A PostgreSQL connection with the TLS the library's store would use for this URL.
async fn connect_postgres(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, Error> {
    let client = if config.get_ssl_mode() == SslMode::Disable {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
    } else {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let tls = if config.get_ssl_mode() == SslMode::Require {
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            builder.with_root_certificates(roots).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
                .with_no_client_auth()
        };
        let (client, connection) = config
            .connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
            .await?;
        tokio::spawn(connection);
        client
    };
    Ok(client)
}

/// `sslmode=prefer`: encrypted, the certificate unchecked (libpq's behaviour, and the
/// library's); handshake signatures still checked.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
