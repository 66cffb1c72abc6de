//! The HTTP routes. Each API family is a file that parses its bodies into the one request path
//! (crate::request) and renders the answer; body.rs and timing.rs are what they share.

mod body;
mod openai;
mod rerank;
mod status;
mod tei;
mod timing;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::gateway::Gateway;

/// All routes of the gateway.
pub fn router(gateway: Gateway) -> Router {
    let payload_limit = gateway.args().payload_limit;
    Router::new()
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/models", get(openai::models))
        .route("/embed", post(tei::embed))
        .route("/tokenize", post(tei::tokenize))
        .route("/decode", post(tei::decode))
        .route("/similarity", post(tei::similarity))
        .route("/predict", post(tei::predict))
        .route("/rerank", post(rerank::tei))
        .route("/v1/rerank", post(rerank::cohere))
        .route("/v2/rerank", post(rerank::cohere))
        .route("/health", get(status::health))
        .route("/info", get(status::info))
        .route("/metrics", get(status::metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(payload_limit))
        .with_state(gateway)
}

async fn not_found() -> (StatusCode, Json<serde_json::Value>) {
    let body = serde_json::json!({"error": "no such route", "error_type": "not_found"});
    (StatusCode::NOT_FOUND, Json(body))
}
