//! GitLab's runner API: the job payload and (with the client) every call a runner makes.

pub mod api;
pub mod client;
pub mod retry;
