//! What a component is: its world, contract version, imports and exports.

use serde::Serialize;
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use crate::base::error_chain;
use crate::cache::ComponentCache;
use crate::compile;

pub use crate::wit::SUPPORTED_VERSIONS;
use crate::wit::{EXPORTS, OWN_INTERFACES, PACKAGE, same_minor};

/// The world providers target (without version).
pub const PROVIDER_WORLD: &str = "cro:provider/provider-world";

/// The provider interfaces this host can call, with versions, for messages:
/// `cro:provider/provider@0.1.0 or cro:provider/cdi-provider@0.2.0 or ...`.
pub fn served_exports() -> String {
    EXPORTS
        .iter()
        .map(|(v, i)| format!("{PACKAGE}/{i}@{v}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Why bytes could not be inspected as a component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    #[error("not a WebAssembly file (it does not start with the `\\0asm` magic)")]
    NotWasm,
    #[error(
        "this is a core WebAssembly module, not a component: build the provider for \
         `wasm32-wasip2` (or wrap it with `wasm-tools component new`) so it becomes a \
         component of the {PROVIDER_WORLD} world"
    )]
    CoreModule,
    #[error("WebAssembly binary of unknown version/layer {0:#010x}")]
    UnknownLayer(u32),
    #[error("not a valid WebAssembly component: {0}")]
    Invalid(String),
}

/// One import or export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// e.g. `cro:provider/http@0.1.0` or `wasi:cli/environment@0.2.6`.
    pub name: String,
    /// `instance`, `function`, `module`, `component`, `type`, `resource`.
    pub kind: &'static str,
    /// The functions of an instance (or the item itself when it is a function).
    pub functions: Vec<String>,
}

/// A component's shape as far as the host cares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentInfo {
    /// `cro:provider/provider-world@<version>` when it exports the provider interface.
    pub world: Option<String>,
    /// The version of the exported `cro:provider` interface (`provider` in 0.1.0,
    /// `cdi-provider` since 0.2.0).
    pub contract_version: Option<String>,
    /// Whether this host serves that version.
    pub supported_version: bool,
    pub imports: Vec<Item>,
    pub exports: Vec<Item>,
    /// Imports this host does not provide (the component cannot be instantiated here).
    pub unsatisfied_imports: Vec<String>,
    /// What it asks the compiler to compile (checked against `limits.compile_max_*`).
    pub code: compile::Shape,
}

/// Checks the binary header: components pass, anything else is named.
pub fn sniff(bytes: &[u8]) -> Result<(), InspectError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(InspectError::NotWasm);
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&bytes[4..8]);
    match u32::from_le_bytes(version) {
        0x0000_0001 => Err(InspectError::CoreModule),
        // Component binaries: version 0x0d (the pre-1.0 component encoding), layer 1.
        v if v >> 16 == 1 => Ok(()),
        v => Err(InspectError::UnknownLayer(v)),
    }
}

/// Compiles `bytes` with a plain engine (through the environment's component cache and
/// the default compile limits, see `crate::compile`) and describes the component.
pub fn inspect(bytes: &[u8]) -> Result<ComponentInfo, InspectError> {
    sniff(bytes)?;
    let invalid = |e: &dyn std::fmt::Display| InspectError::Invalid(e.to_string());
    let limits = crate::Limits::default();
    let shape = compile::scan::shape(bytes).map_err(|e| invalid(&e))?;
    compile::check(&shape, &limits).map_err(|e| invalid(&e))?;
    let max_memory_bytes = crate::engine::DEFAULT_MAX_MEMORY_BYTES;
    let engine = Engine::new(&crate::compile::compile_config(max_memory_bytes))
        .map_err(|e| InspectError::Invalid(error_chain(&e)))?;
    let cache = ComponentCache::from_env();
    let component = crate::cache::compile(cache.as_ref(), &engine, bytes, || {
        let compiler = compile::Compiler::from_process();
        let bounds = compile::Bounds::of(&limits);
        compile::compile(&compiler, &engine, max_memory_bytes, bytes, &bounds)
            .map_err(wasmtime::Error::new)
    })
    .map_err(|e| InspectError::Invalid(error_chain(&e)))?;
    Ok(describe(&engine, &component, shape))
}

fn item(engine: &Engine, name: &str, ty: &ComponentItem) -> Item {
    let (kind, functions) = match ty {
        ComponentItem::ComponentInstance(instance) => (
            "instance",
            instance
                .exports(engine)
                .filter(|(_, e)| matches!(e.ty, ComponentItem::ComponentFunc(_)))
                .map(|(n, _)| n.to_string())
                .collect(),
        ),
        ComponentItem::ComponentFunc(_) => ("function", vec![name.to_string()]),
        ComponentItem::CoreFunc(_) => ("core function", vec![name.to_string()]),
        ComponentItem::Module(_) => ("module", Vec::new()),
        ComponentItem::Component(_) => ("component", Vec::new()),
        ComponentItem::Type(_) => ("type", Vec::new()),
        ComponentItem::Resource(_) => ("resource", Vec::new()),
    };
    Item {
        name: name.to_string(),
        kind,
        functions,
    }
}

