//! The autoscaler (taskscaler): instances with job slots, a policy deciding how many
//! instances there should be, and the actions (create, delete) that get there.
//!
//! [`engine::Engine`] is a deterministic state machine: the runner tells it about jobs
//! (reserve, acquire, release) and provider events (created, ready, removed), calls `tick`
//! with the current time, and carries out the actions it returns through a fleeting plugin
//! ([`crate::plugin::fleeting`]). Both GitLab policies map onto it: taskscaler's
//! (`idle_count` in slots) and docker+machine's (`IdleCount` in machines, `MaxGrowthRate`).
//!
//! Not built yet: the loop that drives the engine against a plugin, the SSH connector, the
//! instance executor and `runway simulate`.

pub mod clock;
pub mod engine;
