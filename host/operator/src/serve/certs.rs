//! Certificates the webhook manages itself (no cert-manager): a CA and a serving
//! certificate kept in a Secret, the CA bundle injected into the
//! ValidatingWebhookConfiguration, both renewed before they expire.
//!
//! Every replica runs [`run`]: each reads the Secret, renews what is due (writes carry
//! the resourceVersion read, so two replicas never both win; the loser reloads what the
//! winner wrote), keeps the webhook configuration's CA bundle in step and hands the
//! serving certificate to the TLS resolver, which uses it from the next handshake on.
//!
//! A CA is replaced in two steps so no client ever sees a certificate it does not trust:
//! halfway through its life a successor CA joins the bundle; once the bundle has been
//! out for a check period (and two thirds of the life are gone) the successor signs the
//! serving certificate and the old CA stays in the bundle until it expires. The decision
//! is the pure [`decide`]; docs/deploying.md describes the cycle.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::{CertPolicy, SelfManagedCerts};

const ANNOTATION_PREFIX: &str = "cro.hpsys.ibm.ie.com/";
const KEY_CA: &str = "ca.crt";
const KEY_CA_KEY: &str = "ca.key";
const KEY_NEXT_CA: &str = "ca-next.crt";
const KEY_NEXT_CA_KEY: &str = "ca-next.key";
const KEY_PREVIOUS_CA: &str = "ca-previous.crt";
const KEY_TLS: &str = "tls.crt";
const KEY_TLS_KEY: &str = "tls.key";
/// Certificates start a little in the past so a node whose clock is behind accepts them.
const BACKDATE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub(crate) enum CertError {
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("the Secret {0} holds no usable certificates: {1}")]
    Unusable(String, String),
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error("TLS: {0}")]
    Tls(String),
}

/// A certificate and key in PEM with its lifetime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Issued {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    pub(crate) issued: DateTime<Utc>,
    pub(crate) not_after: DateTime<Utc>,
}

impl Issued {
    fn fraction_gone(&self, now: DateTime<Utc>) -> f64 {
        let life = (self.not_after - self.issued).num_milliseconds().max(1) as f64;
        (now - self.issued).num_milliseconds() as f64 / life
    }
}

/// Everything in the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Material {
    /// The CA that signs the serving certificate; its name is its common name.
    pub(crate) ca: Issued,
    pub(crate) ca_name: String,
    /// A successor CA already in the bundle, not yet signing.
    pub(crate) next_ca: Option<(Issued, String)>,
    /// The CA before this one, kept in the bundle until it expires.
    pub(crate) previous_ca: Option<(String, DateTime<Utc>)>,
    pub(crate) serving: Issued,
    pub(crate) dns_names: Vec<String>,
}

/// What to renew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Keep,
    /// A new serving certificate from the current CA.
    Serving,
    /// Add a successor CA to the bundle.
    PrepareCa,
    /// The successor becomes the CA and signs a new serving certificate.
    PromoteCa,
    /// Start over: nothing usable (or the CA already expired).
    All,
}

/// The pure decision.
pub(crate) fn decide(
    existing: Option<&Material>,
    dns_names: &[String],
    now: DateTime<Utc>,
    policy: &CertPolicy,
) -> Renewal {
    let Some(m) = existing else {
        return Renewal::All;
    };
    if now >= m.ca.not_after {
        return Renewal::All;
    }
    let ca_gone = m.ca.fraction_gone(now);
    match &m.next_ca {
        Some((next, _)) => {
            let published = chrono::Duration::from_std(policy.check_period).unwrap_or_default();
            if ca_gone >= 2.0 / 3.0 && now - next.issued >= published {
                return Renewal::PromoteCa;
            }
        }
        None if ca_gone >= 0.5 => return Renewal::PrepareCa,
        None => {}
    }
    if m.serving.fraction_gone(now) >= 2.0 / 3.0
        || now >= m.serving.not_after
        || m.dns_names != dns_names
    {
        return Renewal::Serving;
    }
    Renewal::Keep
}

fn to_time(t: DateTime<Utc>) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp())
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn ca_params(
    name: &str,
    issued: DateTime<Utc>,
    not_after: DateTime<Utc>,
) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = to_time(issued - chrono::Duration::from_std(BACKDATE).unwrap_or_default());
    params.not_after = to_time(not_after);
    Ok(params)
}

