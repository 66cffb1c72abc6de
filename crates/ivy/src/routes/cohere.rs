//! Cohere's embed API: POST /v2/embed (texts, input_type, embedding_types), as the Cohere SDK
//! sends it. Its rerank is in rerank.rs.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokenizers::TruncationDirection;
use tulip::proto::Encoding;
use utoipa::ToSchema;

use super::body::JsonBody;
use super::openai::floats;
use super::timing::timing_headers;
use crate::error::{ErrorResponses, IvyError};
use crate::gateway::Gateway;
use crate::input::Input;
use crate::request::{EmbedCall, Embedded};

/// Cohere's v2 embed request (text inputs).
#[derive(Deserialize, ToSchema)]
pub(super) struct CohereEmbedRequest {
    /// The model to embed with (any name when one model is served).
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    texts: Vec<String>,
    /// search_query, search_document, classification or clustering: the model's prompt of that
    /// name (query for search_query, document for search_document) when it has one.
    #[serde(default)]
    input_type: Option<String>,
    /// Any of float (default), int8, uint8, binary, ubinary, base64.
    #[serde(default)]
    embedding_types: Option<Vec<String>>,
    /// NONE (inputs past the model's limit are an error), START or END (default).
    #[serde(default)]
    truncate: Option<String>,
    /// Matryoshka truncation to this many dimensions.
    #[serde(default)]
    output_dimension: Option<i64>,
    /// Not served: images and mixed inputs.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    images: Option<Value>,
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    inputs: Option<Value>,
}

/// The vectors of each asked type, in the order of `texts`.
#[derive(Serialize, Default, ToSchema)]
pub(super) struct EmbeddingsByType {
    #[serde(skip_serializing_if = "Option::is_none")]
    float: Option<Vec<Vec<f32>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    int8: Option<Vec<Vec<i8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uint8: Option<Vec<Vec<u8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binary: Option<Vec<Vec<i8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ubinary: Option<Vec<Vec<u8>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    base64: Option<Vec<String>>,
}

/// Cohere's v2 embed answer.
#[derive(Serialize, ToSchema)]
pub(super) struct CohereEmbedResponse {
    id: String,
    response_type: &'static str,
    embeddings: EmbeddingsByType,
    texts: Vec<String>,
    #[schema(value_type = Object)]
    meta: Value,
}

/// Cohere's `/v2/embed`. int8 and binary are Tulip's quantizations (protos/tulip.proto's
/// Encoding); uint8 is int8 + 128 and binary the packed bits - 128, as Cohere defines them
/// against their unsigned forms.
#[utoipa::path(post, path = "/v2/embed", operation_id = "cohere_embed", tag = "Cohere", request_body = CohereEmbedRequest,
    responses(
        (status = 200, description = "The vectors of each asked type", body = CohereEmbedResponse),
        ErrorResponses))]
pub(super) async fn embed(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<CohereEmbedRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(request.model.as_deref(), "embed")?;
    if request.images.is_some() || request.inputs.is_some() {
        return Err(IvyError::Unsupported(
            "only `texts` is served: `images` and `inputs` are not".into(),
        ));
    }
    if request.texts.is_empty() {
        return Err(IvyError::Validation("`texts` cannot be empty".into()));
    }
    let prompt_name = match request.input_type.as_deref() {
        None => None,
        Some("search_query") => Some("query"),
        Some("search_document") => Some("document"),
        Some(kind @ ("classification" | "clustering")) => Some(kind),
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`input_type` must be search_query, search_document, classification or clustering, not {other:?}"
            )))
        }
    }
    .filter(|name| gateway.prompt(Some(name)).is_ok());
    let (truncate, direction) = match request.truncate.as_deref() {
        None | Some("END") => (true, TruncationDirection::Right),
        Some("START") => (true, TruncationDirection::Left),
        Some("NONE") => (false, TruncationDirection::Right),
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`truncate` must be NONE, START or END, not {other:?}"
            )))
        }
    };
    let types = request
        .embedding_types
        .unwrap_or_else(|| vec!["float".into()]);
    if types.is_empty() {
        return Err(IvyError::Validation(
            "`embedding_types` cannot be empty".into(),
        ));
    }
    let call = |encoding| EmbedCall {
        inputs: request.texts.iter().cloned().map(Input::Text).collect(),
        prompt_name: prompt_name.map(str::to_string),
        truncate: Some(truncate),
        direction,
        normalize: true,
        dimensions: request.output_dimension,
        encoding,
        long_inputs: None,
    };
    // One engine call per Tulip encoding asked for (float32, int8, binary), shared by the types
    // derived from it.
    let mut answers: Vec<(Encoding, Embedded)> = Vec::new();
    let mut out = EmbeddingsByType::default();
    for kind in &types {
        let encoding = match kind.as_str() {
            "float" | "base64" => Encoding::Float32,
            "int8" | "uint8" => Encoding::Int8,
            "binary" | "ubinary" => Encoding::Binary,
            other => {
                return Err(IvyError::Validation(format!(
                    "`embedding_types` may hold float, int8, uint8, binary, ubinary or base64, not {other:?}"
                )))
            }
        };
        if !answers.iter().any(|(e, _)| *e == encoding) {
            answers.push((
                encoding,
                gateway.embed("cohere_embed", call(encoding)).await?,
            ));
        }
        let vectors = &answers
            .iter()
            .find(|(e, _)| *e == encoding)
            .expect("embedded above")
            .1
            .vectors;
        let rows = (0..vectors.count).map(|i| vectors.row(i));
        match kind.as_str() {
            "float" => out.float = Some(rows.map(floats).collect()),
            "base64" => {
                let b64 = |row: &[u8]| base64::engine::general_purpose::STANDARD.encode(row);
                out.base64 = Some(rows.map(b64).collect());
            }
            "int8" => out.int8 = Some(rows.map(|r| r.iter().map(|&b| b as i8).collect()).collect()),
            "uint8" => {
                let unsigned = |r: &[u8]| r.iter().map(|&b| (b as i8 as i16 + 128) as u8).collect();
                out.uint8 = Some(rows.map(unsigned).collect());
            }
            "binary" => {
                let signed = |r: &[u8]| r.iter().map(|&b| (b as i16 - 128) as i8).collect();
                out.binary = Some(rows.map(signed).collect());
            }
            _ => out.ubinary = Some(rows.map(<[u8]>::to_vec).collect()),
        }
    }
    let first = &answers[0].1;
    let tokens: usize = answers.iter().map(|(_, e)| e.tokens).sum();
    let body = CohereEmbedResponse {
        id: format!("embed-{:016x}", rand_id()),
        response_type: "embeddings_by_type",
        embeddings: out,
        texts: request.texts,
        meta: json!({
            "api_version": {"version": "2"},
            "billed_units": {"input_tokens": tokens},
        }),
    };
    Ok((timing_headers(&first.timings), Json(body)))
}

/// A request id that differs between calls (no cryptographic strength needed).
pub(super) fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}
