//! Log output of the tools: `LEVEL message` on stderr, driver logs at INFO by default.
//!
//! `--log-level` is about what `jmp` and `j` do: DEBUG and INFO apply to our own crates
//! (and the `driver`/`hook` log sources) while the libraries under them (TLS, HTTP/2,
//! gRPC) stay at WARN; TRACE shows everything. `JMP_LOG` or `RUST_LOG` (an
//! `EnvFilter` directive such as `h2=debug,jumpstarter_core=trace`) pick freely when
//! `--log-level` is not given.

use std::fmt::Write as _;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::{
    EnvFilter,
    fmt::{self, FmtContext, FormatEvent, FormatFields, format},
    registry::LookupSpan,
};

/// Our crates and log sources, which `--log-level` sets.
const OURS: [&str; 9] = [
    "jmp",
    "j",
    "jumpstarter_cli",
    "jumpstarter_core",
    "jumpstarter_exporter",
    "jumpstarter_drivers",
    "jumpstarter_controller",
    "driver",
    "hook",
];

/// The filter directive for `level` (an upstream level name: DEBUG, INFO, WARNING, ...;
/// TRACE is ours), or the environment's (`JMP_LOG`, then `RUST_LOG`) without one.
fn directive(level: Option<&str>) -> String {
    let ours = |l: &str| {
        let mut d = String::from("warn");
        for target in OURS {
            let _ = write!(d, ",{target}={l}");
        }
        d
    };
    match level.map(str::to_ascii_uppercase).as_deref() {
        Some("TRACE") => "trace".to_string(),
        Some("DEBUG") => ours("debug"),
        Some("INFO") => ours("info"),
        Some("WARNING") | Some("WARN") => "warn".to_string(),
        Some("ERROR") | Some("CRITICAL") => "error".to_string(),
        _ => std::env::var("JMP_LOG")
            .or_else(|_| std::env::var("RUST_LOG"))
            .unwrap_or_else(|_| {
                "warn,driver=info,hook=info,jumpstarter_exporter::controller=info".to_string()
            }),
    }
}

/// `LEVEL message fields`: the level is not padded (no leading space before `INFO`).
struct Line {
    ansi: bool,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: format::Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        let (name, colour) = match level {
            Level::ERROR => ("ERROR", "31"),
            Level::WARN => ("WARN", "33"),
            Level::INFO => ("INFO", "32"),
            Level::DEBUG => ("DEBUG", "34"),
            Level::TRACE => ("TRACE", "35"),
        };
        if self.ansi {
            write!(writer, "\x1b[{colour}m{name}\x1b[0m ")?;
        } else {
            write!(writer, "{name} ")?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Installs the subscriber. `level` is an upstream level name (DEBUG, INFO, WARNING, ...);
/// `json`: [`jumpstarter_core::logging::JsonLines`] of component `exporter` (`jmp run
/// --log-format json`), with each driver call's line (target `driver_call`) at INFO; with
/// the spans of a trace when `jmp run` turned traces on.
pub fn init(level: Option<&str>, json: bool) {
    if json {
        let mut d = directive(level);
        if level.is_none()
            && std::env::var_os("JMP_LOG").is_none()
            && std::env::var_os("RUST_LOG").is_none()
        {
            d.push_str(",jumpstarter::driver_call=info,jumpstarter_exporter=info");
        }
        jumpstarter_core::logging::init_json("exporter", EnvFilter::new(d));
        return;
    }
    use tracing_subscriber::prelude::*;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let filter = EnvFilter::new(directive(level));
    let _ = tracing_subscriber::registry()
        .with(jumpstarter_core::telemetry::with_trace_spans(filter))
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .event_format(Line { ansi }),
        )
        .with(jumpstarter_core::telemetry::layer())
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_for_our_crates_and_trace_for_everything() {
        let d = directive(Some("DEBUG"));
        assert!(d.starts_with("warn,"), "{d}");
        assert!(d.contains(",jumpstarter_core=debug"), "{d}");
        assert!(d.contains(",driver=debug"), "{d}");
        assert!(!d.contains("h2") && !d.contains("rustls"), "{d}");
        assert_eq!(directive(Some("trace")), "trace");
        assert!(directive(Some("INFO")).contains(",jumpstarter_exporter=info"));
        assert_eq!(directive(Some("WARNING")), "warn");
        assert_eq!(directive(Some("CRITICAL")), "error");
    }

    #[test]
    fn lines_have_no_padding_before_the_level() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = fmt::fmt()
            .with_env_filter(EnvFilter::new("info"))
            .with_writer(move || buf.clone())
            .with_ansi(false)
            .event_format(Line { ansi: false })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("registered with controller");
            tracing::warn!(lease = "l1", "lease ended");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "INFO registered with controller\nWARN lease ended lease=\"l1\"\n"
        );
    }
}
