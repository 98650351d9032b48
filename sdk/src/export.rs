//! What the export macros generate code against, shared by both plugin kinds: the
//! [`Named`] facts a macro records about the plugin type, the [`Component`] type exported for
//! it, and the [`metadata`] every plugin returns. Not for plugin authors to use directly.

use std::marker::PhantomData;

use crate::bindings::executor::runway::host0_1_0::plugin::{PluginKind, PluginMetadata};

/// Name, description and version of a plugin type, implemented by the export macros.
pub trait Named {
    /// The plugin's name (what `executor = "..."` or `plugin = "..."` refers to).
    const NAME: &'static str;
    /// One line for `runway plugins list`.
    const DESCRIPTION: &'static str;
    /// The plugin crate's version (`CARGO_PKG_VERSION`).
    const VERSION: &'static str;
}

/// The component type the export macros export for plugin type `T`.
pub struct Component<T>(PhantomData<T>);

/// The metadata of plugin type `T` of `kind`, with the API version this SDK speaks.
pub fn metadata<T: Named>(kind: PluginKind) -> PluginMetadata {
    PluginMetadata {
        name: T::NAME.to_string(),
        kind,
        version: T::VERSION.to_string(),
        api_version: crate::API_VERSION.to_string(),
        description: T::DESCRIPTION.to_string(),
    }
}
