//! The tracing subscriber: human-readable lines by default, one JSON object
//! per line with `LOG_FORMAT=json`. Request spans carry `request_id`, so
//! every line logged while serving a request names it.

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Used when `RUST_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info,actix_server=warn";

pub type BoxedSubscriber = Box<dyn tracing::Subscriber + Send + Sync>;

/// A subscriber writing `format` lines to `writer`; tests pass a buffer.
pub fn subscriber<W>(format: LogFormat, filter: EnvFilter, writer: W) -> BoxedSubscriber
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.finish()),
        // The current span holds request_id; the full span list would only
        // repeat it on every line.
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .finish(),
        ),
    }
}

/// Installs the process-wide subscriber on stderr from `LOG_FORMAT` and `RUST_LOG`.
pub fn init() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    let subscriber = subscriber(crate::config::log_format()?, filter, std::io::stderr);
    tracing::subscriber::set_global_default(subscriber)?;
    Ok(())
}
