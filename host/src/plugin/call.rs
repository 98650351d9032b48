//! Running one guest call under the sandbox: the epoch callback that yields every tick and
//! interrupts a call over budget, a watchdog for guests blocked outside wasm, and turning
//! traps into errors that name the plugin and the cause.
//!
//! Owns: [`PluginError`], call guarding and classification. Must not touch: what the budget
//! measures (`crate::capability::call::CallBudget`), capabilities, executors.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Store, UpdateDeadline};

use crate::capability::CallBudget;
use crate::plugin::state::PluginState;

/// Why a plugin call failed (as opposed to the plugin returning an error value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginErrorKind {
    /// The plugin panicked or hit a wasm trap.
    Trap,
    /// The call used more than `call_timeout` of wasm time.
    Timeout,
    /// The plugin tried to grow memory beyond `memory_mb`.
    MemoryLimit,
    /// The plugin could not be instantiated or does not match the contract.
    Incompatible,
    /// No plugin of that name is loaded.
    NotFound,
}

impl PluginErrorKind {
    /// What happened to the plugin, as a verb phrase ("trapped", "timed out", ...).
    pub fn what(&self) -> &'static str {
        match self {
            PluginErrorKind::Trap => "trapped",
            PluginErrorKind::Timeout => "timed out",
            PluginErrorKind::MemoryLimit => "exceeded its memory limit",
            PluginErrorKind::Incompatible => "cannot be used",
            PluginErrorKind::NotFound => "is not loaded",
        }
    }
}

/// A failed plugin call: which plugin, why, and the details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin `{plugin}` {}: {message}", kind.what())]
pub struct PluginError {
    /// The plugin's name.
    pub plugin: String,
    /// What went wrong.
    pub kind: PluginErrorKind,
    /// The details.
    pub message: String,
}

/// Error raised by the epoch callback when a call is over budget.
#[derive(Debug)]
struct OverBudget(Duration);

impl fmt::Display for OverBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "used more than call_timeout = {:?} of wasm time", self.0)
    }
}

impl std::error::Error for OverBudget {}

/// Arm a fresh store: check the budget every epoch tick and yield to tokio meanwhile.
pub fn arm(store: &mut Store<PluginState>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        let budget = &ctx.data().budget;
        if budget.exhausted() {
            Err(wasmtime::Error::new(OverBudget(budget.limit())))
        } else {
            Ok(UpdateDeadline::Yield(1))
        }
    });
}

/// How long past its budget a call blocked outside wasm (in a WASI poll) may run before
/// the watchdog abandons it.
const WATCHDOG_GRACE: Duration = Duration::from_millis(500);

/// Run `call` under `budget`; the watchdog abandons it (dropping the future) when the budget
/// runs out while the guest is blocked where epochs cannot interrupt it.
pub async fn guarded<R>(
    budget: Arc<CallBudget>,
    call: impl Future<Output = wasmtime::Result<R>>,
) -> Result<R, RawFailure> {
    budget.start_call();
    let watchdog = async {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if budget.used() > budget.limit() + WATCHDOG_GRACE {
                return;
            }
        }
    };
    tokio::select! {
        result = call => result.map_err(RawFailure::Error),
        () = watchdog => Err(RawFailure::Abandoned(budget.limit())),
    }
}

/// A call failure before it is classified.
pub enum RawFailure {
    /// The call returned an error (a trap, the epoch callback's over-budget error).
    Error(wasmtime::Error),
    /// The watchdog abandoned a call blocked past its budget.
    Abandoned(Duration),
}

/// Longest plugin-supplied message (an error value, a trap with its stderr tail) passed on
/// to the job log or the runner log; the rest is cut and counted.
pub const MAX_PLUGIN_MESSAGE: usize = 4096;

/// `text` cut to [`MAX_PLUGIN_MESSAGE`] bytes (on a character boundary), with a note of how
/// much was cut. Every message a plugin supplies passes through here before anyone prints it.
pub fn bound_message(text: String) -> String {
    if text.len() <= MAX_PLUGIN_MESSAGE {
        return text;
    }
    let mut cut = MAX_PLUGIN_MESSAGE;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{} … [{} more bytes truncated]", &text[..cut], text.len() - cut)
}

/// Name the cause of a failure of `plugin`'s call; `store` gives the plugin's stderr.
pub fn classify(plugin: &str, failure: RawFailure, state: &PluginState) -> PluginError {
    let (kind, message) = match failure {
        RawFailure::Abandoned(limit) => {
            (PluginErrorKind::Timeout, format!("blocked for more than call_timeout = {limit:?}"))
        }
        RawFailure::Error(err) => {
            let text = format!("{err:#}");
            if let Some(over) = err.downcast_ref::<OverBudget>() {
                (PluginErrorKind::Timeout, over.to_string())
            } else if state.limits.memory_refused() {
                (PluginErrorKind::MemoryLimit, format!("memory_mb = {} exceeded ({text})", state.grant.memory_mb))
            } else if matches!(err.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) {
                (PluginErrorKind::Timeout, "interrupted".to_string())
            } else {
                let tail = state.stderr().last_lines(MAX_PLUGIN_MESSAGE / 2);
                if tail.is_empty() {
                    (PluginErrorKind::Trap, text)
                } else {
                    (PluginErrorKind::Trap, format!("{tail} ({})", first_line(&text)))
                }
            }
        }
    };
    PluginError { plugin: plugin.to_string(), kind, message: bound_message(message) }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_on_a_character_boundary_with_a_count() {
        assert_eq!(bound_message("short".into()), "short");
        let long = format!("{}{}", "a".repeat(MAX_PLUGIN_MESSAGE - 1), "é".repeat(10_000));
        let bounded = bound_message(long.clone());
        assert!(bounded.len() < MAX_PLUGIN_MESSAGE + 64, "{}", bounded.len());
        assert!(bounded.ends_with(&format!("[{} more bytes truncated]", long.len() - (MAX_PLUGIN_MESSAGE - 1))));
    }
}
