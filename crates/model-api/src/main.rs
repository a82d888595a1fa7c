//! The Lambda binary (`bootstrap` once built by cargo-lambda).
//!
//! Start-up as the worker's (`model-worker`'s `main.rs`): the settings, then side by side
//! the API key's secret and the store, the DynamoDB table's read in a task of its own
//! beside the rest of start-up (every request waits for it; a table that cannot work
//! stops the process with status 2), and one line at the end of init with each phase's
//! time.

use lambda_http::Error;
use model_api::{Api, Settings};
use model_worker::startup::Phases;
use model_worker::{ModelClient, WorkerConfig, idempotency_starting};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let phases = Phases::start();
    lambda_http::tracing::init_default_subscriber();
    // A setting that cannot work, a secret that cannot be read, or a store that does not
    // answer stops the process before any request: Lambda reports the failed init at once.
    let (settings, config) = phases.time("configuration", || {
        let settings = Settings::from_lookup(|name| std::env::var(name).ok());
        let config = WorkerConfig::from_env().map_err(|e| e.to_string());
        match (settings, config) {
            (Ok(settings), Ok(config)) => (settings, config),
            (Err(e), _) | (_, Err(e)) => stop(&e),
        }
    });
    // Neither needs the other: the secret's request and the store's set-up overlap.
    let (secret, store) = tokio::join!(
        async {
            match config.model_api_key_secret_arn {
                Some(_) => Some(
                    phases
                        .time_async("secret", config.clone().read_secrets())
                        .await,
                ),
                None => None,
            }
        },
        idempotency_starting(&config, &phases, |e| {
            tracing::error!(
                "model-api: cannot start: {}",
                lambda_idempotency::report(&**e)
            );
            std::process::exit(2);
        })
    );
    let config = match secret {
        None => config,
        Some(Ok(config)) => config,
        Some(Err(e)) => stop(&e),
    };
    let api = phases.time("worker", || {
        let (idempotency, check) = store?;
        let model = ModelClient::new(&config.model_base_url, config.model_api_key.clone())?;
        Ok::<_, Error>(Api::new(idempotency, model, &settings).checked_by(check))
    });
    let api = match api {
        Ok(api) => api,
        Err(e) => {
            tracing::error!(
                "model-api: cannot start: {}",
                lambda_idempotency::report(&*e)
            );
            std::process::exit(2);
        }
    };
    phases.log();
    // Several requests share one process when AWS_LAMBDA_MAX_CONCURRENCY > 1 (Lambda
    // Managed Instances; locally, `cargo lambda watch --env-var AWS_LAMBDA_MAX_CONCURRENCY=4`).
    lambda_http::run_concurrent(api).await
}

/// Logs a problem of the settings and stops: exit status 2.
fn stop(e: &dyn std::fmt::Display) -> ! {
    tracing::error!("model-api: {e}");
    std::process::exit(2);
}
