//! Process signals of `runway run`, as gitlab-runner handles them: SIGQUIT stops requesting
//! jobs and waits for running ones (graceful); SIGTERM/SIGINT abort running jobs with
//! `runner_interrupted` within `shutdown_timeout` (forceful), and a second such signal exits
//! at once; SIGHUP asks for a config reload.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use super::Shutdown;

/// Listen for signals until the process ends. Reload requests go to `reload`.
pub fn install(shutdown: Shutdown, reload: mpsc::UnboundedSender<()>) -> std::io::Result<()> {
    let mut quit = signal(SignalKind::quit())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = quit.recv() => {
                    tracing::info!("SIGQUIT: graceful shutdown, finishing running jobs");
                    shutdown.graceful.cancel();
                }
                _ = term.recv() => forceful(&shutdown, "SIGTERM"),
                _ = int.recv() => forceful(&shutdown, "SIGINT"),
                _ = hup.recv() => {
                    tracing::info!("SIGHUP: reloading configuration");
                    let _ = reload.send(());
                }
            }
        }
    });
    Ok(())
}

fn forceful(shutdown: &Shutdown, name: &str) {
    if shutdown.forceful.is_cancelled() {
        tracing::warn!("{name} again: exiting now");
        std::process::exit(1);
    }
    tracing::warn!("{name}: forceful shutdown, aborting running jobs");
    shutdown.forceful.cancel();
}
