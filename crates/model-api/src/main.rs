//! The Lambda binary (`bootstrap` once built by cargo-lambda).

use lambda_http::Error;
use model_api::{Api, Settings};
use model_worker::{ModelClient, WorkerConfig, idempotency_from_config};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    // A setting that cannot work, a secret that cannot be read, or a store that does not
    // answer stops the process before any request: Lambda reports the failed init at once.
    let settings = Settings::from_lookup(|name| std::env::var(name).ok());
    let config = match WorkerConfig::from_env() {
        Ok(config) => config.read_secrets().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (settings, config) = match (settings, config) {
        (Ok(settings), Ok(config)) => (settings, config),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!("model-api: {e}");
            std::process::exit(2);
        }
    };
    let ready = async {
        let idempotency = idempotency_from_config(&config).await?;
        let model = ModelClient::new(&config.model_base_url, config.model_api_key.clone())?;
        Ok::<_, Error>(Api::new(idempotency, model, &settings))
    };
    let api = match ready.await {
        Ok(api) => api,
        Err(e) => {
            tracing::error!(
                "model-api: cannot start: {}",
                lambda_idempotency::report(&*e)
            );
            std::process::exit(2);
        }
    };
    // Several requests share one process when AWS_LAMBDA_MAX_CONCURRENCY > 1 (Lambda
    // Managed Instances; locally, `cargo lambda watch --env-var AWS_LAMBDA_MAX_CONCURRENCY=4`).
    lambda_http::run_concurrent(api).await
}
