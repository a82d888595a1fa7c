//! The Lambda binary (`bootstrap` once built by cargo-lambda).

use lambda_runtime::{Error, LambdaEvent, service_fn};
use model_worker::{Worker, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    // Invalid configuration, or a secret that cannot be read, stops the process before any
    // message is received. The secret is read once per execution environment, here.
    let config = match WorkerConfig::from_env() {
        Ok(config) => config.read_secrets().await,
        Err(e) => Err(e),
    };
    let config = match config {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("model-worker: {e}");
            std::process::exit(2);
        }
    };
    // So does a store that cannot work: a server that does not answer, a DynamoDB table
    // that is missing, unreadable, or keyed otherwise than configured.
    let worker = match Worker::from_config(&config).await {
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
    let metrics = match model_worker::emf::install(&namespace) {
        Ok(metrics) => metrics,
        Err(e) => {
            tracing::error!("model-worker: {e}");
            std::process::exit(2);
        }
    };
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
