//! The docker executor's pure logic, kept apart from the WebAssembly glue so it is tested
//! natively (`cargo test -p docker-logic`): `[runners.docker]` parsing, pull policies and
//! allow-lists, image references and service aliases, registry credentials, volumes, names and
//! labels, image platforms, Engine API request bodies, the programs a stage calls, the script archive and the saved state. Nothing here
//! talks to an engine, the host or the job log.

#![deny(missing_docs)]

pub mod archive;
pub mod auth;
pub mod config;
pub mod mounts;
pub mod names;
pub mod platform;
pub mod policy;
pub mod programs;
pub mod reference;
pub mod spec;
pub mod state;
pub mod volumes;
