//! The process's logs and, with `--otlp-endpoint`, its OpenTelemetry traces: one `tracing`
//! subscriber whose spans (Ivy's request, Tulip's call) are also exported over OTLP/gRPC.

use clap::Args;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tulip::config::heading;

/// How the process logs and traces (both commands).
#[derive(Debug, Args)]
pub(crate) struct Logs {
    /// Log JSON lines (one object a line) instead of text, for log collectors.
    #[arg(long, env = "JSON_OUTPUT", help_heading = heading::OBSERVABILITY)]
    pub json_output: bool,

    /// Export traces (OTLP over gRPC) to this collector, e.g. http://otel-collector:4317: a span
    /// per HTTP request and one per Tulip call inside it, across processes (W3C `traceparent`,
    /// taken from the client's request when it sends one).
    #[arg(long, env = "OTLP_ENDPOINT", help_heading = heading::OBSERVABILITY)]
    pub otlp_endpoint: Option<String>,

    /// The `service.name` of the exported traces [default: the command's name].
    #[arg(long, env = "OTLP_SERVICE_NAME", help_heading = heading::OBSERVABILITY)]
    pub otlp_service_name: Option<String>,
}

/// Exports the spans a process still holds when it ends.
pub(crate) struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the subscriber. Call it inside the runtime that will serve: the OTLP exporter's
    /// gRPC channel runs on it.
    pub(crate) fn init(logs: &Logs, command: &str) -> Result<Telemetry, String> {
        let traces = match &logs.otlp_endpoint {
            Some(endpoint) => {
                let service = logs.otlp_service_name.as_deref().unwrap_or(command);
                Some(tracer_provider(endpoint, service)?)
            }
            None => None,
        };
        let filter =
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
        let json = logs
            .json_output
            .then(|| tracing_subscriber::fmt::layer().json().with_target(false));
        let text = (!logs.json_output).then(|| tracing_subscriber::fmt::layer().with_target(false));
        let otel = traces
            .as_ref()
            .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("ivy")));
        let _ = tracing_subscriber::registry()
            .with(filter)
            .with(json)
            .with(text)
            .with(otel)
            .try_init();
        if let Some(endpoint) = &logs.otlp_endpoint {
            tracing::info!("exporting traces to {endpoint}");
        }
        Ok(Telemetry { traces })
    }

    /// Sends what is buffered and stops the exporter.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.traces {
            if let Err(err) = provider.shutdown() {
                tracing::warn!("cannot send the last traces: {err}");
            }
        }
    }
}

/// A tracer provider that batches spans to `endpoint`, with the W3C propagator that Tulip's
/// client and server use (tulip::trace_context).
fn tracer_provider(endpoint: &str, service: &str) -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let resource = Resource::builder()
        .with_service_name(service.to_string())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}
