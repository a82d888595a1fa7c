//! The Lambda binary (`bootstrap` once built by cargo-lambda). One line at the end of init
//! gives each start-up phase's time (`model_worker::startup::Phases`).

use lambda_runtime::{Error, LambdaEvent, service_fn};
use model_worker::startup::Phases;
use model_worker::{Worker, WorkerConfig, idempotency_starting};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let phases = Phases::start();
    lambda_runtime::tracing::init_default_subscriber();
    // Invalid configuration, or a secret that cannot be read, stops the process before any
    // message is received. The secret is read once per execution environment, here.
    let config = match phases.time("configuration", WorkerConfig::from_env) {
        Ok(config) => config,
        Err(e) => stop(&e),
    };
    let config = match config.model_api_key_secret_arn {
        None => config,
        Some(_) => match phases.time_async("secret", config.read_secrets()).await {
            Ok(config) => config,
            Err(e) => stop(&e),
        },
    };
    // So does a store that cannot work: a server that does not answer, a DynamoDB table
    // that is missing, unreadable, or keyed otherwise than configured.
    let worker = async {
        let idempotency = idempotency_starting(&config, &phases).await?;
        phases.time("worker", || Worker::configured(idempotency, &config))
    };
    let worker = match worker.await {
        Ok(worker) => worker,
        Err(e) => {
            tracing::error!(
                "model-worker: cannot start: {}",
                lambda_idempotency::report(&*e)
            );
            std::process::exit(2);
        }
    };
    // The library's counters, as CloudWatch embedded metric format lines after each
    // invocation (model_worker::emf says what a line holds in concurrent mode).
    let namespace = std::env::var("METRICS_NAMESPACE")
        .unwrap_or_else(|_| model_worker::emf::DEFAULT_NAMESPACE.to_owned());
    let metrics = match phases.time("metrics", || model_worker::emf::install(&namespace)) {
        Ok(metrics) => metrics,
        Err(e) => stop(&e),
    };
    phases.log();
    // Several invocations share one process when AWS_LAMBDA_MAX_CONCURRENCY > 1; the
    // worker (idempotency handle, HTTP client) is shared between them.
    lambda_runtime::run_concurrent(service_fn(move |event: LambdaEvent<_>| {
        let worker = worker.clone();
        async move {
            let answer = worker.handle_any(event).await;
            model_worker::emf::flush(metrics, std::io::stdout().lock());
            answer
        }
    }))
    .await
}

/// Logs a problem of the configuration and stops: exit status 2.
fn stop(e: &dyn std::fmt::Display) -> ! {
    tracing::error!("model-worker: {e}");
    std::process::exit(2);
}
