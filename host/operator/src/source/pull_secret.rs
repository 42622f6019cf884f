//! Registry credentials from a `kubernetes.io/dockerconfigjson` Secret, as kubelet reads
//! image pull Secrets.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use cro_api::SecretReference;

use super::error::SourceError;

const DOCKERCONFIGJSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
const DOCKERCONFIGJSON_KEY: &str = ".dockerconfigjson";

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize, Default)]
struct DockerAuth {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    /// base64 of `username:password`.
    #[serde(default)]
    auth: Option<String>,
    /// A bearer token for the registry itself.
    #[serde(default)]
    registrytoken: Option<String>,
}

/// Reads the Secret and picks the credentials for `registry` (`host[:port]`).
pub async fn read(
    client: &kube::Client,
    secret: &SecretReference,
    registry: &str,
) -> Result<RegistryAuth, SourceError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &secret.namespace);
    let found = api
        .get_opt(&secret.name)
        .await
        .map_err(|e| SourceError::Kube {
            what: format!("pull Secret {}/{}", secret.namespace, secret.name),
            source: e,
        })?
        .ok_or_else(|| SourceError::PullSecretNotFound {
            namespace: secret.namespace.clone(),
            name: secret.name.clone(),
        })?;
    let fail = |reason: String| SourceError::PullSecret {
        namespace: secret.namespace.clone(),
        name: secret.name.clone(),
        reason,
    };
    let kind = found.type_.as_deref().unwrap_or("Opaque");
    if kind != DOCKERCONFIGJSON_TYPE {
        return Err(fail(format!(
            "type is {kind}, expected {DOCKERCONFIGJSON_TYPE}"
        )));
    }
    let json = found
        .data
        .as_ref()
        .and_then(|d| d.get(DOCKERCONFIGJSON_KEY))
        .ok_or_else(|| fail(format!("no {DOCKERCONFIGJSON_KEY} key")))?;
    auth_for(&json.0, registry).map_err(fail)
}

/// The credentials a docker config JSON holds for `registry`; the reason when none.
pub fn auth_for(config_json: &[u8], registry: &str) -> Result<RegistryAuth, String> {
    let config: DockerConfig = serde_json::from_slice(config_json)
        .map_err(|e| format!("{DOCKERCONFIGJSON_KEY} is not a docker config: {e}"))?;
    let wanted = normalize(registry);
    let (key, entry) = config
        .auths
        .iter()
        .find(|(k, _)| normalize(k) == wanted)
        .ok_or_else(|| {
            format!(
                "no credentials for registry {registry} (entries: {:?})",
                config.auths.keys().collect::<Vec<_>>()
            )
        })?;
    if let Some(token) = entry.registrytoken.as_deref().filter(|t| !t.is_empty()) {
        return Ok(RegistryAuth::Bearer(token.to_owned()));
    }
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    let encoded = entry
        .auth
        .as_deref()
        .ok_or_else(|| format!("entry {key} has neither username/password nor auth"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| format!("entry {key}: auth is not base64: {e}"))?;
    let text = String::from_utf8(decoded).map_err(|_| format!("entry {key}: auth is not UTF-8"))?;
    let (u, p) = text
        .split_once(':')
        .ok_or_else(|| format!("entry {key}: auth is not username:password"))?;
    Ok(RegistryAuth::Basic(u.to_owned(), p.to_owned()))
}

/// `https://index.docker.io/v1/` and `docker.io` name the same registry, as do
/// `https://r.example:5000/v2/` and `r.example:5000`.
fn normalize(registry: &str) -> String {
    let s = registry
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = s.split('/').next().unwrap_or(s).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".into(),
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(a: RegistryAuth) -> (String, String) {
        match a {
            RegistryAuth::Basic(u, p) => (u, p),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn username_and_password_are_taken_for_the_matching_registry() {
        let json = br#"{"auths":{"other.example":{"username":"x","password":"y"},
            "https://r.example:5000/v2/":{"username":"robot","password":"s3cret"}}}"#;
        assert_eq!(
            basic(auth_for(json, "r.example:5000").unwrap()),
            ("robot".into(), "s3cret".into())
        );
    }

    #[test]
    fn the_auth_field_is_base64_user_colon_password() {
        // base64("robot:pa:ss")
        let json = br#"{"auths":{"r.example":{"auth":"cm9ib3Q6cGE6c3M="}}}"#;
        assert_eq!(
            basic(auth_for(json, "r.example").unwrap()),
            ("robot".into(), "pa:ss".into())
        );
        let bad = br#"{"auths":{"r.example":{"auth":"!!"}}}"#;
        assert!(
            auth_for(bad, "r.example")
                .unwrap_err()
                .contains("not base64")
        );
        let no_colon = br#"{"auths":{"r.example":{"auth":"cm9ib3Q="}}}"#;
        assert!(
            auth_for(no_colon, "r.example")
                .unwrap_err()
                .contains("username:password")
        );
    }

    #[test]
    fn docker_hub_aliases_match_and_a_registry_token_is_bearer() {
        let json = br#"{"auths":{"https://index.docker.io/v1/":{"registrytoken":"tok"}}}"#;
        assert!(
            matches!(auth_for(json, "docker.io").unwrap(), RegistryAuth::Bearer(t) if t == "tok")
        );
    }

    #[test]
    fn no_entry_or_garbage_is_a_clear_refusal() {
        let json = br#"{"auths":{"a.example":{"username":"u","password":"p"}}}"#;
        let msg = auth_for(json, "b.example").unwrap_err();
        assert!(
            msg.contains("no credentials for registry b.example") && msg.contains("a.example"),
            "{msg}"
        );
        assert!(
            auth_for(b"not json", "b")
                .unwrap_err()
                .contains("not a docker config")
        );
        let empty = br#"{"auths":{"b.example":{}}}"#;
        assert!(
            auth_for(empty, "b.example")
                .unwrap_err()
                .contains("neither")
        );
    }
}
