//! The capability import interfaces (`http`, `secrets`, `lookup`, `config`, `log`,
//! `state`), as every served contract version imports them: unchanged since 0.1.0, so
//! 0.2.0's world imports the 0.1.0 interfaces and both version modules map them here.
//! A leaf: the capability modules implement these traits without knowing any version.

wasmtime::component::bindgen!({
    path: "../../wit/since_v0.1.0",
    inline: "
        package cro-host:imports;
        world capability-imports {
            import cro:provider/http@0.1.0;
            import cro:provider/secrets@0.1.0;
            import cro:provider/lookup@0.1.0;
            import cro:provider/config@0.1.0;
            import cro:provider/log@0.1.0;
            import cro:provider/state@0.1.0;
        }
    ",
    world: "cro-host:imports/capability-imports",
    imports: {
        // Host I/O: async, and trappable so the call's deadline can end the call from
        // inside a host import.
        "cro:provider/http.send": async | trappable,
        "cro:provider/secrets.get": async | trappable,
        "cro:provider/lookup": async | trappable,
        // The log budget ends a call that logs past it.
        "cro:provider/log.log": trappable,
    },
});

pub(crate) use cro::provider::{config, http, log, lookup, secrets, state};
