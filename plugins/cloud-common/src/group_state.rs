//! What a cloud plugin remembers about its group between calls, in the host's key-value store
//! under the group's own prefix: until when creating is refused after the cloud ran out of
//! capacity (and the cloud's words for it), and lists of instance ids (those the plugin asked
//! to delete, whose going away is no interruption).
//!
//! Owns these keys and their encoding. Must not touch: the cloud's API (each plugin decides
//! when to back off and what to list).

use std::collections::BTreeSet;

use runway_sdk::fleeting::{CapacityError, ProviderError};

const UNTIL: &str = "capacity-until";
const MESSAGE: &str = "capacity-message";

/// One group's remembered state: keys `<prefix>/<what>`.
#[derive(Clone, Debug)]
pub struct GroupState {
    prefix: String,
}

impl GroupState {
    /// The state of the group identified by `prefix` (e.g. `region/name`).
    pub fn new(prefix: impl Into<String>) -> Self {
        GroupState { prefix: prefix.into() }
    }

    /// The text under `what` (empty when never set).
    pub fn get(&self, what: &str) -> Result<String, ProviderError> {
        let value = runway_sdk::kv::get(&self.key(what))?.unwrap_or_default();
        Ok(String::from_utf8_lossy(&value).into_owned())
    }

    /// Store `value` under `what`.
    pub fn set(&self, what: &str, value: &str) -> Result<(), ProviderError> {
        Ok(runway_sdk::kv::set(&self.key(what), value.as_bytes())?)
    }

    /// The ids listed under `what`.
    pub fn ids(&self, what: &str) -> Result<BTreeSet<String>, ProviderError> {
        Ok(self.get(what)?.lines().filter(|l| !l.is_empty()).map(str::to_string).collect())
    }

    /// List `ids` under `what`, replacing what was there.
    pub fn set_ids<'a>(&self, what: &str, ids: impl IntoIterator<Item = &'a String>) -> Result<(), ProviderError> {
        self.set(what, &ids.into_iter().map(String::as_str).collect::<Vec<_>>().join("\n"))
    }

    /// Drop from the list under `what` the ids for which `present` is false (gone from the
    /// cloud: nothing to remember about them any more); stored again only when one went.
    pub fn retain_ids(&self, what: &str, present: impl Fn(&str) -> bool) -> Result<(), ProviderError> {
        let listed = self.ids(what)?;
        let kept: Vec<&String> = listed.iter().filter(|id| present(id)).collect();
        if kept.len() != listed.len() {
            self.set_ids(what, kept)?;
        }
        Ok(())
    }

    /// Refuse creations for `seconds` from now, for the cloud's reason `message`.
    pub fn back_off(&self, seconds: u64, message: &str) -> Result<(), ProviderError> {
        self.set(UNTIL, &(crate::now_unix() + seconds).to_string())?;
        self.set(MESSAGE, message)
    }

    /// Whether a back-off is running.
    pub fn backing_off(&self) -> Result<bool, ProviderError> {
        Ok(self.get(UNTIL)?.parse::<u64>().is_ok_and(|until| until > crate::now_unix()))
    }

    /// `Err(Capacity)` while a back-off runs, naming `group` (e.g. `group x`) and the cloud's
    /// reason, with the seconds left as the retry time.
    pub fn check_capacity(&self, group: &str) -> Result<(), ProviderError> {
        let now = crate::now_unix();
        match self.get(UNTIL)?.parse::<u64>() {
            Ok(until) if until > now => Err(ProviderError::Capacity(CapacityError {
                message: format!("{group}: {}", self.get(MESSAGE)?),
                retry_after_seconds: u32::try_from(until - now).unwrap_or(u32::MAX),
            })),
            _ => Ok(()),
        }
    }

    fn key(&self, what: &str) -> String {
        format!("{}/{what}", self.prefix)
    }
}
