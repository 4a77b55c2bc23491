//! What a node process does first: logging, and making any panic end the process.

/// Logs through `tracing` to stderr, filtered by `RUST_LOG` (default `info`, see
/// [`log_filter`]): what the binary and programs built on [`crate::Trainer`] do first.
pub fn init_logging() {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&filter)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_filter(None))),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// Libraries of the CUDA backend too loud at `info`, and the level they are held to unless the
/// filter names them: cubecl's kernel compiler (pliron) logs every kernel's IR after every
/// pass at `info` — on the first H100 run, 0.5-0.8 GB of log per node in 60 s, which stalled the
/// nodes — and cubecl warns once per allocation attempt while it reclaims memory.
const QUIET_TARGETS: [(&str, &str); 2] = [("pliron", "warn"), ("cubecl", "error")];

/// The filter for `RUST_LOG`'s value `env` (`info` when unset): the targets of
/// [`QUIET_TARGETS`] it does not name, held to their level, then `env`.
pub fn log_filter(env: Option<&str>) -> String {
    let env = env
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .unwrap_or("info");
    let mut directives: Vec<String> = QUIET_TARGETS
        .iter()
        .filter(|(target, _)| !env.contains(target))
        .map(|(target, level)| format!("{target}={level}"))
        .collect();
    directives.push(env.to_string());
    directives.join(",")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_compiler_is_quiet_unless_the_filter_names_it() {
        assert_eq!(log_filter(None), "pliron=warn,cubecl=error,info");
        assert_eq!(log_filter(Some(" ")), "pliron=warn,cubecl=error,info");
        assert_eq!(
            log_filter(Some("debug,pliron=info")),
            "cubecl=error,debug,pliron=info"
        );
        let filter = tracing_subscriber::EnvFilter::try_new(log_filter(Some("info"))).unwrap();
        assert_eq!(
            filter.to_string().split(',').count(),
            3,
            "three directives: {filter}"
        );
    }
}
