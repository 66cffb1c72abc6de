//! The text-embeddings-inference-compatible API: POST /embed, POST /tokenize.

use std::sync::Arc;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use futures::future::try_join_all;
use serde::Deserialize;
use serde_json::Value;
use tokenizers::TruncationDirection;
use tulip::proto::Encoding;

use super::body::JsonBody;
use super::openai::floats;
use super::timing::timing_headers;
use crate::error::IvyError;
use crate::gateway::Gateway;
use crate::input::{parse_inputs, Input};
use crate::request::EmbedCall;
use crate::tokenization::EncodeOptions;

#[derive(Deserialize)]
pub(super) struct EmbedRequest {
    #[serde(default)]
    inputs: Value,
    #[serde(default = "yes")]
    normalize: bool,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Option<String>,
    #[serde(default)]
    prompt_name: Option<String>,
    #[serde(default)]
    dimensions: Option<i64>,
}

fn yes() -> bool {
    true
}

pub(super) async fn embed(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<EmbedRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let call = EmbedCall {
        inputs: parse_inputs(&request.inputs, "inputs")?,
        prompt_name: request.prompt_name,
        truncate: request.truncate,
        direction: direction(request.truncation_direction.as_deref())?,
        normalize: request.normalize,
        dimensions: request.dimensions,
        encoding: Encoding::Float32,
    };
    let embedded = gateway.embed("tei", call).await?;
    let e = &embedded.vectors;
    let vectors: Vec<Vec<f32>> = (0..e.count).map(|i| floats(e.row(i))).collect();
    Ok((timing_headers(&embedded.timings), Json(vectors)))
}

#[derive(Deserialize)]
pub(super) struct TokenizeRequest {
    #[serde(default)]
    inputs: Value,
    #[serde(default = "yes")]
    add_special_tokens: bool,
    #[serde(default)]
    prompt_name: Option<String>,
}

pub(super) async fn tokenize(
    State(gateway): State<Gateway>,
    JsonBody(request): JsonBody<TokenizeRequest>,
) -> Result<impl IntoResponse, IvyError> {
    let _permit = gateway.admit()?;
    let options = Arc::new(EncodeOptions {
        prompt: gateway.prompt(request.prompt_name.as_deref())?.into(),
        truncate: false,
        direction: TruncationDirection::Right,
        add_special_tokens: request.add_special_tokens,
        inline: false,
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

fn direction(value: Option<&str>) -> Result<TruncationDirection, IvyError> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("right") => Ok(TruncationDirection::Right),
        Some("left") => Ok(TruncationDirection::Left),
        Some(_) => Err(IvyError::Validation(format!(
            "`truncation_direction` must be Left or Right, not {:?}",
            value.unwrap_or_default()
        ))),
    }
}
