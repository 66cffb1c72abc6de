//! The OpenAPI schemas of the fields that routes read as free JSON (crate::input parses them, with
//! its own errors): what a client may send there.

#![allow(dead_code)] // The types only describe JSON; they are never built.

use serde::Serialize;
use utoipa::ToSchema;

/// Inputs to embed or tokenize: a text, texts, token ids, or lists of token ids.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Inputs {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdsList(Vec<Vec<u32>>),
}

/// Token ids to decode: one sequence, or several.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum TokenIds {
    Ids(Vec<u32>),
    IdsList(Vec<Vec<u32>>),
}

/// `/predict`'s inputs: a text, a pair of texts, or a list of either.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum PredictInputs {
    Text(String),
    Pair(Vec<String>),
    Texts(Vec<String>),
    Pairs(Vec<Vec<String>>),
}

/// A document to rerank: its text, or an object with a `text`.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(super) enum Document {
    Text(String),
    Object(DocumentObject),
}

/// A document as an object.
#[derive(Serialize, ToSchema)]
pub(super) struct DocumentObject {
    text: String,
}
