//! The `cro:provider/http` import's bindings, as every served contract version imports
//! it (unchanged since 0.1.0; the version modules in `crate::wit` map it here).

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    inline: "
        package cro-host:http;
        world imports {
            import cro:provider/http@0.1.0;
        }
    ",
    world: "cro-host:http/imports",
    imports: {
        // Host I/O: async, and trappable so the call's deadline can end the call from
        // inside the import.
        "cro:provider/http.send": async | trappable,
    },
});

pub(crate) use self::cro::provider::http::*;
