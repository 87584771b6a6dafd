//! The WIT world's generated bindings, and nothing else: the component's glue
//! (`component`) and the wasi:http transport (`wasi_http`) both build on them.

wit_bindgen::generate!({
    path: "../wit",
    world: "clickhouse-state-backend",
    generate_all,
    default_bindings_module: "crate::bindings",
});
