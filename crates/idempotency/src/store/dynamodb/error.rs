//! DynamoDB's errors as [`Error::Store`]: what a later attempt may fix, and a table whose
//! key is not the one the store was set up for, named with both keys.

use super::names::KeySchema;
use super::{BACKEND, DynamoDbStore};
use crate::error::{BoxError, Error};
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use std::fmt;

impl DynamoDbStore {
    /// A request's error as [`Error::Store`]. A `ValidationException` from a table whose
    /// key is not the store's becomes a [`KeySchemaMismatch`] that says which key the
    /// table has and which the store expected: the table's key comes from one
    /// `DescribeTable` (only on a `ValidationException`, which no request of a working
    /// store gets); if the role may not describe the table, DynamoDB's message decides.
    pub(super) async fn request_error<E, R>(&self, err: SdkError<E, R>) -> Error
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static + HasStatus,
    {
        let Some(service) = err.as_service_error() else {
            return store_error(err);
        };
        if service.code() != Some("ValidationException") {
            return store_error(err);
        }
        let about_the_key = is_key_schema_message(service.message());
        match self.describe_key().await {
            Ok(found) if found != self.layout.expected(&self.names) => {
                self.key_mismatch(Some(found), err)
            }
            Ok(_) => store_error(err),
            Err(_) if about_the_key => self.key_mismatch(None, err),
            Err(_) => store_error(err),
        }
    }

    /// A [`KeySchemaMismatch`] for this store, the table's key as `found` when known.
    pub(super) fn key_mismatch(
        &self,
        found: Option<KeySchema>,
        source: impl Into<BoxError>,
    ) -> Error {
        Error::store(
            BACKEND,
            false,
            KeySchemaMismatch {
                table: self.table.clone(),
                found,
                expected: self.layout.expected(&self.names),
                source: source.into(),
            },
        )
    }
}

/// Whether a `ValidationException`'s message says the request's key does not fit the
/// table's: a key with other attributes than the table's (`GetItem`, `UpdateItem`,
/// `DeleteItem`), an item without one of them or with another type (`PutItem`). The
/// messages are DynamoDB's, which dynalite copies (moto says only "Validation Exception"
/// for a `PutItem` without the sort key).
pub(super) fn is_key_schema_message(message: Option<&str>) -> bool {
    let message = message.unwrap_or_default().to_ascii_lowercase();
    [
        "key element does not match the schema",
        "missing the key",
        "type mismatch for key",
    ]
    .iter()
    .any(|phrase| message.contains(phrase))
}

/// The table's key is not the one the store's settings need: not retryable, a fix of the
/// settings or of the table is.
#[derive(Debug)]
pub(super) struct KeySchemaMismatch {
    pub(super) table: String,
    /// The table's key, when `DescribeTable` said it.
    pub(super) found: Option<KeySchema>,
    pub(super) expected: KeySchema,
    /// What showed it: DynamoDB's error, or what the store saw.
    pub(super) source: BoxError,
}

impl fmt::Display for KeySchemaMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (table, expected) = (&self.table, &self.expected);
        match &self.found {
            Some(found) => write!(
                f,
                "table {table:?} has key {found} but the store was set up for {expected}"
            )?,
            None => write!(
                f,
                "table {table:?} has another key than the store was set up for, {expected} (allow dynamodb:DescribeTable to see which)"
            )?,
        }
        f.write_str(
            ": the partition key's name is AttributeNames::id, a sort key is set with DynamoDbStore::sort_key_attr",
        )
    }
}

impl std::error::Error for KeySchemaMismatch {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

/// Maps an SDK error to [`Error::Store`], marking what a later attempt may fix; the SDK
/// error is the source.
pub(super) fn store_error<E, R>(err: SdkError<E, R>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static + HasStatus,
{
    let retryable = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(service) => {
            service.raw().status_code() >= 500
                || matches!(
                    service.err().code(),
                    Some(
                        "ThrottlingException"
                            | "ProvisionedThroughputExceededException"
                            | "RequestLimitExceeded"
                            | "InternalServerError"
                            | "TransactionConflictException"
                    )
                )
        }
        _ => false,
    };
    // The SDK's own error, boxed: a caller can downcast it (`SdkError<PutItemError, _>`).
    Error::store(BACKEND, retryable, err)
}

/// The HTTP status of a raw response, abstracted so [`store_error`] stays generic.
pub(super) trait HasStatus {
    fn status_code(&self) -> u16;
}

impl HasStatus for aws_sdk_dynamodb::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_messages_about_the_key_say_the_key_does_not_match() {
        for message in [
            "The provided key element does not match the schema",
            "One or more parameter values were invalid: Missing the key sk in the item",
            "One or more parameter values were invalid: Type mismatch for key id expected: N actual: S",
        ] {
            assert!(is_key_schema_message(Some(message)), "{message}");
        }
        for message in [
            "Item size has exceeded the maximum allowed size",
            "Invalid ConditionExpression: Syntax error",
            "Validation Exception",
        ] {
            assert!(!is_key_schema_message(Some(message)), "{message}");
        }
        assert!(!is_key_schema_message(None));
    }
}
