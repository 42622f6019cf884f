//! A component pulled from an OCI registry, pinned by the manifest's digest.
//!
//! The artifact layout is the CNCF wasm OCI artifact one that wasm-pkg-tools (`wkg oci
//! push`) writes: an OCI image manifest whose single layer has media type
//! `application/wasm` (config `application/vnd.wasm.config.v0+json`). The older
//! `application/vnd.wasm.content.layer.v1+wasm` layer (wasm-to-oci, Krustlet) is accepted
//! too. docs/providers.md describes how to push one.

use std::str::FromStr;

use futures::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use cro_api::OciSource;

use super::digest::{Accumulator, check_declared, is_sha256_hex, sha256_hex};
use super::error::SourceError;
use super::{FetchOptions, Fetched, pull_secret};

/// Layer media type of the CNCF wasm OCI artifact layout (wasm-pkg-tools).
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// Config media type of the same layout.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The older wasm-to-oci layer media type, still accepted.
pub const LEGACY_WASM_LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// The registry and the pinned digest's hex of a reference the CRD accepts.
pub fn parse_reference(reference: &str) -> Result<(Reference, String), SourceError> {
    let bad = |reason: String| SourceError::OciReference {
        reference: reference.to_owned(),
        reason,
    };
    let parsed = Reference::from_str(reference).map_err(|e| bad(e.to_string()))?;
    let digest = parsed.digest().ok_or_else(|| {
        bad("no @sha256:<digest>: a tag alone can be moved to other bytes".into())
    })?;
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| is_sha256_hex(h))
        .ok_or_else(|| bad(format!("digest {digest} is not sha256:<64 lowercase hex>")))?
        .to_owned();
    Ok((parsed, hex))
}

pub async fn fetch(
    kube: &kube::Client,
    source: &OciSource,
    options: &FetchOptions,
) -> Result<Fetched, SourceError> {
    let (reference, manifest_hex) = parse_reference(&source.reference)?;
    let auth = match &source.pull_secret {
        Some(secret) => pull_secret::read(kube, secret, reference.registry()).await?,
        None => RegistryAuth::Anonymous,
    };
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::HttpsExcept(options.plain_http_registries.clone()),
        ..ClientConfig::default()
    });
    let registry_err = |source| SourceError::Registry {
        reference: source_ref(&reference),
        source,
    };

    let (raw, _) = client
        .pull_manifest_raw(&reference, &auth, &[OCI_IMAGE_MEDIA_TYPE])
        .await
        .map_err(registry_err)?;
    // Checked here, not only by the client: the digest in the spec is the whole trust.
    let actual = sha256_hex(&raw);
    if actual != manifest_hex {
        return Err(SourceError::DigestMismatch {
            origin: format!("manifest of {}", source.reference),
            expected: manifest_hex,
            actual,
        });
    }
    let manifest: OciImageManifest =
        serde_json::from_slice(&raw).map_err(|e| SourceError::Manifest {
            reference: source.reference.clone(),
            reason: e.to_string(),
        })?;
    let layer = wasm_layer(&source.reference, &manifest)?;
    let origin = format!("layer {} of {}", layer.digest, source.reference);
    let layer_hex = layer
        .digest
        .strip_prefix("sha256:")
        .filter(|h| is_sha256_hex(h))
        .ok_or_else(|| SourceError::BadDigest {
            origin: origin.clone(),
            digest: layer.digest.clone(),
        })?
        .to_owned();
    // The manifest (verified above) announces the size: refuse before downloading.
    check_declared(
        &origin,
        Some(u64::try_from(layer.size).unwrap_or(u64::MAX)),
        options.max_component_bytes,
    )?;

    let sized = client
        .pull_blob_stream(&reference, layer)
        .await
        .map_err(registry_err)?;
    check_declared(&origin, sized.content_length, options.max_component_bytes)?;
    let mut acc = Accumulator::new(origin.clone(), options.max_component_bytes);
    let mut stream = sized.stream;
    while let Some(chunk) = stream.next().await {
        // The client's own stream check ends in an I/O error on a digest mismatch.
        let chunk = chunk.map_err(|e| SourceError::LayerStream {
            origin: origin.clone(),
            reason: e.to_string(),
        })?;
        acc.push(&chunk)?;
    }
    let bytes = acc.finish(&layer_hex)?;
    Ok(Fetched {
        digest: layer.digest.clone(),
        bytes,
        origin: source.reference.clone(),
    })
}

fn source_ref(reference: &Reference) -> String {
    reference.whole()
}

/// The one wasm layer of an artifact.
pub fn wasm_layer<'m>(
    reference: &str,
    manifest: &'m OciImageManifest,
) -> Result<&'m oci_client::manifest::OciDescriptor, SourceError> {
    let mut wasm = manifest.layers.iter().filter(|l| {
        l.media_type == WASM_LAYER_MEDIA_TYPE || l.media_type == LEGACY_WASM_LAYER_MEDIA_TYPE
    });
    match (wasm.next(), wasm.next()) {
        (Some(layer), None) => Ok(layer),
        _ => Err(SourceError::WasmLayer {
            reference: reference.to_owned(),
            accepted: format!("{WASM_LAYER_MEDIA_TYPE} (or {LEGACY_WASM_LAYER_MEDIA_TYPE})"),
            found: manifest
                .layers
                .iter()
                .map(|l| l.media_type.clone())
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn only_references_pinned_by_sha256_parse() {
        let (r, hex) = parse_reference(&format!("127.0.0.1:5000/cro/fti:1.0@sha256:{D}")).unwrap();
        assert_eq!(hex, D);
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "cro/fti");
        let msg = parse_reference("r.example/cro/fti:1.0")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("a tag alone"), "{msg}");
        assert!(parse_reference("r.example/cro/fti@sha256:abc").is_err());
    }

    fn layer(media_type: &str) -> oci_client::manifest::OciDescriptor {
        oci_client::manifest::OciDescriptor {
            media_type: media_type.into(),
            digest: format!("sha256:{D}"),
            size: 10,
            ..Default::default()
        }
    }

    #[test]
    fn exactly_one_wasm_layer_is_required() {
        let mut m = OciImageManifest {
            layers: vec![
                layer("application/vnd.oci.image.layer.v1.tar"),
                layer(WASM_LAYER_MEDIA_TYPE),
            ],
            ..OciImageManifest::default()
        };
        assert_eq!(
            wasm_layer("r", &m).unwrap().media_type,
            WASM_LAYER_MEDIA_TYPE
        );
        m.layers = vec![layer(LEGACY_WASM_LAYER_MEDIA_TYPE)];
        assert!(wasm_layer("r", &m).is_ok());
        m.layers.push(layer(WASM_LAYER_MEDIA_TYPE));
        let msg = wasm_layer("r", &m).unwrap_err().to_string();
        assert!(
            msg.contains("exactly one layer of media type application/wasm"),
            "{msg}"
        );
        m.layers = vec![layer("application/vnd.oci.image.layer.v1.tar")];
        assert!(wasm_layer("r", &m).is_err());
    }
}
