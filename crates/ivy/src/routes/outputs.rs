//! The routes of outputs beside the dense vector, all through Tulip's Encode: TEI's
//! /embed_sparse (a SPLADE model's vector, BGE-M3's lexical weights) and /embed_all (every
//! token's hidden state), and /encode, any subset of a model's outputs from one forward pass.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use tulip::proto::{Encoding, Output, SparseVectors, TokenVectors};
use tulip::sparse::Pruning;
use utoipa::ToSchema;

use super::body::JsonBody;
use super::tei::{direction, yes, TextInputs};
use super::timing::timing_headers;
use crate::encode::EncodeCall;
use crate::error::{ErrorResponses, IvyError};
use crate::gateway::Gateway;
use crate::input::parse_inputs;
use crate::replicas::floats;
use crate::request::TextOptions;
use crate::template::Role;

/// The fields every output route takes: TEI's inputs and truncation, and sparse pruning.
#[derive(Deserialize, ToSchema)]
pub(super) struct OutputsRequest {
    #[serde(flatten)]
    text: TextInputs,
    /// Sparse vectors: keep only the `top_k` largest entries of each.
    #[serde(default)]
    top_k: Option<i64>,
    /// Sparse vectors: keep only entries of at least this value.
    #[serde(default)]
    min_value: Option<f64>,
    /// `query` or `document` (default): a ColBERT model prefixes, pads and cuts each its own way;
    /// another model takes its prompt of that name where it has one (as Cohere's input_type).
    #[serde(default)]
    input_type: Option<String>,
}

/// One non-zero entry of a sparse vector: a vocabulary index (a token id) and its weight.
#[derive(Serialize, ToSchema)]
pub(super) struct SparseValue {
    index: u32,
    value: f32,
}

#[utoipa::path(post, path = "/embed_sparse", operation_id = "tei_embed_sparse", tag = "TEI",
    request_body = OutputsRequest,
    responses(
        (status = 200, description = "Each input's non-zero entries, by index", body = Vec<Vec<SparseValue>>),
        ErrorResponses))]
pub(super) async fn embed_sparse(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<OutputsRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "embed")?;
    let encoded = gateway
        .encode("tei_sparse", call(&request, vec![Output::Sparse], false)?)
        .await?;
    let vectors = sparse(encoded.outputs.sparse.as_ref());
    Ok((timing_headers(&encoded.timings), Json(vectors)))
}

#[utoipa::path(post, path = "/embed_all", operation_id = "tei_embed_all", tag = "TEI",
    request_body = OutputsRequest,
    responses(
        (status = 200, description = "Each input's tokens' final hidden states", body = Vec<Vec<Vec<f32>>>),
        ErrorResponses))]
pub(super) async fn embed_all(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<OutputsRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "embed")?;
    let encoded = gateway
        .encode("tei_all", call(&request, vec![Output::Tokens], false)?)
        .await?;
    let vectors = token_vectors(encoded.outputs.tokens.as_ref());
    Ok((timing_headers(&encoded.timings), Json(vectors)))
}

/// Any subset of the model's outputs, from one forward pass.
#[derive(Deserialize, ToSchema)]
pub(super) struct EncodeRequest {
    #[serde(flatten)]
    common: OutputsRequest,
    /// Which outputs: dense, sparse, multi_vector, tokens (default: dense); /info's `outputs`
    /// lists the model's.
    #[serde(default)]
    outputs: Option<Vec<String>>,
    /// L2-normalize the dense vectors (default true); multi-vectors always are.
    #[serde(default = "yes")]
    #[schema(default = true)]
    normalize: bool,
    /// float (default), int8 (round(tanh(x) * 127), of the dense vector before normalization and
    /// of each multi-vector after it) or binary (the signs as bits, 8 a byte): the dense vectors
    /// and multi-vectors come as lists of floats, of int8 values, or of packed bytes.
    #[serde(default)]
    encoding_format: Option<String>,
    /// The model name, as clients send it (ignored beyond choosing the model).
    #[serde(default)]
    model: Option<String>,
}

/// One input's outputs, those asked for.
#[derive(Serialize, ToSchema)]
pub(super) struct EncodedItem {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    dense: Option<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sparse: Option<Vec<SparseValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    multi_vector: Option<Rows>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<Vec<Vec<f32>>>,
}

/// Vectors as their encoding gives them: floats, int8 values, or bytes of packed bits.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Rows {
    Float(Vec<Vec<f32>>),
    Int8(Vec<Vec<i8>>),
    Binary(Vec<Vec<u8>>),
}

/// A dense vector as its encoding gives it.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Row {
    Float(Vec<f32>),
    Int8(Vec<i8>),
    Binary(Vec<u8>),
}

/// The outputs of every input, in order, with the usage.
#[derive(Serialize, ToSchema)]
pub(super) struct EncodeResponse {
    object: &'static str,
    data: Vec<EncodedItem>,
    model: String,
    usage: Usage,
}

#[derive(Serialize, ToSchema)]
pub(super) struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[utoipa::path(post, path = "/encode", operation_id = "encode", tag = "Outputs", request_body = EncodeRequest,
    responses(
        (status = 200, description = "The outputs asked for, per input", body = EncodeResponse),
        ErrorResponses))]
