//! TLS from the URL's `sslmode`: the roots or configuration given, the rustls
//! configuration of a connection, the system's roots (from `rustls-native-certs`, as
//! for Redis), and the verifier that checks no certificate (libpq's `prefer`).

use super::{BACKEND, PostgresStore};
use crate::error::Error;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::sync::Arc;
use tokio_postgres::config::SslMode;

/// The TLS settings given to the store.
#[derive(Clone)]
pub(super) enum Tls {
    /// System roots plus these, verified for `require`; unverified for `prefer`.
    Roots(Vec<CertificateDer<'static>>),
    /// A configuration you built, used for `prefer` and `require`.
    Config(Arc<rustls::ClientConfig>),
}

/// Given roots or a TLS configuration, `sslmode=prefer` (the default) becomes `require`:
/// a server, or a man in the middle, that declines TLS must not get a plaintext session.
/// `disable` stays as asked.
pub(super) fn require_tls(config: &mut tokio_postgres::Config) {
    if config.get_ssl_mode() == SslMode::Prefer {
        config.ssl_mode(SslMode::Require);
    }
}

impl PostgresStore {
    /// The rustls configuration of a new connection (not for `sslmode=disable`).
    pub(super) fn tls_config(&self) -> Result<rustls::ClientConfig, Error> {
        let roots = match &self.inner.tls {
            Tls::Config(config) => return Ok((**config).clone()),
            Tls::Roots(roots) => roots,
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::store(BACKEND, false, e))?;
        let verify = self.inner.config.get_ssl_mode() == SslMode::Require || !roots.is_empty();
        if !verify {
            // libpq's `prefer`: encrypted, the certificate not checked.
            return Ok(builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
                .with_no_client_auth());
        }
        let mut store = rustls::RootCertStore::empty();
        store.add_parsable_certificates(system_roots());
        store.add_parsable_certificates(roots.iter().cloned());
        if store.is_empty() {
            return Err(Error::store(
                BACKEND,
                false,
                "sslmode=require but no root certificate was found: set SSL_CERT_FILE (or SSL_CERT_DIR) or use root_certificates_pem",
            ));
        }
        Ok(builder.with_root_certificates(store).with_no_client_auth())
    }
}

/// Root certificates of the system, found as the Redis store's TLS finds them (both
/// through `rustls-native-certs`): `SSL_CERT_FILE` or `SSL_CERT_DIR` if set, else the
/// platform's store. Unreadable entries are skipped; none at all fails the connection
/// with a message that says what to set.
fn system_roots() -> Vec<CertificateDer<'static>> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::debug!(%error, "skipped a system root certificate source");
    }
    found.certs
}

/// `sslmode=prefer` without roots: encrypted, the certificate unchecked (libpq's
/// behaviour); handshake signatures are still checked.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_roots_prefer_becomes_require() {
        let store = PostgresStore::from_url("postgres://u@h/db", "t").unwrap();
        assert_eq!(store.inner.config.get_ssl_mode(), SslMode::Prefer);
        // Roots given: tests/postgres/connection.rs, against a server that declines TLS.
        let store = PostgresStore::from_url("postgres://u@h/db?sslmode=disable", "t").unwrap();
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let disabled = store.tls(tls.clone());
        assert_eq!(
            disabled.inner.config.get_ssl_mode(),
            SslMode::Disable,
            "disable stays as asked"
        );
        let preferred = PostgresStore::from_url("postgres://u@h/db", "t")
            .unwrap()
            .tls(tls);
        assert_eq!(preferred.inner.config.get_ssl_mode(), SslMode::Require);
    }
}
