//! Runway: a GitLab-compatible CI runner whose executors and fleet providers are
//! WebAssembly components.
//!
//! Data flows one way through the job path: [`gitlab`] → [`job`] → [`script`] →
//! [`executor`] → plugin → [`capability`] → [`trace`] → [`gitlab`]. No module reaches back up
//! that chain. See `DESIGN.md`-style notes in each module's docs for what it owns.

pub mod archive;
pub mod autoscaler;
pub mod bindings;
pub mod buildinfo;
pub mod cache;
pub mod capability;
pub mod cli;
pub mod config;
pub mod connector;
pub mod executor;
pub mod gitlab;
pub mod helper;
pub mod job;
pub mod local;
pub mod manager;
pub mod metrics;
pub mod payload;
pub mod plugin;
pub mod router;
pub mod script;
pub mod secrets;
pub mod session;
pub mod stop;
pub mod store;
pub mod trace;
