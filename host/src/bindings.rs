//! Host-side bindings generated from `wit/`. Imports are async (the host does I/O) and
//! trappable (a host bug traps the call instead of panicking); exports are called async so a
//! busy guest yields to tokio at every epoch tick.
//!
//! A leaf: the WIT types as Rust, nothing else. `capability` implements the imports on its
//! contexts, `plugin` instantiates and links, `executor` calls the exports. Everything else
//! speaks the domain types of those modules, never these.

/// `runway:executor/executor-plugin@0.7.0` (which links plugins built against 0.1.0 to 0.6.0
/// too: the exported interface is the same, the imports a superset).
#[allow(missing_docs)] // generated; the WIT files carry the documentation
pub mod executor {
    wasmtime::component::bindgen!({
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
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

/// `runway:fleeting/fleeting-plugin`; host interfaces are shared with the executor bindings
/// so each is implemented once.
#[allow(missing_docs)] // generated; the WIT files carry the documentation
pub mod fleeting {
    wasmtime::component::bindgen!({
        world: "runway:fleeting/fleeting-plugin@0.1.0",
        path: ["../wit/host", "../wit/fleeting"],
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "runway:host/log@0.1.0": super::executor::runway::host0_1_0::log,
            "runway:host/kv@0.1.0": super::executor::runway::host0_1_0::kv,
            "runway:host/plugin@0.1.0": super::executor::runway::host0_1_0::plugin,
        },
    });
}
