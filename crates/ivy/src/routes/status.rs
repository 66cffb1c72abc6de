//! GET /health, /info and /metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use crate::error::{ErrorBody, IvyError};
use crate::gateway::Gateway;

/// Ready: some replica passed its last health check, and the server is not draining.
#[utoipa::path(get, path = "/health", operation_id = "health", tag = "Status",
    responses((status = 200, description = "Ready"),
              (status = 503, description = "No replica is ready, or the server drains", body = ErrorBody)))]
pub(super) async fn health(State(gateway): State<Gateway>) -> Result<StatusCode, IvyError> {
    if gateway.is_draining() {
        return Err(IvyError::Unavailable("the server is shutting down".into()));
    }
    if gateway.pool().any_ready(None) {
        Ok(StatusCode::OK)
    } else {
        Err(IvyError::Unavailable("no replica is ready".into()))
    }
}

/// Live: the process serves HTTP, whatever its replicas' state (a liveness probe that does not
/// restart a gateway while its workers load).
#[utoipa::path(get, path = "/live", operation_id = "live", tag = "Status",
    responses((status = 200, description = "The gateway serves HTTP")))]
pub(super) async fn live() -> StatusCode {
    StatusCode::OK
}

/// Like TEI's /info: the (first) model as Tulip reports it (protos/tulip.proto's ModelInfo, live
/// when a replica answers), the engine's live state, and Ivy's own limits; then `models`, each
/// served model described the same way, and `replicas`, each Tulip's state, load and engine.
#[utoipa::path(get, path = "/info", operation_id = "info", tag = "Status",
    responses((status = 200, description = "The models, the engines' state, the replicas and the limits", body = Object)))]
pub(super) async fn info(State(gateway): State<Gateway>) -> Json<Value> {
    let mut body = describe(&gateway).await;
    let mut models = Vec::new();
    for model in gateway.all() {
        models.push(describe(&model).await);
    }
    body["models"] = json!(models);
    let replicas = gateway
        .pool()
        .report()
        .await
        .into_iter()
        .map(|(report, engine)| {
            let mut entry = json!(report);
            let engine = engine.and_then(|e| serde_json::from_str::<Value>(&e).ok());
            entry["engine"] = engine.unwrap_or(Value::Null);
            entry
        });
    body["replicas"] = json!(replicas.collect::<Vec<_>>());
    Json(body)
}

/// One model as /info shows it.
async fn describe(gateway: &Gateway) -> Value {
    let live = gateway.replicas().info().await.ok();
    let model = live
        .as_ref()
        .and_then(|i| i.model.as_ref())
        .unwrap_or(gateway.model());
    let engine: Value = live
        .as_ref()
        .and_then(|i| serde_json::from_str(&i.engine_json).ok())
        .unwrap_or(Value::Null);
    let mut body = serde_json::to_value(model).unwrap_or_else(|_| json!({}));
    // The engine may switch backends after start (ROSE imports some in the background): its
    // live report wins over what it said at start.
    if let Some(backend) = engine.get("attention_backend") {
        body["attention_backend"] = backend.clone();
    }
    let args = gateway.args();
    body["max_client_batch_size"] = json!(args.max_client_batch_size);
    body["max_concurrent_requests"] = json!(args.max_concurrent_requests);
    body["max_queued_tokens"] = json!(args.max_queued_tokens);
    body["max_request_tokens"] = json!(args.max_request_tokens);
    body["auto_truncate"] = json!(args.auto_truncate);
    body["long_inputs"] = json!(args.long_inputs);
    body["chunk_overlap"] = json!(args.chunk_overlap);
    body["tokenization_workers"] = json!(gateway.tokenizer().workers());
    body["fast_tokenizer"] = json!(gateway.tokenizer().fast());
    body["engine"] = engine;
    body["replica_timeout_seconds"] = json!(args.replica_timeout.as_secs_f64());
    body["health_interval_seconds"] = json!(args.health_interval.as_secs_f64());
    body["discovery_interval_seconds"] = json!(args.discovery_interval.as_secs_f64());
    body["tulip_endpoints"] = json!(args.tulip_endpoints);
    // How many keys, never which.
    body["api_keys"] = json!(args.keys.len());
    body["otlp_endpoint"] = json!(args.otlp_endpoint);
    body["api_key_requests_per_second"] = json!(args.api_key_requests_per_second);
    body["api_key_tokens_per_minute"] = json!(args.api_key_tokens_per_minute);
    body["version"] = json!(env!("CARGO_PKG_VERSION"));
    body
}

/// Prometheus' text format.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "Status",
    responses((status = 200, description = "The metrics", body = String, content_type = "text/plain")))]
pub(super) async fn metrics(State(gateway): State<Gateway>) -> impl IntoResponse {
    let mut text = gateway.metrics().render();
    if gateway.args().worker_metrics {
        text = crate::metrics::merge(&text, &gateway.pool().metrics().await);
    }
    ([(header::CONTENT_TYPE, crate::metrics::TEXT_FORMAT)], text)
}
