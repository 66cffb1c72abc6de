//! The one request path every embedding route shares: limits, templating, tokenization, the
//! replicas, timings. A route parses its body into an [`EmbedCall`] and renders the [`Embedded`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tokenizers::TruncationDirection;
use tulip::postprocess::Shape;
use tulip::proto::Encoding;

use crate::chunking::combine;
use crate::config::LongInputs;
use crate::error::IvyError;
use crate::gateway::Gateway;
use crate::input::Input;
use crate::replicas::{floats, ChunkTimes, VectorShape, Vectors};
use crate::tokenization::{EncodeOptions, INLINE_BYTES};

/// What a route asks of the shared path.
#[derive(Debug, Clone)]
pub struct EmbedCall {
    pub inputs: Vec<Input>,
    pub prompt_name: Option<String>,
    /// None follows `--auto-truncate`.
    pub truncate: Option<bool>,
    pub direction: TruncationDirection,
    pub normalize: bool,
    pub dimensions: Option<i64>,
    pub encoding: Encoding,
    /// None follows `--long-inputs`.
    pub long_inputs: Option<LongInputs>,
}

/// The vectors of a request, with the facts a response reports.
pub struct Embedded {
    pub vectors: Vectors,
    pub tokens: usize,
    pub timings: Timings,
}

/// Where a request's time went (its slowest chunk's, for the parts in Tulip), and what it
/// computed: TEI's timing and compute headers.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    pub tokenization: Duration,
    pub queue: Duration,
    pub inference: Duration,
    /// gRPC and (de)serialization between Ivy and Tulip.
    pub transfer: Duration,
    pub total: Duration,
    /// Tokens the engine ran, and characters of text the request sent.
    pub tokens: usize,
    pub characters: usize,
}

impl Timings {
    /// The timings of a request that started at `start` and spent `tokenization` on its text,
    /// its slowest chunk's `chunk` in Tulip.
    pub fn of(
        start: Instant,
        tokenization: Duration,
        chunk: ChunkTimes,
        tokens: usize,
        characters: usize,
    ) -> Timings {
        Timings {
            tokenization,
            queue: chunk.queue,
            inference: chunk.inference,
            transfer: chunk.transfer,
            total: start.elapsed(),
            tokens,
            characters,
        }
    }

    /// TEI's compute time: tokenization, queue and inference.
    pub fn compute(&self) -> Duration {
        self.tokenization + self.queue + self.inference
    }
}

/// How a request's texts are tokenized.
#[derive(Debug, Clone, Copy)]
pub struct TextOptions<'a> {
    pub prompt_name: Option<&'a str>,
    /// None follows `--auto-truncate`.
    pub truncate: Option<bool>,
    pub direction: TruncationDirection,
    /// A shorter limit than the model's (a ColBERT model's query or document length).
    pub max_length: Option<usize>,
}

impl Gateway {
    /// The token ids of each input (with `chunked`, the windows of one longer than the model's
    /// limit), and the characters of text the request sent.
    pub(crate) async fn tokenize(
        &self,
        inputs: Vec<Input>,
        text: TextOptions<'_>,
        chunked: bool,
    ) -> Result<(Vec<Vec<Vec<u32>>>, usize), IvyError> {
        let prompt: Arc<str> = self.prompt(text.prompt_name)?.into();
        let characters = (inputs.iter())
            .map(|input| match input {
                Input::Text(text) => text.chars().count(),
                Input::Ids(_) => 0,
            })
            .sum();
        let text_bytes: usize = (inputs.iter())
            .map(|input| match input {
                Input::Text(text) => prompt.len() + text.len(),
                Input::Ids(_) => 0,
            })
            .sum();
        let options = Arc::new(EncodeOptions {
            prompt,
            truncate: text.truncate.unwrap_or(self.args().auto_truncate),
            direction: text.direction,
            add_special_tokens: true,
            inline: text_bytes <= INLINE_BYTES,
            max_length: text.max_length,
        });
        let windows = try_join_all(
            (inputs.into_iter().enumerate())
                .map(|(i, input)| self.windows(i, input, &options, chunked)),
        )
        .await?;
        Ok((windows, characters))
    }

