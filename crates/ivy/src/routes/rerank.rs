//! Reranking: TEI's `POST /rerank`, and the Cohere / Jina / vLLM `POST /v1/rerank` and
//! `POST /v2/rerank` (one handler). Both go through the one scoring path (crate::score).

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::body::JsonBody;
use super::tei::direction;
use super::timing::timing_headers;
use crate::error::IvyError;
use crate::gateway::Gateway;
use crate::score::{rank, RerankCall};

#[derive(Deserialize)]
pub(super) struct TeiRerankRequest {
    #[serde(default)]
    query: String,
    #[serde(default)]
    texts: Vec<String>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Option<String>,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    return_text: bool,
}

#[derive(Serialize)]
struct TeiRank {
    index: usize,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// TEI's `/rerank`: `[{"index", "score", "text"?}]`, best first.
pub(super) async fn tei(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<TeiRerankRequest>,
) -> Result<impl IntoResponse, IvyError> {
    // Truncation shortens the document, from its end (TEI's Left is not offered for pairs).
    direction(request.truncation_direction.as_deref())?;
    let call = RerankCall {
        query: request.query,
        documents: request.texts.clone(),
        truncate: request.truncate,
        raw_scores: request.raw_scores,
        ..RerankCall::default()
    };
    let scored = gateway.rerank("tei_rerank", call).await?;
    let ranks: Vec<TeiRank> = rank(&scored.scores, None)
        .into_iter()
        .map(|(index, score)| TeiRank {
            index,
            score,
            text: request.return_text.then(|| request.texts[index].clone()),
        })
        .collect();
    Ok((timing_headers(&scored.timings), Json(ranks)))
}

#[derive(Deserialize)]
pub(super) struct CohereRerankRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    query: String,
    #[serde(default)]
    documents: Vec<Value>,
    #[serde(default)]
    top_n: Option<i64>,
    #[serde(default)]
    return_documents: bool,
    #[serde(default)]
    max_tokens_per_doc: Option<i64>,
    /// A causal reranker's instruction (Qwen3-Reranker's), instead of the server's default.
    #[serde(default)]
    instruction: Option<String>,
}

#[derive(Serialize)]
struct CohereResponse {
    id: String,
    model: String,
    results: Vec<CohereResult>,
    usage: Usage,
    meta: Value,
}

#[derive(Serialize)]
struct CohereResult {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

#[derive(Serialize)]
struct DocumentText {
    text: String,
}

#[derive(Serialize)]
struct Usage {
    total_tokens: usize,
}

/// Cohere's rerank (v1 and v2), as Jina and vLLM serve it too.
pub(super) async fn cohere(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<CohereRerankRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let documents = request
        .documents
        .iter()
        .enumerate()
        .map(|(i, doc)| match doc {
            Value::String(text) => Ok(text.clone()),
            Value::Object(fields) => match fields.get("text") {
                Some(Value::String(text)) => Ok(text.clone()),
                _ => Err(IvyError::Validation(format!(
                    "`documents[{i}]` must be a string or an object with a string `text`"
                ))),
            },
            _ => Err(IvyError::Validation(format!(
                "`documents[{i}]` must be a string or an object with a string `text`"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let top_n = at_least_one("top_n", request.top_n)?;
    let max_tokens_per_doc = at_least_one("max_tokens_per_doc", request.max_tokens_per_doc)?;
    let call = RerankCall {
        query: request.query,
        documents: documents.clone(),
        instruction: request.instruction,
        truncate: Some(true),
        max_tokens_per_doc,
        raw_scores: false,
    };
    let scored = gateway.rerank("cohere_rerank", call).await?;
    let results = rank(&scored.scores, top_n)
        .into_iter()
        .map(|(index, relevance_score)| CohereResult {
            index,
            relevance_score,
            document: request.return_documents.then(|| DocumentText {
                text: documents[index].clone(),
            }),
        })
        .collect();
    let body = CohereResponse {
        id: format!("rerank-{:016x}", rand_id()),
        model: request
            .model
            .unwrap_or_else(|| gateway.model().model_id.clone()),
        results,
        usage: Usage {
            total_tokens: scored.tokens,
        },
        meta: serde_json::json!({"billed_units": {"search_units": 1}}),
    };
    Ok((timing_headers(&scored.timings), Json(body)))
}

/// An optional count that must be at least 1 when given.
fn at_least_one(field: &str, value: Option<i64>) -> Result<Option<usize>, IvyError> {
    match value {
        Some(n) if n < 1 => Err(IvyError::Validation(format!(
            "`{field}` must be at least 1; got {n}"
        ))),
        other => Ok(other.map(|n| n as usize)),
    }
}

/// A request id that differs between calls (no cryptographic strength needed).
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}
