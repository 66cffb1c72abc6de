//! The HTTP routes; each file holds one API family.

mod openai;
mod status;
mod tei;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;

use crate::embed::Embedded;
use crate::error::IvyError;
use crate::server::Gateway;

/// All routes of the gateway.
pub fn router(gateway: Gateway) -> Router {
    let payload_limit = gateway.args().payload_limit;
    Router::new()
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/models", get(openai::models))
        .route("/embed", post(tei::embed))
        .route("/tokenize", post(tei::tokenize))
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

/// A JSON body whose rejections are answered in Ivy's error format.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Gateway> for JsonBody<T> {
    type Rejection = IvyError;

    async fn from_request(req: Request, state: &Gateway) -> Result<Self, IvyError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(JsonBody(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(IvyError::UnsupportedMediaType),
            Err(JsonRejection::JsonSyntaxError(e)) => Err(IvyError::InvalidJson(e.body_text())),
            Err(JsonRejection::JsonDataError(e)) => Err(IvyError::Validation(e.body_text())),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(IvyError::TooLarge(format!(
                "the request body is larger than this server's limit of {} bytes (--payload-limit)",
                state.args().payload_limit
            )))
            }
            Err(e) => Err(IvyError::InvalidJson(e.body_text())),
        }
    }
}

/// TEI's timing headers plus the split Ivy measures, in milliseconds.
fn timing_headers(embedded: &Embedded) -> HeaderMap {
    let e = &embedded.embeddings;
    let fields = [
        ("x-total-time", embedded.total_time),
        ("x-tokenization-time", embedded.tokenization_time),
        ("x-queue-time", e.queue_time),
        ("x-inference-time", e.inference_time),
        ("x-transfer-time", e.transfer_time),
    ];
    let mut headers = HeaderMap::new();
    for (name, time) in fields {
        let millis = format!("{:.3}", time.as_secs_f64() * 1000.0);
        headers.insert(
            name,
            HeaderValue::from_str(&millis).expect("digits are a valid header value"),
        );
    }
    headers
}
