//! The Lambda binary (`bootstrap` once built by cargo-lambda).
//!
//! Start-up, in order: the configuration (checked whole), then side by side the API key's
//! secret (`MODEL_API_KEY_SECRET_ARN`) and the store (its client; Redis and PostgreSQL
//! connect), then the worker, then the DynamoDB table's check: its settings at once, its
//! read (is the table there, may this role read it, is it keyed as configured) in a task
//! of its own that runs beside the runtime's first `/next`. Every claim waits for the
//! check, and a table that cannot work stops the process with status 2 and its message,
//! as any other start-up problem does. The read starts last so that its work does not
//! slow init's own (measured: docs/benchmarks.md). One line at the end of init gives
//! each phase's time (`model_worker::startup::Phases`).

use lambda_runtime::{Error, LambdaEvent, service_fn};
use model_worker::startup::Phases;
use model_worker::{Worker, WorkerConfig, secret_and_store};

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
    // Neither needs the other: the secret's request and the store's set-up overlap.
    // Whichever fails, the process stops with status 2 (the secret's problem first).
    let (config, store) = secret_and_store(&config, &phases).await;
    let config = match config {
        Ok(config) => config,
        Err(e) => stop(&e),
    };
    let worker = async {
        let (idempotency, check) = store?;
        let worker = phases.time("worker", || Worker::configured(idempotency, &config))?;
        Ok::<_, Error>((worker, check))
    };
    let (worker, check) = match worker.await {
        Ok(started) => started,
        Err(e) => cannot_start(&*e),
    };
    // The library's counters, as CloudWatch embedded metric format lines after each
    // invocation (model_worker::emf says what a line holds in concurrent mode).
    let namespace = std::env::var("METRICS_NAMESPACE")
        .unwrap_or_else(|_| model_worker::emf::DEFAULT_NAMESPACE.to_owned());
    let metrics = match phases.time("metrics", || model_worker::emf::install(&namespace)) {
        Ok(metrics) => metrics,
        Err(e) => stop(&e),
    };
    // And a DynamoDB table that is missing, unreadable, or keyed otherwise than
    // configured, or a PostgreSQL table without the store's columns: its settings now, its read in a task of its own, last, so that it runs
    // beside the first `/next` without slowing init's own work. If the table cannot work,
    // that task stops the process at once; no claim is made before it passed.
    let check = check.start(|e| cannot_start(&**e));
    let worker = match phases.time_async("table_check", check).await {
        Ok(check) => worker.checked_by(check),
        Err(e) => cannot_start(&*e),
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

/// Logs a configuration problem and stops: exit status 2.
fn stop(e: &dyn std::fmt::Display) -> ! {
    tracing::error!("model-worker: {e}");
    std::process::exit(2);
}

/// Logs a store that cannot work and stops: exit status 2.
fn cannot_start(e: &(dyn std::error::Error + 'static)) -> ! {
    tracing::error!(
        "model-worker: cannot start: {}",
        lambda_idempotency::report(e)
    );
    std::process::exit(2);
}