pub(super) async fn encode(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<EncodeRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(request.model.as_deref(), "embed")?;
    let names = request.outputs.unwrap_or_else(|| vec!["dense".into()]);
    let outputs = (names.iter())
        .map(|name| {
            Output::from_str_name(&name.to_ascii_uppercase()).ok_or_else(|| {
                IvyError::Validation(format!(
                    "unknown output {name:?}; use dense, sparse, multi_vector or tokens"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut call = call(&request.common, outputs, request.normalize)?;
    call.encoding = match request.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float32,
        Some("int8") => Encoding::Int8,
        Some("binary") => Encoding::Binary,
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`encoding_format` must be float, int8 or binary, not {other:?}"
            )))
        }
    };
    let encoded = gateway.encode("encode", call).await?;
    let o = &encoded.outputs;
    let mut dense = rows(o.dense.as_ref()).into_iter();
    let mut sparse_vectors = sparse(o.sparse.as_ref()).into_iter();
    let mut multi = rows(o.multi_vector.as_ref()).into_iter();
    let mut tokens = token_vectors(o.tokens.as_ref()).into_iter();
    let data = (0..o.count as usize)
        .map(|index| EncodedItem {
            index,
            dense: dense.next().and_then(Rows::first),
            sparse: sparse_vectors.next(),
            multi_vector: multi.next(),
            tokens: tokens.next(),
        })
        .collect();
    let body = EncodeResponse {
        object: "list",
        data,
        model: gateway.model().model_id.clone(),
        usage: Usage {
            prompt_tokens: encoded.tokens,
            total_tokens: encoded.tokens,
        },
    };
    Ok((timing_headers(&encoded.timings), Json(body)))
}

fn call(
    request: &OutputsRequest,
    outputs: Vec<Output>,
    normalize: bool,
) -> Result<EncodeCall<'_>, IvyError> {
    let role = match request.input_type.as_deref() {
        None => None,
        Some("document") => Some(Role::Document),
        Some("query") => Some(Role::Query),
        Some(other) => {
            return Err(IvyError::Validation(format!(
                "`input_type` must be query or document, not {other:?}"
            )))
        }
    };
    Ok(EncodeCall {
        inputs: parse_inputs(&request.text.inputs, "inputs")?,
        text: TextOptions {
            prompt_name: request.text.prompt_name.as_deref(),
            truncate: request.text.truncate,
            direction: direction(request.text.truncation_direction.as_deref())?,
            max_length: None,
        },
        outputs,
        normalize,
        pruning: pruning(request.top_k, request.min_value)?,
        encoding: Encoding::Float32,
        role,
    })
}

impl Rows {
    /// A sequence's one row (a dense vector).
    fn first(self) -> Option<Row> {
        match self {
            Rows::Float(rows) => rows.into_iter().next().map(Row::Float),
            Rows::Int8(rows) => rows.into_iter().next().map(Row::Int8),
            Rows::Binary(rows) => rows.into_iter().next().map(Row::Binary),
        }
    }
}

/// Each sequence's rows, as their encoding packs them (none when the output is absent).
fn rows(vectors: Option<&TokenVectors>) -> Vec<Rows> {
    let Some(v) = vectors else { return Vec::new() };
    let width = match v.encoding() {
        Encoding::Float32 => {
            return token_vectors(vectors)
                .into_iter()
                .map(Rows::Float)
                .collect()
        }
        Encoding::Int8 => v.dimensions as usize,
        Encoding::Binary => (v.dimensions as usize).div_ceil(8),
    };
    let row = |r: usize| &v.data[r * width..(r + 1) * width];
    (v.offsets.windows(2))
        .map(|w| {
            let span = w[0] as usize..w[1] as usize;
            match v.encoding() {
                Encoding::Int8 => Rows::Int8(
                    span.map(|r| row(r).iter().map(|&b| b as i8).collect())
                        .collect(),
                ),
                _ => Rows::Binary(span.map(|r| row(r).to_vec()).collect()),
            }
        })
        .collect()
}

/// Each sequence's sparse entries (none when the output is absent).
fn sparse(vectors: Option<&SparseVectors>) -> Vec<Vec<SparseValue>> {
    let Some(v) = vectors else { return Vec::new() };
    (v.offsets.windows(2))
        .map(|w| {
            let span = w[0] as usize..w[1] as usize;
            (v.indices[span.clone()].iter().zip(&v.values[span]))
                .map(|(&index, &value)| SparseValue { index, value })
                .collect()
        })
        .collect()
}

/// Each sequence's rows (none when the output is absent).
fn token_vectors(vectors: Option<&TokenVectors>) -> Vec<Vec<Vec<f32>>> {
    let Some(v) = vectors else { return Vec::new() };
    let values = floats(&v.data);
    let dim = v.dimensions as usize;
    (v.offsets.windows(2))
        .map(|w| {
            (w[0] as usize..w[1] as usize)
                .map(|r| values[r * dim..(r + 1) * dim].to_vec())
                .collect()
        })
        .collect()
}

fn pruning(top_k: Option<i64>, min_value: Option<f64>) -> Result<Pruning, IvyError> {
    let top_k = match top_k {
        Some(k) if k < 1 => {
            return Err(IvyError::Validation(format!(
                "`top_k` must be at least 1, not {k}"
            )))
        }
        k => k.map(|k| k as usize),
    };
    let min_value = match min_value {
        Some(v) if !v.is_finite() || v < 0.0 => {
            return Err(IvyError::Validation(format!(
                "`min_value` must be a number of at least 0, not {v}"
            )))
        }
        v => v.unwrap_or(0.0) as f32,
    };
    Ok(Pruning { top_k, min_value })
}
