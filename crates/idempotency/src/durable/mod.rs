//! Durable functions ([`aws-durable-execution-sdk`](aws_durable_execution_sdk), feature
//! `durable`): an execution that waits, suspends and resumes over many invocations keeps
//! one claim, and a step's side effect runs once across executions.
//!
//! A durable handler runs from the top on every invocation of its execution, its
//! completed steps replayed from checkpoints. [`IdempotentExecution`] claims the
//! execution's key with a token derived from the execution (its ARN), so every
//! invocation of that execution re-enters the claim, whether or not the SDK says it is
//! replaying and even after an invocation that crashed before its first checkpoint;
//! another execution with the same key is a true duplicate. The claim's lease is the
//! execution's timeout, a setting, as no invocation carries it. [`step`] makes one
//! step's side effect idempotent by a key of its own.
//!
//! ```no_run
//! use aws_durable_execution_sdk::{self as durable, BoxError, DurableContext};
//! use lambda_idempotency::durable::{IdempotentExecution, step};
//! use lambda_idempotency::{Idempotency, KeyStrategy, MemoryStore, Operation};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[derive(Clone, Serialize, Deserialize)]
//! struct Order { order_id: String, amount_cents: u64 }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Receipt { charge: String }
//!
//! async fn charge(order: &Order) -> Result<Receipt, BoxError> {
//!     Ok(Receipt { charge: format!("ch_{}", order.order_id) })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let idempotency = Idempotency::new(MemoryStore::new()); // DynamoDbStore in production
//!     // The function's DurableConfig.ExecutionTimeout, as template.yaml sets it.
//!     let timeout = Duration::from_secs(7 * 24 * 60 * 60);
//!     let execution = IdempotentExecution::new(
//!         idempotency.clone(),
//!         Operation::new("order", KeyStrategy::field("order_id")),
//!         timeout,
//!     )?;
//!     let charges = Operation::new("charge", KeyStrategy::field("order_id"));
//!     durable::run(execution.handler(move |order: Order, ctx: DurableContext| {
//!         let (idempotency, charges) = (idempotency.clone(), charges.clone());
//!         async move {
//!             // Once per order, whichever execution gets here.
//!             let to_charge = order.clone();
//!             let receipt: Receipt = step(&idempotency, &ctx, &charges, &order, move || async move {
//!                 charge(&to_charge).await
//!             })
//!             .await?;
//!             ctx.wait(Duration::from_secs(24 * 60 * 60)).await?;
//!             Ok(receipt)
//!         }
//!     }))
//!     .await
//! }
//! ```
//!
//! The SDK is a preview: this feature is pinned to its 0.1.0, and a release of ours moves
//! with it.

mod step;

pub use step::step;

use crate::context::invocation::{self, Invocation};
use crate::context::owner::Owner;
use crate::context::{CallContext, WithCallContext};
use crate::error::{BoxError, Error, ExecuteError};
use crate::handle::{Idempotency, to_json};
use crate::operation::Operation;
use crate::record::lease;
use aws_durable_execution_sdk::DurableContext;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// The longest execution timeout Lambda accepts (`DurableConfig.ExecutionTimeout`): 366
/// days.
pub const MAX_EXECUTION_TIMEOUT: Duration = Duration::from_secs(31_622_400);

/// What names an execution's owner: its ARN unless a test says otherwise.
type OwnerName = Arc<dyn Fn(&DurableContext) -> String + Send + Sync>;

/// A durable handler made idempotent by a key of its event: one claim per execution,
/// re-entered by every invocation of that execution, answered to every other execution
/// with the same key.
///
/// - the first invocation claims the key (one conditional write) and runs the handler;
/// - a later invocation of the same execution (after a wait, a callback, a retry, a
///   crash) re-enters the claim and runs the handler again, which the SDK replays from
///   its checkpoints; at-most-once operations re-enter too;
/// - the handler returning `Ok` completes the record before the execution ends, `Err`
///   releases it (the execution failed: a new one may run); a suspension (a wait) drops
///   the handler and leaves the claim as it is;
/// - another execution with the same key gets the stored result once completed, without
///   running the handler, and [`Error::AlreadyInProgress`] (its execution fails: an event
///   source mapping delivers the message again) while the first may still run.
///
/// The lease is the execution timeout given here: set it to the function's
/// `DurableConfig.ExecutionTimeout`.
#[derive(Clone)]
pub struct IdempotentExecution {
    idempotency: Idempotency,
    op: Arc<Operation>,
    timeout: Duration,
    owner: OwnerName,
}

