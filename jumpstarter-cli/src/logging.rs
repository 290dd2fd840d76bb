//! Log output of the tools: `LEVEL message` on stderr, driver logs at INFO by default.

use tracing_subscriber::{EnvFilter, fmt};

/// Installs the subscriber. `level` is an upstream level name (DEBUG, INFO, WARNING, ...).
pub fn init(level: Option<&str>) {
    let filter = match level.map(str::to_ascii_uppercase).as_deref() {
        Some("DEBUG") => "debug".to_string(),
        Some("INFO") => "info".to_string(),
        Some("WARNING") | Some("WARN") => "warn".to_string(),
        Some("ERROR") | Some("CRITICAL") => "error".to_string(),
        _ => std::env::var("JMP_LOG").unwrap_or_else(|_| {
            "warn,driver=info,hook=info,jumpstarter_exporter::controller=info".to_string()
        }),
    };
    let _ = fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
