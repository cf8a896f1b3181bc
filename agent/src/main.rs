//! `gpuwatch-agent`: parse flags, set up logging, run the agent, map errors to exit codes
//! (0 ok, 2 usage or configuration error or NVML unavailable, 1 other failure).

use std::process::ExitCode;

use gpuwatch_agent::{Error, config};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let settings = match config::load(std::env::args_os(), &|k| std::env::var(k).ok()) {
        Ok(s) => s,
        // --help / --version print to stdout and exit 0; usage errors print to stderr, exit 2.
        Err(Error::Usage(e)) => e.exit(),
        Err(e) => return fail(&e),
    };
    let filter = match EnvFilter::try_new(&settings.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "error: invalid --log-level {:?}: {e}; use e.g. info or gpuwatch_agent=debug",
                settings.log_level
            );
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&Error::Runtime(e)),
    };
    match runtime.block_on(gpuwatch_agent::run(settings.agent, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(e.exit_code())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for sigterm");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("ctrl-c: stopping"),
        () = terminate => tracing::info!("sigterm: stopping"),
    }
}