pub(crate) fn describe(
    engine: &Engine,
    component: &Component,
    code: compile::Shape,
) -> ComponentInfo {
    let ty = component.component_type();
    let imports: Vec<Item> = ty
        .imports(engine)
        .map(|(name, e)| item(engine, name, &e.ty))
        .collect();
    let exports: Vec<Item> = ty
        .exports(engine)
        .map(|(name, e)| item(engine, name, &e.ty))
        .collect();
    // Any exported interface of the contract's package says which version the
    // component targets, even one this host does not know.
    let contract_version = exports.iter().find_map(|e| {
        let rest = e.name.strip_prefix(PACKAGE)?.strip_prefix('/')?;
        match rest.split_once('@') {
            Some((_, version)) => Some(version.to_string()),
            None => Some("unversioned".to_string()),
        }
    });
    let supported_version = contract_version
        .as_deref()
        .is_some_and(|v| SUPPORTED_VERSIONS.iter().any(|s| same_minor(s, v)));
    let unsatisfied_imports = imports
        .iter()
        .filter(|i| !host_provides(&i.name))
        .map(|i| i.name.clone())
        .collect();
    ComponentInfo {
        world: contract_version
            .as_ref()
            .map(|v| format!("{PROVIDER_WORLD}@{v}")),
        contract_version,
        supported_version,
        imports,
        exports,
        unsatisfied_imports,
        code,
    }
}

const WASI_INTERFACES: &[(&str, &[&str])] = &[
    ("io", &["error", "poll", "streams"]),
    ("clocks", &["wall-clock", "monotonic-clock"]),
    ("filesystem", &["types", "preopens"]),
    ("random", &["random", "insecure", "insecure-seed"]),
    (
        "cli",
        &[
            "exit",
            "environment",
            "stdin",
            "stdout",
            "stderr",
            "terminal-input",
            "terminal-output",
            "terminal-stdin",
            "terminal-stdout",
            "terminal-stderr",
        ],
    ),
    (
        "sockets",
        &[
            "tcp",
            "udp",
            "udp-create-socket",
            "tcp-create-socket",
            "instance-network",
            "network",
            "ip-name-lookup",
        ],
    ),
];

/// Whether the runtime's linker defines an import of this name (for messages; the
/// linker's own check is the authority).
fn host_provides(name: &str) -> bool {
    let Some((path, version)) = name.split_once('@') else {
        return false;
    };
    let Some((package, interface)) = path.split_once('/') else {
        return false;
    };
    match package {
        PACKAGE => OWN_INTERFACES
            .iter()
            .any(|(v, ifaces)| same_minor(v, version) && ifaces.contains(&interface)),
        _ => package.strip_prefix("wasi:").is_some_and(|wasi| {
            same_minor("0.2.0", version)
                && WASI_INTERFACES
                    .iter()
                    .any(|(p, ifaces)| *p == wasi && ifaces.contains(&interface))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_headers() {
        assert_eq!(sniff(b""), Err(InspectError::NotWasm));
        assert_eq!(sniff(b"#!/bin/sh\necho hi\n"), Err(InspectError::NotWasm));
        assert_eq!(sniff(b"\0asm\x01\0\0\0"), Err(InspectError::CoreModule));
        assert_eq!(sniff(b"\0asm\x0d\0\x01\0"), Ok(()));
        assert_eq!(
            sniff(b"\0asm\x02\0\0\0"),
            Err(InspectError::UnknownLayer(2))
        );
    }

    #[test]
    fn knows_what_the_host_provides() {
        for ok in [
            "cro:provider/http@0.1.0",
            "cro:provider/state@0.1.3",
            "cro:provider/types@0.2.0",
            "wasi:cli/environment@0.2.6",
            "wasi:io/streams@0.2.0",
            "wasi:sockets/tcp@0.2.3",
        ] {
            assert!(host_provides(ok), "{ok}");
        }
        for missing in [
            "cro:provider/http@0.2.0",
            "cro:provider/types@0.4.0",
            "cro:provider/backdoor@0.1.0",
            "wasi:http/outgoing-handler@0.2.0",
            "wasi:cli/environment@0.3.0",
            "acme:extra/backdoor@1.0.0",
            "env",
        ] {
            assert!(!host_provides(missing), "{missing}");
        }
    }
}
