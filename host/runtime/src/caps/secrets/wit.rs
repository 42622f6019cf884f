//! The `cro:provider/secrets` import's bindings, as every served contract version
//! imports it (unchanged since 0.1.0; the version modules in `crate::wit` map it here).

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    inline: "
        package cro-host:secrets;
        world imports {
            import cro:provider/secrets@0.1.0;
        }
    ",
    world: "cro-host:secrets/imports",
    imports: {
        // Reads the cluster: async, and trappable for the deadline and the read budget.
        "cro:provider/secrets.get": async | trappable,
    },
});

pub(crate) use self::cro::provider::secrets::*;
