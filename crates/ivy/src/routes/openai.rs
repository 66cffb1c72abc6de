//! The OpenAI-compatible API: POST /v1/embeddings (with vLLM's raw-bytes encodings), GET /v1/models.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokenizers::TruncationDirection;
use tulip::proto::Encoding;
use utoipa::ToSchema;

use super::body::JsonBody;
use super::schema::Inputs;
use super::timing::timing_headers;
use crate::config::LongInputs;
use crate::error::{ErrorResponses, IvyError};
use crate::gateway::Gateway;
use crate::input::parse_inputs;
pub(super) use crate::replicas::floats;
use crate::request::EmbedCall;

/// OpenAI's embeddings request, with vLLM's `embed_dtype` and `endianness` for the raw encodings.
#[derive(Deserialize, ToSchema)]
pub(super) struct EmbeddingsRequest {
    /// A text, a list of texts, a list of token ids, or a list of such lists.
    #[serde(default)]
    #[schema(value_type = Inputs)]
    input: Value,
    /// Echoed in the answer.
    #[serde(default)]
    model: Option<String>,
    /// float (default), base64 (the vector's bytes), int8 or binary (quantized), or vLLM's bytes
    /// (the body is every vector's bytes, their offsets in the `metadata` header) and bytes_only
    /// (the same without the header).
    #[serde(default)]
    encoding_format: Option<String>,
    /// Matryoshka truncation to this many dimensions (then normalized).
    #[serde(default)]
    dimensions: Option<i64>,
    /// For base64, bytes and bytes_only: float32 (default), float16 or bfloat16.
    #[serde(default)]
    embed_dtype: Option<String>,
    /// For base64, bytes and bytes_only: native (default, little on every platform served),
    /// little or big.
    #[serde(default)]
    endianness: Option<String>,
    /// Inputs longer than the model: truncate or chunk (default: --long-inputs).
    #[serde(default)]
    long_inputs: Option<LongInputs>,
}

/// How the vectors of an answer are written.
#[derive(Clone, Copy, PartialEq)]
enum Format {
    Float,
    Base64,
    Int8,
    Binary,
    /// vLLM's bytes; `true` with the metadata header.
    Bytes(bool),
}

#[utoipa::path(post, path = "/v1/embeddings", operation_id = "openai_embeddings", tag = "OpenAI", request_body = EmbeddingsRequest,
    responses(
        (status = 200, description = "The vectors; with bytes, their raw bytes (see `metadata`)",
         content((EmbeddingsResponse = "application/json"), (Vec<u8> = "application/octet-stream"))),
        ErrorResponses))]
