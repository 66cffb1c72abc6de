//! The timing and compute headers of an answer: TEI's, plus the split Ivy measures (times in ms).

use axum::http::{HeaderMap, HeaderValue};

use crate::request::Timings;

/// `x-total-time`, `x-compute-time` (tokenization, queue and inference), `x-tokenization-time`,
/// `x-queue-time`, `x-inference-time`, `x-transfer-time`, `x-compute-tokens`, `x-compute-characters`.
pub(super) fn timing_headers(timings: &Timings) -> HeaderMap {
    let fields = [
        ("x-total-time", timings.total),
        ("x-compute-time", timings.compute()),
        ("x-tokenization-time", timings.tokenization),
        ("x-queue-time", timings.queue),
        ("x-inference-time", timings.inference),
        ("x-transfer-time", timings.transfer),
    ];
    let mut headers = HeaderMap::new();
    for (name, time) in fields {
        let millis = format!("{:.3}", time.as_secs_f64() * 1000.0);
        headers.insert(
            name,
            HeaderValue::from_str(&millis).expect("digits are a valid header value"),
        );
    }
    for (name, count) in [
        ("x-compute-tokens", timings.tokens),
        ("x-compute-characters", timings.characters),
    ] {
        headers.insert(name, HeaderValue::from(count));
    }
    headers
}
