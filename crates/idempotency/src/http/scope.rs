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
    /// Only a value many callers share (an identity pool's role session, an API key):
    /// refused, with why, rather than shared.
    Shared(&'static str),
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

    /// The caller API Gateway identified, from lambda_http's request context: a value no
    /// two callers share. The first of:
    ///
    /// 1. a JWT authorizer's `iss` and `sub` claims (a token without `sub`, as some
    ///    machine-to-machine tokens are: its `iss` and `client_id`);
    /// 2. a REST API Lambda authorizer's `principalId` (it must be the caller's own: AWS's
    ///    sample authorizers return the constant `user`, which would make every caller one);
    /// 3. a Cognito user pool authorizer's `sub` claim (REST APIs);
    /// 4. a Cognito identity pool's identity (`cognitoIdentityPoolId` and
    ///    `cognitoIdentityId` in a REST API's `identity`; `cognitoIdentity` in an HTTP API's
    ///    or Function URL's IAM authorizer): every user of a pool signs as the same
    ///    assumed-role session, so the identity, not the ARN, is the caller;
    /// 5. the IAM caller's ARN (IAM authorization, Function URLs with `AWS_IAM`; an assumed
    ///    role's ARN names its session, so a retry from a new session is another caller);
    /// 6. an HTTP API's mutual TLS client certificate (its issuer and serial number).
    ///
    /// A request that carries only a value many callers share is refused with `401`
    /// (`caller-unidentified`, with the reason) rather than scoped by it: an identity pool's
    /// role session (`…/CognitoIdentityCredentials`) without its identity, and an API key
    /// (one key may serve every client of a usage plan; scope by what the key's owner
    /// knows with [`from_fn`](Self::from_fn), or share deliberately with
    /// [`unscoped`](Self::unscoped)). Nothing is found for ALB events, without an
    /// authorizer, or for an HTTP API Lambda authorizer (payload 2.0 has no principal: use
    /// [`lambda_authorizer_context`](Self::lambda_authorizer_context)); a REST API's mTLS
    /// certificate is not in lambda_http's request context, so mTLS on a REST API needs
    /// [`from_fn`](Self::from_fn).
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
                let mut shared = None;
                for scope in list {
                    match scope.resolve(parts) {
                        Resolved::Nobody => continue,
                        Resolved::Shared(why) => shared = shared.or(Some(why)),
                        found => return found,
                    }
                }
                return shared.map_or(Resolved::Nobody, Resolved::Shared);
            }
            Source::Fn(f) => f(parts)
                .filter(|caller| !caller.is_empty())
                .map(|caller| format!("fn:{caller}")),
            #[cfg(feature = "lambda-http")]
            Source::Authorizer => match authorizer::principal(parts) {
                authorizer::Found::Caller(caller) => Some(caller),
                authorizer::Found::Shared(why) => return Resolved::Shared(why),
                authorizer::Found::Nothing => None,
            },
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

    /// What the request context says of the caller.
    pub(super) enum Found {
        Caller(String),
        /// Only a value many callers share.
        Shared(&'static str),
        Nothing,
    }

    const SHARED_ROLE_SESSION: &str = "the request is signed by a role session every web identity user shares (CognitoIdentityCredentials, web-identity) and carries no Cognito identity";
    const SHARED_API_KEY: &str =
        "an API key is the only identity in the request, and one key may serve many clients";

    /// The caller API Gateway identified, with its kind as a prefix so that two kinds of
    /// identity never meet.
    pub(super) fn principal(parts: &Parts) -> Found {
        let found = match parts.extensions.get::<RequestContext>() {
            Some(RequestContext::ApiGatewayV1(context)) => {
                let identity = &context.identity;
                from_authorizer(&context.authorizer)
                    .or_else(|| {
                        cognito(
                            identity.cognito_identity_pool_id.as_deref(),
                            identity.cognito_identity_id.as_deref(),
                        )
                    })
                    .or_else(|| iam(identity.user_arn.as_deref()))
                    .or_else(|| {
                        identity
                            .api_key_id
                            .as_deref()
                            .filter(|id| !id.is_empty())
                            .map(|_| Err(SHARED_API_KEY))
                    })
            }
            Some(RequestContext::ApiGatewayV2(context)) => context
                .authorizer
                .as_ref()
                .and_then(from_authorizer)
                .or_else(|| {
                    let cert = context.authentication.as_ref()?.client_cert.as_ref()?;
                    let serial = cert.serial_number.as_deref().filter(|s| !s.is_empty())?;
                    let pair = serde_json::to_string(&(cert.issuer_dn.as_deref(), serial)).ok()?;
                    prefixed("mtls", Some(&pair)).map(Ok)
                }),
            _ => None,
        };
        match found {
            Some(Ok(caller)) => Found::Caller(caller),
            Some(Err(why)) => Found::Shared(why),
            None => Found::Nothing,
        }
    }

    /// A Cognito identity pool's identity: the pool and the id, as JSON.
    fn cognito(pool: Option<&str>, id: Option<&str>) -> Option<Result<String, &'static str>> {
        let id = id.filter(|id| !id.is_empty())?;
        let pair = serde_json::to_string(&(pool.unwrap_or(""), id)).ok()?;
        prefixed("cognito", Some(&pair)).map(Ok)
    }

    /// An IAM caller's ARN, unless it is the session every identity pool user shares.
    fn iam(arn: Option<&str>) -> Option<Result<String, &'static str>> {
        let arn = arn.filter(|arn| !arn.is_empty())?;
        // The session names SDKs give every user of a web identity alike.
        if arn.contains(":assumed-role/")
            && (arn.ends_with("/CognitoIdentityCredentials") || arn.ends_with("/web-identity"))
        {
            return Some(Err(SHARED_ROLE_SESSION));
        }
        prefixed("iam", Some(arn)).map(Ok)
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

    fn from_authorizer(
        authorizer: &ApiGatewayRequestAuthorizer,
    ) -> Option<Result<String, &'static str>> {
        let fields = &authorizer.fields;
        let from_jwt = authorizer.jwt.as_ref().and_then(|token| {
            let claim = |name: &str| token.claims.get(name).map(String::as_str);
            jwt(claim("iss"), claim("sub")).or_else(|| jwt_client(claim("iss"), claim("client_id")))
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
                    .or_else(|| jwt_client(claim("iss"), claim("client_id")))
            })
            .map(Ok)
            .or_else(|| {
                let iam = authorizer.iam.as_ref()?;
                let identity = iam.cognito_identity.as_ref();
                cognito(
                    identity.and_then(|c| c.identity_pool_id.as_deref()),
                    identity.and_then(|c| c.identity_id.as_deref()),
                )
                .or_else(|| self::iam(iam.user_arn.as_deref()))
            })
    }

    /// A machine client's token without a subject: its issuer and client id.
    fn jwt_client(iss: Option<&str>, client_id: Option<&str>) -> Option<String> {
        let client_id = client_id.filter(|s| !s.is_empty())?;
        let pair = serde_json::to_string(&(iss.unwrap_or(""), client_id)).ok()?;
        prefixed("jwt-client", Some(&pair))
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
