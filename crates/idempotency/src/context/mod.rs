//! What a call inherits from where it runs, in one value ([`CallContext`]) and one
//! task-local slot: the invocation (its deadline, when its batch answers, its tenant), the
//! batch record it belongs to, where its twins meet and how long they wait, who owns the
//! claim (a durable execution), and the marks of the calls running around it.
//!
//! Every entry point (each batch, the HTTP layer, the tower layer, the macro's support, a
//! call's function) derives a context from [`CallContext::current`] and enters it with
//! [`WithCallContext::with_call_context`]; a task the library spawns carries the
//! invocation and tenant with [`spawn`]. Nothing else touches the slot (as
//! `opentelemetry::Context` with `FutureExt::with_context`).

pub(crate) mod invocation;
pub(crate) mod outcome_unknown;
pub(crate) mod owner;
pub(crate) mod record_scope;
pub(crate) mod twins;

use invocation::{FromLambda, Invocation};
use owner::Owner;
use record_scope::RecordScope;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;
use tokio::task::futures::TaskLocalFuture;
use twins::InFlight;

tokio::task_local! {
    static CURRENT: CallContext;
}

/// What a call inherits. Three pointers: cheap to clone, and cheap to swap into the slot,
/// which a scope does on every poll of its future.
#[derive(Clone, Default)]
pub(crate) struct CallContext {
    /// What the entry points set, shared by every call under them (`None`: nothing set).
    inherited: Option<Arc<Inherited>>,
    /// The calls whose function runs around this one, by handle and id: a call nested in
    /// one with its own id is no twin, it would wait for its own caller.
    enclosing: Option<Arc<Vec<(usize, String)>>>,
    /// The running call's mark: set when its function says its outcome is unknown.
    outcome_unknown: Option<Arc<AtomicBool>>,
}

/// What the entry points set (read through [`CallContext`]'s `Deref`).
#[derive(Clone, Default)]
pub(crate) struct Inherited {
    /// The invocation's deadline and when its batch answers; bounds every lease.
    pub(crate) invocation: Option<Invocation>,
    /// Lambda's tenant (tenant isolation mode): part of every stored id. Apart from the
    /// invocation: a context may have a tenant and no usable deadline (`cargo lambda
    /// watch`), and a nested deadline never changes the tenant.
    pub(crate) tenant: Option<Arc<str>>,
    /// Where twins meet: a batch invocation's registry, or an HTTP layer's.
    pub(crate) twins: Option<Arc<InFlight>>,
    /// When a twin stops waiting, besides the invocation's bound: an HTTP caller's
    /// patience, the same for every join of one request.
    pub(crate) wait_until: Option<SystemTime>,
    /// The batch record's attempt the call belongs to: also what tells a batch record's
    /// call from a direct one.
    pub(crate) record: Option<Arc<RecordScope>>,
    /// Who owns the claim of the call made directly in this context (a durable
    /// execution, across its invocations); `None`: each claim its own.
    pub(crate) owner: Option<Owner>,
}

/// Nothing inherited.
static NOTHING: Inherited = Inherited {
    invocation: None,
    tenant: None,
    twins: None,
    wait_until: None,
    record: None,
    owner: None,
};

/// The context outside any: what `read` lends when no context is set.
const EMPTY: CallContext = CallContext {
    inherited: None,
    enclosing: None,
    outcome_unknown: None,
};

impl std::ops::Deref for CallContext {
    type Target = Inherited;

    fn deref(&self) -> &Inherited {
        self.inherited.as_deref().unwrap_or(&NOTHING)
    }
}

impl CallContext {
    /// The context this code runs in (empty outside any).
    pub(crate) fn current() -> Self {
        CURRENT.try_with(Clone::clone).unwrap_or_default()
    }

    /// `f` of the context this code runs in, without copying it.
    pub(crate) fn read<R>(f: impl FnOnce(&CallContext) -> R) -> R {
        let mut f = Some(f);
        match CURRENT.try_with(|cx| (f.take().expect("called once"))(cx)) {
            Ok(r) => r,
            Err(_) => (f.take().expect("not called"))(&EMPTY),
        }
    }

    /// What the entry points set, to change: copied first when shared.
    fn inherited_mut(&mut self) -> &mut Inherited {
        Arc::make_mut(self.inherited.get_or_insert_with(Default::default))
    }

