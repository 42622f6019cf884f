//! Read-only cluster access for the `secrets` and `lookup` imports, as a trait so the
//! runtime works without a cluster: [`StaticCluster`] (in memory, loadable from YAML) for
//! tests and vendors, [`KubeCluster`] for the operator.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Deserialize;
use serde_json::{Value, json};

/// A boxed `Send` future, so [`ClusterReader`] stays dyn-compatible.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a cluster read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The object (or Secret) does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The API server (or discovery) failed.
    #[error("{0}")]
    Api(String),
    /// The request or an object is malformed.
    #[error("{0}")]
    Invalid(String),
}

/// What the runtime reads from a cluster. Implementations return objects as the API server
/// does (JSON with `apiVersion`, `kind`, `metadata`).
pub trait ClusterReader: Send + Sync {
    /// The data of Secret `namespace/name`, decoded.
    fn get_secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, Vec<u8>>, ClusterError>>;

    /// One object; `namespace` is `None` for cluster-scoped kinds.
    fn get_object<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Value, ClusterError>>;

    /// Every object of a kind, in every namespace.
    fn list_objects<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, ClusterError>>;
}

fn describe(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{api_version} {kind} {ns}/{name}"),
        None => format!("{api_version} {kind} {name}"),
    }
}

type ObjectKey = (String, String, String, String);

#[derive(Debug, Default)]
struct StaticState {
    /// (apiVersion, kind, namespace or "", name) → object.
    objects: BTreeMap<ObjectKey, Value>,
    secrets: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
}

/// An in-memory cluster. Clones share the same objects, so a test can change them while a
/// provider holds the reader.
#[derive(Debug, Clone, Default)]
pub struct StaticCluster {
    inner: Arc<RwLock<StaticState>>,
}

impl StaticCluster {
    pub fn new() -> StaticCluster {
        StaticCluster::default()
    }

    /// Adds a `v1 Node` with no labels or annotations.
    pub fn with_node(self, name: &str) -> StaticCluster {
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
        });
        self.write().objects.insert(
            ("v1".into(), "Node".into(), String::new(), name.to_string()),
            node,
        );
        self
    }

    /// Adds an object (it needs `apiVersion`, `kind` and `metadata.name`).
    pub fn with_object(self, object: Value) -> Result<StaticCluster, ClusterError> {
        self.insert_object(object)?;
        Ok(self)
    }

    /// Adds a Secret.
    pub fn with_secret<K, V>(
        self,
        namespace: &str,
        name: &str,
        data: impl IntoIterator<Item = (K, V)>,
    ) -> StaticCluster
    where
        K: Into<String>,
        V: AsRef<[u8]>,
    {
        self.insert_secret(namespace, name, data);
        self
    }

    /// Adds or replaces an object. A `v1 Secret` is stored as a Secret (its `data` base64
    /// decoded, `stringData` taken as is), never as a lookup object.
    pub fn insert_object(&self, object: Value) -> Result<(), ClusterError> {
        let field = |path: &[&str]| -> Option<String> {
            let mut v = &object;
            for p in path {
                v = v.get(p)?;
            }
            v.as_str().map(str::to_string)
        };
        let (Some(api_version), Some(kind), Some(name)) = (
            field(&["apiVersion"]),
            field(&["kind"]),
            field(&["metadata", "name"]),
        ) else {
            return Err(ClusterError::Invalid(
                "an object needs apiVersion, kind and metadata.name".into(),
            ));
        };
        let namespace = field(&["metadata", "namespace"]).unwrap_or_default();
        if api_version == "v1" && kind == "Secret" {
            return self.insert_secret_object(&namespace, &name, &object);
        }
        self.write()
            .objects
            .insert((api_version, kind, namespace, name), object);
        Ok(())
    }

    fn insert_secret_object(
        &self,
        namespace: &str,
        name: &str,
        object: &Value,
    ) -> Result<(), ClusterError> {
        use base64::Engine as _;
        let mut data = BTreeMap::new();
        if let Some(map) = object.get("data").and_then(Value::as_object) {
            for (k, v) in map {
                let text = v.as_str().unwrap_or_default();
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| {
                        ClusterError::Invalid(format!(
                            "Secret {namespace}/{name} key {k} is not base64: {e}"
                        ))
                    })?;
                data.insert(k.clone(), bytes);
            }
        }
        if let Some(map) = object.get("stringData").and_then(Value::as_object) {
            for (k, v) in map {
                data.insert(
                    k.clone(),
                    v.as_str().unwrap_or_default().as_bytes().to_vec(),
                );
            }
        }
        self.insert_secret(namespace, name, data);
        Ok(())
    }

    /// Adds or replaces a Secret.
    pub fn insert_secret<K, V>(
        &self,
        namespace: &str,
        name: &str,
        data: impl IntoIterator<Item = (K, V)>,
    ) where
        K: Into<String>,
        V: AsRef<[u8]>,
    {
        let data = data
            .into_iter()
            .map(|(k, v)| (k.into(), v.as_ref().to_vec()))
            .collect();
        self.write()
            .secrets
            .insert((namespace.to_string(), name.to_string()), data);
    }

    /// Removes an object; true when it existed.
    pub fn remove_object(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        let key = (
            api_version.to_string(),
            kind.to_string(),
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        self.write().objects.remove(&key).is_some()
    }

    /// Objects from a multi-document YAML (`kind: List` documents are expanded).
    pub fn from_yaml(text: &str) -> Result<StaticCluster, ClusterError> {
        let cluster = StaticCluster::new();
        for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(document)
                .map_err(|e| ClusterError::Invalid(format!("YAML document {}: {e}", i + 1)))?;
            match value {
                Value::Null => {}
                Value::Object(_) if value.get("kind") == Some(&json!("List")) => {
                    let items = value.get("items").and_then(Value::as_array);
                    for item in items.into_iter().flatten() {
                        cluster.insert_object(item.clone())?;
                    }
                }
                Value::Object(_) => cluster.insert_object(value)?,
                _ => {
                    return Err(ClusterError::Invalid(format!(
                        "YAML document {} is not an object",
                        i + 1
                    )));
                }
            }
        }
        Ok(cluster)
    }

    pub fn from_yaml_file(path: &Path) -> Result<StaticCluster, ClusterError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClusterError::Invalid(format!("cannot read {}: {e}", path.display())))?;
        StaticCluster::from_yaml(&text)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, StaticState> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StaticState> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ClusterReader for StaticCluster {
    fn get_secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, Vec<u8>>, ClusterError>> {
        let found = self
            .read()
            .secrets
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ClusterError::NotFound(format!("Secret {namespace}/{name}")));
        Box::pin(async move { found })
    }

    fn get_object<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Value, ClusterError>> {
        let key = (
            api_version.to_string(),
            kind.to_string(),
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        let found =
            self.read().objects.get(&key).cloned().ok_or_else(|| {
                ClusterError::NotFound(describe(api_version, kind, namespace, name))
            });
        Box::pin(async move { found })
    }

    fn list_objects<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, ClusterError>> {
        let found = self
            .read()
            .objects
            .iter()
            .filter(|((v, k, _, _), _)| v == api_version && k == kind)
            .map(|(_, o)| o.clone())
            .collect();
        Box::pin(async move { Ok(found) })
    }
}

