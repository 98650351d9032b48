//! `image: docker: platform:` (`os/arch[/variant]`, or a bare `arch` meaning Linux): parsed,
//! normalised the way the Engine and containerd spell it, and compared with an image's
//! inspect answer, so a local image of another platform is not taken for the one asked for.
//! Does not pull or talk to the engine.

use serde_json::Value;

/// A parsed platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// `linux` or `windows`.
    pub os: String,
    /// `amd64`, `arm64`, `arm`, `386`, ...
    pub architecture: String,
    /// `v7`, `v8`, ...; empty when not given.
    pub variant: String,
}

fn normalise_architecture(arch: &str) -> &str {
    match arch {
        "x86_64" | "x86-64" => "amd64",
        "aarch64" => "arm64",
        "i386" | "i686" => "386",
        other => other,
    }
}

/// Parse `raw` (`linux/arm64`, `linux/arm/v7`, `arm64`); an error says what is wrong.
pub fn parse(raw: &str) -> Result<Platform, String> {
    let lower = raw.trim().to_ascii_lowercase();
    let parts: Vec<&str> = lower.split('/').collect();
    let bad = || format!("invalid docker platform {raw:?}: expected os/arch[/variant], e.g. linux/arm64");
    if parts.iter().any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')) {
        return Err(bad());
    }
    let (os, arch, variant) = match parts.as_slice() {
        [arch] => ("linux", *arch, ""),
        [os, arch] => (*os, *arch, ""),
        [os, arch, variant] => (*os, *arch, *variant),
        _ => return Err(bad()),
    };
    // Only Linux and Windows container images exist (gitlab-runner's normalisation).
    let os = if os == "linux" || os == "windows" { os } else { "linux" };
    let architecture = normalise_architecture(arch).to_string();
    let mut variant = variant.to_string();
    if architecture == "arm64" && variant == "v8" {
        variant.clear();
    }
    Ok(Platform { os: os.to_string(), architecture, variant })
}

impl Platform {
    /// The Engine API's `platform` query value.
    pub fn as_query(&self) -> String {
        if self.variant.is_empty() {
            format!("{}/{}", self.os, self.architecture)
        } else {
            format!("{}/{}/{}", self.os, self.architecture, self.variant)
        }
    }

    /// Whether `inspect` (`GET /images/{name}/json`) is an image of this platform; an image
    /// without a variant matches a platform asking for none.
    pub fn matches(&self, inspect: &Value) -> bool {
        let os = inspect["Os"].as_str().unwrap_or_default();
        let arch = normalise_architecture(inspect["Architecture"].as_str().unwrap_or_default());
        let variant = inspect["Variant"].as_str().unwrap_or_default();
        os == self.os && arch == self.architecture && (self.variant.is_empty() || variant == self.variant)
    }
}

/// How an inspected image's platform is spelled in messages (`linux/amd64`).
pub fn of_image(inspect: &Value) -> String {
    let os = inspect["Os"].as_str().unwrap_or("unknown");
    let arch = inspect["Architecture"].as_str().unwrap_or("unknown");
    match inspect["Variant"].as_str().filter(|v| !v.is_empty()) {
        Some(variant) => format!("{os}/{arch}/{variant}"),
        None => format!("{os}/{arch}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_and_normalises() {
        assert_eq!(parse("linux/arm64").unwrap().as_query(), "linux/arm64");
        assert_eq!(parse("arm64").unwrap().as_query(), "linux/arm64");
        assert_eq!(parse("linux/x86_64").unwrap().as_query(), "linux/amd64");
        assert_eq!(parse("linux/arm/v7").unwrap().as_query(), "linux/arm/v7");
        assert_eq!(parse("linux/arm64/v8").unwrap().as_query(), "linux/arm64");
        assert_eq!(parse("darwin/arm64").unwrap().as_query(), "linux/arm64");
        for bad in ["", "linux/", "a/b/c/d", "linux/amd64?x=1", "linux//amd64"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn matches_inspected_images() {
        let amd = json!({"Os": "linux", "Architecture": "amd64"});
        let arm7 = json!({"Os": "linux", "Architecture": "arm", "Variant": "v7"});
        assert!(parse("linux/amd64").unwrap().matches(&amd));
        assert!(!parse("linux/arm64").unwrap().matches(&amd));
        assert!(parse("linux/arm").unwrap().matches(&arm7));
        assert!(parse("linux/arm/v7").unwrap().matches(&arm7));
        assert!(!parse("linux/arm/v6").unwrap().matches(&arm7));
        assert_eq!(of_image(&arm7), "linux/arm/v7");
        assert_eq!(of_image(&amd), "linux/amd64");
    }
}
