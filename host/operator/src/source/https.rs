//! A component downloaded over https, pinned by the sha256 given in the spec.

use cro_api::HttpsSource;

use super::Fetched;
use super::digest::{Accumulator, check_declared, is_sha256_hex};
use super::error::SourceError;

pub async fn fetch(
    http: &reqwest::Client,
    source: &HttpsSource,
    limit: u64,
) -> Result<Fetched, SourceError> {
    let url = reqwest::Url::parse(&source.url).map_err(|e| SourceError::HttpsUrl {
        url: source.url.clone(),
        reason: e.to_string(),
    })?;
    // Plain http would let anyone on the path choose the bytes we then hash: the sha256
    // still protects, but refusing keeps what the CRD promises.
    if url.scheme() != "https" {
        return Err(SourceError::HttpsUrl {
            url: source.url.clone(),
            reason: format!("scheme {} is not https", url.scheme()),
        });
    }
    if !is_sha256_hex(&source.sha256) {
        return Err(SourceError::BadDigest {
            origin: source.url.clone(),
            digest: source.sha256.clone(),
        });
    }
    let http_err = |e| SourceError::Http {
        url: source.url.clone(),
        source: e,
    };
    let mut response = http.get(url).send().await.map_err(http_err)?;
    if !response.status().is_success() {
        return Err(SourceError::HttpStatus {
            url: source.url.clone(),
            status: response.status().as_u16(),
        });
    }
    check_declared(&source.url, response.content_length(), limit)?;
    let mut acc = Accumulator::new(source.url.clone(), limit);
    while let Some(chunk) = response.chunk().await.map_err(http_err)? {
        acc.push(&chunk)?;
    }
    let bytes = acc.finish(&source.sha256)?;
    Ok(Fetched {
        digest: format!("sha256:{}", source.sha256),
        bytes,
        origin: source.url.clone(),
    })
}
