//! A claim's owner: what lets every invocation of one durable execution re-enter the
//! claim its first invocation made, while any other caller finds it held.

use std::sync::Arc;
use std::time::Duration;

/// Who owns the claims a call makes, and for how long: set by an entry point whose work
/// spans invocations (a durable execution), read by the engine for the call made directly
/// under it. Calls nested in that call's function make claims of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The lease token every claim of this owner carries: a claim finding its own token on
    /// a record in progress re-enters it, on a completed one replays it.
    pub(crate) token: Arc<str>,
    /// The lease of each claim: the owner's whole life, not one invocation's.
    pub(crate) lease: Duration,
}

impl Owner {
    /// The owner named `name` (a durable execution's ARN): its token is a hash of the
    /// name, as long as a random token ([`LEASE_TOKEN_LEN`](crate::record::LEASE_TOKEN_LEN)),
    /// so the name (an account and a function) is not written into every record.
    #[cfg_attr(not(feature = "durable"), allow(dead_code))]
    pub(crate) fn named(name: &str, lease: Duration) -> Self {
        let mut token = crate::key::sha256_hex(name.as_bytes());
        token.truncate(crate::record::LEASE_TOKEN_LEN);
        Self {
            token: token.into(),
            lease,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_makes_the_same_token_of_a_random_tokens_length_and_another_name_another() {
        let lease = Duration::from_secs(60);
        let a = Owner::named(
            "arn:aws:lambda:us-east-1:1:function:f:$LATEST/durable-execution/x/1",
            lease,
        );
        assert_eq!(
            a,
            Owner::named(
                "arn:aws:lambda:us-east-1:1:function:f:$LATEST/durable-execution/x/1",
                lease
            )
        );
        assert_eq!(a.token.len(), crate::record::LEASE_TOKEN_LEN);
        assert!(
            a.token
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(
            a.token,
            Owner::named(
                "arn:aws:lambda:us-east-1:1:function:f:$LATEST/durable-execution/x/2",
                lease
            )
            .token
        );
        // sha256("") begins e3b0c442 98fc1c14 9afbf4c8 996fb924 27ae41e4.
        assert_eq!(
            &*Owner::named("", lease).token,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4"
        );
    }
}
