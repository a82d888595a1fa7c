//! Whose key it is. The draft's security section asks that keys be scoped by caller: two
//! clients that happen to send the same key must never see each other's responses. The
//! scope is hashed into the stored id with the key, never stored as it is.

use crate::key::sha256_hex;
use http::request::Parts;
use std::fmt;
use std::sync::Arc;

/// Where the layer finds who is calling. The scope and the key together name the record,
/// so a request's response is replayed only to a caller with the same scope.
///
/// A request for which the scope finds no caller is refused with `401` (problem type
/// `caller-unidentified`): it is never run unscoped by accident. To share keys between
/// all callers (a service with one trusted client), say so with
/// [`unscoped`](Self::unscoped).
#[derive(Clone)]
pub struct CallerScope(Source);

type ScopeFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

#[derive(Clone)]
enum Source {
    Fn(Arc<ScopeFn>),
    Unscoped,
    #[cfg(feature = "lambda-http")]
    Authorizer,
    #[cfg(feature = "lambda-http")]
    AuthorizerContext(String),
    AuthorizationHeader,
    FirstOf(Vec<CallerScope>),
}

/// What a scope found for one request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    Caller(String),
    Everyone,
    Nobody,
}

impl CallerScope {
    /// The caller as `f` finds it in the request (a verified JWT's subject, a mTLS
    /// certificate's subject, a tenant id a middleware put in the extensions). `None`, or
    /// an empty string, means "no caller": the request is refused with `401`.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        CallerScope(Source::Fn(Arc::new(f)))
    }

    /// Every caller shares one key space. Only for a service whose callers are one party.
    pub fn unscoped() -> Self {
        CallerScope(Source::Unscoped)
    }

    /// The principal API Gateway's authorizer found, from lambda_http's request context,
    /// the first of: a JWT authorizer's `iss` and `sub` claims; a REST API Lambda
    /// authorizer's `principalId` (it must be the caller's own: AWS's sample authorizers
    /// return the constant `user`, which would make every caller one); a Cognito user pool
    /// authorizer's `sub` claim (REST APIs); the IAM caller's ARN (IAM authorization,
    /// Function URLs with `AWS_IAM`; an assumed role's ARN names its session, so a retry
    /// from a new session is another caller); the Cognito identity; the API key's id.
    /// Nothing for ALB events, without an authorizer, or for an HTTP API Lambda authorizer
    /// (payload 2.0 has no principal: use
    /// [`lambda_authorizer_context`](Self::lambda_authorizer_context)).
    ///
    /// The default scope when the `lambda-http` feature is on.
    #[cfg(feature = "lambda-http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "lambda-http")))]
    pub fn lambda_authorizer() -> Self {
        CallerScope(Source::Authorizer)
    }

    /// The value a Lambda authorizer put in its context under `key` (an HTTP API's
    /// `requestContext.authorizer.lambda.<key>`, a REST API's
    /// `requestContext.authorizer.<key>`), a string or a number.
    #[cfg(feature = "lambda-http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "lambda-http")))]
    pub fn lambda_authorizer_context(key: impl Into<String>) -> Self {
        CallerScope(Source::AuthorizerContext(key.into()))
    }

    /// The `Authorization` header's value (its SHA-256 is what the record's id holds):
    /// whoever holds the same credential is the same caller. A credential that rotates
    /// between a request and its retry (a refreshed OAuth token) makes the retry another
    /// caller, which runs again: prefer a stable identity where there is one.
    pub fn authorization_header() -> Self {
        CallerScope(Source::AuthorizationHeader)
    }

    /// This scope, or `other` for a request in which this one finds no caller.
    pub fn or(self, other: CallerScope) -> Self {
        let mut list = match self.0 {
            Source::FirstOf(list) => list,
            _ => vec![self],
        };
        list.push(other);
        CallerScope(Source::FirstOf(list))
    }

    pub(crate) fn resolve(&self, parts: &Parts) -> Resolved {
        let found = match &self.0 {
            Source::Unscoped => return Resolved::Everyone,
            Source::FirstOf(list) => {
                for scope in list {
                    match scope.resolve(parts) {
                        Resolved::Nobody => continue,
                        found => return found,
                    }
                }
                return Resolved::Nobody;
            }
            Source::Fn(f) => f(parts)
                .filter(|caller| !caller.is_empty())
                .map(|caller| format!("fn:{caller}")),
            #[cfg(feature = "lambda-http")]
            Source::Authorizer => authorizer::principal(parts),
            #[cfg(feature = "lambda-http")]
            Source::AuthorizerContext(key) => authorizer::context_value(parts, key),
            // The raw bytes, hashed: two credentials that differ in any byte are two callers.
            Source::AuthorizationHeader => parts
                .headers
                .get(http::header::AUTHORIZATION)
                .filter(|v| !v.is_empty())
                .map(|v| format!("authorization:{}", sha256_hex(v.as_bytes()))),
        };
        match found {
            Some(caller) => Resolved::Caller(caller),
            None => Resolved::Nobody,
        }
    }
}

impl fmt::Debug for CallerScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Fn(_) => f.write_str("CallerScope::from_fn(..)"),
            Source::Unscoped => f.write_str("CallerScope::unscoped()"),
            #[cfg(feature = "lambda-http")]
            Source::Authorizer => f.write_str("CallerScope::lambda_authorizer()"),
            #[cfg(feature = "lambda-http")]
            Source::AuthorizerContext(key) => {
                write!(f, "CallerScope::lambda_authorizer_context({key:?})")
            }
            Source::AuthorizationHeader => f.write_str("CallerScope::authorization_header()"),
            Source::FirstOf(list) => f.debug_list().entries(list).finish(),
        }
    }
}

