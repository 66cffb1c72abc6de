//! Prometheus metrics of the whole process (Ivy's and, in-process, Tulip's), served at /metrics.

use std::time::Duration;

use crate::request::Timings;

/// The Content-Type of Prometheus' text format, which /metrics answers in.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// Serves this process's metrics alone, at /metrics on `listener`, until `shutdown`: for a Tulip
/// without an Ivy in its process, whose step metrics no gateway serves.
pub async fn serve_alone(
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = tulip::metrics::install();
    let render = move || {
        let text = handle.render();
        async move { ([(axum::http::header::CONTENT_TYPE, TEXT_FORMAT)], text) }
    };
    let app = axum::Router::new().route("/metrics", axum::routing::get(render));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// This process's metrics text with each worker's (address, text) added: a worker's samples get
/// a `worker` label, and each family keeps one HELP and TYPE line with all its samples under
/// them, as Prometheus' text format requires.
pub fn merge(own: &str, workers: &[(String, String)]) -> String {
    let mut families: Vec<(String, Vec<String>)> = Vec::new();
    let sources =
        std::iter::once((None, own)).chain(workers.iter().map(|(w, t)| (Some(w), t.as_str())));
    for (worker, text) in sources {
        let mut current: Option<usize> = None;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.splitn(3, ' ');
                let (Some(kind @ ("HELP" | "TYPE")), Some(name)) = (words.next(), words.next())
                else {
                    continue;
                };
                let index = match families.iter().position(|(n, _)| n == name) {
                    Some(index) => index,
                    None => {
                        families.push((name.to_string(), Vec::new()));
                        families.len() - 1
                    }
                };
                let lines = &mut families[index].1;
                if !lines.iter().any(|l| l.starts_with(&format!("# {kind} "))) {
                    // Headers before the samples already there (a family first seen without one).
                    let at = lines.iter().take_while(|l| l.starts_with('#')).count();
                    lines.insert(at, line.to_string());
                }
                current = Some(index);
                continue;
            }
            let sample = match worker {
                Some(worker) => labelled(line, "worker", worker),
                None => line.to_string(),
            };
            match current {
                Some(index) => families[index].1.push(sample),
                None => families.push((String::new(), vec![sample])),
            }
        }
    }
    let mut out = String::new();
    for line in families.iter().flat_map(|(_, lines)| lines) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A sample line with `name="value"` added first among its labels.
fn labelled(line: &str, name: &str, value: &str) -> String {
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    let (metric, rest) = line.split_at(end);
    let value = value.replace('\\', "\\\\").replace('"', "\\\"");
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{metric}{{{name}=\"{value}\"{labels}"),
        Some(labels) => format!("{metric}{{{name}=\"{value}\",{labels}"),
        None => format!("{metric}{{{name}=\"{value}\"}}{rest}"),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const WORKER: &str = "# HELP tulip_steps_total Steps.\n# TYPE tulip_steps_total counter\ntulip_steps_total 3\n\n\
        # TYPE tulip_batch_tokens histogram\ntulip_batch_tokens_bucket{le=\"16\"} 1\ntulip_batch_tokens_sum 9\n";

    #[test]
    fn workers_samples_join_their_family_labelled() {
        let own = "# TYPE ivy_requests_total counter\nivy_requests_total{route=\"embed\"} 2\n";
        let workers = [
            ("http://a:1".to_string(), WORKER.to_string()),
            ("b".to_string(), WORKER.to_string()),
        ];
        let merged = merge(own, &workers);
        let want = "# TYPE ivy_requests_total counter\nivy_requests_total{route=\"embed\"} 2\n\
            # HELP tulip_steps_total Steps.\n# TYPE tulip_steps_total counter\n\
            tulip_steps_total{worker=\"http://a:1\"} 3\ntulip_steps_total{worker=\"b\"} 3\n\
            # TYPE tulip_batch_tokens histogram\n\
            tulip_batch_tokens_bucket{worker=\"http://a:1\",le=\"16\"} 1\ntulip_batch_tokens_sum{worker=\"http://a:1\"} 9\n\
            tulip_batch_tokens_bucket{worker=\"b\",le=\"16\"} 1\ntulip_batch_tokens_sum{worker=\"b\"} 9\n";
        assert_eq!(merged, want);
        assert_eq!(merge(own, &[]), own);
    }

    #[test]
    fn a_label_goes_first_and_its_value_is_escaped() {
        assert_eq!(labelled("m 1", "w", "x"), "m{w=\"x\"} 1");
        assert_eq!(labelled("m{} 1", "w", "x"), "m{w=\"x\"} 1");
        assert_eq!(
            labelled("m{a=\"b c\"} 1", "w", "q\""),
            "m{w=\"q\\\"\",a=\"b c\"} 1"
        );
    }
}
