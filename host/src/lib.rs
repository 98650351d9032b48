//! Runway: a GitLab-compatible CI runner whose executors and fleet providers are
//! WebAssembly components.
//!
//! Data flows one way through the job path: [`gitlab`] → [`job`] → [`script`] →
//! [`executor`] → plugin → [`capability`] → [`trace`] → [`gitlab`]. No module reaches back up
//! that chain. See `DESIGN.md`-style notes in each module's docs for what it owns.

pub mod capability;
pub mod cli;
pub mod executor;
pub mod gitlab;
// pub mod job; (enabled once script lands)
pub mod plugin;
pub mod trace;
