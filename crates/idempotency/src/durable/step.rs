//! One durable step whose side effect runs once per key across executions.

use crate::context::{CallContext, WithCallContext};
use crate::error::{BoxError, Error, ExecuteError};
use crate::handle::{Idempotency, to_json};
use crate::operation::Operation;
use aws_durable_execution_sdk::{DurableContext, RetryDecision, StepError};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// How many times a step waits for another execution's claim of its key before it fails.
const IN_PROGRESS_WAITS: u32 = 20;

/// Runs `f` as a durable step named after `op`, at most once per key of `payload` under
/// `op` across executions: a step interrupted after its side effect (its checkpoint
/// lost, its invocation ended) that runs again, or another execution's step with the same
/// key, gets the stored answer instead of running `f` again.
///
/// The claim is an ordinary one (its lease this invocation's time), as for any call
/// outside a durable function: a step runs within one invocation. A step whose key is in
/// progress in another execution waits for that claim's lease with a durable retry (no
/// invocation waits); a failing `f` or a retryable store error is retried as the SDK
/// retries a step by default (6 attempts, 5 s doubling to 60 s); an error no retry can
/// mend (a missing key, a payload that differs from the stored one) fails at once. The
/// error reaches the handler as the SDK's `OperationError`.
pub async fn step<P, T, E, F, Fut>(
    idempotency: &Idempotency,
    ctx: &DurableContext,
    op: &Operation,
    payload: &P,
    f: F,
) -> Result<T, BoxError>
where
    P: Serialize + ?Sized,
    T: Serialize + DeserializeOwned + Send + 'static,
    E: Into<BoxError> + fmt::Display + Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    let payload = to_json(payload)?;
    let idempotency = idempotency.clone();
    let name = op.name.clone();
    let op = op.clone();
    // Read here, in the handler's task: the SDK may run a step body on another.
    let lambda = ctx.lambda_context();
    let cx = CallContext::current().within_lambda(lambda, idempotency.now());
    let value = ctx
        .step(move |_| async move {
            let run = idempotency
                .execute(&op, &payload, f)
                .with_call_context(cx)
                .await;
            match run {
                Ok((value, _)) => Ok(value),
                Err(ExecuteError::Function(err)) => Err(err.into()),
                Err(ExecuteError::Idempotency(err)) => Err(Box::new(err) as BoxError),
            }
        })
        .name(name)
        .retry_strategy(retry)
        .await?;
    Ok(value)
}

/// The step's retry: wait out another's claim, stop on what no retry mends, otherwise
/// the SDK's default schedule.
fn retry(err: &StepError, attempt: u32) -> RetryDecision {
    decide(
        std::error::Error::source(err).and_then(|e| e.downcast_ref::<Error>()),
        attempt,
    )
}

/// [`retry`] for the library's error, if the step failed with one (else the function's).
fn decide(ours: Option<&Error>, attempt: u32) -> RetryDecision {
    match ours {
        Some(Error::AlreadyInProgress { retry_after, .. }) => {
            if attempt >= IN_PROGRESS_WAITS {
                return RetryDecision::Stop;
            }
            RetryDecision::Retry {
                delay: (*retry_after)
                    .clamp(Duration::from_secs(1), crate::record::lease::DEFAULT_LEASE),
            }
        }
        Some(err) if err.is_permanent() => RetryDecision::Stop,
        _ if attempt >= 6 => RetryDecision::Stop,
        // Full jitter in whole seconds, at least one: executions failing together do not
        // retry together.
        _ => RetryDecision::Retry {
            delay: Duration::from_secs(fastrand::u64(1..=backoff_secs(attempt))),
        },
    }
}

/// The SDK's default backoff before jitter: 5 s doubling, at most 60 s.
fn backoff_secs(attempt: u32) -> u64 {
    (5u64 << (attempt.clamp(1, 5) - 1)).min(60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn delays(ours: Option<&Error>, attempts: std::ops::RangeInclusive<u32>) -> Vec<Option<u64>> {
        attempts
            .map(|attempt| match decide(ours, attempt) {
                RetryDecision::Retry { delay } => Some(delay.as_secs()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_failing_step_retries_as_the_sdk_does_by_default() {
        let store = Error::Store {
            backend: "memory",
            retryable: true,
            source: "throttled".into(),
        };
        let bounds = [5, 10, 20, 40, 60];
        assert_eq!(bounds, [1, 2, 3, 4, 5].map(backoff_secs));
        for ours in [None, Some(&store)] {
            let mut highest = [0; 5];
            for _ in 0..200 {
                let delays = delays(ours, 1..=6);
                assert_eq!(delays[5], None, "six attempts in all");
                for (i, delay) in delays[..5].iter().enumerate() {
                    let delay = delay.expect("retried");
                    assert!(
                        (1..=bounds[i]).contains(&delay),
                        "{delay} within 1..={}",
                        bounds[i]
                    );
                    highest[i] = highest[i].max(delay);
                }
            }
            assert!(
                highest.iter().zip(bounds).all(|(h, b)| *h > b / 2),
                "jittered up to the bound: {highest:?}"
            );
        }
    }

    #[test]
    fn a_step_in_progress_elsewhere_waits_for_its_lease_and_a_permanent_error_stops() {
        let in_progress = |secs| Error::AlreadyInProgress {
            key: "k".into(),
            lease_expires: SystemTime::UNIX_EPOCH,
            retry_after: Duration::from_millis(secs),
        };
        assert_eq!(delays(Some(&in_progress(90_000)), 1..=1), [Some(90)]);
        assert_eq!(
            delays(Some(&in_progress(0)), 7..=7),
            [Some(1)],
            "at least a second"
        );
        assert_eq!(
            delays(Some(&in_progress(86_400_000)), 1..=1),
            [Some(900)],
            "at most 15 minutes"
        );
        assert_eq!(
            delays(Some(&in_progress(1_000)), 19..=20),
            [Some(1), None],
            "not forever"
        );
        let mismatch = Error::PayloadMismatch { key: "k".into() };
        assert_eq!(delays(Some(&mismatch), 1..=1), [None]);
    }
}
