//! A fleeting provider over a fixed list of machines reachable over SSH: the on-prem case.
//!
//! `plugin_config`: `{"hosts": ["10.0.0.5", "build-2:2222", ...]}`. `increase(n)` takes up to
//! `n` idle hosts into service, `decrease(ids)` takes them out; `update` reports the hosts in
//! service as running. Which hosts are in service is kept in the plugin's key-value store, so
//! a runner restart (or a plugin reload) adopts them instead of forgetting them.
//!
//! `increase` prefers hosts never taken out of service, then the ones released longest ago:
//! a host just removed (failed its ready command, went unhealthy) is the last to come back.

use runway_sdk::fleeting::*;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    hosts: Vec<String>,
}

struct StaticGroup {
    hosts: Vec<String>,
    connector: ConnectorConfig,
}

const IN_SERVICE: &str = "in-service";
const RELEASED: &str = "released";

impl StaticGroup {
    fn in_service(&self) -> Result<Vec<String>, ProviderError> {
        let stored = runway_sdk::kv::get(IN_SERVICE)?.unwrap_or_default();
        let text = String::from_utf8_lossy(&stored);
        // Hosts removed from the config are no longer ours to hand out.
        Ok(text.lines().filter(|h| self.hosts.iter().any(|c| c == h)).map(str::to_string).collect())
    }

    fn store(&self, hosts: &[String]) -> Result<(), ProviderError> {
        runway_sdk::kv::set(IN_SERVICE, hosts.join("\n").as_bytes()).map_err(ProviderError::from)
    }

    /// Hosts taken out of service, oldest release first.
    fn released(&self) -> Result<Vec<String>, ProviderError> {
        let stored = runway_sdk::kv::get(RELEASED)?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&stored).lines().map(str::to_string).collect())
    }

    fn store_released(&self, hosts: &[String]) -> Result<(), ProviderError> {
        runway_sdk::kv::set(RELEASED, hosts.join("\n").as_bytes()).map_err(ProviderError::from)
    }
}

impl InstanceGroup for StaticGroup {
    fn init(connector: ConnectorConfig, plugin_config: &str) -> Result<(Self, ProviderInfo), ProviderError> {
        let config: Config = serde_json::from_str(plugin_config)
            .map_err(|e| ProviderError::InvalidConfig(format!("plugin_config: {e}")))?;
        if config.hosts.is_empty() {
            return Err(ProviderError::InvalidConfig("plugin_config.hosts is empty".into()));
        }
        let info = ProviderInfo {
            id: format!("static/{}", config.hosts.len()),
            max_size: u32::try_from(config.hosts.len()).unwrap_or(u32::MAX),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: Vec::new(),
        };
        Ok((StaticGroup { hosts: config.hosts, connector }, info))
    }

    fn update(&mut self) -> Result<Vec<Instance>, ProviderError> {
        Ok(self.in_service()?.into_iter().map(|id| Instance { id, state: InstanceState::Running }).collect())
    }

    fn increase(&mut self, n: u32) -> Result<u32, ProviderError> {
        let mut used = self.in_service()?;
        let released = self.released()?;
        let mut free: Vec<&String> = self.hosts.iter().filter(|h| !used.contains(h)).collect();
        // Never released first (config order), then by release time, oldest first.
        free.sort_by_key(|h| released.iter().position(|r| r == *h).map_or((0, 0), |i| (1, i)));
        let free: Vec<String> = free.into_iter().take(n as usize).cloned().collect();
        if free.is_empty() && n > 0 {
            return Err(ProviderError::Capacity(CapacityError {
                message: "every static host is in service".into(),
                retry_after_seconds: 60,
            }));
        }
        let added = free.len() as u32;
        used.extend(free);
        self.store(&used)?;
        Ok(added)
    }

    fn decrease(&mut self, ids: Vec<String>) -> Result<Vec<String>, ProviderError> {
        let used = self.in_service()?;
        let (removed, kept): (Vec<String>, Vec<String>) = used.into_iter().partition(|h| ids.contains(h));
        self.store(&kept)?;
        let mut released: Vec<String> = self.released()?.into_iter().filter(|h| !removed.contains(h)).collect();
        released.extend(removed.iter().cloned());
        self.store_released(&released)?;
        Ok(removed)
    }

    fn connect_info(&mut self, id: &str) -> Result<ConnectInfo, ProviderError> {
        if !self.hosts.iter().any(|h| h == id) {
            return Err(ProviderError::NotFound(id.to_string()));
        }
        Ok(ConnectInfo {
            id: id.to_string(),
            external_addr: Some(id.to_string()),
            internal_addr: Some(id.to_string()),
            connector: self.connector.clone(),
            expires_at: None,
        })
    }
}

runway_sdk::export_fleeting!(StaticGroup, name: "static", description: "a fixed list of SSH hosts");
