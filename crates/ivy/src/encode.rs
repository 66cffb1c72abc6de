//! The path of the routes that ask for several outputs of one pass (/encode, /embed_sparse,
//! /embed_all): tokenization as every embedding route's, then Tulip's Encode over the replicas.

use std::time::Instant;

use tulip::outputs::{Wanted, MAX_TOKEN_VECTOR_BYTES};
use tulip::proto::{EncodeRequest, EncodeResponse, Encoding, Output};
use tulip::sparse::Pruning;

use crate::error::IvyError;
use crate::gateway::Gateway;
use crate::input::Input;
use crate::request::{TextOptions, Timings};
use crate::template::Role;

/// What an output route asks of the shared path.
#[derive(Debug, Clone)]
pub struct EncodeCall<'a> {
    pub inputs: Vec<Input>,
    pub text: TextOptions<'a>,
    pub outputs: Vec<Output>,
    /// L2-normalize the dense vectors.
    pub normalize: bool,
    pub pruning: Pruning,
    /// How dense vectors and multi-vectors are packed (float32, int8 or binary).
    pub encoding: Encoding,
    /// Query or document (None: document): a ColBERT model tokenizes each its own way; another
    /// model takes its prompt of that name where it has one and no prompt is named.
    pub role: Option<Role>,
}

/// The outputs of a request, with the facts a response reports.
pub struct Encoded {
    pub outputs: EncodeResponse,
    pub tokens: usize,
    pub timings: Timings,
}

impl Gateway {
    /// Validates, tokenizes and encodes the inputs of one request (inputs past the model's limit
    /// are truncated or refused: windows would not line up with a text's tokens).
    pub async fn encode(
        &self,
        route: &'static str,
        call: EncodeCall<'_>,
    ) -> Result<Encoded, IvyError> {
        let inputs = call.inputs.len();
        let encoded = self.encode_unrecorded(call).await?;
        crate::metrics::record(route, inputs, &encoded.timings);
        Ok(encoded)
    }

    /// `encode` without its metrics, for a route that records its parts as one request.
    pub(crate) async fn encode_unrecorded(
        &self,
        call: EncodeCall<'_>,
    ) -> Result<Encoded, IvyError> {
        let start = Instant::now();
        let _permit = self.admit()?;
        self.require_task("embed")?;
        self.check_batch_size(call.inputs.len())?;
        let model = self.model();
        let outputs: Vec<i32> = call.outputs.iter().map(|&o| o as i32).collect();
        let wanted =
            Wanted::parse(&outputs, model).map_err(|e| IvyError::Unsupported(e.to_string()))?;
        let colbert = self.colbert();
        let role = call.role.unwrap_or_default();
        let role_prompt = (call.role.filter(|_| colbert.is_none()))
            .map(Role::name)
            .filter(|name| self.prompt(Some(name)).is_ok());
        let text = TextOptions {
            max_length: colbert.map(|c| c.limit(role)),
            prompt_name: call.text.prompt_name.or(role_prompt),
            ..call.text
        };
        let (windows, characters) = self.tokenize(call.inputs, text, false).await?;
        let mut sequences: Vec<Vec<u32>> = windows.into_iter().flatten().collect();
        if let Some(colbert) = colbert {
            sequences = (sequences.into_iter())
                .map(|ids| colbert.apply(ids, role))
                .collect();
        }
        let tokens = sequences.iter().map(Vec::len).sum();
        let bytes = wanted.token_vector_bytes(model, tokens, sequences.len());
        if bytes > MAX_TOKEN_VECTOR_BYTES {
            return Err(IvyError::TooLarge(format!(
                "the token vectors of {tokens} tokens would take {} MiB, over the {} MiB a request may have; send fewer inputs",
                bytes >> 20,
                MAX_TOKEN_VECTOR_BYTES >> 20
            )));
        }
        let tokenization = start.elapsed();
        let _queued = self.admit_tokens(tokens)?;
        let template = EncodeRequest {
            outputs,
            normalize: call.normalize,
            sparse_top_k: call
                .pruning
                .top_k
                .map_or(0, |k| k.min(u32::MAX as usize) as u32),
            sparse_min_value: call.pruning.min_value,
            multi_vector_skip_ids: colbert.map_or(Vec::new(), |c| c.skipped(role).to_vec()),
            encoding: call.encoding as i32,
            ..EncodeRequest::default()
        };
        let (outputs, chunk) = self.replicas().encode(&sequences, &template).await?;
        Ok(Encoded {
            outputs,
            tokens,
            timings: Timings::of(start, tokenization, chunk, tokens, characters),
        })
    }
}
