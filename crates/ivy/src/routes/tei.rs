//! The text-embeddings-inference-compatible API: POST /embed, /tokenize, /decode, /similarity,
//! /predict (its /rerank is in rerank.rs, /embed_sparse and /embed_all in outputs.rs).

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokenizers::TruncationDirection;
use tulip::proto::Encoding;
use utoipa::ToSchema;

use super::body::JsonBody;
use super::openai::floats;
use super::schema::{Inputs, PredictInputs, TokenIds};
use super::timing::timing_headers;
use crate::config::LongInputs;
use crate::error::{ErrorResponses, IvyError};
use crate::gateway::Gateway;
use crate::input::{parse_inputs, Input};
use crate::request::EmbedCall;
use crate::score::PredictInput;
use crate::tokenization::{EncodeOptions, Token};

/// The fields TEI's text routes share (/embed, /embed_sparse, /embed_all, /encode): the inputs,
/// how they are cut, and a prompt.
#[derive(Deserialize, ToSchema)]
pub(super) struct TextInputs {
    #[serde(default)]
    #[schema(value_type = Inputs)]
    pub(super) inputs: Value,
    /// Truncate inputs longer than the model's limit (default: --auto-truncate).
    #[serde(default)]
    pub(super) truncate: Option<bool>,
    /// Left or Right (default).
    #[serde(default)]
    pub(super) truncation_direction: Option<String>,
    /// A prompt of the model's sentence-transformers config, put before each text.
    #[serde(default)]
    pub(super) prompt_name: Option<String>,
}

/// TEI's embed request.
#[derive(Deserialize, ToSchema)]
pub(super) struct EmbedRequest {
    #[serde(flatten)]
    text: TextInputs,
    /// L2-normalize the vectors (default true).
    #[serde(default = "yes")]
    #[schema(default = true)]
    normalize: bool,
    /// Matryoshka truncation to this many dimensions.
    #[serde(default)]
    dimensions: Option<i64>,
    /// Inputs longer than the model: truncate or chunk (default: --long-inputs).
    #[serde(default)]
    long_inputs: Option<LongInputs>,
}

pub(super) fn yes() -> bool {
    true
}

#[utoipa::path(post, path = "/embed", operation_id = "tei_embed", tag = "TEI", request_body = EmbedRequest,
    responses(
        (status = 200, description = "One vector per input", body = Vec<Vec<f32>>),
        ErrorResponses))]
pub(super) async fn embed(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<EmbedRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "embed")?;
    let call = EmbedCall {
        inputs: parse_inputs(&request.text.inputs, "inputs")?,
        prompt_name: request.text.prompt_name,
        truncate: request.text.truncate,
        direction: direction(request.text.truncation_direction.as_deref())?,
        normalize: request.normalize,
        dimensions: request.dimensions,
        encoding: Encoding::Float32,
        long_inputs: request.long_inputs,
    };
    let embedded = gateway.embed("tei", call).await?;
    let e = &embedded.vectors;
    let vectors: Vec<Vec<f32>> = (0..e.count).map(|i| floats(e.row(i))).collect();
    Ok((timing_headers(&embedded.timings), Json(vectors)))
}

/// TEI's tokenize request.
#[derive(Deserialize, ToSchema)]
pub(super) struct TokenizeRequest {
    #[serde(default)]
    #[schema(value_type = Inputs)]
    inputs: Value,
    /// Add the model's special tokens (default true).
    #[serde(default = "yes")]
    #[schema(default = true)]
    add_special_tokens: bool,
    #[serde(default)]
    prompt_name: Option<String>,
}

#[utoipa::path(post, path = "/tokenize", operation_id = "tei_tokenize", tag = "TEI", request_body = TokenizeRequest,
    responses(
        (status = 200, description = "Each input's tokens", body = Vec<Vec<Token>>),
        ErrorResponses))]
