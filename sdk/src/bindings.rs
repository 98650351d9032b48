//! Generated bindings; plugin authors use the wrappers in the other modules instead.

/// The `runway:executor/executor-plugin` world.
pub mod executor {
    wit_bindgen::generate!({
        world: "runway:executor/executor-plugin@0.7.0",
        path: [
            "../wit/host",
            "../wit/executor",
            "../wit/0.2.0/host",
            "../wit/0.2.0/executor",
            "../wit/0.3.0/host",
            "../wit/0.3.0/executor",
            "../wit/0.4.0/host",
            "../wit/0.4.0/executor",
            "../wit/0.5.0/host",
            "../wit/0.5.0/executor",
            "../wit/0.6.0/host",
            "../wit/0.6.0/executor",
            "../wit/0.7.0/host",
            "../wit/0.7.0/executor",
        ],
        runtime_path: "::runway_sdk::wit_bindgen::rt",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "::runway_sdk::bindings::executor",
        generate_all,
    });
}

/// The `runway:fleeting/fleeting-plugin` world. Host interfaces are shared with the
/// executor bindings.
pub mod fleeting {
    wit_bindgen::generate!({
        world: "runway:fleeting/fleeting-plugin@0.1.0",
        path: ["../wit/host", "../wit/fleeting"],
        runtime_path: "::runway_sdk::wit_bindgen::rt",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "::runway_sdk::bindings::fleeting",
        with: {
            "runway:host/log@0.1.0": crate::bindings::executor::runway::host0_1_0::log,
            "runway:host/kv@0.1.0": crate::bindings::executor::runway::host0_1_0::kv,
            "runway:host/plugin@0.1.0": crate::bindings::executor::runway::host0_1_0::plugin,
        },
        generate_all,
    });
}