    /// Validates, tokenizes and embeds the inputs of one request.
    pub async fn embed(&self, route: &'static str, call: EmbedCall) -> Result<Embedded, IvyError> {
        let start = Instant::now();
        let _permit = self.admit()?;
        self.require_task("embed")?;
        self.require_dense()?;
        self.check_batch_size(call.inputs.len())?;
        let dimensions = self.check_dimensions(call.dimensions)?;
        let chunked = call.long_inputs.unwrap_or(self.args().long_inputs) == LongInputs::Chunk;
        let text = TextOptions {
            prompt_name: call.prompt_name.as_deref(),
            truncate: call.truncate,
            direction: call.direction,
            max_length: None,
        };
        let (windows, characters) = self.tokenize(call.inputs, text, chunked).await?;
        let tokenization = start.elapsed();
        let tokens = windows.iter().flatten().map(Vec::len).sum();
        let shape = VectorShape {
            normalize: call.normalize,
            dimensions,
            encoding: call.encoding,
        };
        let _queued = self.admit_tokens(tokens)?;
        let (vectors, chunk) = if windows.iter().all(|w| w.len() == 1) {
            let sequences: Vec<Vec<u32>> = windows.into_iter().flatten().collect();
            self.replicas().embed(&sequences, &[], shape).await?
        } else {
            self.embed_windows(windows, shape).await?
        };
        let embedded = Embedded {
            vectors,
            tokens,
            timings: Timings::of(start, tokenization, chunk, tokens, characters),
        };
        crate::metrics::record(route, embedded.vectors.count, &embedded.timings);
        Ok(embedded)
    }

    /// Embeds every window of every input as a sequence of its own (packed with everything
    /// else), then combines each input's windows into its one vector, shaped as asked.
    async fn embed_windows(
        &self,
        windows: Vec<Vec<Vec<u32>>>,
        shape: VectorShape,
    ) -> Result<(Vectors, ChunkTimes), IvyError> {
        let lengths: Vec<Vec<usize>> = (windows.iter())
            .map(|w| w.iter().map(Vec::len).collect())
            .collect();
        let sequences: Vec<Vec<u32>> = windows.into_iter().flatten().collect();
        let raw = VectorShape {
            normalize: false,
            dimensions: 0,
            encoding: Encoding::Float32,
        };
        let (window_vectors, times) = self.replicas().embed(&sequences, &[], raw).await?;
        let width = window_vectors.dimensions;
        let floats = floats(&window_vectors.data);
        let dimensions = if shape.dimensions == 0 {
            width
        } else {
            shape.dimensions as usize
        };
        let shaped = Shape {
            dimensions,
            normalize: shape.normalize,
            encoding: shape.encoding,
        };
        let vectors = Vectors {
            count: lengths.len(),
            dimensions,
            encoding: shape.encoding,
            data: combine(&floats, width, &lengths, shaped),
        };
        Ok((vectors, times))
    }

    /// An input's token ids: one sequence, or with `chunked` the windows a text longer than the
    /// model's limit is cut into (pre-tokenized ids are never chunked).
    async fn windows(
        &self,
        index: usize,
        input: Input,
        options: &Arc<EncodeOptions>,
        chunked: bool,
    ) -> Result<Vec<Vec<u32>>, IvyError> {
        match input {
            Input::Text(text) if chunked && !text.is_empty() => {
                let overlap = self.args().chunk_overlap;
                (self.tokenizer())
                    .encode_windows(text, overlap, options.clone())
                    .await
            }
            input => Ok(vec![self.sequence(index, input, options).await?]),
        }
    }