fn new_ca(now: DateTime<Utc>, policy: &CertPolicy) -> Result<(Issued, String), CertError> {
    let key = KeyPair::generate()?;
    let not_after = now + chrono::Duration::from_std(policy.ca_validity).unwrap_or_default();
    // A distinct name per CA: while two are in the bundle, clients pick by issuer name.
    let name = format!("cro webhook CA {}", now.timestamp_millis());
    let cert = ca_params(&name, now, not_after)?.self_signed(&key)?;
    Ok((
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issued: now,
            not_after,
        },
        name,
    ))
}

fn new_serving(
    ca: &Issued,
    ca_name: &str,
    dns_names: &[String],
    now: DateTime<Utc>,
    policy: &CertPolicy,
) -> Result<Issued, CertError> {
    // The issuer is rebuilt from the stored key and the CA's name and dates: a signature
    // only needs the key and the issuer's distinguished name.
    let ca_key = KeyPair::from_pem(&ca.key_pem)?;
    let issuer = Issuer::new(ca_params(ca_name, ca.issued, ca.not_after)?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params.distinguished_name.push(
        DnType::CommonName,
        dns_names.first().map_or("cro-webhook", String::as_str),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = to_time(now - chrono::Duration::from_std(BACKDATE).unwrap_or_default());
    // Never beyond the CA.
    let not_after = (now + chrono::Duration::from_std(policy.serving_validity).unwrap_or_default())
        .min(ca.not_after);
    params.not_after = to_time(not_after);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        issued: now,
        not_after,
    })
}

/// Carries out `renewal` on `existing`.
pub(crate) fn renew(
    existing: Option<&Material>,
    renewal: Renewal,
    dns_names: &[String],
    now: DateTime<Utc>,
    policy: &CertPolicy,
) -> Result<Option<Material>, CertError> {
    let fresh = || -> Result<Material, CertError> {
        let (ca, ca_name) = new_ca(now, policy)?;
        let serving = new_serving(&ca, &ca_name, dns_names, now, policy)?;
        Ok(Material {
            ca,
            ca_name,
            next_ca: None,
            previous_ca: None,
            serving,
            dns_names: dns_names.to_vec(),
        })
    };
    let Some(m) = existing else {
        return fresh().map(Some);
    };
    let mut m = m.clone();
    match renewal {
        Renewal::Keep => return Ok(None),
        Renewal::All => return fresh().map(Some),
        Renewal::Serving => {
            m.serving = new_serving(&m.ca, &m.ca_name, dns_names, now, policy)?;
        }
        Renewal::PrepareCa => m.next_ca = Some(new_ca(now, policy)?),
        Renewal::PromoteCa => {
            let Some((next, next_name)) = m.next_ca.take() else {
                return Ok(None);
            };
            m.previous_ca = Some((m.ca.cert_pem.clone(), m.ca.not_after));
            m.ca = next;
            m.ca_name = next_name;
            m.serving = new_serving(&m.ca, &m.ca_name, dns_names, now, policy)?;
        }
    }
    m.dns_names = dns_names.to_vec();
    Ok(Some(m))
}

impl Material {
    /// The CAs clients must trust now: current, successor, and predecessor while valid.
    pub(crate) fn bundle(&self, now: DateTime<Utc>) -> String {
        let mut pem = self.ca.cert_pem.clone();
        if let Some((next, _)) = &self.next_ca {
            pem.push_str(&next.cert_pem);
        }
        if let Some((previous, not_after)) = &self.previous_ca
            && now < *not_after
        {
            pem.push_str(previous);
        }
        pem
    }

