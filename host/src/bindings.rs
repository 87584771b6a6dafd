//! Generated bindings of the `clickhouse-state-backend` world. wasi:http, wasi:io, wasi:random
//! and wasi:clocks come from wasmtime-wasi(-http); only our own interfaces are generated here.

// `host/wit` links to the workspace's `wit/`, so that `cargo package` (and with it the Python
// sdist, which maturin builds from it) carries the contract.
wasmtime::component::bindgen!({
    path: "wit",
    world: "meltano:state-backend/clickhouse-state-backend",
    imports: { default: async | trappable },
    exports: { default: async },
    require_store_data_send: true,
    with: {
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:random": wasmtime_wasi::p2::bindings::random,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
    },
});

pub use meltano::state_backend::types as wit;