pub(super) async fn tokenize(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<TokenizeRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "embed")?;
    let _permit = gateway.admit()?;
    let options = Arc::new(EncodeOptions {
        prompt: gateway.prompt(request.prompt_name.as_deref())?.into(),
        truncate: false,
        direction: TruncationDirection::Right,
        add_special_tokens: request.add_special_tokens,
        inline: false,
        max_length: None,
    });
    let texts = parse_inputs(&request.inputs, "inputs")?
        .into_iter()
        .enumerate()
        .map(|(i, input)| match input {
            Input::Text(text) => Ok(text),
            Input::Ids(_) => Err(IvyError::Validation(format!(
                "`inputs[{i}]` must be text to tokenize"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    gateway.check_batch_size(texts.len())?;
    let tokens = try_join_all(
        texts
            .into_iter()
            .map(|text| gateway.tokenizer().tokenize(text, options.clone())),
    )
    .await?;
    Ok(Json(tokens))
}

/// TEI's decode request.
#[derive(Deserialize, ToSchema)]
pub(super) struct DecodeRequest {
    #[serde(default)]
    #[schema(value_type = TokenIds)]
    ids: Value,
    /// Leave the special tokens out of the text (default true).
    #[serde(default = "yes")]
    #[schema(default = true)]
    skip_special_tokens: bool,
}

/// The text of one sequence, or of each.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Decoded {
    One(String),
    Many(Vec<String>),
}

/// TEI's `/decode`: token ids (a list, or a list of lists) to text (a string, or a list).
#[utoipa::path(post, path = "/decode", operation_id = "tei_decode", tag = "TEI", request_body = DecodeRequest,
    responses(
        (status = 200, description = "The text", body = Decoded),
        ErrorResponses))]
pub(super) async fn decode(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<DecodeRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "embed")?;
    let _permit = gateway.admit()?;
    let inputs = parse_inputs(&request.ids, "ids")?;
    let single = matches!(&request.ids, Value::Array(items) if items.iter().all(Value::is_number));
    let vocab = gateway.model().vocab_size;
    let sequences = (inputs.into_iter().enumerate())
        .map(|(i, input)| match input {
            Input::Ids(ids) => match ids.iter().find(|&&id| id >= vocab) {
                Some(id) => Err(IvyError::Validation(format!(
                    "`ids[{i}]` has token id {id}, outside the model's vocabulary of {vocab}"
                ))),
                None => Ok(ids),
            },
            Input::Text(_) => Err(IvyError::Validation(format!(
                "`ids[{i}]` must be token ids, not text"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    gateway.check_batch_size(sequences.len())?;
    let texts = gateway
        .tokenizer()
        .decode(&sequences, request.skip_special_tokens)?;
    Ok(Json(if single {
        Decoded::One(texts.into_iter().next().unwrap_or_default())
    } else {
        Decoded::Many(texts)
    }))
}

pub(super) fn direction(value: Option<&str>) -> Result<TruncationDirection, IvyError> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("right") => Ok(TruncationDirection::Right),
        Some("left") => Ok(TruncationDirection::Left),
        Some(_) => Err(IvyError::Validation(format!(
            "`truncation_direction` must be Left or Right, not {:?}",
            value.unwrap_or_default()
        ))),
    }
}

/// TEI's similarity request.
#[derive(Deserialize, ToSchema)]
pub(super) struct SimilarityRequest {
    #[serde(default)]
    inputs: SimilarityInputs,
}

/// A sentence and the sentences to compare it with.
#[derive(Deserialize, Default, ToSchema)]
struct SimilarityInputs {
    #[serde(default)]
    source_sentence: String,
    #[serde(default)]
    sentences: Vec<String>,
}

/// TEI's `/similarity`: the cosine of the source sentence with each sentence, in their order.
#[utoipa::path(post, path = "/similarity", operation_id = "tei_similarity", tag = "TEI", request_body = SimilarityRequest,
    responses(
        (status = 200, description = "One cosine per sentence", body = Vec<f32>),
        ErrorResponses))]
pub(super) async fn similarity(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<SimilarityRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "embed")?;
    gateway.require_task("embed")?;
    let call = crate::score::RerankCall {
        query: request.inputs.source_sentence,
        documents: request.inputs.sentences,
        ..Default::default()
    };
    let scored = gateway.rerank("tei_similarity", call).await?;
    Ok((timing_headers(&scored.timings), Json(scored.scores)))
}

