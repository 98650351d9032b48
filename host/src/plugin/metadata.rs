//! Reading a plugin's identity from its `runway-plugin` custom section before compiling it.
//!
//! The whole binary is parsed first, so a truncated or corrupt file is refused here in
//! microseconds, with a message naming the file, instead of reaching the compiler.

use std::fmt;

/// Versions of the WIT packages this host implements. A plugin built against another
/// version is refused with a message naming both.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["0.1"];

/// Which contract a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginKind {
    Executor,
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
    pub name: String,
    pub kind: PluginKind,
    pub version: String,
    pub api_version: String,
    pub description: String,
}

/// Parse and validate the metadata section of a component.
pub fn read(bytes: &[u8]) -> Result<PluginMeta, String> {
    let mut section: Option<Vec<u8>> = None;
    let mut saw_component = false;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a valid WebAssembly file (truncated or corrupt?): {e}"))?;
        match payload {
            wasmparser::Payload::Version { encoding, .. } => {
                if encoding == wasmparser::Encoding::Component {
                    saw_component = true;
                }
            }
            wasmparser::Payload::CustomSection(reader) if reader.name() == "runway-plugin" => {
                section.get_or_insert_with(|| reader.data().to_vec());
            }
            _ => {}
        }
    }
    if !saw_component {
        return Err("a core WebAssembly module, not a component: build with `--target wasm32-wasip2`".into());
    }
    let section =
        section.ok_or("no `runway-plugin` metadata section: build the plugin with runway-sdk's export macro")?;
    let text = std::str::from_utf8(&section).map_err(|_| "metadata section is not UTF-8".to_string())?;
    parse_section(text)
}

fn parse_section(text: &str) -> Result<PluginMeta, String> {
    let mut lines = text.lines();
    if lines.next() != Some("runway-plugin-v1") {
        return Err("metadata section has an unknown format (expected runway-plugin-v1)".into());
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
    let name = name.filter(|n| !n.is_empty()).ok_or("metadata has no plugin name")?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(format!("plugin name {name:?} may only contain letters, digits, '-' and '_'"));
    }
    let kind = match kind.as_deref() {
        Some("executor") => PluginKind::Executor,
        Some("fleeting") => PluginKind::Fleeting,
        other => return Err(format!("unknown plugin kind {other:?} (expected executor or fleeting)")),
    };
    let api_version = api.ok_or("metadata has no API version")?;
    check_api(&api_version)?;
    Ok(PluginMeta { name, kind, version: version.unwrap_or_default(), api_version, description })
}

/// Is a plugin built against `api_version` loadable by this host?
pub fn check_api(api_version: &str) -> Result<(), String> {
    let mut parts = api_version.split('.');
    let major = parts.next().unwrap_or("");
    let minor = parts.next().unwrap_or("");
    let key = if major == "0" { format!("0.{minor}") } else { major.to_string() };
    if SUPPORTED_API_VERSIONS.contains(&key.as_str()) {
        Ok(())
    } else {
        Err(format!(
            "built against Runway plugin API {api_version}, but this runner supports {}",
            SUPPORTED_API_VERSIONS.iter().map(|v| format!("{v}.x")).collect::<Vec<_>>().join(", ")
        ))
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
        let err = parse_section("runway-plugin-v1\nname=x\nkind=executor\napi=0.2.0\n").expect_err("0.2 unsupported");
        assert!(err.contains("0.2.0") && err.contains("0.1.x"), "{err}");
        assert!(check_api("0.1.7").is_ok());
        assert!(check_api("1.0.0").is_err());
    }

    #[test]
    fn refuses_garbage() {
        assert!(read(b"not wasm at all").is_err());
        // A core module header, not a component.
        assert!(read(b"\0asm\x01\0\0\0").expect_err("core module").contains("not a component"));
    }
}
