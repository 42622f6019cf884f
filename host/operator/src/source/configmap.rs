//! A component kept in a ConfigMap's `binaryData` (small components only: a ConfigMap
//! holds about 1 MiB).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use cro_api::ConfigMapSource;

use super::Fetched;
use super::digest::{check_declared, sha256_hex};
use super::error::SourceError;

pub async fn fetch(
    client: &kube::Client,
    source: &ConfigMapSource,
    limit: u64,
) -> Result<Fetched, SourceError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &source.namespace);
    let origin = format!(
        "ConfigMap {}/{} key {}",
        source.namespace, source.name, source.key
    );
    let cm = api
        .get_opt(&source.name)
        .await
        .map_err(|e| SourceError::Kube {
            what: origin.clone(),
            source: e,
        })?
        .ok_or_else(|| SourceError::ConfigMapNotFound {
            namespace: source.namespace.clone(),
            name: source.name.clone(),
        })?;
    let bytes = cm
        .binary_data
        .and_then(|mut d| d.remove(&source.key))
        .ok_or_else(|| SourceError::ConfigMapKeyMissing {
            namespace: source.namespace.clone(),
            name: source.name.clone(),
            key: source.key.clone(),
        })?
        .0;
    check_declared(&origin, Some(bytes.len() as u64), limit)?;
    Ok(Fetched {
        digest: format!("sha256:{}", sha256_hex(&bytes)),
        bytes,
        origin,
    })
}
