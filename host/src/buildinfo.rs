//! What this build is: the version, the git revision it was built from, and the platform
//! names GitLab expects (Go's `GOOS`/`GOARCH` spellings).
//!
//! A leaf: the job header, the runner `info` object, the user agent, `CI_RUNNER_*` variables
//! and the version metric all read it, and it imports nothing of the crate.

/// The crate version (`0.1.0`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit this binary was built from (short hash),
/// set by `host/build.rs`; `unknown` outside a git checkout.
pub const REVISION: &str = env!("RUNWAY_REVISION");

/// `std::env::consts::OS` (GitLab's `platform`).
pub const OS: &str = std::env::consts::OS;

/// `std::env::consts::ARCH` in Go's `GOARCH` spelling, as GitLab expects.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `runway 0.1.0 (linux/amd64)`: the user agent towards GitLab.
pub fn user_agent() -> String {
    format!("runway {VERSION} ({OS}/{})", go_arch())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_gitlabs() {
        assert!(!REVISION.is_empty());
        assert_ne!(go_arch(), "x86_64");
        assert!(user_agent().starts_with("runway "));
    }
}
