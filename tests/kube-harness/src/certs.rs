//! Credentials of a throw-away control plane: a CA, the API server's serving certificate,
//! the service-account signing key and an admin bearer token.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Why the credentials could not be generated.
#[derive(Debug, thiserror::Error)]
#[error("cannot generate test credentials: {0}")]
pub struct CertError(#[from] rcgen::Error);

/// PEM-encoded credentials, written to files for kube-apiserver.
#[derive(Clone)]
pub struct Credentials {
    /// The CA certificate clients trust.
    pub ca_pem: String,
    /// Serving certificate for 127.0.0.1 and localhost, signed by the CA.
    pub serving_cert_pem: String,
    /// Its private key (PKCS#8).
    pub serving_key_pem: String,
    /// Service-account token signing key (PKCS#8, ECDSA P-256).
    pub service_account_key_pem: String,
    /// Its public key.
    pub service_account_public_pem: String,
    /// Bearer token of a `system:masters` user.
    pub admin_token: String,
    /// The CA's private key, kept to sign the client certificates of a real node's
    /// components (kubelet, the API server's kubelet client).
    ca_key_pem: String,
    /// The CA's parameters, to make it an issuer again.
    ca_params: CertificateParams,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

impl Credentials {
    /// Generates fresh credentials.
    pub fn generate() -> Result<Self, CertError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "cro kube-harness CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params.clone(), ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        serving_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let serving_cert = serving_params.signed_by(&serving_key, &issuer)?;

        let sa_key = KeyPair::generate()?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            serving_cert_pem: serving_cert.pem(),
            serving_key_pem: serving_key.serialize_pem(),
            service_account_public_pem: sa_key.public_key_pem(),
            service_account_key_pem: sa_key.serialize_pem(),
            admin_token: format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            ),
            ca_key_pem: issuer.key().serialize_pem(),
            ca_params,
        })
    }

    /// A client certificate signed by the CA for user `common_name` in `groups` (the API
    /// server maps CN to the user and O to groups): (certificate PEM, key PEM).
    pub fn client_cert(
        &self,
        common_name: &str,
        groups: &[&str],
    ) -> Result<(String, String), CertError> {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem)?;
        let issuer = Issuer::new(self.ca_params.clone(), ca_key);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        // One O is what the components here need; rcgen keeps one value per type.
        if let Some(group) = groups.first() {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The CA's private key (PEM), for the controller-manager's certificate signer.
    pub fn ca_key_pem(&self) -> &str {
        &self.ca_key_pem
    }

    /// The `--token-auth-file` line: token, user, uid, groups.
    pub fn token_file(&self) -> String {
        format!(
            "{},cro-admin,cro-admin,\"system:masters\"\n",
            self.admin_token
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_fresh_and_pem_encoded() {
        let a = Credentials::generate().unwrap();
        let b = Credentials::generate().unwrap();
        assert!(a.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            a.serving_cert_pem
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert!(a.serving_key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(
            a.service_account_public_pem
                .starts_with("-----BEGIN PUBLIC KEY-----")
        );
        assert_ne!(a.admin_token, b.admin_token);
        assert_eq!(a.admin_token.len(), 64);
        assert_ne!(a.ca_pem, b.ca_pem);
        assert!(a.token_file().contains("system:masters"));
        assert!(!format!("{a:?}").contains(&a.admin_token));
    }

    #[test]
    fn the_serving_certificate_verifies_against_the_ca_for_loopback() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
        let creds = Credentials::generate().unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(creds.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .unwrap();
        let leaf = CertificateDer::from_pem_slice(creds.serving_cert_pem.as_bytes()).unwrap();
        for name in ["127.0.0.1", "localhost"] {
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &ServerName::try_from(name).unwrap(),
                    &[],
                    UnixTime::now(),
                )
                .unwrap();
        }
        assert!(
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &ServerName::try_from("example.com").unwrap(),
                    &[],
                    UnixTime::now()
                )
                .is_err()
        );
    }
}
