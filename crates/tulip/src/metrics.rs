//! The process's Prometheus recorder: Tulip's step metrics and, in `ivy-serve`, Ivy's request
//! metrics go to the one installed here.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Buckets of the histograms of time, in seconds.
const SECONDS: &[f64] = &[
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0, 30.0,
];

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
