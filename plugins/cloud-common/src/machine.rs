//! What the `docker+machine` modes of the cloud plugins share: the `plugin_config.machine`
//! the host writes (name template, manager identity, `MachineOptions`), machine names as
//! gitlab-runner makes them, and reading one driver flag (`name=value`, a bare `name` for a
//! true boolean, a leading `--` allowed).
//!
//! Owns: those shapes. Must not touch: any driver's flags or cloud API (each plugin's own).

/// `plugin_config.machine`, written by the host for `executor = "docker+machine"`.
#[derive(serde::Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    /// The name template: `runner-<short token>-<MachineName>`, `%s` where the unique part goes.
    pub name: String,
    /// The manager's identity (its system id).
    pub manager: String,
    /// `[runners.machine] MachineOptions`.
    #[serde(default)]
    pub options: Vec<String>,
}

/// A machine's name: the template with `%s` filled as gitlab-runner fills it (its unix time and
/// four random bytes in hex), or with that appended when the template has no `%s`.
pub fn machine_name(template: &str, now: u64, random: [u8; 4]) -> String {
    let unique = format!("{now}-{}", random.iter().map(|b| format!("{b:02x}")).collect::<String>());
    if template.contains("%s") {
        template.replacen("%s", &unique, 1)
    } else {
        format!("{template}-{unique}")
    }
}

/// One `MachineOptions` entry as its flag name and value (`None` for a bare flag).
pub fn split(option: &str) -> (&str, Option<&str>) {
    let option = option.trim().trim_start_matches("--");
    match option.split_once('=') {
        Some((name, value)) => (name.trim(), Some(value.trim())),
        None => (option, None),
    }
}

/// A boolean flag's value (bare: true).
pub fn boolean(name: &str, value: Option<&str>) -> Result<bool, String> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("true") | Some("1") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some(other) => Err(format!("MachineOptions {name}={other}: not a boolean")),
    }
}

/// A flag that needs a value.
pub fn required<'a>(name: &str, value: Option<&'a str>) -> Result<&'a str, String> {
    value.filter(|v| !v.is_empty()).ok_or_else(|| format!("MachineOptions {name}: needs a value ({name}=...)"))
}

/// A numeric flag.
pub fn number<T: std::str::FromStr>(name: &str, value: Option<&str>) -> Result<T, String> {
    let text = required(name, value)?;
    text.parse().map_err(|_| format!("MachineOptions {name}={text}: not a number"))
}