/// A real cluster through `kube`; kinds are resolved by API discovery (cached).
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
    resolved: Arc<Mutex<HashMap<(String, String), Resolved>>>,
}

#[derive(Clone)]
struct Resolved {
    resource: kube::discovery::ApiResource,
    namespaced: bool,
}

impl KubeCluster {
    pub fn new(client: kube::Client) -> KubeCluster {
        KubeCluster {
            client,
            resolved: Arc::default(),
        }
    }

    async fn resolve(&self, api_version: &str, kind: &str) -> Result<Resolved, ClusterError> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(r) = self
            .resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(r.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| kube_error(e, &format!("{api_version} {kind}")))?;
        let resolved = Resolved {
            resource,
            namespaced: matches!(caps.scope, kube::discovery::Scope::Namespaced),
        };
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, resolved.clone());
        Ok(resolved)
    }
}

fn kube_error(e: kube::Error, what: &str) -> ClusterError {
    match &e {
        kube::Error::Api(status) if status.code == 404 => ClusterError::NotFound(what.into()),
        _ => ClusterError::Api(format!("{what}: {e}")),
    }
}

/// Lists leave `apiVersion`/`kind` out of their items; put them back so every object looks
/// like a GET of it.
fn with_type(mut object: Value, api_version: &str, kind: &str) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.entry("apiVersion")
            .or_insert_with(|| json!(api_version));
        map.entry("kind").or_insert_with(|| json!(kind));
    }
    object
}

impl ClusterReader for KubeCluster {
    fn get_secret<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, Vec<u8>>, ClusterError>> {
        Box::pin(async move {
            let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
                kube::Api::namespaced(self.client.clone(), namespace);
            let secret = api
                .get(name)
                .await
                .map_err(|e| kube_error(e, &format!("Secret {namespace}/{name}")))?;
            Ok(secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect())
        })
    }

