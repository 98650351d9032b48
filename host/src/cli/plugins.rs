//! `runway plugins list` and `runway plugins check FILE`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;

use crate::plugin::PluginListing;

#[derive(Subcommand, Debug)]
pub enum PluginsCommand {
    /// List loaded plugins and rejected files: name, kind, version, API, file, grants, status.
    List {
        /// Plugin directory (default: plugins_dir from config.toml).
        #[arg(long)]
        plugins_dir: Option<PathBuf>,
    },
    /// Load and validate one plugin file; print its metadata or why it is refused.
    Check {
        /// The .wasm file.
        file: PathBuf,
    },
}

fn print_table(rows: &[PluginListing]) {
    let header = ["NAME", "KIND", "VERSION", "API", "FILE", "GRANTS", "STATUS"];
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.kind.clone(),
                r.version.clone(),
                r.api_version.clone(),
                r.source.clone(),
                r.grants.clone(),
                r.status.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: Vec<&str>| {
        cols.iter()
            .zip(widths.iter())
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(header.to_vec()));
    for row in &cells {
        println!("{}", line(row.iter().map(String::as_str).collect()));
    }
}

pub(super) async fn run(command: PluginsCommand, config: Option<&Path>) -> anyhow::Result<ExitCode> {
    match command {
        PluginsCommand::List { plugins_dir } => {
            let host = super::setup::plugin_host_of_file(config, plugins_dir).await?;
            print_table(&host.listing());
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Check { file } => {
            let host = super::setup::plugin_host_of_file(config, None).await?;
            match host.check_file(&file).await {
                Ok(row) => {
                    print_table(&[row]);
                    Ok(ExitCode::SUCCESS)
                }
                Err(reason) => {
                    eprintln!("refused: {reason}");
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}
