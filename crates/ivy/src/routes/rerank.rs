//! Reranking: TEI's `POST /rerank`, and the Cohere / Jina / vLLM `POST /v1/rerank` and
//! `POST /v2/rerank` (one handler). Both go through the one scoring path (crate::score).

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::body::JsonBody;
use super::cohere::rand_id;
use super::schema::Document;
use super::tei::direction;
use super::timing::timing_headers;
use crate::config::LongInputs;
use crate::error::{ErrorResponses, IvyError};
use crate::gateway::Gateway;
use crate::score::{rank, RerankCall};

/// TEI's rerank request.
#[derive(Deserialize, ToSchema)]
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
    /// Documents longer than the model: truncate, or chunk (scored by their best window);
    /// default: --long-inputs.
    #[serde(default)]
    long_inputs: Option<LongInputs>,
}

/// A text's place: its index in `texts` and its score.
#[derive(Serialize, ToSchema)]
pub(super) struct TeiRank {
    index: usize,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// TEI's `/rerank`: `[{"index", "score", "text"?}]`, best first.
#[utoipa::path(post, path = "/rerank", operation_id = "tei_rerank", tag = "TEI", request_body = TeiRerankRequest,
    responses(
        (status = 200, description = "The texts, best first", body = Vec<TeiRank>),
        ErrorResponses))]
pub(super) async fn tei(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<TeiRerankRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "score")?;
    // Truncation shortens the document, from its end (TEI's Left is not offered for pairs).
    direction(request.truncation_direction.as_deref())?;
    let call = RerankCall {
        query: request.query,
        documents: request.texts.clone(),
        truncate: request.truncate,
        raw_scores: request.raw_scores,
        long_inputs: request.long_inputs,
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

/// Cohere's rerank request (v1 and v2), as Jina and vLLM take it too.
#[derive(Deserialize, ToSchema)]
pub(super) struct CohereRerankRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    query: String,
    #[serde(default)]
    #[schema(value_type = Vec<Document>)]
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

/// Cohere's rerank answer.
#[derive(Serialize, ToSchema)]
pub(super) struct CohereResponse {
    id: String,
    model: String,
    results: Vec<CohereResult>,
    usage: Usage,
    #[schema(value_type = Object)]
    meta: Value,
}

#[derive(Serialize, ToSchema)]
struct CohereResult {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<DocumentText>,
}

#[derive(Serialize, ToSchema)]
struct DocumentText {
    text: String,
}

#[derive(Serialize, ToSchema)]
struct Usage {
    total_tokens: usize,
}

/// Cohere's (and Jina's) v1 rerank.
#[utoipa::path(post, path = "/v1/rerank", operation_id = "cohere_rerank_v1", tag = "Cohere", request_body = CohereRerankRequest,
    responses(
        (status = 200, description = "The documents, best first", body = CohereResponse),
        ErrorResponses))]
pub(super) async fn cohere_v1(
    state: State<Gateway>,
    body: JsonBody<CohereRerankRequest>,
) -> Result<impl IntoResponse, IvyError> {
    cohere(state, body).await
}

/// Cohere's v2 rerank (the same body and answer as v1's here).
#[utoipa::path(post, path = "/v2/rerank", operation_id = "cohere_rerank_v2", tag = "Cohere", request_body = CohereRerankRequest,
    responses(
        (status = 200, description = "The documents, best first", body = CohereResponse),
        ErrorResponses))]
pub(super) async fn cohere_v2(
    state: State<Gateway>,
    body: JsonBody<CohereRerankRequest>,
) -> Result<impl IntoResponse, IvyError> {
    cohere(state, body).await
}

/// Cohere's rerank (v1 and v2), as Jina and vLLM serve it too.
async fn cohere(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<CohereRerankRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(request.model.as_deref(), "score")?;
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
        long_inputs: None,
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
