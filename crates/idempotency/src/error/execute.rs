//! What a call fails with: the library's refusal or the function's own error, and how
//! either prints on one line.

use super::Error;
use std::error::Error as StdError;
use std::fmt;

/// What [`Idempotency::execute`](crate::Idempotency::execute) fails with: either the
/// idempotency layer refused or failed, or the wrapped function returned its own error
/// (after which the record was released).
pub enum ExecuteError<E> {
    /// The idempotency layer's own error.
    Idempotency(Error),
    /// The wrapped function's error, unchanged.
    Function(E),
}

impl<E> ExecuteError<E> {
    /// Folds both cases into the function's error type, the shape a handler returns.
    pub fn into_inner(self) -> E
    where
        E: From<Error>,
    {
        match self {
            ExecuteError::Idempotency(e) => E::from(e),
            ExecuteError::Function(e) => e,
        }
    }
}

/// Which side failed, and nothing of the inner error: that is the `source()`, so anyhow's
/// `{:#}`, eyre and [`report`] print each cause once (`the function failed: HTTP 400`).
/// Print it with [`report`] (or `{:#}`): `{}` alone shows this layer only.
impl<E> fmt::Display for ExecuteError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExecuteError::Idempotency(_) => "the idempotency layer failed the call",
            ExecuteError::Function(_) => "the idempotent function failed",
        })
    }
}

/// `{:?}` is this layer and the inner error's report: [`report`] of the library's error, the
/// function's error in its own `Debug` (its report too, for an error that follows this
/// crate's convention or anyhow's). `{:#?}` is `Idempotency(..)` or `Function(..)` with the
/// inner error's `{:#?}`.
impl<E: fmt::Debug> fmt::Debug for ExecuteError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, f.alternate()) {
            (ExecuteError::Idempotency(e), true) => f.debug_tuple("Idempotency").field(e).finish(),
            (ExecuteError::Function(e), true) => f.debug_tuple("Function").field(e).finish(),
            (ExecuteError::Idempotency(e), false) => write!(f, "{self}: {}", report(e)),
            (ExecuteError::Function(e), false) => write!(f, "{self}: {e:?}"),
        }
    }
}

/// The inner error itself as `source()`: a batch, or any code that walks the chain, finds
/// this crate's [`Error`] or a [`PermanentError`](crate::PermanentError) behind it and
/// classifies the failure by it.
impl<E: StdError + 'static> StdError for ExecuteError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            ExecuteError::Idempotency(e) => Some(e),
            ExecuteError::Function(e) => Some(e),
        }
    }
}

/// An error and all its causes on one line, `error: cause: cause`, each printed once.
///
/// Every error of this crate prints only its own layer (`Display`) and gives the rest
/// through `source()`, as the Rust API guidelines ask, so anyhow, eyre and tracing's error
/// fields print each cause once. This is for a log line that has only `Display`: the
/// batch's log and each record's reason use it. A cause whose text the layer above
/// already ends with (some drivers repeat their I/O error) is left out.
///
/// ```
/// use lambda_idempotency::report;
/// let io = std::io::Error::other("connection reset");
/// let err = std::io::Error::new(std::io::ErrorKind::Other, io);
/// assert_eq!(report(&err), "connection reset");
/// ```
pub fn report(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut cause = error.source();
    while let Some(c) = cause {
        let layer = c.to_string();
        if !layer.is_empty() && !last.ends_with(&layer) {
            text.push_str(": ");
            text.push_str(&layer);
        }
        last = layer;
        cause = c.source();
    }
    text
}
