//! DRA: finding a GPU in the ResourceSlices and tainting it while it is detached.
//!
//! `resource.k8s.io` moved between versions across Kubernetes releases (ResourceSlice:
//! v1beta1 → v1; DeviceTaintRule: v1alpha3 behind a feature gate → v1beta2 → v1), so the
//! version is discovered from the API server and objects are handled as JSON.

#[cfg(test)]
use kube::api::GroupVersionKind;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{ApiGroup, Discovery};
use serde_json::{Value, json};

use super::NodeOpsError;

#[cfg(test)]
pub(crate) const DRA_DRIVER: &str = "dra-driver-nvidia-gpu";
pub(crate) const TAINT_KEY: &str = "k8s.io/device-uuid";
const GROUP: &str = "resource.k8s.io";
const SLICE_VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1beta1"];
const TAINT_RULE_VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1alpha3"];

/// Where a device sits in the slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SliceDevice {
    pub(crate) driver: String,
    pub(crate) pool: String,
    pub(crate) device: String,
}

/// The served versions of the two DRA kinds, found once.
#[derive(Debug, Clone)]
pub(crate) struct DraApis {
    slices: Option<ApiResource>,
    taint_rules: Option<ApiResource>,
}

fn pick(group: Option<&ApiGroup>, kind: &str, versions: &[&str]) -> Option<ApiResource> {
    let group = group?;
    versions.iter().find_map(|v| {
        group
            .versioned_resources(v)
            .into_iter()
            .find(|(ar, _)| ar.kind == kind)
            .map(|(ar, _)| ar)
    })
}

impl DraApis {
    pub(crate) async fn discover(client: &kube::Client) -> Result<Self, NodeOpsError> {
        let discovery = Discovery::new(client.clone())
            .filter(&[GROUP])
            .run()
            .await?;
        let group = discovery.get(GROUP);
        Ok(Self {
            slices: pick(group, "ResourceSlice", &SLICE_VERSIONS),
            taint_rules: pick(group, "DeviceTaintRule", &TAINT_RULE_VERSIONS),
        })
    }

    /// For tests and clusters where discovery is known: a fixed version of each kind.
    #[cfg(test)]
    pub(crate) fn fixed(slice_version: Option<&str>, taint_version: Option<&str>) -> Self {
        let ar = |v: &str, kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, v, kind), plural)
        };
        Self {
            slices: slice_version.map(|v| ar(v, "ResourceSlice", "resourceslices")),
            taint_rules: taint_version.map(|v| ar(v, "DeviceTaintRule", "devicetaintrules")),
        }
    }

    fn slices(&self) -> Result<&ApiResource, NodeOpsError> {
        self.slices.as_ref().ok_or(NodeOpsError::ApiUnavailable {
            what: "resource.k8s.io ResourceSlice (DRA mode)",
            why: "no v1, v1beta2 or v1beta1 version is served".into(),
        })
    }

    fn taint_rules(&self) -> Result<&ApiResource, NodeOpsError> {
        self.taint_rules.as_ref().ok_or(NodeOpsError::ApiUnavailable {
            what: "resource.k8s.io DeviceTaintRule (DRA mode)",
            why: "no v1, v1beta2 or v1alpha3 version is served; enable the DRADeviceTaints feature gate".into(),
        })
    }

    /// The slice device whose `uuid` attribute is `uuid`, if any slice lists it.
    pub(crate) async fn find_device(
        &self,
        client: &kube::Client,
        uuid: &str,
    ) -> Result<Option<SliceDevice>, NodeOpsError> {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), self.slices()?);
        let slices = api.list(&ListParams::default()).await?;
        Ok(slices
            .items
            .iter()
            .find_map(|s| device_in_slice(&s.data, uuid)))
    }

    /// Creates `<resource>-taint` (NoSchedule) for the device; an existing one is kept.
    pub(crate) async fn taint(
        &self,
        client: &kube::Client,
        resource_name: &str,
        uuid: &str,
        device: &SliceDevice,
    ) -> Result<(), NodeOpsError> {
        let ar = self.taint_rules()?;
        let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
        let mut rule = DynamicObject::new(&taint_rule_name(resource_name), ar);
        rule.data = json!({"spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.device},
            "taint": {"key": TAINT_KEY, "value": uuid, "effect": "NoSchedule"},
        }});
        match api.create(&PostParams::default(), &rule).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the taint rule; a missing rule (or a missing API) is already done.
    pub(crate) async fn untaint(
        &self,
        client: &kube::Client,
        resource_name: &str,
    ) -> Result<(), NodeOpsError> {
        let Some(ar) = &self.taint_rules else {
            return Ok(());
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
        match api
            .delete(&taint_rule_name(resource_name), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

pub(crate) fn taint_rule_name(resource_name: &str) -> String {
    format!("{resource_name}-taint")
}

/// Finds `uuid` among a slice's devices. v1 and v1beta2 keep attributes on the device;
/// v1beta1 keeps them under `basic`.
pub(crate) fn device_in_slice(slice: &Value, uuid: &str) -> Option<SliceDevice> {
    let spec = slice.get("spec")?;
    let driver = spec.get("driver")?.as_str()?;
    let pool = spec.pointer("/pool/name")?.as_str()?;
    spec.get("devices")?.as_array()?.iter().find_map(|d| {
        let attrs = d
            .get("attributes")
            .or_else(|| d.pointer("/basic/attributes"))?;
        (attrs.pointer("/uuid/string")?.as_str()? == uuid).then(|| SliceDevice {
            driver: driver.to_owned(),
            pool: pool.to_owned(),
            device: d
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_devices_in_v1_and_v1beta1_slices() {
        let v1 = json!({"spec": {"driver": DRA_DRIVER, "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}},
                {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-b"}}}]}});
        assert_eq!(
            device_in_slice(&v1, "GPU-b"),
            Some(SliceDevice {
                driver: DRA_DRIVER.into(),
                pool: "n1".into(),
                device: "gpu-1".into()
            })
        );
        assert_eq!(device_in_slice(&v1, "GPU-c"), None);
        let beta1 = json!({"spec": {"driver": "d", "pool": {"name": "p"},
            "devices": [{"name": "x", "basic": {"attributes": {"uuid": {"string": "GPU-a"}}}}]}});
        assert_eq!(
            device_in_slice(&beta1, "GPU-a").map(|d| d.device),
            Some("x".into())
        );
        assert_eq!(
            device_in_slice(&json!({"spec": {"devices": "nonsense"}}), "GPU-a"),
            None
        );
        assert_eq!(device_in_slice(&json!(null), "GPU-a"), None);
    }

    #[test]
    fn missing_taint_api_is_a_clear_error() {
        let apis = DraApis::fixed(Some("v1"), None);
        let err = apis.taint_rules().unwrap_err().to_string();
        assert!(
            err.contains("DeviceTaintRule") && err.contains("feature gate"),
            "{err}"
        );
    }
}
