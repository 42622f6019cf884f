//! A configured endpoint as the origin every request URL is built on.

use crate::model::ProviderError;

/// `endpoint` (the value of configuration key `key`) as an origin, `http(s)://authority`:
/// a trailing `/`, or one of the API's own base paths in `base_paths` (e.g.
/// `/redfish/v1`), is accepted and dropped; any other path, a query, credentials in the
/// authority or another scheme is refused, since the provider builds every request path
/// itself and a grant covers the origin.
pub fn origin(key: &str, endpoint: &str, base_paths: &[&str]) -> Result<String, ProviderError> {
    let bad = |why: &str| {
        ProviderError::Config(format!(
            "configuration key `{key}` = '{endpoint}' {why}; expected http(s)://host:port"
        ))
    };
    let rest = endpoint
        .strip_prefix("https://")
        .or_else(|| endpoint.strip_prefix("http://"))
        .ok_or_else(|| bad("is not an http:// or https:// URL"))?;
    let scheme_len = endpoint.len() - rest.len();
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains(['?', '#', '@', ' ']) {
        return Err(bad("has no usable host"));
    }
    let path = path.trim_end_matches('/');
    if !(path.is_empty() || base_paths.contains(&path)) {
        return Err(bad("has a path"));
    }
    Ok(endpoint[..scheme_len + authority.len()].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_with_or_without_the_apis_base_path() {
        let base = ["/api/v1"];
        for ok in [
            "http://10.0.0.1:8080",
            "http://10.0.0.1:8080/",
            "http://10.0.0.1:8080/api/v1",
            "http://10.0.0.1:8080/api/v1/",
        ] {
            assert_eq!(
                origin("endpoint", ok, &base).unwrap(),
                "http://10.0.0.1:8080"
            );
        }
        assert_eq!(
            origin("endpoint", "https://[::1]:8443/", &base).unwrap(),
            "https://[::1]:8443"
        );
        for (bad, why) in [
            ("ftp://h:1", "is not an http"),
            ("h:1", "is not an http"),
            ("http://", "has no usable host"),
            ("http://user@h:1", "has no usable host"),
            ("http://h:1?x=1", "has no usable host"),
            ("http://h:1/other", "has a path"),
            ("http://h:1/api/v1/x", "has a path"),
        ] {
            let e = origin("endpoint", bad, &base).unwrap_err();
            assert!(
                matches!(&e, ProviderError::Config(m) if m.contains(why) && m.contains("`endpoint`")),
                "{bad}: {e:?}"
            );
        }
    }
}
