//! The worker's metrics: the library's counters (`lambda_idempotency::metrics`) written as
//! CloudWatch embedded metric format (EMF) lines on stdout, which Lambda sends to CloudWatch
//! Logs and CloudWatch turns into metrics, with no API call and no agent.
//!
//! The lines are written after each invocation: one JSON line per label set counted since
//! the last flush (an outcome of an operation, a failure kind, a store operation), not one
//! per record. Under Lambda's concurrent mode (`AWS_LAMBDA_MAX_CONCURRENCY` > 1, Lambda
//! Managed Instances) several invocations share the process and its one collector: a flush
//! writes what every invocation counted since the previous flush, so a line is the
//! process's, not one invocation's. No count is lost or written twice (each flush takes
//! the counters' values and resets them): sums and rates over time are exact, per-line
//! values are not per-invocation values.
//!
//! Latencies (`idempotency_store_request_seconds`) are sampled: the collector keeps at most
//! 100 values per label set between two flushes and drops the rest (logging an error for
//! each), so a flush after more than 100 store requests of one operation (a large batch,
//! several concurrent invocations) reports 100 of them. The request counts stay exact.

use metrics_cloudwatch_embedded::{Builder, Collector};

/// The CloudWatch namespace when `METRICS_NAMESPACE` is unset.
pub const DEFAULT_NAMESPACE: &str = "lambda-idempotency";

/// Installs the process's collector as the global `metrics` recorder, with the library's
/// descriptions. Once per process, at start-up.
pub fn install(namespace: &str) -> Result<&'static Collector, String> {
    check_namespace(namespace)?;
    let collector = Builder::new()
        .cloudwatch_namespace(namespace.to_owned())
        .init()
        .map_err(|e| format!("cannot install the metrics collector: {e}"))?;
    lambda_idempotency::metrics::describe();
    Ok(collector)
}

/// Refuses a namespace CloudWatch would refuse or that is reserved, naming
/// `METRICS_NAMESPACE`: CloudWatch's namespaces are 1 to 255 characters of alphanumerics,
/// period, hyphen, underscore, forward slash, hash, colon and space (no control
/// characters), do not start with `:`, and `AWS/` starts the namespaces of AWS's own
/// services. An EMF line with another namespace is dropped by CloudWatch, silently.
pub fn check_namespace(namespace: &str) -> Result<(), String> {
    let refused = |why: String| {
        Err(format!(
            "METRICS_NAMESPACE={namespace:?} is no CloudWatch namespace: {why}"
        ))
    };
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | '#' | ':' | ' ');
    if namespace.trim().is_empty() {
        return refused("it is empty (1 to 255 characters)".into());
    }
    if namespace.len() > 255 {
        return refused(format!(
            "it is {} bytes long; at most 255 characters",
            namespace.len()
        ));
    }
    if namespace.starts_with(':') {
        return refused("it starts with ':'".into());
    }
    if namespace.starts_with("AWS/") {
        return refused(
            "namespaces starting with \"AWS/\" are reserved for AWS's own services".into(),
        );
    }
    if let Some(c) = namespace.chars().find(|&c| !allowed(c)) {
        return refused(format!(
            "it holds {c:?}; a namespace holds only letters, digits, space and . - _ / # :"
        ));
    }
    Ok(())
}

/// Writes what was counted since the last flush to `out`, as EMF lines.
pub fn flush(collector: &Collector, out: impl std::io::Write) {
    if let Err(e) = collector.flush(out) {
        tracing::warn!(error = %e, "could not write the metrics");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_namespace_cloudwatch_refuses_fails_at_start_up() {
        for bad in [
            "",
            "  ",
            ":ns",
            &"n".repeat(256),
            "AWS/Lambda",
            "AWS/",
            "my\tapp",
            "my\napp",
            "app\u{7f}",
            "caf\u{e9}",
            "app*",
            "app\\x",
            "app@prod",
        ] {
            let Err(e) = super::install(bad) else {
                panic!("{bad:?} accepted")
            };
            assert!(e.contains("METRICS_NAMESPACE"), "{e}");
            assert!(super::check_namespace(bad).is_err(), "{bad:?}");
        }
        for good in [
            "lambda-idempotency",
            "My App/Workers:prod#1.v2_x",
            "aws/lowercase-is-not-reserved",
            "AWSX",
            &"n".repeat(255),
        ] {
            super::check_namespace(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }
}
