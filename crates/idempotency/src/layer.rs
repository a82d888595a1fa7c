//! Middleware that makes a whole Lambda handler idempotent, keyed on its event.

use crate::context::{CallContext, WithCallContext, invocation};
use crate::envelope::{Envelope, Opened};
use crate::error::{Error, ExecuteError};
use crate::handle::Idempotency;
use crate::operation::Operation;
use lambda_runtime::tower::{Layer, Service};
use lambda_runtime::{Error as LambdaError, LambdaEvent};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A tower [`Layer`] that makes a whole handler idempotent: the Powertools `@idempotent`
/// case, for direct invocations and API Gateway events. The key comes from the event
/// (`Operation`'s key strategy runs over the serialized payload), the lease from the
/// invocation's deadline. A duplicate gets the stored response; an in-progress duplicate
/// is an error the caller sees ([`Error::AlreadyInProgress`](crate::Error::AlreadyInProgress)),
/// or the operation's [`when_in_progress`](crate::Operation::when_in_progress) answer.
/// An invocation with a tenant id keys its record under that tenant.
///
/// For SQS, use [`SqsBatch`](crate::SqsBatch) with a per-message function instead: a
/// batch's records must be deduplicated one by one.
///
/// ```no_run
/// use lambda_idempotency::{IdempotentLayer, Idempotency, KeyStrategy, MemoryStore, Operation};
/// use lambda_runtime::tower::ServiceBuilder;
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
/// use serde_json::{Value, json};
///
/// async fn handler(event: LambdaEvent<Value>) -> Result<Value, Error> {
///     Ok(json!({"charged": event.payload["amount"]}))
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), Error> {
///     let idempotency = Idempotency::new(MemoryStore::new());
///     let op = Operation::new("charge", KeyStrategy::field("payment_id"));
///     let service = ServiceBuilder::new()
///         .layer(IdempotentLayer::new(idempotency, op))
///         .service(service_fn(handler));
///     lambda_runtime::run(service).await
/// }
/// ```
#[derive(Clone)]
pub struct IdempotentLayer {
    idempotency: Idempotency,
    operation: Arc<Operation>,
    envelope: Option<Arc<Envelope>>,
}

impl IdempotentLayer {
    /// A layer keyed by `operation` over `idempotency`'s store.
    pub fn new(idempotency: Idempotency, operation: Operation) -> Self {
        Self {
            idempotency,
            operation: Arc::new(operation),
            envelope: None,
        }
    }

    /// Keys (and hashes and validates) the request inside the event rather than the
    /// event: [`Envelope::http_body`] for an API Gateway event invoked directly,
    /// [`Envelope::eventbridge`] for an EventBridge rule's target. The handler still gets
    /// the whole event. A payload the envelope does not open is refused for good
    /// ([`Error::MalformedBody`](crate::Error::MalformedBody)) before anything is claimed,
    /// and so is a carrier's own message the envelope skips (an S3 `s3:TestEvent`): there
    /// is no request to key, and the handler never runs unclaimed.
    pub fn envelope(mut self, envelope: Envelope) -> Self {
        self.envelope = Some(Arc::new(envelope));
        self
    }
}

impl fmt::Debug for IdempotentLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentLayer")
            .field("operation", &self.operation)
            .finish()
    }
}

impl<S> Layer<S> for IdempotentLayer {
    type Service = IdempotentService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotentService {
            inner,
            idempotency: self.idempotency.clone(),
            operation: self.operation.clone(),
            envelope: self.envelope.clone(),
        }
    }
}

/// The service made by [`IdempotentLayer`].
///
/// # Clone
/// The inner service is cloned for each call, as tower services that hand work to a
/// future do; `service_fn` handlers are cheap to clone.
#[derive(Clone)]
pub struct IdempotentService<S> {
    inner: S,
    idempotency: Idempotency,
    operation: Arc<Operation>,
    envelope: Option<Arc<Envelope>>,
}

impl<S> fmt::Debug for IdempotentService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentService")
            .field("operation", &self.operation)
            .finish()
    }
}

impl<S, T, R> Service<LambdaEvent<T>> for IdempotentService<S>
where
    S: Service<LambdaEvent<T>, Response = R> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<LambdaError>,
    T: Serialize + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
{
    type Response = R;
    type Error = LambdaError;
    type Future = Pin<Box<dyn Future<Output = Result<R, LambdaError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, event: LambdaEvent<T>) -> Self::Future {
        // The clone is not ready; the one that was polled ready handles this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let idempotency = self.idempotency.clone();
        let operation = self.operation.clone();
        let envelope = self.envelope.clone();
        Box::pin(async move {
            let mut payload = serde_json::to_value(&event.payload)?;
            if let Some(envelope) = envelope {
                payload = match envelope.open_value(payload) {
                    Ok(Opened::Request(request)) => request,
                    // Not a request, and nothing to key: never run unclaimed.
                    Ok(Opened::Skip { reason }) => {
                        let e = Error::MalformedBody {
                            reason: format!("not a request: {reason}"),
                        };
                        tracing::warn!(error = %e, "idempotency refused the invocation");
                        return Err(e.into());
                    }
                    Err(e) => {
                        let e = Error::MalformedBody {
                            reason: e.to_string(),
                        };
                        tracing::warn!(error = %e, "idempotency refused the invocation");
                        return Err(e.into());
                    }
                };
            }
            let deadline = invocation::context_deadline_at(&event.context, idempotency.now());
            let from_lambda = invocation::from_lambda(&event.context);
            let run = || async move { inner.call(event).await.map_err(Into::into) };
            let cx = CallContext::current()
                .with_lambda(from_lambda)
                .with_deadline(deadline);
            let run = idempotency.execute_inner(&operation, &payload, deadline, run);
            match run.with_call_context(cx).await {
                Ok((response, _)) => Ok(response),
                Err(ExecuteError::Function(e)) => Err(e),
                Err(ExecuteError::Idempotency(e)) => {
                    // The runtime reports only the error's `Display`, one layer: the log
                    // line carries the whole chain. The error itself stays downcastable.
                    tracing::warn!(error = %crate::error::report(&e), "idempotency refused or failed the invocation");
                    Err(e.into())
                }
            }
        })
    }
}
