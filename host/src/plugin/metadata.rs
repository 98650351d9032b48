//! Reading a plugin's identity from its `runway-plugin` custom section before compiling it.
//!
//! The whole binary is parsed first, so a truncated or corrupt file is refused here in
//! microseconds, with a message naming the file, instead of reaching the compiler.
//!
//! Owns: [`PluginMeta`], the section format and API-version compatibility. Must not touch:
//! compiling, instantiating or granting plugins (the registry's).

use std::fmt;

/// Why a plugin binary's metadata was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// The binary does not parse.
    #[error("not a valid WebAssembly file (truncated or corrupt?): {0}")]
    Invalid(String),
    /// A core module where a component was expected.
    #[error("a core WebAssembly module, not a component: build with `--target wasm32-wasip2`")]
    CoreModule,
    /// No `runway-plugin` section.
    #[error("no `runway-plugin` metadata section: build the plugin with runway-sdk's export macro")]
    NoSection,
    /// The section is not UTF-8.
    #[error("metadata section is not UTF-8")]
    NotUtf8,
    /// The section's first line is not `runway-plugin-v1`.
    #[error("metadata section has an unknown format (expected runway-plugin-v1)")]
    UnknownFormat,
    /// No `name=`.
    #[error("metadata has no plugin name")]
    NoName,
    /// A name with characters outside `[A-Za-z0-9_-]`.
    #[error("plugin name {0:?} may only contain letters, digits, '-' and '_'")]
    BadName(String),
    /// A `kind=` other than executor or fleeting.
    #[error("unknown plugin kind {0:?} (expected executor or fleeting)")]
    UnknownKind(Option<String>),
    /// No `api=`.
    #[error("metadata has no API version")]
    NoApiVersion,
    /// Built against an API version this host does not implement.
    #[error("built against Runway plugin API {api_version}, but this runner supports {supported}")]
    UnsupportedApi {
        /// The plugin's API version.
        api_version: String,
        /// The versions this host supports (`0.1.x, ...`).
        supported: String,
    },
}

/// Versions of the WIT packages this host implements. A plugin built against another
/// version is refused with a message naming both.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7"];

/// Which contract a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginKind {
    /// `runway:executor/executor-plugin`.
    Executor,
    /// `runway:fleeting/fleeting-plugin`.
    Fleeting,
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PluginKind::Executor => "executor",
            PluginKind::Fleeting => "fleeting",
        })
    }
}

/// A plugin's identity as embedded by the SDK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginMeta {
    /// The plugin's name (what config.toml and `[plugins.NAME]` refer to).
    pub name: String,
    /// Which contract it implements.
    pub kind: PluginKind,
    /// Its own version.
    pub version: String,
    /// The WIT API version it was built against.
    pub api_version: String,
    /// A one-line description.
    pub description: String,
}

/// Parse and validate the metadata section of a component.
pub fn read(bytes: &[u8]) -> Result<PluginMeta, MetadataError> {
    let mut section: Option<Vec<u8>> = None;
    let mut saw_component = false;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| MetadataError::Invalid(e.to_string()))?;
        match payload {
            wasmparser::Payload::Version { encoding: wasmparser::Encoding::Component, .. } => {
                saw_component = true;
            }
            wasmparser::Payload::CustomSection(reader) if reader.name() == "runway-plugin" => {
                section.get_or_insert_with(|| reader.data().to_vec());
            }
            _ => {}
        }
    }
    if !saw_component {
        return Err(MetadataError::CoreModule);
    }
    let section = section.ok_or(MetadataError::NoSection)?;
    let text = std::str::from_utf8(&section).map_err(|_| MetadataError::NotUtf8)?;
    parse_section(text)
}

fn parse_section(text: &str) -> Result<PluginMeta, MetadataError> {
    let mut lines = text.lines();
    if lines.next() != Some("runway-plugin-v1") {
        return Err(MetadataError::UnknownFormat);
    }
    let (mut name, mut kind, mut version, mut api, mut description) = (None, None, None, None, String::new());
    for line in lines {
        let Some((key, value)) = line.split_once('=') else { continue };
        match key {
            "name" => name = Some(value.to_string()),
            "kind" => kind = Some(value.to_string()),
            "version" => version = Some(value.to_string()),
            "api" => api = Some(value.to_string()),
            "description" => description = value.to_string(),
            _ => {}
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or(MetadataError::NoName)?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(MetadataError::BadName(name));
    }
    let kind = match kind.as_deref() {
        Some("executor") => PluginKind::Executor,
        Some("fleeting") => PluginKind::Fleeting,
        _ => return Err(MetadataError::UnknownKind(kind)),
    };
    let api_version = api.ok_or(MetadataError::NoApiVersion)?;
    check_api(&api_version)?;
    Ok(PluginMeta { name, kind, version: version.unwrap_or_default(), api_version, description })
}

/// Is a plugin built against `api_version` loadable by this host?
pub fn check_api(api_version: &str) -> Result<(), MetadataError> {
    let mut parts = api_version.split('.');
    let major = parts.next().unwrap_or("");
    let minor = parts.next().unwrap_or("");
    let key = if major == "0" { format!("0.{minor}") } else { major.to_string() };
    if SUPPORTED_API_VERSIONS.contains(&key.as_str()) {
        Ok(())
    } else {
        Err(MetadataError::UnsupportedApi {
            api_version: api_version.to_string(),
            supported: SUPPORTED_API_VERSIONS.iter().map(|v| format!("{v}.x")).collect::<Vec<_>>().join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_section() {
        let meta =
            parse_section("runway-plugin-v1\nname=shell\nkind=executor\nversion=1.2.3\napi=0.1.0\ndescription=d\n")
                .expect("valid");
        assert_eq!(meta.name, "shell");
        assert_eq!(meta.kind, PluginKind::Executor);
        assert_eq!(meta.version, "1.2.3");
    }

    #[test]
    fn refuses_other_api_versions() {
        let err = parse_section("runway-plugin-v1\nname=x\nkind=executor\napi=0.8.0\n")
            .expect_err("0.8 unsupported")
            .to_string();
        assert!(err.contains("0.8.0") && err.contains("0.1.x, 0.2.x, 0.3.x, 0.4.x, 0.5.x, 0.6.x, 0.7.x"), "{err}");
        assert!(check_api("0.1.7").is_ok());
        assert!(check_api("0.2.0").is_ok());
        assert!(check_api("0.3.0").is_ok());
        assert!(check_api("0.4.0").is_ok());
        assert!(check_api("0.5.0").is_ok());
        assert!(check_api("0.6.0").is_ok());
        assert!(check_api("0.7.0").is_ok());
        assert!(check_api("1.0.0").is_err());
    }

    #[test]
    fn refuses_garbage() {
        assert!(read(b"not wasm at all").is_err());
        // A core module header, not a component.
        assert!(read(b"\0asm\x01\0\0\0").expect_err("core module").to_string().contains("not a component"));
    }
}
