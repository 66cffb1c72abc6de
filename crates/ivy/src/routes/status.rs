//! GET /health, /info and /metrics.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use crate::error::IvyError;
use crate::server::Gateway;

pub(super) async fn health(State(gateway): State<Gateway>) -> Result<StatusCode, IvyError> {
    if gateway.backend().is_healthy().await {
        Ok(StatusCode::OK)
    } else {
        Err(IvyError::Unavailable("the engine is not ready".into()))
    }
}

/// Like TEI's /info, plus where the model runs and how.
pub(super) async fn info(State(gateway): State<Gateway>) -> Json<Value> {
    // Live from Tulip, for the engine's state; what it said at start if it cannot answer now.
    let live = gateway.backend().info().await.ok();
    let info = live.as_ref().unwrap_or(gateway.info());
    let args = gateway.args();
    let engine: Value = serde_json::from_str(&info.engine_json).unwrap_or(Value::Null);
    // The engine may switch backends after start (ROSE imports some in the background): its
    // live report wins over what it said at start.
    let attention_backend = engine
        .get("attention_backend")
        .and_then(Value::as_str)
        .unwrap_or(&info.attention_backend);
    Json(json!({
        "model_id": info.model_id,
        "model_type": info.model_type,
        "model_dtype": info.dtype,
        "device": info.device,
        "attention_backend": attention_backend,
        "pooling": info.pooling,
        "dimensions": info.dimensions,
        "max_input_length": info.max_input_length,
        "max_batch_tokens": info.max_batch_tokens,
        "max_batch_requests": info.max_batch_requests,
        "max_client_batch_size": args.max_client_batch_size,
        "max_concurrent_requests": args.max_concurrent_requests,
        "auto_truncate": args.auto_truncate,
        "tokenization_workers": gateway.tokenizer().workers(),
        "engine": engine,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

pub(super) async fn metrics(State(gateway): State<Gateway>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gateway.metrics().render(),
    )
}
