//! The `runway-helper` executable's command line: the four helper commands alone, with the
//! same names and flags as under `runway`, so a stage script calls either binary the same way.
//! Built as its own executable (`host/src/helper_main.rs`) it links none of the plugin host
//! (wasmtime, Cranelift), which is most of `runway`'s size: Runway's helper image and the copy
//! put on fleet instances carry this one (`connector::rootfs::helper_executable`).
//!
//! Owns: parsing the helper's arguments and running one command on a small runtime. Must not
//! touch: anything of the runner's own verbs (`cli`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// `runway-helper`: what job scripts run in the job environment.
#[derive(Parser, Debug)]
#[command(name = "runway-helper", version, about = "Runway's helper: artifacts and caches in the job environment")]
struct HelperCli {
    #[command(subcommand)]
    command: HelperCommand,
}

#[derive(Subcommand, Debug)]
enum HelperCommand {
    /// Archive and upload job artifacts.
    ArtifactsUploader(super::artifacts::UploaderArgs),
    /// Download and extract a dependency's artifacts.
    ArtifactsDownloader(super::artifacts::DownloaderArgs),
    /// Archive a cache and upload it to the distributed cache.
    CacheArchiver(super::cache::ArchiverArgs),
    /// Download a cache from the distributed cache and extract it.
    CacheExtractor(super::cache::ExtractorArgs),
}

/// Parse the arguments and run the command; its exit code.
pub fn main() -> ExitCode {
    let cli = HelperCli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("runway-helper: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        match cli.command {
            HelperCommand::ArtifactsUploader(args) => super::artifacts::upload(args).await,
            HelperCommand::ArtifactsDownloader(args) => super::artifacts::download(args).await,
            HelperCommand::CacheArchiver(args) => super::cache::archive_cache(args).await,
            HelperCommand::CacheExtractor(args) => super::cache::extract_cache(args).await,
        }
    })
}
