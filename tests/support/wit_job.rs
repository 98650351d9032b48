//! The WIT job record the plugin tests prepare executors with, shared by
//! tests/plugin_host.rs and tests/plugin_security.rs.

use std::path::Path;

use runway::bindings::executor::exports::runway::executor0_1_0::executor::Job;

/// A one-hour job of `group/project` whose builds, project and cache live under `dir`.
pub(crate) fn job(dir: &Path) -> Job {
    Job {
        id: 1,
        name: "test".into(),
        project_path: "group/project".into(),
        shell: "bash".into(),
        builds_dir: dir.display().to_string(),
        project_dir: dir.display().to_string(),
        cache_dir: dir.join("cache").display().to_string(),
        config: "{}".into(),
        timeout_seconds: 3600,
        image: None,
        services: Vec::new(),
    }
}
