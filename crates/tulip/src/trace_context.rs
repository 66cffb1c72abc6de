//! W3C trace context (`traceparent`) across process boundaries: read from an incoming call's
//! headers, written on an outgoing one, so that one trace spans Ivy and Tulip. Until a process
//! installs a propagator and an OpenTelemetry layer (`--otlp-endpoint`), both are no-ops.

use opentelemetry::global;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use tonic::metadata::MetadataMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of the caller's span when `headers` carry one; otherwise it keeps its
/// place in this process's span tree (a call from Ivy in the same process).
pub fn continue_from(headers: &http::HeaderMap, span: &tracing::Span) {
    let parent = global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
}

/// Writes the current span's context on an outgoing call.
pub fn inject(metadata: &mut MetadataMap) {
    let context = tracing::Span::current().context();
    global::get_text_map_propagator(|p| {
        p.inject_context(&context, &mut HeaderInjector(metadata.as_mut()))
    });
}
