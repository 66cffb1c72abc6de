//! The OpenAI-compatible API: POST /v1/embeddings, GET /v1/models.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokenizers::TruncationDirection;
use tulip::proto::Encoding;

use super::body::JsonBody;
use super::timing::timing_headers;
use crate::error::IvyError;
use crate::gateway::Gateway;
use crate::input::parse_inputs;
use crate::request::EmbedCall;

#[derive(Deserialize)]
pub(super) struct EmbeddingsRequest {
    #[serde(default)]
    input: Value,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<i64>,
}

pub(super) async fn embeddings(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<EmbeddingsRequest>,
) -> Result<impl IntoResponse, IvyError> {
    // int8 and binary are pplx-embed's quantized outputs (see tulip.proto's Encoding).
    let (encoding, base64) = match request.encoding_format.as_deref() {
        None | Some("float") => (Encoding::Float32, false),
        Some("base64") => (Encoding::Float32, true),
        Some("int8") => (Encoding::Int8, false),
        Some("binary") => (Encoding::Binary, false),
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`encoding_format` must be float, base64, int8 or binary, not {other:?}"
            )))
        }
    };
    let call = EmbedCall {
        inputs: parse_inputs(&request.input, "input")?,
        prompt_name: None,
        truncate: None,
        direction: TruncationDirection::Right,
        normalize: true,
        dimensions: request.dimensions,
        encoding,
    };
    let embedded = gateway.embed("openai", call).await?;
    let e = &embedded.vectors;
    let data = (0..e.count)
        .map(|index| {
            let row = e.row(index);
            let embedding = match encoding {
                // OpenAI's base64 is the little-endian float32 bytes, which is how Tulip packs them.
                Encoding::Float32 if base64 => {
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(row))
                }
                Encoding::Float32 => Vector::Float(floats(row)),
                Encoding::Int8 => Vector::Int8(row.iter().map(|&b| b as i8).collect()),
                Encoding::Binary => Vector::Binary(row.to_vec()),
            };
            Item {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    let body = EmbeddingsResponse {
        object: "list",
        data,
        model: request
            .model
            .unwrap_or_else(|| gateway.model().model_id.clone()),
        usage: Usage {
            prompt_tokens: embedded.tokens,
            total_tokens: embedded.tokens,
        },
    };
    Ok((timing_headers(&embedded.timings), Json(body)))
}

/// The body of an embeddings answer. Typed, so that floats are written as float32 (the shortest
/// text that reads back to the same value): through `serde_json::Value` they were widened to
/// float64 and written with 17 digits, which made the body 1.7 times as long and slower to write.
#[derive(Serialize)]
struct EmbeddingsResponse {
    object: &'static str,
    data: Vec<Item>,
    model: String,
    usage: Usage,
}

#[derive(Serialize)]
struct Item {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
    Int8(Vec<i8>),
    Binary(Vec<u8>),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

pub(super) async fn models(State(gateway): State<Gateway>) -> Json<Value> {
    let model = json!({"id": gateway.model().model_id, "object": "model", "owned_by": "ivy"});
    Json(json!({"object": "list", "data": [model]}))
}

/// Little-endian float32 bytes as floats.
pub(super) fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