/// TEI's predict request.
#[derive(Deserialize, ToSchema)]
pub(super) struct PredictRequest {
    #[serde(default)]
    #[schema(value_type = PredictInputs)]
    inputs: Value,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    raw_scores: bool,
}

/// A label and its score.
#[derive(Serialize, ToSchema)]
struct Prediction {
    label: String,
    score: f32,
}

/// One input's labels, best first; a list of those for a list of inputs.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum Predictions {
    One(Vec<Prediction>),
    Many(Vec<Vec<Prediction>>),
}

/// TEI's `/predict`: a sequence-classification model's labels with their scores, best first;
/// `inputs` is a text, a pair of texts, or a list of either (then a list of answers).
#[utoipa::path(post, path = "/predict", operation_id = "tei_predict", tag = "TEI", request_body = PredictRequest,
    responses(
        (status = 200, description = "The labels with their scores", body = Predictions),
        ErrorResponses))]
pub(super) async fn predict(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<PredictRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let gateway = gateway.select(None, "score")?;
    let (inputs, single) = predict_inputs(&request.inputs)?;
    let (scores, labels, _, timings) = gateway
        .predict(inputs, request.truncate, request.raw_scores)
        .await?;
    let names = &gateway.model().labels;
    let mut answers: Vec<Vec<Prediction>> = scores
        .chunks(labels.max(1))
        .map(|row| {
            let mut ranked: Vec<Prediction> = row
                .iter()
                .enumerate()
                .map(|(i, &score)| Prediction {
                    label: names
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| format!("LABEL_{i}")),
                    score,
                })
                .collect();
            ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
            ranked
        })
        .collect();
    let body = if single {
        Predictions::One(answers.swap_remove(0))
    } else {
        Predictions::Many(answers)
    };
    Ok((timing_headers(&timings), Json(body)))
}

/// `/predict`'s inputs: (first text, second text of a pair), and whether one input was sent bare.
fn predict_inputs(value: &Value) -> Result<(Vec<PredictInput>, bool), IvyError> {
    let one = |item: &Value, at: &str| match item {
        Value::String(text) => Ok((text.clone(), None)),
        Value::Array(pair) => match pair.as_slice() {
            [Value::String(a), Value::String(b)] => Ok((a.clone(), Some(b.clone()))),
            _ => Err(IvyError::Validation(format!(
                "`{at}` must be a text or a pair of two texts"
            ))),
        },
        _ => Err(IvyError::Validation(format!(
            "`{at}` must be a text or a pair of two texts"
        ))),
    };
    match value {
        Value::String(_) => Ok((vec![one(value, "inputs")?], true)),
        Value::Array(items) if items.is_empty() => {
            Err(IvyError::Validation("`inputs` cannot be empty".into()))
        }
        Value::Array(items) if items.len() == 2 && items.iter().all(Value::is_string) => {
            Ok((vec![one(value, "inputs")?], true))
        }
        Value::Array(items) => Ok((
            items
                .iter()
                .enumerate()
                .map(|(i, item)| one(item, &format!("inputs[{i}]")))
                .collect::<Result<_, _>>()?,
            false,
        )),
        Value::Null => Err(IvyError::Validation("`inputs` is required".into())),
        _ => Err(IvyError::Validation(
            "`inputs` must be a text, a pair of texts, or a list of them".into(),
        )),
    }
}
