//! The model API key from AWS Secrets Manager (`MODEL_API_KEY_SECRET_ARN`), read once per
//! execution environment at start-up: the key is never an environment variable of a
//! deployed function.

use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_secretsmanager::error::{ProvideErrorMetadata, SdkError};
use std::fmt;
use std::time::Duration;

/// The variable naming the secret.
pub const SECRET_ARN_ENV: &str = "MODEL_API_KEY_SECRET_ARN";

/// Why the key could not be read. Never holds the secret's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretError {
    /// The secret's ARN.
    pub arn: String,
    /// What went wrong.
    pub reason: String,
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SECRET_ARN_ENV}={:?}: the model API key cannot be read from Secrets Manager: {}",
            self.arn, self.reason
        )
    }
}

impl std::error::Error for SecretError {}

/// Whether `arn` is a full Secrets Manager secret ARN:
/// `arn:PARTITION:secretsmanager:REGION:ACCOUNT:secret:NAME`.
pub fn is_secret_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.splitn(7, ':').collect();
    matches!(
        parts.as_slice(),
        ["arn", partition, "secretsmanager", region, account, "secret", name]
            if partition.starts_with("aws")
                && !region.is_empty()
                && account.len() == 12
                && account.bytes().all(|b| b.is_ascii_digit())
                && !name.is_empty()
    )
}

/// The region in a secret's ARN: the secret is read there, whatever `AWS_REGION` says.
fn region_of(arn: &str) -> Option<&str> {
    arn.split(':').nth(3).filter(|r| !r.is_empty())
}

/// The AWS configuration the worker reads its secret with: the standard chain (the
/// function's role on Lambda), bounded so a start-up never hangs on Secrets Manager.
pub async fn sdk_config() -> SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(3))
                .operation_timeout(Duration::from_secs(8))
                .build(),
        )
        .load()
        .await
}

/// Reads the API key from the secret at `arn` (`GetSecretValue`, the only permission it needs).
pub async fn read_api_key(sdk: &SdkConfig, arn: &str) -> Result<String, SecretError> {
    let error = |reason: String| SecretError {
        arn: arn.to_owned(),
        reason,
    };
    let mut config = aws_sdk_secretsmanager::config::Builder::from(sdk);
    if let Some(region) = region_of(arn) {
        config = config.region(Region::new(region.to_owned()));
    }
    let client = aws_sdk_secretsmanager::Client::from_conf(config.build());
    let answer = client
        .get_secret_value()
        .secret_id(arn)
        .send()
        .await
        .map_err(|e| error(describe(&e)))?;
    let value = answer
        .secret_string()
        .ok_or_else(|| error("the secret has no string value (a binary secret?)".into()))?;
    api_key_from_secret_value(value).map_err(error)
}

/// A one-line account of a failed call: the service's error code and message, or the
/// chain of causes (no credentials, timeout, unreachable endpoint).
fn describe<E, R>(e: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: fmt::Debug,
{
    if let SdkError::ServiceError(service) = e {
        let err = service.err();
        let code = err.code().unwrap_or("service error");
        let hint = if code == "AccessDeniedException" {
            " (the function's role needs secretsmanager:GetSecretValue on this ARN, and \
             kms:Decrypt on the secret's key if it is a customer managed key)"
        } else {
            ""
        };
        return format!("{code}: {}{hint}", err.message().unwrap_or("no message"));
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The key in a secret's value: the value itself, or the `api_key` field when the value is
/// a JSON object (as the console's key/value secrets are).
pub fn api_key_from_secret_value(value: &str) -> Result<String, String> {
    let value = value.trim();
    let key = if value.starts_with('{') {
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(value)
            .map_err(|e| format!("the secret's value looks like JSON but is not an object: {e}"))?;
        match object.get("api_key") {
            Some(serde_json::Value::String(key)) => key.trim().to_owned(),
            _ => {
                return Err("the secret's value is JSON without a string \"api_key\" field".into());
            }
        }
    } else {
        value.to_owned()
    };
    if key.is_empty() {
        return Err("the secret's API key is empty".into());
    }
    if key.chars().any(|c| c.is_control()) {
        return Err("the secret's API key holds control characters".into());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_arns() {
        assert!(is_secret_arn(
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:model/api-key-AbC123"
        ));
        assert!(is_secret_arn(
            "arn:aws-cn:secretsmanager:cn-north-1:123456789012:secret:k-AbC123"
        ));
        for bad in [
            "model/api-key",
            "arn:aws:ssm:eu-west-1:123456789012:parameter/k",
            "arn:aws:secretsmanager::123456789012:secret:k",
            "arn:aws:secretsmanager:eu-west-1:1234:secret:k",
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:",
        ] {
            assert!(!is_secret_arn(bad), "{bad}");
        }
        assert_eq!(
            region_of("arn:aws:secretsmanager:eu-west-1:123456789012:secret:k"),
            Some("eu-west-1")
        );
    }

    #[test]
    fn the_key_is_the_value_or_its_api_key_field() {
        assert_eq!(api_key_from_secret_value(" sk-1\n").unwrap(), "sk-1");
        assert_eq!(
            api_key_from_secret_value(r#"{"api_key": "sk-2", "note": "x"}"#).unwrap(),
            "sk-2"
        );
        for (value, reason) in [
            ("", "empty"),
            (r#"{"key": "sk"}"#, "without a string \"api_key\""),
            (r#"{"api_key": 1}"#, "without a string \"api_key\""),
            ("{not json", "not an object"),
            ("sk\n-1", "control characters"),
        ] {
            let err = api_key_from_secret_value(value).unwrap_err();
            assert!(err.contains(reason), "{value:?}: {err}");
        }
    }

    #[test]
    fn errors_never_show_the_value() {
        let err = api_key_from_secret_value(r#"{"token": "sk-secret"}"#).unwrap_err();
        assert!(!err.contains("sk-secret"), "{err}");
    }
}
