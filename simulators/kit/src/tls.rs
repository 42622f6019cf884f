//! A throw-away CA and a server certificate for 127.0.0.1 / localhost, for a simulator
//! that serves HTTPS.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS configuration failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// What a simulator serving HTTPS needs, and what its clients must trust.
pub struct TlsMaterial {
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    pub server_config: Arc<rustls::ServerConfig>,
}

/// The crypto provider of every simulator TLS configuration.
pub fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A new CA (`<name> test CA`) and a server certificate it signs (`<name>`).
pub fn generate(name: &str) -> Result<TlsMaterial, TlsError> {
    // Wide validity: tests move the simulator's clock, and a verifier on a moved clock
    // must still accept the certificate.
    let not_before = date_time_ymd(2000, 1, 1);
    let not_after = date_time_ymd(2099, 12, 31);

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("{name} test CA"));
    ca_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
    ];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut server_config = rustls::ServerConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone(), ca_cert.der().clone()], key_der)?;
    // The server speaks HTTP/1.1 only; say so rather than let a client pick h2.
    server_config.alpn_protocols = vec![b"http/1.1".to_vec()];

    Ok(TlsMaterial {
        ca_pem: ca_cert.pem(),
        ca_der: ca_cert.der().clone(),
        server_config: Arc::new(server_config),
    })
}

/// A rustls client configuration (ring provider) that trusts only `ca`.
pub fn client_config(ca: &CertificateDer<'static>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone())?;
    Ok(rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
