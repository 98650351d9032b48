//! Small persistent state scoped to the plugin, kept by the host.

use crate::bindings::executor::runway::host0_1_0::kv as wit;
pub use crate::bindings::executor::runway::host0_1_0::kv::KvError;

/// The value under `key`.
pub fn get(key: &str) -> Result<Option<Vec<u8>>, KvError> {
    wit::get(key)
}
/// Store `value` under `key`.
pub fn set(key: &str, value: &[u8]) -> Result<(), KvError> {
    wit::set(key, value)
}
/// Remove `key`.
pub fn delete(key: &str) -> Result<(), KvError> {
    wit::delete(key)
}
/// Keys starting with `prefix`.
pub fn list_keys(prefix: &str) -> Result<Vec<String>, KvError> {
    wit::list_keys(prefix)
}
