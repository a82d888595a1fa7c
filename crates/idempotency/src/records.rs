//! Records for operators: read one, forget one, list them. The engine never needs these;
//! the `lambda-idempotency` command-line tool and on-call runbooks do.

use crate::error::Error;
use crate::handle::Idempotency;
use crate::operation::Operation;
use crate::record::Record;
use crate::store::{Forgotten, ListRequest, RecordPage};
use serde_json::Value;
use std::time::SystemTime;

impl Idempotency {
    /// The record `payload` has under `op` (the id [`idempotency_id`] gives), if any:
    /// status, expiry, lease end, the stored result and its size
    /// ([`Record::data`]). Retried on retryable store errors, as every request is.
    ///
    /// [`idempotency_id`]: Self::idempotency_id
    pub async fn record(&self, op: &Operation, payload: &Value) -> Result<Option<Record>, Error> {
        let id = self.idempotency_id(op, payload)?;
        self.record_by_id(&id).await
    }

    /// The record with the stored id `id`, if any.
    pub async fn record_by_id(&self, id: &str) -> Result<Option<Record>, Error> {
        let store = &self.engine.store;
        self.engine
            .retry(self.cutoff(), self.attempts(), "get", || store.get(id))
            .await
    }

    /// Deletes the record `read` if it is still as read ([`Record::is_as_read`]): a claim,
    /// completion or takeover made since is never deleted by mistake
    /// ([`Forgotten::Changed`]: read it again).
    ///
    /// What it does:
    /// - to a **stuck or live claim**: its worker, if it is still running, finds its
    ///   completion refused ([`Error::LeaseLost`]); its result is not stored and nothing
    ///   runs twice within that invocation;
    /// - to the **next delivery** of the message: it claims the key and runs the function
    ///   again. That is the point: use it when the earlier run is known not to have had its
    ///   effect, or when running again is the lesser harm;
    /// - to a **completed record** (a bad stored result): the next duplicate runs again
    ///   instead of replaying it.
    ///
    /// A retried request whose first attempt was applied and its answer lost answers
    /// [`Forgotten::Absent`].
    pub async fn forget(&self, read: &Record) -> Result<Forgotten, Error> {
        let store = &self.engine.store;
        self.engine
            .retry(self.cutoff(), self.attempts(), "forget", || {
                store.forget(read)
            })
            .await
    }

    /// One page of the records whose id starts with `request.prefix` (one bounded store
    /// request). Go on with [`ListRequest::after`] and the page's
    /// [`next`](RecordPage::next) until it is `None`.
    pub async fn list(&self, request: &ListRequest) -> Result<RecordPage, Error> {
        let store = &self.engine.store;
        self.engine
            .retry(self.cutoff(), self.attempts(), "list", || {
                store.list(request)
            })
            .await
    }

    fn attempts(&self) -> u32 {
        self.engine.config.max_store_attempts
    }

    /// Every attempt's timeout and a backoff between them: an operator's request has no
    /// invocation deadline to keep.
    fn cutoff(&self) -> SystemTime {
        let each = self.engine.config.store_attempt_timeout + crate::config::MAX_BACKOFF;
        crate::clock::add(self.now(), each.saturating_mul(self.attempts()))
    }
}