    fn get_object<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Value, ClusterError>> {
        Box::pin(async move {
            let what = describe(api_version, kind, namespace, name);
            let resolved = self.resolve(api_version, kind).await?;
            let api: kube::Api<kube::core::DynamicObject> = match (resolved.namespaced, namespace) {
                (true, Some(ns)) => {
                    kube::Api::namespaced_with(self.client.clone(), ns, &resolved.resource)
                }
                (false, None) => kube::Api::all_with(self.client.clone(), &resolved.resource),
                (true, None) => {
                    return Err(ClusterError::Invalid(format!(
                        "{api_version} {kind} is namespaced: give a namespace"
                    )));
                }
                (false, Some(_)) => {
                    return Err(ClusterError::Invalid(format!(
                        "{api_version} {kind} is cluster-scoped: give no namespace"
                    )));
                }
            };
            let object = api.get(name).await.map_err(|e| kube_error(e, &what))?;
            let value = serde_json::to_value(object)
                .map_err(|e| ClusterError::Api(format!("{what}: {e}")))?;
            Ok(with_type(value, api_version, kind))
        })
    }

    fn list_objects<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Value>, ClusterError>> {
        Box::pin(async move {
            let what = format!("{api_version} {kind}");
            let resolved = self.resolve(api_version, kind).await?;
            let api: kube::Api<kube::core::DynamicObject> =
                kube::Api::all_with(self.client.clone(), &resolved.resource);
            let list = api
                .list(&Default::default())
                .await
                .map_err(|e| kube_error(e, &what))?;
            list.items
                .into_iter()
                .map(|o| {
                    serde_json::to_value(o)
                        .map(|v| with_type(v, api_version, kind))
                        .map_err(|e| ClusterError::Api(format!("{what}: {e}")))
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn static_cluster_from_yaml() {
        let yaml = r#"
apiVersion: v1
kind: Node
metadata: {name: worker-0, annotations: {machine.openshift.io/machine: openshift-machine-api/m0}}
---
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Node, metadata: {name: worker-1}}
  - {apiVersion: machine.openshift.io/v1beta1, kind: Machine, metadata: {name: m0, namespace: openshift-machine-api}}
---
apiVersion: v1
kind: Secret
metadata: {name: credentials, namespace: cro-system}
data: {username: YWRtaW4=}
stringData: {password: hunter2}
---
"#;
        let cluster = StaticCluster::from_yaml(yaml).unwrap();
        let nodes = cluster.list_objects("v1", "Node").await.unwrap();
        assert_eq!(nodes.len(), 2);
        let node = cluster
            .get_object("v1", "Node", None, "worker-0")
            .await
            .unwrap();
        assert_eq!(
            node["metadata"]["annotations"]["machine.openshift.io/machine"],
            "openshift-machine-api/m0"
        );
        let machine = cluster
            .get_object(
                "machine.openshift.io/v1beta1",
                "Machine",
                Some("openshift-machine-api"),
                "m0",
            )
            .await
            .unwrap();
        assert_eq!(machine["metadata"]["name"], "m0");
        assert_eq!(
            cluster
                .get_object("machine.openshift.io/v1beta1", "Machine", None, "m0")
                .await,
            Err(ClusterError::NotFound(
                "machine.openshift.io/v1beta1 Machine m0".into()
            ))
        );
        let secret = cluster
            .get_secret("cro-system", "credentials")
            .await
            .unwrap();
        assert_eq!(secret["username"], b"admin");
        assert_eq!(secret["password"], b"hunter2");
        // Secrets are never served as lookup objects.
        assert!(
            cluster
                .list_objects("v1", "Secret")
                .await
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            cluster.get_secret("cro-system", "other").await,
            Err(ClusterError::NotFound(_))
        ));
    }

    #[test]
    fn bad_yaml_objects_are_refused() {
        for (yaml, expected) in [
            ("kind: Node\nmetadata: {name: a}\n", "apiVersion, kind"),
            ("- a\n- b\n", "not an object"),
            (
                "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: '!!'}\n",
                "base64",
            ),
            (
                "apiVersion: v1\nkind: Node\nmetadata: {name: [\n",
                "YAML document 1",
            ),
        ] {
            let err = StaticCluster::from_yaml(yaml).unwrap_err().to_string();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }

    #[tokio::test]
    async fn clones_share_objects() {
        let cluster = StaticCluster::new().with_node("a");
        let reader: Arc<dyn ClusterReader> = Arc::new(cluster.clone());
        cluster
            .insert_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "b"}}))
            .unwrap();
        assert_eq!(reader.list_objects("v1", "Node").await.unwrap().len(), 2);
        assert!(cluster.remove_object("v1", "Node", None, "a"));
        assert!(!cluster.remove_object("v1", "Node", None, "a"));
        assert_eq!(reader.list_objects("v1", "Node").await.unwrap().len(), 1);
    }
}
