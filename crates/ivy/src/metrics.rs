//! Prometheus metrics of the whole process (Ivy's and, in-process, Tulip's), served at /metrics.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::request::Timings;

const SECONDS: &[f64] = &[
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0, 30.0,
];

/// The Content-Type of Prometheus' text format, which /metrics answers in.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// Buckets of the histograms that count (a step's tokens and sequences), not time.
const COUNTS: &[(&str, &[f64])] = &[
    (
        "tulip_batch_tokens",
        &[
            16.0, 64.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 12288.0, 16384.0, 32768.0,
            65536.0,
        ],
    ),
    (
        "tulip_batch_sequences",
        &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0],
    ),
];

/// Installs the process-wide recorder once and returns the handle that renders it.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let mut builder = PrometheusBuilder::new()
                .set_buckets(SECONDS)
                .expect("bucket list is not empty");
            for (name, buckets) in COUNTS {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full((*name).into()), buckets)
                    .expect("bucket list is not empty");
            }
            builder
                .install_recorder()
                .expect("no other metrics recorder is installed")
        })
        .clone()
}

/// Serves this process's metrics alone, at /metrics on `listener`, until `shutdown`: for a Tulip
/// without an Ivy in its process, whose step metrics no gateway serves.
pub async fn serve_alone(
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = install();
    let render = move || {
        let text = handle.render();
        async move { ([(axum::http::header::CONTENT_TYPE, TEXT_FORMAT)], text) }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(render));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Records one answered request: where its time went (the numbers of its timing headers) and
/// what it computed.
pub fn record(route: &'static str, inputs: usize, t: &Timings) {
    metrics::counter!("ivy_requests_total", "route" => route).increment(1);
    metrics::counter!("ivy_inputs_total").increment(inputs as u64);
    metrics::counter!("ivy_input_tokens_total").increment(t.tokens as u64);
    metrics::counter!("ivy_input_characters_total").increment(t.characters as u64);
    let parts: [(&'static str, Duration); 6] = [
        ("ivy_total_duration_seconds", t.total),
        ("ivy_compute_duration_seconds", t.compute()),
        ("ivy_tokenization_duration_seconds", t.tokenization),
        ("ivy_queue_duration_seconds", t.queue),
        ("ivy_inference_duration_seconds", t.inference),
        ("ivy_transfer_duration_seconds", t.transfer),
    ];
    for (name, time) in parts {
        metrics::histogram!(name, "route" => route).record(time.as_secs_f64());
    }
}
