//! The invocation a call runs in, read off a Lambda context: its deadline, carried to
//! every record's lease, and its tenant, carried to every stored id.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The invocation a call runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Invocation {
    /// When Lambda ends the invocation.
    pub(crate) deadline: SystemTime,
    /// When the enclosing batch stops waiting and answers (the deadline outside a batch).
    pub(crate) answer_by: SystemTime,
}

/// The deadline of a Lambda context, or `None` for a context without one
/// (`Context::default()` in tests) or with one already past when read: a real invocation
/// always starts before its deadline, and some local emulators send a duration instead
/// of an epoch time (`cargo lambda watch` sends `600000`). Reads the system clock; the
/// library's own callers read the time from their handle's clock instead.
pub(crate) fn context_deadline(context: &lambda_runtime::Context) -> Option<SystemTime> {
    context_deadline_at(context, SystemTime::now())
}

/// [`context_deadline`] as seen at `now`.
pub(crate) fn context_deadline_at(
    context: &lambda_runtime::Context,
    now: SystemTime,
) -> Option<SystemTime> {
    let deadline = UNIX_EPOCH + Duration::from_millis(context.deadline);
    (context.deadline > 0 && deadline > now).then_some(deadline)
}

/// What a call inherits from its Lambda context besides the deadline (which each entry
/// point bounds its own way: a batch answers early, a layer leases to it). Read in one
/// place, [`from_lambda`], and entered in one, [`CallContext::with_lambda`](super::CallContext::with_lambda):
/// a new per-invocation field is added to these two.
#[derive(Debug, Clone, Default)]
pub(crate) struct FromLambda {
    /// Lambda's tenant (tenant isolation mode).
    pub(crate) tenant: Option<Arc<str>>,
}

/// What a call inherits from `context` (its deadline aside).
pub(crate) fn from_lambda(context: &lambda_runtime::Context) -> FromLambda {
    FromLambda {
        tenant: context_tenant(context),
    }
}

/// The tenant of a Lambda context: `None` without one, and for an empty tenant id, which
/// Lambda never sends (a tenant id is 1 to 256 characters) and which would make a stored id
/// no different from another tenant's empty one: it is no tenant.
fn context_tenant(context: &lambda_runtime::Context) -> Option<Arc<str>> {
    context
        .tenant_id
        .as_deref()
        .filter(|tenant| !tenant.is_empty())
        .map(Arc::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_already_past_is_no_deadline() {
        let mut context = lambda_runtime::Context::default();
        assert_eq!(context_deadline(&context), None, "no deadline");
        // `cargo lambda watch` sends 600000: ten minutes after 1970, not from now.
        context.deadline = 600_000;
        assert_eq!(context_deadline(&context), None, "a duration, not a time");
        let future = SystemTime::now() + Duration::from_secs(30);
        context.deadline = crate::record::epoch_millis(future);
        assert_eq!(
            context_deadline(&context),
            Some(crate::record::from_epoch_millis(context.deadline))
        );
    }
}
