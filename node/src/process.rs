//! What a node process does first: logging, and making any panic end the process.

/// Logs through `tracing` to stderr, filtered by `RUST_LOG` (default `info`): what the binary
/// and programs built on [`crate::Trainer`] do first.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Exit code of a node that panicked ([`exit_on_panic`]).
pub const PANIC_EXIT_CODE: i32 = 70;

/// Makes any panic, on any thread, end the process with [`PANIC_EXIT_CODE`] after the usual
/// report. A panic in an actor or a connection task stops only that task: the process would
/// stay up with its ports open and its status frozen, a zombie no supervisor restarts.
pub fn exit_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!("panic: {info}; the node exits");
        std::process::exit(PANIC_EXIT_CODE);
    }));
}