pub(super) async fn embeddings(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<EmbeddingsRequest>,
) -> Result<Response, IvyError> {
    let gateway = gateway.select(request.model.as_deref(), "embed")?;
    let format = match request.encoding_format.as_deref() {
        None | Some("float") => Format::Float,
        Some("base64") => Format::Base64,
        Some("int8") => Format::Int8,
        Some("binary") => Format::Binary,
        Some("bytes") => Format::Bytes(true),
        Some("bytes_only") => Format::Bytes(false),
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`encoding_format` must be float, base64, int8, binary, bytes or bytes_only, not {other:?}"
            )))
        }
    };
    let dtype = ByteDtype::parse(request.embed_dtype.as_deref())?;
    let big_endian = match request.endianness.as_deref() {
        None | Some("native") | Some("little") => false,
        Some("big") => true,
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`endianness` must be native, little or big, not {other:?}"
            )))
        }
    };
    // int8 and binary are pplx-embed's quantized outputs (see tulip.proto's Encoding).
    let encoding = match format {
        Format::Int8 => Encoding::Int8,
        Format::Binary => Encoding::Binary,
        _ => Encoding::Float32,
    };
    let call = EmbedCall {
        inputs: parse_inputs(&request.input, "input")?,
        prompt_name: None,
        truncate: None,
        direction: TruncationDirection::Right,
        normalize: true,
        dimensions: request.dimensions,
        encoding,
        long_inputs: request.long_inputs,
    };
    let embedded = gateway.embed("openai", call).await?;
    let model = request
        .model
        .unwrap_or_else(|| gateway.model().model_id.clone());
    let usage = Usage {
        prompt_tokens: embedded.tokens,
        total_tokens: embedded.tokens,
    };
    let e = &embedded.vectors;
    let headers = timing_headers(&embedded.timings);
    if let Format::Bytes(with_metadata) = format {
        let mut body = Vec::with_capacity(e.data.len());
        let mut items = Vec::with_capacity(e.count);
        for index in 0..e.count {
            let start = body.len();
            dtype.write(&floats(e.row(index)), big_endian, &mut body);
            items.push(json!({
                "index": index, "embed_dtype": dtype.name(), "start": start, "end": body.len(),
                "endianness": if big_endian { "big" } else { "little" }, "shape": [e.dimensions],
            }));
        }
        let mut response = (headers, body).into_response();
        let out = response.headers_mut();
        out.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        if with_metadata {
            let metadata = json!({"model": model, "data": items, "usage": usage});
            let value = HeaderValue::from_str(&metadata.to_string())
                .map_err(|e| IvyError::Engine(format!("cannot write the metadata header: {e}")))?;
            out.insert("metadata", value);
        }
        return Ok(response);
    }
    let data = (0..e.count)
        .map(|index| {
            let row = e.row(index);
            let embedding = match format {
                Format::Base64 => {
                    let mut bytes = Vec::with_capacity(row.len());
                    dtype.write(&floats(row), big_endian, &mut bytes);
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                Format::Int8 => Vector::Int8(row.iter().map(|&b| b as i8).collect()),
                Format::Binary => Vector::Binary(row.to_vec()),
                _ => Vector::Float(floats(row)),
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
        model,
        usage,
    };
    Ok((headers, Json(body)).into_response())
}

/// The element type of vLLM's raw encodings.
#[derive(Clone, Copy)]
enum ByteDtype {
    F32,
    F16,
    Bf16,
}

impl ByteDtype {
    fn parse(value: Option<&str>) -> Result<ByteDtype, IvyError> {
        match value {
            None | Some("float32") => Ok(ByteDtype::F32),
            Some("float16") => Ok(ByteDtype::F16),
            Some("bfloat16") => Ok(ByteDtype::Bf16),
            Some(other) => Err(IvyError::Validation(format!(
                "`embed_dtype` must be float32, float16 or bfloat16, not {other:?}"
            ))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            ByteDtype::F32 => "float32",
            ByteDtype::F16 => "float16",
            ByteDtype::Bf16 => "bfloat16",
        }
    }

    /// Appends `values` in this type and byte order.
    fn write(self, values: &[f32], big_endian: bool, out: &mut Vec<u8>) {
        for &v in values {
            match (self, big_endian) {
                (ByteDtype::F32, false) => out.extend(v.to_le_bytes()),
                (ByteDtype::F32, true) => out.extend(v.to_be_bytes()),
                (ByteDtype::F16, false) => out.extend(half::f16::from_f32(v).to_le_bytes()),
                (ByteDtype::F16, true) => out.extend(half::f16::from_f32(v).to_be_bytes()),
                (ByteDtype::Bf16, false) => out.extend(half::bf16::from_f32(v).to_le_bytes()),
                (ByteDtype::Bf16, true) => out.extend(half::bf16::from_f32(v).to_be_bytes()),
            }
        }
    }
}

/// The body of an embeddings answer. Typed, so that floats are written as float32 (the shortest
/// text that reads back to the same value): through `serde_json::Value` they were widened to
/// float64 and written with 17 digits, which made the body 1.7 times as long and slower to write.
#[derive(Serialize, ToSchema)]
pub(super) struct EmbeddingsResponse {
    object: &'static str,
    data: Vec<Item>,
    model: String,
    usage: Usage,
}

#[derive(Serialize, ToSchema)]
struct Item {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

/// One vector, as `encoding_format` asks.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
    Int8(Vec<i8>),
    Binary(Vec<u8>),
}

#[derive(Serialize, ToSchema)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// OpenAI's model list.
#[derive(Serialize, ToSchema)]
pub(super) struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

#[derive(Serialize, ToSchema)]
struct ModelCard {
    id: String,
    object: &'static str,
    owned_by: &'static str,
}

#[utoipa::path(get, path = "/v1/models", operation_id = "openai_models", tag = "OpenAI",
    responses((status = 200, description = "The served models", body = ModelList)))]
pub(super) async fn models(State(gateway): State<Gateway>) -> Json<ModelList> {
    let card = |model: Gateway| ModelCard {
        id: model.model().model_id.clone(),
        object: "model",
        owned_by: "ivy",
    };
    Json(ModelList {
        object: "list",
        data: gateway.all().into_iter().map(card).collect(),
    })
}