#[cfg(feature = "lambda-http")]
mod authorizer {
    use http::request::Parts;
    use lambda_http::aws_lambda_events::apigw::ApiGatewayRequestAuthorizer;
    use lambda_http::request::RequestContext;
    use serde_json::Value;

    /// The caller API Gateway's authorizer found, with its kind as a prefix so that two
    /// kinds of identity never meet.
    pub(super) fn principal(parts: &Parts) -> Option<String> {
        match parts.extensions.get::<RequestContext>()? {
            RequestContext::ApiGatewayV1(context) => {
                let identity = &context.identity;
                from_authorizer(&context.authorizer)
                    .or_else(|| prefixed("iam", identity.user_arn.as_deref()))
                    .or_else(|| prefixed("cognito", identity.cognito_identity_id.as_deref()))
                    .or_else(|| prefixed("api-key", identity.api_key_id.as_deref()))
            }
            RequestContext::ApiGatewayV2(context) => {
                context.authorizer.as_ref().and_then(from_authorizer)
            }
            _ => None,
        }
    }

    /// A Lambda authorizer's context value under `key`, in either payload version.
    pub(super) fn context_value(parts: &Parts, key: &str) -> Option<String> {
        let authorizer = match parts.extensions.get::<RequestContext>()? {
            RequestContext::ApiGatewayV1(context) => &context.authorizer,
            RequestContext::ApiGatewayV2(context) => context.authorizer.as_ref()?,
            _ => return None,
        };
        let value = match authorizer.fields.get(key)? {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => return None,
        };
        prefixed(&format!("context.{key}"), Some(&value))
    }

    /// A JWT's issuer and subject, as JSON: no two pairs give one string.
    fn jwt(iss: Option<&str>, sub: Option<&str>) -> Option<String> {
        let sub = sub.filter(|s| !s.is_empty())?;
        let pair = serde_json::to_string(&(iss.unwrap_or(""), sub)).ok()?;
        prefixed("jwt", Some(&pair))
    }

    fn from_authorizer(authorizer: &ApiGatewayRequestAuthorizer) -> Option<String> {
        let fields = &authorizer.fields;
        let from_jwt = authorizer.jwt.as_ref().and_then(|token| {
            let claim = |name: &str| token.claims.get(name).map(String::as_str);
            jwt(claim("iss"), claim("sub"))
        });
        from_jwt
            .or_else(|| {
                prefixed(
                    "principal",
                    fields.get("principalId").and_then(Value::as_str),
                )
            })
            .or_else(|| {
                let claims = fields.get("claims")?;
                let claim = |name: &str| claims.get(name).and_then(Value::as_str);
                jwt(claim("iss"), claim("sub"))
            })
            .or_else(|| {
                let iam = authorizer.iam.as_ref()?;
                prefixed("iam", iam.user_arn.as_deref())
            })
    }

    fn prefixed(kind: &str, id: Option<&str>) -> Option<String> {
        id.filter(|id| !id.is_empty())
            .map(|id| format!("{kind}:{id}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(authorization: Option<&str>) -> Parts {
        let mut request = http::Request::builder();
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn each_scope_finds_its_caller_or_nobody() {
        let header = CallerScope::authorization_header();
        let Resolved::Caller(caller) = header.resolve(&parts(Some("Bearer a"))) else {
            panic!("a caller")
        };
        assert!(!caller.contains("Bearer"), "the credential is hashed");
        assert_eq!(header.resolve(&parts(None)), Resolved::Nobody);
        assert_eq!(header.resolve(&parts(Some(""))), Resolved::Nobody);
        assert_eq!(
            CallerScope::unscoped().resolve(&parts(None)),
            Resolved::Everyone
        );
        let tenant = CallerScope::from_fn(|p| {
            p.headers
                .get("x-tenant")
                .map(|v| v.to_str().unwrap().to_owned())
        });
        assert_eq!(tenant.resolve(&parts(None)), Resolved::Nobody);
        let empty = CallerScope::from_fn(|_| Some(String::new()));
        assert_eq!(empty.resolve(&parts(None)), Resolved::Nobody);
        let colon = CallerScope::from_fn(|_| Some("tenant:".into()));
        assert_eq!(
            colon.resolve(&parts(None)),
            Resolved::Caller("fn:tenant:".into()),
            "only an empty id is no caller"
        );
    }

    #[test]
    fn a_scope_shows_what_it_reads_and_never_a_credential() {
        let scope = CallerScope::from_fn(|_| None)
            .or(CallerScope::authorization_header())
            .or(CallerScope::unscoped());
        assert_eq!(
            format!("{scope:?}"),
            "[CallerScope::from_fn(..), CallerScope::authorization_header(), CallerScope::unscoped()]"
        );
    }

    #[test]
    fn or_takes_the_first_scope_that_finds_a_caller() {
        let scope = CallerScope::from_fn(|_| None)
            .or(CallerScope::authorization_header())
            .or(CallerScope::unscoped());
        assert!(matches!(
            scope.resolve(&parts(Some("t"))),
            Resolved::Caller(c) if c.starts_with("authorization:")
        ));
        assert_eq!(scope.resolve(&parts(None)), Resolved::Everyone);
        let named = CallerScope::from_fn(|_| Some("a".into()));
        assert_eq!(
            named.resolve(&parts(None)),
            Resolved::Caller("fn:a".into()),
            "a function's caller and a header's never meet"
        );
    }
}