    /// An entry point of its own (a spawned HTTP request): the invocation and the tenant,
    /// none of the spawner's batch record, twins or running calls.
    #[cfg(feature = "http")]
    pub(crate) fn entry(&self) -> Self {
        let mut cx = Self::default();
        if self.invocation.is_some() || self.tenant.is_some() {
            let inherited = cx.inherited_mut();
            inherited.invocation = self.invocation;
            inherited.tenant = self.tenant.clone();
        }
        cx
    }

    /// Within `invocation`; `None` keeps the enclosing one.
    pub(crate) fn with_invocation(mut self, invocation: Option<Invocation>) -> Self {
        if invocation.is_some() {
            self.inherited_mut().invocation = invocation;
        }
        self
    }

    /// Within an invocation that ends at `deadline`; inside a batch, the batch still
    /// answers when it said it would. `None` keeps the enclosing invocation.
    pub(crate) fn with_deadline(self, deadline: Option<SystemTime>) -> Self {
        let invocation = deadline.map(|deadline| self.invocation_until(deadline));
        self.with_invocation(invocation)
    }

    /// The enclosing invocation with `deadline` in place of its deadline.
    pub(crate) fn invocation_until(&self, deadline: SystemTime) -> Invocation {
        Invocation {
            deadline,
            answer_by: self
                .invocation
                .map_or(deadline, |i| i.answer_by.min(deadline)),
        }
    }

    /// This context inheriting what a Lambda invocation gives a call (its tenant; the
    /// deadline apart, see [`FromLambda`]): the one way every entry point enters it.
    pub(crate) fn with_lambda(self, from: FromLambda) -> Self {
        self.with_tenant(from.tenant)
    }

    /// This context within the Lambda invocation `context` describes, as seen at `now`:
    /// what it gives a call ([`with_lambda`](Self::with_lambda)) and its deadline.
    pub(crate) fn within_lambda(self, context: &lambda_runtime::Context, now: SystemTime) -> Self {
        self.with_lambda(invocation::from_lambda(context))
            .with_deadline(invocation::context_deadline_at(context, now))
    }

    /// With `tenant`; `None` keeps the enclosing tenant: a context without one, met inside
    /// a tenant's invocation, never lets its calls out of that tenant's records.
    fn with_tenant(mut self, tenant: Option<Arc<str>>) -> Self {
        if tenant.is_some() {
            self.inherited_mut().tenant = tenant;
        }
        self
    }

    /// With `twins` as the registry where twins meet.
    pub(crate) fn with_twins(mut self, twins: Arc<InFlight>) -> Self {
        self.inherited_mut().twins = Some(twins);
        self
    }

    /// With twins waiting until `until` at most.
    #[cfg(feature = "http")]
    pub(crate) fn waiting_until(mut self, until: SystemTime) -> Self {
        self.inherited_mut().wait_until = Some(until);
        self
    }

    /// Within one attempt at a batch record.
    pub(crate) fn with_record(mut self, record: Arc<RecordScope>) -> Self {
        self.inherited_mut().record = Some(record);
        self
    }

    /// With the next call's claim owned by `owner`.
    #[cfg_attr(not(feature = "durable"), allow(dead_code))]
    pub(crate) fn with_owner(mut self, owner: Owner) -> Self {
        self.inherited_mut().owner = Some(owner);
        self
    }

    /// Whether `id` of `handle` is a call whose function runs around this context.
    pub(crate) fn encloses(&self, handle: usize, id: &str) -> bool {
        self.enclosing
            .as_ref()
            .is_some_and(|ids| ids.iter().any(|(h, i)| *h == handle && i == id))
    }

    /// The context of the function of the call to `id` of `handle`, and the mark it sets
    /// when it says its outcome is unknown. `twin` says whether the call is registered
    /// where twins meet (then a call to `id` nested in the function is no twin). An owner
    /// stays with the call it was set for: the calls in its function claim as their own.
    pub(crate) fn for_function(
        &self,
        handle: usize,
        id: &str,
        twin: bool,
    ) -> (Self, Arc<AtomicBool>) {
        let mark = Arc::new(AtomicBool::new(false));
        let mut cx = self.clone();
        if cx.owner.is_some() {
            cx.inherited_mut().owner = None;
        }
        if twin {
            let mut ids = self.enclosing.as_deref().cloned().unwrap_or_default();
            ids.push((handle, id.to_owned()));
            cx.enclosing = Some(Arc::new(ids));
        }
        cx.outcome_unknown = Some(Arc::clone(&mark));
        (cx, mark)
    }
}

