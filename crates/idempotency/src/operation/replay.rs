//! The replay hook: what a replay returns, changed or annotated by the operation before it
//! becomes the function's type (Powertools' `response_hook`).

use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// The record a replay answers from, as the hook set by
/// [`Operation::on_replay`](crate::Operation::on_replay) sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Replay {
    /// The stored id.
    pub id: String,
    /// When the record expires.
    pub expiration: SystemTime,
    /// Whether the local cache answered, with no store request.
    pub from_cache: bool,
}

/// The stored value and its record in, the answer out.
type HookFn = dyn Fn(Value, &Replay) -> Value + Send + Sync;

/// The hook, shared by the operation's clones.
#[derive(Clone)]
pub(crate) struct ReplayHook(pub(crate) Arc<HookFn>);

impl fmt::Debug for ReplayHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReplayHook(set)")
    }
}

/// The stored `data` of the record `id`, through `hook` when set (which sees `replay()`),
/// as `T`. Without a hook no [`Replay`] is built: this runs for every duplicate.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    hook: Option<&ReplayHook>,
    id: &str,
    replay: impl FnOnce() -> Replay,
    data: Option<&str>,
) -> Result<T, crate::Error> {
    let Some(hook) = hook else {
        return crate::record::decode(id, data);
    };
    let replay = replay();
    let stored: Value = crate::record::decode(&replay.id, data)?;
    let answer = (hook.0)(stored, &replay);
    serde_json::from_value(answer).map_err(|source| crate::Error::ReplayAnswerIncompatible {
        key: replay.id.clone(),
        source,
    })
}
