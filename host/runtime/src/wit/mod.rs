//! The contract versions this host serves: one module per version (its bindgen world
//! and the conversions to the host's own types in [`crate::domain`]) behind one
//! dispatch. Nothing outside this folder names a WIT version, except the capability
//! modules' import bindings (`crate::caps::<name>::wit`), which every version maps onto.
//!
//! Adding a version: a `wit/since_vX.Y.Z/` folder, a `since_vX_Y_Z.rs` module here, a
//! [`Version`] case, a [`ProviderPre`]/[`ProviderInstance`] case, and its entries in
//! [`SUPPORTED_VERSIONS`] and [`OWN_INTERFACES`] (docs/ARCHITECTURE.md).

mod since_v0_1_0;
mod since_v0_2_0;
mod since_v0_3_0;

use wasmtime::Store;
use wasmtime::component::{InstancePre, Linker};

use crate::call::CallCtx;
use crate::domain::{
    AddOutcome, AddRequest, Claim, ComposableResource, DeviceInfo, PoolOutcome, PoolQuery,
    ProviderError, ProviderInfo, RemoveOutcome,
};

/// Contract versions this host serves, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0"];

/// The package every contract version belongs to.
pub const PACKAGE: &str = "cro:provider";

/// The interfaces of package `cro:provider` each version defines and the host links
/// (exports excluded): `(version, interfaces)`.
pub(crate) const OWN_INTERFACES: &[(&str, &[&str])] = &[
    (
        "0.1.0",
        &[
            "types", "http", "secrets", "lookup", "config", "log", "state",
        ],
    ),
    ("0.2.0", &["types"]),
    ("0.3.0", &["pool"]),
];

/// The interface a version's providers export, by version.
pub(crate) const EXPORTS: &[(&str, &str)] = &[
    ("0.1.0", "provider"),
    ("0.2.0", "cdi-provider"),
    ("0.3.0", "cdi-provider"),
];

/// A contract version this host serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V0_1,
    V0_2,
    V0_3,
}

impl Version {
    /// The served version compatible with `found` (`0.x.*` within the same `x`).
    pub fn of(found: &str) -> Option<Version> {
        let i = SUPPORTED_VERSIONS
            .iter()
            .position(|v| same_minor(v, found))?;
        [Version::V0_1, Version::V0_2, Version::V0_3]
            .get(i)
            .copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1 => "0.1.0",
            Version::V0_2 => "0.2.0",
            Version::V0_3 => "0.3.0",
        }
    }
}

/// `0.x.*` versions are compatible within the same `x` (the component model's semver rule).
pub(crate) fn same_minor(a: &str, b: &str) -> bool {
    let key = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
    };
    match (key(a), key(b)) {
        (Some((0, a_minor)), Some((0, b_minor))) => a_minor == b_minor,
        (Some((a_major, _)), Some((b_major, _))) => a_major != 0 && a_major == b_major,
        _ => false,
    }
}

/// Every version's own interfaces in the linker (the capability imports, shared by all
/// versions, are added by `crate::call` from each capability module).
pub(crate) fn add_to_linker(linker: &mut Linker<CallCtx>) -> wasmtime::Result<()> {
    since_v0_1_0::add_to_linker(linker)?;
    since_v0_2_0::add_to_linker(linker)?;
    since_v0_3_0::add_to_linker(linker)
}

/// A component pre-instantiated against the world of its version, chosen at load from
/// the version of the provider interface it exports.
pub(crate) enum ProviderPre {
    V0_1(since_v0_1_0::Pre),
    V0_2(since_v0_2_0::Pre),
    V0_3(since_v0_3_0::Pre),
}

/// One instance of a provider, for one call.
pub(crate) enum ProviderInstance {
    V0_1(since_v0_1_0::ProviderWorld),
    V0_2(since_v0_2_0::ProviderWorld),
    V0_3(since_v0_3_0::ProviderWorld),
}

/// A call's reply: the outer error is a trap, the inner one the provider's own.
pub(crate) type Reply<T> = wasmtime::Result<Result<T, ProviderError>>;

impl ProviderPre {
    pub(crate) fn new(version: Version, pre: InstancePre<CallCtx>) -> wasmtime::Result<Self> {
        Ok(match version {
            Version::V0_1 => ProviderPre::V0_1(since_v0_1_0::pre(pre)?),
            Version::V0_2 => ProviderPre::V0_2(since_v0_2_0::pre(pre)?),
            Version::V0_3 => ProviderPre::V0_3(since_v0_3_0::pre(pre)?),
        })
    }