/// Entering a context for a future: the one way into the slot.
pub(crate) trait WithCallContext: Future + Sized {
    /// Runs this future within `cx`.
    fn with_call_context(self, cx: CallContext) -> TaskLocalFuture<CallContext, Self> {
        CURRENT.scope(cx, self)
    }
}

impl<F: Future> WithCallContext for F {}

/// Marks the call whose function runs in this task, if any, as leaving its outcome unknown.
pub(crate) fn mark_outcome_unknown() {
    CallContext::read(|cx| {
        if let Some(mark) = &cx.outcome_unknown {
            mark.store(true, Ordering::SeqCst);
        }
    });
}

/// [`tokio::spawn`], carrying the current invocation and tenant, read now: a plain spawn
/// drops the slot, and a tenant's request would share another tenant's records. The task
/// is an entry point of its own: it joins neither the spawner's batch record nor its twins.
#[cfg(feature = "http")]
pub(crate) fn spawn<F>(fut: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let cx = CallContext::read(CallContext::entry);
    // Boxed first: the layers then wrap a pointer, not a copy of a large future.
    tokio::spawn(Box::pin(fut).with_call_context(cx))
}

/// Runs `fut` with `deadline` as the invocation deadline seen by idempotent functions in it.
pub async fn with_deadline<F: Future>(deadline: Option<SystemTime>, fut: F) -> F::Output {
    let cx = CallContext::current().with_deadline(deadline);
    fut.with_call_context(cx).await
}

/// Runs `fut` within the invocation described by `context`: its deadline and, in Lambda's
/// tenant isolation mode, its tenant ([`Context::tenant_id`](lambda_runtime::Context)),
/// which every stored id in `fut` then includes.
pub async fn with_context<F: Future>(context: &lambda_runtime::Context, fut: F) -> F::Output {
    let cx = CallContext::current().within_lambda(context, SystemTime::now());
    fut.with_call_context(cx).await
}

/// The tenant set by an enclosing [`with_context`] (or a batch, or a layer), if any.
pub fn current_tenant() -> Option<Arc<str>> {
    CallContext::read(|cx| cx.tenant.clone())
}

/// The deadline set by an enclosing [`with_deadline`] or [`with_context`].
pub fn current_deadline() -> Option<SystemTime> {
    CallContext::read(|cx| cx.invocation.map(|i| i.deadline))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_tenant_outlives_a_nested_deadline_and_an_empty_one_is_none() {
        let mut context = lambda_runtime::Context::default();
        context.tenant_id = Some(String::new());
        assert_eq!(invocation::from_lambda(&context).tenant, None);
        context.tenant_id = Some("a".into());
        let seen = with_context(&context, async {
            let nested = with_deadline(Some(SystemTime::now()), async { current_tenant() });
            let none = lambda_runtime::Context::default();
            let untenanted = with_context(&none, async { current_tenant() }).await;
            (nested.await, untenanted)
        })
        .await;
        assert_eq!(seen, (Some("a".into()), Some("a".into())));
        assert_eq!(current_tenant(), None);
    }

    #[tokio::test]
    async fn a_nested_deadline_keeps_the_batch_answer_and_a_spawn_carries_only_the_entry() {
        let batch = Invocation {
            deadline: SystemTime::UNIX_EPOCH + Duration::from_secs(100),
            answer_by: SystemTime::UNIX_EPOCH + Duration::from_secs(90),
        };
        let cx = CallContext::default()
            .with_invocation(Some(batch))
            .with_tenant(Some("t".into()))
            .with_record(Arc::default())
            .with_twins(Arc::default());
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(200);
        let (nested, entry) = async {
            let nested =
                with_deadline(Some(later), async { CallContext::read(|cx| cx.invocation) }).await;
            (nested, CallContext::read(CallContext::entry))
        }
        .with_call_context(cx)
        .await;
        assert_eq!(
            nested,
            Some(Invocation {
                deadline: later,
                answer_by: batch.answer_by
            })
        );
        assert_eq!(entry.invocation, Some(batch));
        assert_eq!(entry.tenant.as_deref(), Some("t"));
        assert!(entry.record.is_none() && entry.twins.is_none());
    }
}
