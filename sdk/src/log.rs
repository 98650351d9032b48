//! Log lines into the runner's own log (not the job log), tagged with the plugin's name.

use crate::bindings::executor::runway::host0_1_0::log::{write, Level};

/// Write a debug line.
pub fn debug(message: &str) {
    write(Level::Debug, message)
}
/// Write an info line.
pub fn info(message: &str) {
    write(Level::Info, message)
}
/// Write a warning.
pub fn warn(message: &str) {
    write(Level::Warn, message)
}
/// Write an error line.
pub fn error(message: &str) {
    write(Level::Error, message)
}