    /// The token ids of one input: text goes through the tokenizer pool, ids are checked.
    async fn sequence(
        &self,
        index: usize,
        input: Input,
        options: &Arc<EncodeOptions>,
    ) -> Result<Vec<u32>, IvyError> {
        match input {
            Input::Text(text) if text.is_empty() => Err(IvyError::Validation(format!(
                "input {index} is an empty string"
            ))),
            Input::Text(text) => self.tokenizer().encode(index, text, options.clone()).await,
            Input::Ids(ids) => self.check_ids(index, ids, options),
        }
    }

    fn check_ids(
        &self,
        index: usize,
        mut ids: Vec<u32>,
        options: &EncodeOptions,
    ) -> Result<Vec<u32>, IvyError> {
        let max = options.limit(self.tokenizer().max_input_length());
        let vocab = self.model().vocab_size;
        if ids.is_empty() {
            return Err(IvyError::Validation(format!(
                "input {index} is an empty list of token ids"
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id >= vocab) {
            return Err(IvyError::Validation(format!(
                "input {index} has token id {id}, outside the model's vocabulary of {vocab}"
            )));
        }
        if ids.len() > max {
            if !options.truncate {
                return Err(IvyError::Validation(format!(
                    "input {index} has {} tokens, more than the model's limit of {max}; shorten it or set truncate to true",
                    ids.len()
                )));
            }
            match options.direction {
                TruncationDirection::Right => ids.truncate(max),
                TruncationDirection::Left => ids = ids.split_off(ids.len() - max),
            }
        }
        Ok(ids)
    }

    /// Dense routes need a model with a dense vector (a SPLADE model's are sparse, a ColBERT
    /// model's a vector a token).
    fn require_dense(&self) -> Result<(), IvyError> {
        let model = self.model();
        if model.task != "embed" || model.outputs.iter().any(|o| o == "dense") {
            return Ok(());
        }
        Err(IvyError::Unsupported(if model.pooling == "splade" {
            format!(
                "{} is a SPLADE model: its vectors are sparse, served by /embed_sparse",
                model.model_id
            )
        } else {
            format!(
                "{} is a multi-vector (ColBERT) model: it has a vector a token, served by /encode (multi_vector); the rerank routes score by MaxSim",
                model.model_id
            )
        }))
    }

    /// Refuses a request of the other task, naming the model's: an embedding route asked of a
    /// score model (a reranker), or a score route of an embedding model.
    pub(crate) fn require_task(&self, task: &str) -> Result<(), IvyError> {
        let model = self.model();
        if model.task == task {
            return Ok(());
        }
        let (kind, routes) = match model.task.as_str() {
            "score" => (
                "a score model (a reranker or classifier)",
                "/rerank, /v1/rerank, /v2/rerank or /predict",
            ),
            _ => (
                "an embedding model",
                "/v1/embeddings, /embed, /rerank or /similarity",
            ),
        };
        Err(IvyError::Unsupported(format!(
            "{} is {kind}: it answers {routes}",
            model.model_id
        )))
    }

    /// Rejects a request with no inputs, or more than `--max-client-batch-size`.
    pub(crate) fn check_batch_size(&self, inputs: usize) -> Result<(), IvyError> {
        let max = self.args().max_client_batch_size;
        if inputs == 0 {
            return Err(IvyError::Validation("inputs cannot be empty".into()));
        }
        if inputs > max {
            return Err(IvyError::TooLarge(format!(
                "{inputs} inputs in one request; this server takes at most {max} (--max-client-batch-size)"
            )));
        }
        Ok(())
    }

    /// 0 means the model's full dimension.
    fn check_dimensions(&self, dimensions: Option<i64>) -> Result<u32, IvyError> {
        let full = self.model().dimensions as i64;
        match dimensions {
            None => Ok(0),
            Some(d) if (1..=full).contains(&d) => Ok(d as u32),
            Some(d) => Err(IvyError::Validation(format!(
                "`dimensions` must be between 1 and {full}; got {d}"
            ))),
        }
    }
}
