//! The `http` capability's part of the capability report: the endpoints a provider says
//! it calls (origins, or `${key}` for the URL in a configuration key) against its grants.

use std::collections::BTreeMap;

use url::Url;

use super::grant::{HttpGrant, HttpTarget};
use crate::caps::capability::{Declared, Findings};

pub(crate) fn report(grants: &[HttpGrant], declared: &Declared<'_>, findings: &mut Findings) {
    let mut used = vec![false; grants.len()];
    for pattern in &declared.info.capabilities.http {
        let url = match resolve(pattern, declared.config) {
            Ok(url) => url,
            Err(why) => {
                findings
                    .wanted_not_granted
                    .push(format!("http {pattern}: {why}"));
                continue;
            }
        };
        match grants.iter().position(|g| g.allows(&url)) {
            Some(i) => used[i] = true,
            None => findings
                .wanted_not_granted
                .push(format!("http {} ({pattern})", HttpTarget::describe(&url))),
        }
    }
    for (g, used) in grants.iter().zip(used) {
        if !used {
            findings.granted_not_wanted.push(format!("http {}", g.url));
        }
    }
}

/// The URL an HTTP pattern names: an origin, or `${key}` (optionally followed by a
/// path) for the URL in configuration key `key` (`https://` when it has no scheme).
fn resolve(pattern: &str, config: &BTreeMap<String, String>) -> Result<Url, String> {
    let text = match pattern.strip_prefix("${") {
        Some(rest) => {
            let Some((key, tail)) = rest.split_once('}') else {
                return Err("unterminated `${`".into());
            };
            let Some(base) = config.get(key) else {
                return Err(format!("configuration key `{key}` is not set"));
            };
            let base = base.trim().trim_end_matches('/');
            // A value without a scheme (`host:port/`) is read as HTTPS, the convention
            // of fabric endpoints.
            if base.contains("://") {
                format!("{base}{tail}")
            } else {
                format!("https://{base}{tail}")
            }
        }
        None => pattern.to_string(),
    };
    Url::parse(&text).map_err(|e| format!("`{text}` is not a URL: {e}"))
}
