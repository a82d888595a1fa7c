//! The Lambda binary (`bootstrap` once built by cargo-lambda).
//!
//! Start-up as the worker's (`model-worker`'s `main.rs`): the settings, then side by side
//! the API key's secret and the store, then the API, then the DynamoDB table's check, its
//! read in a task of its own beside the runtime's first `/next` (every request waits for
//! it; a table that cannot work stops the process with status 2), and one line at the end
//! of init with each phase's time.

use lambda_http::Error;
use model_api::{Api, Settings};
use model_worker::startup::Phases;
use model_worker::{ModelClient, WorkerConfig, secret_and_store};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let phases = Phases::start();
    lambda_http::tracing::init_default_subscriber();
    // A setting that cannot work, a secret that cannot be read, or a store that does not
    // answer stops the process (status 2) before any request is served.
    let (settings, config) = phases.time("configuration", || {
        let settings = Settings::from_lookup(|name| std::env::var(name).ok());
        let config = WorkerConfig::from_env().map_err(|e| e.to_string());
        match (settings, config) {
            (Ok(settings), Ok(config)) => (settings, config),
            (Err(e), _) | (_, Err(e)) => stop(&e),
        }
    });
    // Neither needs the other: the secret's request and the store's set-up overlap.
    // Whichever fails, the process stops with status 2 (the secret's problem first).
    let (config, store) = secret_and_store(&config, &phases).await;
    let config = match config {
        Ok(config) => config,
        Err(e) => stop(&e),
    };
    let api = async {
        let (idempotency, check) = store?;
        let api = phases.time("worker", || {
            let model = ModelClient::new(&config.model_base_url, config.model_api_key.clone())?;
            Ok::<_, Error>(Api::new(idempotency, model, &settings))
        })?;
        Ok::<_, Error>((api, check))
    };
    let (api, check) = match api.await {
        Ok(started) => started,
        Err(e) => cannot_start(&*e),
    };
    // The DynamoDB table's check last: its read runs beside the first `/next`, and stops
    // the process with status 2 if the table cannot work; no key is claimed before it
    // passed.
    let check = check.start(|e| cannot_start(&**e));
    let api = match phases.time_async("table_check", check).await {
        Ok(check) => api.checked_by(check),
        Err(e) => cannot_start(&*e),
    };
    phases.log();
    // Several requests share one process when AWS_LAMBDA_MAX_CONCURRENCY > 1 (Lambda
    // Managed Instances; locally, `cargo lambda watch --env-var AWS_LAMBDA_MAX_CONCURRENCY=4`).
    lambda_http::run_concurrent(api).await
}

/// Logs a store that cannot work and stops: exit status 2.
fn cannot_start(e: &(dyn std::error::Error + 'static)) -> ! {
    tracing::error!("model-api: cannot start: {}", lambda_idempotency::report(e));
    std::process::exit(2);
}

/// Logs a problem of the settings and stops: exit status 2.
fn stop(e: &dyn std::fmt::Display) -> ! {
    tracing::error!("model-api: {e}");
    std::process::exit(2);
}