    fn to_secret(&self, namespace: &str, name: &str, resource_version: Option<String>) -> Secret {
        let mut data = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            data.insert(k.to_owned(), ByteString(v.as_bytes().to_vec()));
        };
        put(KEY_CA, &self.ca.cert_pem);
        put(KEY_CA_KEY, &self.ca.key_pem);
        put(KEY_TLS, &self.serving.cert_pem);
        put(KEY_TLS_KEY, &self.serving.key_pem);
        if let Some((next, _)) = &self.next_ca {
            put(KEY_NEXT_CA, &next.cert_pem);
            put(KEY_NEXT_CA_KEY, &next.key_pem);
        }
        if let Some((previous, _)) = &self.previous_ca {
            put(KEY_PREVIOUS_CA, previous);
        }
        let mut notes = BTreeMap::new();
        let mut note = |k: &str, v: String| {
            notes.insert(format!("{ANNOTATION_PREFIX}{k}"), v);
        };
        let ts = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        note("ca-name", self.ca_name.clone());
        note("ca-issued", ts(self.ca.issued));
        note("ca-not-after", ts(self.ca.not_after));
        note("tls-issued", ts(self.serving.issued));
        note("tls-not-after", ts(self.serving.not_after));
        note("dns-names", self.dns_names.join(","));
        if let Some((next, next_name)) = &self.next_ca {
            note("ca-next-name", next_name.clone());
            note("ca-next-issued", ts(next.issued));
            note("ca-next-not-after", ts(next.not_after));
        }
        if let Some((_, not_after)) = &self.previous_ca {
            note("ca-previous-not-after", ts(*not_after));
        }
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                annotations: Some(notes),
                resource_version,
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(data),
            ..Secret::default()
        }
    }

    fn from_secret(secret: &Secret) -> Result<Self, String> {
        let data = secret.data.clone().unwrap_or_default();
        let notes = secret.metadata.annotations.clone().unwrap_or_default();
        let text = |k: &str| -> Result<String, String> {
            data.get(k)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .ok_or_else(|| format!("no {k}"))
        };
        let note = |k: &str| -> Result<String, String> {
            notes
                .get(&format!("{ANNOTATION_PREFIX}{k}"))
                .cloned()
                .ok_or_else(|| format!("no annotation {k}"))
        };
        let time = |k: &str| -> Result<DateTime<Utc>, String> {
            DateTime::parse_from_rfc3339(&note(k)?)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| format!("{k}: {e}"))
        };
        let next_ca = match (text(KEY_NEXT_CA), text(KEY_NEXT_CA_KEY)) {
            (Ok(cert_pem), Ok(key_pem)) => Some((
                Issued {
                    cert_pem,
                    key_pem,
                    issued: time("ca-next-issued")?,
                    not_after: time("ca-next-not-after")?,
                },
                note("ca-next-name")?,
            )),
            _ => None,
        };
        let previous_ca = match text(KEY_PREVIOUS_CA) {
            Ok(pem) => Some((pem, time("ca-previous-not-after")?)),
            Err(_) => None,
        };
        Ok(Self {
            ca: Issued {
                cert_pem: text(KEY_CA)?,
                key_pem: text(KEY_CA_KEY)?,
                issued: time("ca-issued")?,
                not_after: time("ca-not-after")?,
            },
            ca_name: note("ca-name")?,
            next_ca,
            previous_ca,
            serving: Issued {
                cert_pem: text(KEY_TLS)?,
                key_pem: text(KEY_TLS_KEY)?,
                issued: time("tls-issued")?,
                not_after: time("tls-not-after")?,
            },
            dns_names: note("dns-names")?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// The serving certificate TLS handshakes use; replaced while the server runs.
#[derive(Debug, Default)]
pub(crate) struct ReloadingCert {
    current: RwLock<Option<(Vec<u8>, Arc<CertifiedKey>)>>,
}

impl ReloadingCert {
    /// Uses this certificate chain and key from the next handshake on; returns whether it
    /// differs from the one in use.
    pub(crate) fn set_pem(&self, cert_chain: &[u8], key: &[u8]) -> Result<bool, CertError> {
        let mut fingerprint = cert_chain.to_vec();
        fingerprint.extend_from_slice(key);
        if self
            .current
            .read()
            .map(|c| c.as_ref().is_some_and(|(f, _)| *f == fingerprint))
            .unwrap_or(false)
        {
            return Ok(false);
        }
        let bad = |what: &str, e: &dyn std::fmt::Display| CertError::Tls(format!("{what}: {e}"));
        let certs = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("certificate", &e))?;
        if certs.is_empty() {
            return Err(CertError::Tls("no certificate in the PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("private key", &e))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| bad("private key", &e))?;
        let certified = Arc::new(CertifiedKey::new(certs, signing));
        certified
            .keys_match()
            .map_err(|e| bad("certificate and key", &e))?;
        if let Ok(mut current) = self.current.write() {
            *current = Some((fingerprint, certified));
        }
        Ok(true)
    }

    #[cfg(test)]
    pub(crate) fn is_loaded(&self) -> bool {
        self.current.read().map(|c| c.is_some()).unwrap_or(false)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .ok()
            .and_then(|c| c.as_ref().map(|(_, k)| k.clone()))
    }
}

/// Reads the Secret, renews what is due and writes it back; returns the material in
/// force afterwards. Lost races re-read what the other replica wrote.
pub(crate) async fn ensure_secret(
    client: &kube::Client,
    cfg: &SelfManagedCerts,
) -> Result<Material, CertError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let secret_ref = || format!("{}/{}", cfg.namespace, cfg.secret_name);
    for _ in 0..5 {
        let current = api.get_opt(&cfg.secret_name).await?;
        let material = match &current {
            Some(s) => match Material::from_secret(s) {
                Ok(m) => Some(m),
                Err(why) => {
                    tracing::warn!(secret = %secret_ref(), %why, "webhook certificate Secret unusable; issuing new certificates");
                    None
                }
            },
            None => None,
        };
        let now = Utc::now();
        let renewal = decide(material.as_ref(), &cfg.dns_names, now, &cfg.policy);
        let Some(renewed) = renew(material.as_ref(), renewal, &cfg.dns_names, now, &cfg.policy)?
        else {
            return material
                .ok_or_else(|| CertError::Unusable(secret_ref(), "nothing issued".into()));
        };
        let written = match &current {
            None => {
                api.create(
                    &PostParams::default(),
                    &renewed.to_secret(&cfg.namespace, &cfg.secret_name, None),
                )
                .await
            }
            Some(s) => {
                api.replace(
                    &cfg.secret_name,
                    &PostParams::default(),
                    &renewed.to_secret(
                        &cfg.namespace,
                        &cfg.secret_name,
                        s.metadata.resource_version.clone(),
                    ),
                )
                .await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = %secret_ref(), ?renewal, not_after = %renewed.serving.not_after, "webhook certificates renewed");
                return Ok(renewed);
            }
            // Another replica wrote first: use what it wrote.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CertError::Unusable(
        secret_ref(),
        "kept losing write races".into(),
    ))
}

/// Puts `bundle` into every webhook of the configuration; a missing configuration is
/// not an error (it may be installed after the operator).
pub(crate) async fn inject_ca(
    client: &kube::Client,
    name: &str,
    bundle: &str,
) -> Result<bool, CertError> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for _ in 0..5 {
        let Some(mut vwc) = api.get_opt(name).await? else {
            tracing::warn!(
                configuration = name,
                "ValidatingWebhookConfiguration not found; CA not injected yet"
            );
            return Ok(false);
        };
        let mut changed = false;
        for hook in vwc.webhooks.iter_mut().flatten() {
            if hook
                .client_config
                .ca_bundle
                .as_ref()
                .map(|b| b.0.as_slice())
                != Some(bundle.as_bytes())
            {
                hook.client_config.ca_bundle = Some(ByteString(bundle.as_bytes().to_vec()));
                changed = true;
            }
        }
        if !changed {
            return Ok(false);
        }
        match api.replace(name, &PostParams::default(), &vwc).await {
            Ok(_) => {
                tracing::info!(configuration = name, "CA bundle injected");
                return Ok(true);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(false)
}

/// One round: renew if due, inject the bundle, load the serving certificate.
pub(crate) async fn reconcile_once(
    client: &kube::Client,
    cfg: &SelfManagedCerts,
    resolver: &ReloadingCert,
) -> Result<(), CertError> {
    let material = ensure_secret(client, cfg).await?;
    // The bundle goes out before the certificate is used, so the API server already
    // trusts whatever this replica serves next.
    inject_ca(
        client,
        &cfg.webhook_configuration,
        &material.bundle(Utc::now()),
    )
    .await?;
    if resolver.set_pem(
        material.serving.cert_pem.as_bytes(),
        material.serving.key_pem.as_bytes(),
    )? {
        tracing::info!(not_after = %material.serving.not_after, "webhook serving certificate loaded");
    }
    Ok(())
}

/// Keeps the certificates current until `shutdown`; errors are logged and retried.
pub(crate) async fn run(
    client: kube::Client,
    cfg: SelfManagedCerts,
    resolver: Arc<ReloadingCert>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let wait = match reconcile_once(&client, &cfg, &resolver).await {
            Ok(()) => cfg.policy.check_period,
            Err(e) => {
                tracing::warn!(error = %e, "webhook certificates: retrying");
                cfg.policy.check_period.min(Duration::from_secs(5))
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = &mut shutdown => return,
        }
    }
}

/// Reloads certificate files (cert-manager's Secret mounted into the pod) when they
/// change, until `shutdown`.
pub(crate) async fn watch_files(
    cert_file: std::path::PathBuf,
    key_file: std::path::PathBuf,
    resolver: Arc<ReloadingCert>,
    period: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = &mut shutdown => return,
        }
        let (cert, key) = (
            tokio::fs::read(&cert_file).await,
            tokio::fs::read(&key_file).await,
        );
        match (cert, key) {
            (Ok(cert), Ok(key)) => match resolver.set_pem(&cert, &key) {
                Ok(true) => {
                    tracing::info!(file = %cert_file.display(), "webhook certificate reloaded")
                }
                Ok(false) => {}
                // Mid-update (one file new, the other old): the next look gets both.
                Err(e) => tracing::warn!(error = %e, "webhook certificate files not usable yet"),
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(error = %e, "cannot read the webhook certificate files")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> CertPolicy {
        CertPolicy {
            ca_validity: Duration::from_secs(3000),
            serving_validity: Duration::from_secs(300),
            check_period: Duration::from_secs(10),
        }
    }

    fn names() -> Vec<String> {
        vec!["cro-webhook.ns.svc".to_owned()]
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn the_cycle_of_renewals() {
        let p = policy();
        assert_eq!(decide(None, &names(), at(0), &p), Renewal::All);
        let m = renew(None, Renewal::All, &names(), at(0), &p)
            .unwrap()
            .unwrap();
        assert_eq!(decide(Some(&m), &names(), at(100), &p), Renewal::Keep);
        // Serving renewed after two thirds of its life.
        assert_eq!(decide(Some(&m), &names(), at(200), &p), Renewal::Serving);
        // Other names (the Service was renamed): a new serving certificate at once.
        assert_eq!(
            decide(Some(&m), &["other".to_owned()], at(1), &p),
            Renewal::Serving
        );
        // Half the CA's life: a successor joins the bundle.
        assert_eq!(decide(Some(&m), &names(), at(1500), &p), Renewal::PrepareCa);
        let prepared = renew(Some(&m), Renewal::PrepareCa, &names(), at(1500), &p)
            .unwrap()
            .unwrap();
        assert_eq!(prepared.serving, m.serving, "the serving certificate stays");
        assert_eq!(
            prepared
                .bundle(at(1500))
                .matches("BEGIN CERTIFICATE")
                .count(),
            2
        );
        // Two thirds gone, successor out long enough: it takes over.
        assert_eq!(
            decide(Some(&prepared), &names(), at(2001), &p),
            Renewal::PromoteCa
        );
        // But not before the bundle had a check period to spread.
        let late = renew(Some(&m), Renewal::PrepareCa, &names(), at(1998), &p)
            .unwrap()
            .unwrap();
        assert_ne!(
            decide(Some(&late), &names(), at(2001), &p),
            Renewal::PromoteCa
        );
        let promoted = renew(Some(&prepared), Renewal::PromoteCa, &names(), at(2001), &p)
            .unwrap()
            .unwrap();
        assert_eq!(promoted.ca, prepared.next_ca.clone().unwrap().0);
        assert_eq!(promoted.previous_ca.as_ref().unwrap().0, m.ca.cert_pem);
        assert!(promoted.next_ca.is_none());
        // The old CA stays trusted until it expires, then drops out of the bundle.
        assert_eq!(
            promoted
                .bundle(at(2500))
                .matches("BEGIN CERTIFICATE")
                .count(),
            2
        );
        assert_eq!(
            promoted
                .bundle(at(3001))
                .matches("BEGIN CERTIFICATE")
                .count(),
            1
        );
        // An expired CA: start over.
        assert_eq!(decide(Some(&m), &names(), at(3000), &p), Renewal::All);
    }

    /// Issue 23: with `webhook.url: https://127.0.0.1:9443` the API server checks the
    /// certificate against the IP, so an IP among the names must become an IP SAN (rcgen's
    /// `CertificateParams::new` parses each name as an IP first). A verifier that trusts
    /// the CA must accept the serving certificate for that IP and for the Service name,
    /// and refuse it for an IP it does not name.
    #[test]
    fn an_ip_among_the_names_is_an_ip_san_a_tls_client_accepts() {
        use rustls::client::WebPkiServerVerifier;
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{ServerName, UnixTime};

        let names = vec!["cro-webhook.ns.svc".to_owned(), "127.0.0.1".to_owned()];
        let m = renew(None, Renewal::All, &names, at(0), &policy())
            .unwrap()
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(m.ca.cert_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let serving = CertificateDer::from_pem_slice(m.serving.cert_pem.as_bytes()).unwrap();
        let now = UnixTime::since_unix_epoch(Duration::from_secs(
            u64::try_from(at(10).timestamp()).unwrap(),
        ));
        let verify = |host: &'static str| {
            verifier.verify_server_cert(
                &serving,
                &[],
                &ServerName::try_from(host).unwrap(),
                &[],
                now,
            )
        };
        verify("127.0.0.1").expect("the IP SAN is accepted");
        verify("cro-webhook.ns.svc").expect("the Service name is accepted");
        assert!(verify("127.0.0.2").is_err(), "an IP not named is refused");
        // Adding the name to an existing certificate reissues it.
        let before = renew(None, Renewal::All, &names[..1], at(0), &policy())
            .unwrap()
            .unwrap();
        assert_eq!(
            decide(Some(&before), &names, at(1), &policy()),
            Renewal::Serving
        );
        let m = Material::from_secret(&m.to_secret("ns", "tls", None)).unwrap();
        assert_eq!(m.dns_names, names, "the names survive the Secret");
        assert_eq!(decide(Some(&m), &names, at(1), &policy()), Renewal::Keep);
    }

    #[test]
    fn serving_never_outlives_its_ca() {
        let p = CertPolicy {
            ca_validity: Duration::from_secs(100),
            serving_validity: Duration::from_secs(1000),
            check_period: Duration::from_secs(1),
        };
        let m = renew(None, Renewal::All, &names(), at(0), &p)
            .unwrap()
            .unwrap();
        assert_eq!(m.serving.not_after, m.ca.not_after);
    }

    #[test]
    fn the_secret_round_trips_and_the_resolver_loads_it() {
        let p = policy();
        let m = renew(None, Renewal::All, &names(), at(0), &p)
            .unwrap()
            .unwrap();
        let m = renew(Some(&m), Renewal::PrepareCa, &names(), at(1600), &p)
            .unwrap()
            .unwrap();
        let m = renew(Some(&m), Renewal::PromoteCa, &names(), at(2100), &p)
            .unwrap()
            .unwrap();
        let secret = m.to_secret("ns", "tls", None);
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(Material::from_secret(&secret).unwrap(), m);
        let mut broken = secret.clone();
        broken.data.as_mut().unwrap().remove(KEY_TLS_KEY);
        assert!(Material::from_secret(&broken).is_err());

        let resolver = ReloadingCert::default();
        assert!(!resolver.is_loaded());
        assert!(
            resolver
                .set_pem(m.serving.cert_pem.as_bytes(), m.serving.key_pem.as_bytes())
                .unwrap()
        );
        assert!(
            !resolver
                .set_pem(m.serving.cert_pem.as_bytes(), m.serving.key_pem.as_bytes())
                .unwrap()
        );
        assert!(resolver.is_loaded());
        // A key that does not belong to the certificate is refused; the old one stays.
        assert!(
            resolver
                .set_pem(m.serving.cert_pem.as_bytes(), m.ca.key_pem.as_bytes())
                .is_err()
        );
    }
}