    pub(crate) fn version(&self) -> Version {
        match self {
            ProviderPre::V0_1(_) => Version::V0_1,
            ProviderPre::V0_2(_) => Version::V0_2,
            ProviderPre::V0_3(_) => Version::V0_3,
        }
    }

    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<CallCtx>,
    ) -> wasmtime::Result<ProviderInstance> {
        Ok(match self {
            ProviderPre::V0_1(p) => ProviderInstance::V0_1(p.instantiate_async(store).await?),
            ProviderPre::V0_2(p) => ProviderInstance::V0_2(p.instantiate_async(store).await?),
            ProviderPre::V0_3(p) => ProviderInstance::V0_3(p.instantiate_async(store).await?),
        })
    }
}

impl ProviderInstance {
    /// What the provider declares; `None` for versions without `describe`.
    pub(crate) async fn describe(
        &self,
        s: &mut Store<CallCtx>,
    ) -> wasmtime::Result<Option<ProviderInfo>> {
        match self {
            ProviderInstance::V0_1(_) => Ok(None),
            ProviderInstance::V0_2(w) => since_v0_2_0::describe(w, s).await.map(Some),
            ProviderInstance::V0_3(w) => since_v0_3_0::describe(w, s).await.map(Some),
        }
    }

    pub(crate) async fn add(&self, s: &mut Store<CallCtx>, req: &AddRequest) -> Reply<AddOutcome> {
        match self {
            ProviderInstance::V0_1(w) => since_v0_1_0::add(w, s, req).await,
            ProviderInstance::V0_2(w) => since_v0_2_0::add(w, s, req).await,
            ProviderInstance::V0_3(w) => since_v0_3_0::add(w, s, req).await,
        }
    }

    pub(crate) async fn remove(
        &self,
        s: &mut Store<CallCtx>,
        r: &ComposableResource,
    ) -> Reply<RemoveOutcome> {
        match self {
            ProviderInstance::V0_1(w) => since_v0_1_0::remove(w, s, r).await,
            ProviderInstance::V0_2(w) => since_v0_2_0::remove(w, s, r).await,
            ProviderInstance::V0_3(w) => since_v0_3_0::remove(w, s, r).await,
        }
    }

    pub(crate) async fn check(&self, s: &mut Store<CallCtx>, r: &ComposableResource) -> Reply<()> {
        match self {
            ProviderInstance::V0_1(w) => since_v0_1_0::check(w, s, r).await,
            ProviderInstance::V0_2(w) => since_v0_2_0::check(w, s, r).await,
            ProviderInstance::V0_3(w) => since_v0_3_0::check(w, s, r).await,
        }
    }

    pub(crate) async fn list(
        &self,
        s: &mut Store<CallCtx>,
        claims: &[Claim],
    ) -> Reply<Vec<DeviceInfo>> {
        match self {
            ProviderInstance::V0_1(w) => since_v0_1_0::list(w, s, claims).await,
            ProviderInstance::V0_2(w) => since_v0_2_0::list(w, s, claims).await,
            ProviderInstance::V0_3(w) => since_v0_3_0::list(w, s, claims).await,
        }
    }

    /// The fabric's free devices; `None` for versions without `get-pool` (before 0.3.0).
    pub(crate) async fn pool(
        &self,
        s: &mut Store<CallCtx>,
        query: &PoolQuery,
    ) -> Option<Reply<PoolOutcome>> {
        match self {
            ProviderInstance::V0_1(_) | ProviderInstance::V0_2(_) => None,
            ProviderInstance::V0_3(w) => Some(since_v0_3_0::pool(w, s, query).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_like_the_component_model() {
        assert!(same_minor("0.1.0", "0.1.7"));
        assert!(!same_minor("0.1.0", "0.2.0"));
        assert!(same_minor("1.0.0", "1.4.0"));
        assert!(!same_minor("1.0.0", "2.0.0"));
        assert!(!same_minor("0.1.0", "unversioned"));
    }

    #[test]
    fn every_served_version_has_a_world() {
        assert_eq!(Version::of("0.1.3"), Some(Version::V0_1));
        assert_eq!(Version::of("0.2.0"), Some(Version::V0_2));
        assert_eq!(Version::of("0.3.2"), Some(Version::V0_3));
        assert_eq!(Version::of("0.4.0"), None);
        for v in SUPPORTED_VERSIONS {
            let version = Version::of(v).expect("served");
            assert_eq!(version.as_str(), *v);
            assert!(OWN_INTERFACES.iter().any(|(o, _)| o == v));
            assert!(EXPORTS.iter().any(|(o, _)| o == v));
        }
    }
}