impl fmt::Debug for IdempotentExecution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentExecution")
            .field("operation", &self.op.name)
            .field("execution_timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl IdempotentExecution {
    /// Executions keyed by `op`, each holding its claim for `execution_timeout` (the
    /// function's `DurableConfig.ExecutionTimeout`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] (`what: "execution timeout"`), at start-up rather than on
    /// every execution: a timeout of zero or past [`MAX_EXECUTION_TIMEOUT`]; an
    /// at-most-once handle or operation whose records expire no later than the timeout (a
    /// claim would expire while its execution may still run); an operation with a lease
    /// of its own (the execution's claim lasts the execution timeout, so that lease would
    /// mean nothing).
    pub fn new(
        idempotency: Idempotency,
        op: Operation,
        execution_timeout: Duration,
    ) -> Result<Self, Error> {
        let refuse = |reason: String| Error::InvalidName {
            what: "execution timeout",
            name: format!("{execution_timeout:?}"),
            reason,
        };
        if execution_timeout < Duration::from_secs(1)
            || execution_timeout > MAX_EXECUTION_TIMEOUT
            || execution_timeout.subsec_nanos() != 0
        {
            return Err(refuse(format!(
                "a durable execution's timeout is whole seconds, from 1 second to {} days (Lambda's DurableConfig.ExecutionTimeout): give the function's own",
                MAX_EXECUTION_TIMEOUT.as_secs() / 86_400
            )));
        }
        if let Some(op_lease) = op.lease {
            return Err(refuse(format!(
                "operation {:?} has a lease of its own ({op_lease:?}), but an execution's claim lasts the execution timeout: drop the operation's lease",
                op.name
            )));
        }
        let config = &idempotency.engine.config;
        if op.at_most_once || config.at_most_once {
            lease::check_at_most_once_expiry(config.expires_after, execution_timeout)?;
        }
        Ok(Self {
            idempotency,
            op: Arc::new(op),
            timeout: execution_timeout,
            owner: Arc::new(|ctx: &DurableContext| ctx.execution_arn().to_owned()),
        })
    }

    /// Names the execution that owns a claim by `name` instead of its ARN. For runners
    /// whose ARN is fixed (the SDK's `LocalRunner` gives every execution the same one),
    /// so that a test can start a second execution; in Lambda, keep the ARN. Two
    /// executions given one name share their claims: a duplicate would run again.
    #[must_use]
    pub fn owner(
        mut self,
        name: impl Fn(&DurableContext) -> String + Send + Sync + 'static,
    ) -> Self {
        self.owner = Arc::new(name);
        self
    }

    /// The execution timeout, each claim's lease.
    pub fn execution_timeout(&self) -> Duration {
        self.timeout
    }

    /// `handler`, made idempotent: what [`aws_durable_execution_sdk::run`] (or `wrap`,
    /// or the SDK's test runner) takes. The event is the key's payload; the handler's
    /// answer is the stored result.
    pub fn handler<E, O, F, Fut>(
        self,
        handler: F,
    ) -> impl Fn(E, DurableContext) -> Pin<Box<dyn Future<Output = Result<O, BoxError>> + Send>>
    + Send
    + Sync
    + 'static
    where
        E: Serialize + DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + 'static,
        F: Fn(E, DurableContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, BoxError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        move |event: E, ctx: DurableContext| {
            let this = self.clone();
            let handler = Arc::clone(&handler);
            Box::pin(async move { this.invoke(event, ctx, handler.as_ref()).await })
        }
    }

    /// One invocation: claim (or re-enter) the execution's key, then run, replay or refuse.
    async fn invoke<E, O, F, Fut>(
        &self,
        event: E,
        ctx: DurableContext,
        handler: &F,
    ) -> Result<O, BoxError>
    where
        E: Serialize,
        O: Serialize + DeserializeOwned,
        F: Fn(E, DurableContext) -> Fut,
        Fut: Future<Output = Result<O, BoxError>>,
    {
        let payload = to_json(&event)?;
        let owner = Owner::named(&(self.owner)(&ctx), self.timeout);
        let lambda = ctx.lambda_context();
        let now = self.idempotency.now();
        // Store requests stop with this invocation (Lambda's longest when its context has
        // no deadline, as in the SDK's test runner); the claim outlives it.
        let deadline = invocation::context_deadline_at(lambda, now)
            .unwrap_or_else(|| crate::clock::add(now, lease::DEFAULT_LEASE));
        let cx = CallContext::current()
            .with_lambda(invocation::from_lambda(lambda))
            .with_invocation(Some(Invocation {
                deadline,
                answer_by: deadline,
            }))
            .with_owner(owner);
        let run = self
            .idempotency
            .execute(&self.op, &payload, move || handler(event, ctx))
            .with_call_context(cx)
            .await;
        match run {
            Ok((value, _)) => Ok(value),
            Err(ExecuteError::Function(err)) => Err(err),
            Err(ExecuteError::Idempotency(err)) => Err(Box::new(err)),
        }
    }
}
