//! The machinery of the capability list: [`capabilities!`] takes the list (written once,
//! in `crate::caps`) and makes from it everything that iterates over capabilities: the
//! spec's `Grants` and their validation, the provider-level and per-call state
//! (`Capabilities`, `CallCapabilities`), the linker's host functions (`add_to_linker`)
//! and the capability report (`report`). A capability missing from the list is missing
//! everywhere, and the list's tests (`crate::caps::tests`) fail for one half there.
//! A leaf: it names no capability and no other module.

/// Each entry: `field: CapabilityType`, then, for a capability with a section under
/// `grants`, `{ /// docs  key: GrantType }` (the type must be the capability's `Grant`).
macro_rules! capabilities {
    (@grant $grants:ident) => { &$crate::caps::capability::NoGrant };
    (@grant $grants:ident $key:ident) => { &$grants.$key };
    ($(
        $field:ident: $cap:ty $({ $(#[$doc:meta])* $key:ident: $grant:ty })?
    ),* $(,)?) => {
        /// The capabilities granted to one provider. The default grants nothing.
        #[derive(Debug, Clone, Default, PartialEq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct Grants {
            $($(
                $(#[$doc])*
                #[serde(default)]
                pub $key: $grant,
            )?)*
        }

        impl Grants {
            /// Each capability's check of its own section.
            pub(crate) fn validate(&self) -> Result<(), $crate::base::FieldError> {
                $($( <$cap as $crate::caps::capability::Capability>::validate(&self.$key)?; )?)*
                Ok(())
            }
        }

        /// Every capability's provider-level side.
        pub(crate) struct Capabilities {
            $( pub(crate) $field: ::std::sync::Arc<<$cap as $crate::caps::capability::Capability>::Shared>, )*
        }

        /// A store's data that holds a call's capabilities (the linker finds them
        /// through it).
        pub(crate) trait HasCapabilities {
            fn capabilities(&mut self) -> &mut CallCapabilities;
        }

        /// Every capability's side of one call.
        pub(crate) struct CallCapabilities {
            $( pub(crate) $field: <$cap as $crate::caps::capability::Capability>::Call, )*
        }

        impl Capabilities {
            /// Each capability's provider-level side, from its grant.
            pub(crate) fn load(
                grants: &Grants,
                load: &$crate::caps::capability::Load<'_>,
            ) -> Result<Capabilities, $crate::caps::capability::SetupError> {
                Ok(Capabilities {
                    $( $field: {
                        let name = <$cap as $crate::caps::capability::Capability>::NAME;
                        ::tracing::trace!(provider = load.provider, capability = name, "setting up");
                        ::std::sync::Arc::new(<$cap as $crate::caps::capability::Capability>::load(
                            $crate::caps::registry::capabilities!(@grant grants $($key)?),
                            load,
                        )?)
                    }, )*
                })
            }

            /// Each capability's side of a new call.
            pub(crate) fn call(&self, setup: &$crate::caps::capability::CallSetup) -> CallCapabilities {
                CallCapabilities {
                    $( $field: <$cap as $crate::caps::capability::Capability>::call(&self.$field, setup), )*
                }
            }
        }

        /// Every capability's host functions.
        pub(crate) fn add_to_linker<T>(
            linker: &mut ::wasmtime::component::Linker<T>,
        ) -> ::wasmtime::Result<()>
        where
            T: $crate::caps::HasCapabilities + ::wasmtime_wasi::WasiView + 'static,
        {
            $( <$cap as $crate::caps::capability::Capability>::add_to_linker(
                linker,
                |t| &mut $crate::caps::HasCapabilities::capabilities(t).$field,
            )?; )*
            Ok(())
        }

        /// Every capability's part of the capability report, in registration order.
        pub(crate) fn report(
            grants: &Grants,
            declared: &$crate::caps::capability::Declared<'_>,
            findings: &mut $crate::caps::capability::Findings,
        ) {
            $( <$cap as $crate::caps::capability::Capability>::report($crate::caps::registry::capabilities!(@grant grants $($key)?), declared, findings); )*
        }

        /// Every capability's name, in registration order.
        #[cfg(test)]
        const NAMES: &[&str] = &[$( <$cap as $crate::caps::capability::Capability>::NAME, )*];

        /// `(name, grants key)` of every capability that has a section under `grants`.
        #[cfg(test)]
        const GRANTED: &[(&str, &str)] = &[$($( (<$cap as $crate::caps::capability::Capability>::NAME, stringify!($key)), )?)*];

        /// For each capability with a section: its name and grants with only its
        /// example set.
        #[cfg(test)]
        fn examples() -> Vec<(&'static str, Grants)> {
            vec![$($( (<$cap as $crate::caps::capability::Capability>::NAME, Grants {
                $key: <$cap as $crate::caps::capability::Capability>::example(),
                ..Grants::default()
            }), )?)*]
        }
    };
}

pub(crate) use capabilities;
