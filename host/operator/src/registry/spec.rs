//! The one provider a spec file or the Go operator's environment names (not the
//! `CdiProvider` objects): its spec read and checked ([`super::startup`]), then loaded
//! into the host runtime.

use std::sync::Arc;

use cro_runtime::{ProviderSpec, Runtime, RuntimeOptions};

use super::startup;
use crate::config::compat;
use crate::config::{OperatorConfig, ProviderSource};
use crate::error::OperatorError;
use crate::provider::DeviceProvider;
use crate::provider::node_cache::NodeCache;
use crate::provider::node_machine::RememberingCluster;

/// The provider spec the configuration names: a spec file, or the Go operator's
/// environment (read through `env`) for the shipped FTI component. Checked before
/// anything is loaded (crate::registry::startup): a mistake is refused here, naming the setting,
/// instead of failing a user's first request.
pub fn provider_spec(
    config: &OperatorConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ProviderSpec, OperatorError> {
    let (spec, known_keys): (ProviderSpec, Option<&[&str]>) = match &config.provider {
        ProviderSource::SpecFile(path) => {
            let spec = ProviderSpec::from_file(path).map_err(|e| {
                OperatorError::Provider(format!("provider spec {}: {e}", path.display()))
            })?;
            // The keys a provider accepts are what its describe() declares, checked
            // once it is loaded (check_loaded); a 0.1.0 component declares none.
            (spec, None)
        }
        ProviderSource::Objects => {
            return Err(OperatorError::Config(
                "providers come from CdiProvider objects (--provider-objects): there is no provider spec".into(),
            ));
        }
        ProviderSource::GoEnvironment => {
            let spec = compat::spec_from_env(&env)
                .map_err(|e| OperatorError::Provider(e.to_string()))?
                .ok_or_else(|| {
                    OperatorError::Config(
                        "no provider: set CRO_PROVIDER_SPEC (--provider-spec) or CDI_PROVIDER_TYPE"
                            .into(),
                    )
                })?;
            let (var, default, keys) = compat::shipped_component(&spec.name);
            if !spec.component.exists() {
                let set = env(var).is_some_and(|v| !v.trim().is_empty());
                return Err(OperatorError::Provider(format!(
                    "the {} component {} does not exist: {}",
                    spec.name.to_uppercase(),
                    spec.component.display(),
                    if set {
                        format!("{var} names a file that is not there")
                    } else {
                        format!(
                            "set {var} to the component's path (the cro image ships it at {default})"
                        )
                    }
                )));
            }
            (spec, Some(keys))
        }
    };
    let problems = startup::check_spec(&spec, known_keys);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(OperatorError::Config(format!(
            "provider {}: {}",
            spec.name,
            list.join("; ")
        )));
    }
    Ok(spec)
}

/// Loads the provider of `spec`, reading the cluster through `client` (and remembering
/// the machines of deleted Nodes, crate::provider::node_machine), its Node lookups
/// through `nodes` first.
pub(crate) async fn load_spec(
    spec: &ProviderSpec,
    client: kube::Client,
    fence: Option<cro_runtime::Fence>,
    nodes: NodeCache,
) -> Result<Arc<dyn DeviceProvider>, OperatorError> {
    let runtime = Runtime::new(RuntimeOptions::default())
        .map_err(|e| OperatorError::Provider(e.to_string()))?;
    let cluster = RememberingCluster::of_api_server(client, nodes);
    let mut options = cro_runtime::LoadOptions::default();
    if let Some(fence) = fence {
        options = options.with_fence(fence);
    }
    let provider = runtime
        .load_with(spec, Arc::new(cluster), options)
        .await
        .map_err(|e| OperatorError::Provider(format!("{}: {e}", spec.component.display())))?;
    startup::check_loaded(&provider)?;
    tracing::info!(provider = provider.name(), component = %spec.component.display(),
        contract = %provider.contract_version(), "provider loaded");
    Ok(Arc::new(provider))
}

/// Loads the provider the configuration names (see [`provider_spec`]); records its
/// Secret grant in the configuration so credential failures name it. Its Node lookups
/// are answered from the cache the operator lends `nodes`.
pub(crate) async fn load_provider(
    config: &mut OperatorConfig,
    client: kube::Client,
    fence: cro_runtime::Fence,
    nodes: NodeCache,
) -> Result<Arc<dyn DeviceProvider>, OperatorError> {
    let spec = provider_spec(config, |k| std::env::var(k).ok())?;
    config.credentials = spec.grants.secret.clone();
    load_spec(&spec, client, Some(fence), nodes).await
}
