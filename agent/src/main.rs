//! `gpuwatch-agent`: parse flags, set up logging, run the agent, map errors to exit codes
//! (0 ok, 2 usage or configuration error or NVML unavailable, 1 other failure).

use std::process::ExitCode;

use gpuwatch_agent::{Error, config};
use gpuwatch_common::logging::{self, LogFormat};

fn main() -> ExitCode {
    let settings = match config::load(std::env::args_os(), &|k| std::env::var(k).ok()) {
        Ok(s) => s,
        // --help / --version print to stdout and exit 0; usage errors print to stderr, exit 2.
        Err(Error::Usage(e)) => e.exit(),
        Err(e) => return fail(&e),
    };
    if let Err(e) = init_logging(&settings.log_level, settings.log_format) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }

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

/// Logs on stderr, filtered by `--log-level`, as `--log-format` says.
fn init_logging(level: &str, format: LogFormat) -> Result<(), gpuwatch_common::Error> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    tracing_subscriber::registry()
        .with(logging::filter(level, &[])?)
        .with(logging::stderr_layer(format))
        .try_init()?;
    Ok(())
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
