//! `runway-sdk`: write Runway plugins as WebAssembly components.
//!
//! A plugin is a struct, a trait implementation and one macro line:
//!
//! ```ignore
//! use runway_sdk::executor::*;
//!
//! struct Hello;
//! struct HelloEnv;
//!
//! impl Executor for Hello {
//!     type Environment = HelloEnv;
//!     fn info(_config: &str) -> Result<ProviderInfo, ExecutorError> {
//!         Ok(ProviderInfo::new("hello", "bash"))
//!     }
//!     fn prepare(_job: Job) -> Result<HelloEnv, ExecutorError> { Ok(HelloEnv) }
//! }
//! impl Environment for HelloEnv {
//!     fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
//!         runway_sdk::trace::write_str(&format!("would run {}\n", stage.name));
//!         Ok(ExitStatus { code: 0 })
//!     }
//! }
//!
//! runway_sdk::export_executor!(Hello, name: "hello", description: "prints stage names");
//! ```
//!
//! Build with `cargo build --release --target wasm32-wasip2` and copy the `.wasm` file into
//! the runner's `plugins_dir`. The SDK hides the generated bindings; it re-exports the WIT
//! types under friendlier modules and wraps the host capabilities (`log`, `trace`, `process`,
//! `kv`, `remote`, `files`, `docker`, `docker_stages`, `kube`, `terminal`, `job`, `supervisor`, `job_config`) in small idiomatic APIs.

#![deny(missing_docs)]

// Lets the generated bindings name `::runway_sdk::...` from inside this crate too.
extern crate self as runway_sdk;

#[doc(hidden)]
pub use wit_bindgen;

#[doc(hidden)]
pub mod bindings;
#[doc(hidden)]
pub mod export;

pub mod docker;
pub mod docker_stages;
pub mod executor;
pub mod files;
pub mod fleeting;
pub mod job;
pub mod job_config;
pub mod kube;
pub mod kv;
pub mod log;
pub mod process;
pub mod remote;
pub mod supervisor;
pub mod terminal;
pub mod trace;

/// Version of the WIT packages this SDK implements; the host refuses plugins whose major
/// (or, before 1.0, minor) version differs from its own.
pub const API_VERSION: &str = "0.7.0";

#[doc(hidden)]
pub mod meta {
    //! The `runway-plugin` custom section: read by the host before compiling a plugin.

    /// Name of the custom section.
    pub const SECTION: &str = "runway-plugin";

    /// Copies a string into a byte array at compile time.
    pub const fn to_array<const N: usize>(s: &str) -> [u8; N] {
        let bytes = s.as_bytes();
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N {
            out[i] = bytes[i];
            i += 1;
        }
        out
    }
}

/// Embeds the metadata custom section. Used by the export macros.
#[doc(hidden)]
#[macro_export]
macro_rules! __embed_metadata {
    ($kind:literal, $name:expr, $description:expr) => {
        const __RUNWAY_PLUGIN_META: &str = concat!(
            "runway-plugin-v1\n",
            "name=",
            $name,
            "\n",
            "kind=",
            $kind,
            "\n",
            "version=",
            env!("CARGO_PKG_VERSION"),
            "\n",
            // `concat!` takes literals only: keep equal to `API_VERSION` (the host refuses a
            // plugin whose section and `metadata()` disagree).
            "api=0.7.0\n",
            "description=",
            $description,
            "\n",
        );
        #[link_section = "runway-plugin"]
        #[used]
        static __RUNWAY_PLUGIN_SECTION: [u8; __RUNWAY_PLUGIN_META.len()] =
            $crate::meta::to_array::<{ __RUNWAY_PLUGIN_META.len() }>(__RUNWAY_PLUGIN_META);
    };
}

/// Exports an executor plugin: `export_executor!(MyExecutor, name: "x", description: "...")`.
///
/// `MyExecutor` implements [`executor::Executor`]. The macro exports the component's
/// `runway:executor/executor` and `runway:host/plugin` interfaces and embeds the metadata
/// (name, kind, version from `CARGO_PKG_VERSION`, API version) the host reads before compiling.
#[macro_export]
macro_rules! export_executor {
    ($ty:ty, name: $name:literal, description: $description:literal $(,)?) => {
        $crate::__embed_metadata!("executor", $name, $description);
        #[doc(hidden)]
        type __RunwayExecutorComponent = $crate::export::Component<$ty>;
        impl $crate::export::Named for $ty {
            const NAME: &'static str = $name;
            const DESCRIPTION: &'static str = $description;
            const VERSION: &'static str = env!("CARGO_PKG_VERSION");
        }
        $crate::bindings::executor::export!(
            __RunwayExecutorComponent with_types_in $crate::bindings::executor
        );
    };
}

/// Exports a fleeting provider plugin: `export_fleeting!(MyGroup, name: "x", description: "...")`.
///
/// `MyGroup` implements [`fleeting::InstanceGroup`]. One value of it lives as long as the
/// host keeps the plugin instance; the host calls it one call at a time.
#[macro_export]
macro_rules! export_fleeting {
    ($ty:ty, name: $name:literal, description: $description:literal $(,)?) => {
        $crate::__embed_metadata!("fleeting", $name, $description);
        #[doc(hidden)]
        type __RunwayFleetingComponent = $crate::export::Component<$ty>;
        impl $crate::export::Named for $ty {
            const NAME: &'static str = $name;
            const DESCRIPTION: &'static str = $description;
            const VERSION: &'static str = env!("CARGO_PKG_VERSION");
        }
        $crate::bindings::fleeting::export!(
            __RunwayFleetingComponent with_types_in $crate::bindings::fleeting
        );
    };
}
