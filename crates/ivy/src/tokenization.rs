//! Tokenization on a pool of worker threads, so that long inputs never hold up the async executor.
//!
//! Each worker owns a clone of the tokenizer and takes one input at a time from a shared channel;
//! async callers await a oneshot answer. Short requests (a search query) are tokenized on the
//! caller's thread instead: handing one to a worker and back costs two thread wake-ups, many times
//! what tokenizing it costs.

use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Instant;

use serde::Serialize;
pub use tokenizers::TruncationDirection;
use tokenizers::{EncodeInput, Tokenizer, TruncationParams, TruncationStrategy};
use tokio::sync::oneshot;

use crate::error::IvyError;
use crate::fast_tokenizer::{FastTokenizer, Ids};

/// How to tokenize the inputs of one request.
#[derive(Debug, Clone)]
pub struct EncodeOptions {
    /// Text put before every input (the model's prompt or instruction).
    pub prompt: Arc<str>,
    /// Cut inputs longer than the model's limit instead of rejecting them.
    pub truncate: bool,
    pub direction: TruncationDirection,
    pub add_special_tokens: bool,
    /// Tokenize on the caller's thread rather than a worker's: for short requests (see
    /// [`INLINE_BYTES`]), where the hand-over would cost more than the work.
    pub inline: bool,
    /// A shorter limit than the model's for these inputs (a ColBERT model's query or document
    /// length), in tokens with the special ones.
    pub max_length: Option<usize>,
}

impl EncodeOptions {
    /// The most tokens an input may have: `max_length`, else the model's `limit`.
    pub fn limit(&self, model_limit: usize) -> usize {
        self.max_length.unwrap_or(model_limit)
    }
}

/// How to tokenize the (query, document) pairs of one request for a score model.
#[derive(Debug, Clone)]
pub struct PairOptions {
    pub query: Arc<str>,
    /// Shorten a document (never the query) to fit the model's limit instead of rejecting it.
    pub truncate: bool,
    /// A document's own limit in tokens before it is paired (Cohere's `max_tokens_per_doc`).
    pub max_doc_tokens: Option<usize>,
    /// A causal reranker's prompt; None: the tokenizer's own pair template.
    pub rendered: Option<Rendered>,
    /// Tokenize on the caller's thread (see [`EncodeOptions::inline`]).
    pub inline: bool,
    /// Cut a document past the limit into windows sharing this many tokens, each paired with
    /// the query (`--long-inputs chunk`); None truncates or refuses it.
    pub overlap: Option<usize>,
}

/// A causal reranker's prompt for one request: `content` holds `{query}` and `{document}` (the
/// instruction already in), between the prefix's and the suffix's token ids.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub prefix: Arc<[u32]>,
    pub content: String,
    pub suffix: Arc<[u32]>,
}

/// A pair's sequence: its token ids, and its token type ids where the template sets them.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub types: Option<Vec<u32>>,
}

/// One token as `/tokenize` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub special: bool,
    /// Byte offsets in the templated input; absent for special tokens.
    pub start: Option<usize>,
    pub stop: Option<usize>,
}

enum Job {
    Encode {
        index: usize,
        text: String,
        options: Arc<EncodeOptions>,
        reply: oneshot::Sender<Result<Vec<u32>, IvyError>>,
    },
    Windows {
        text: String,
        overlap: usize,
        options: Arc<EncodeOptions>,
        reply: oneshot::Sender<Result<Vec<Vec<u32>>, IvyError>>,
    },
    Tokenize {
        text: String,
        options: Arc<EncodeOptions>,
        reply: oneshot::Sender<Result<Vec<Token>, IvyError>>,
    },
    EncodePair {
        index: usize,
        document: String,
        options: Arc<PairOptions>,
        reply: oneshot::Sender<Result<Vec<Encoded>, IvyError>>,
    },
}

/// Requests whose texts (prompts included) add up to at most this many bytes are worth
/// tokenizing inline; larger ones keep the async threads free and use the workers in parallel.
pub const INLINE_BYTES: usize = 256;

/// Cheap-to-clone handle to the tokenization workers.
#[derive(Clone)]
pub struct TokenizerPool {
    jobs: crossbeam_channel::Sender<Job>,
    workers: usize,
    max_input_length: usize,
    /// Tokenizer copies for inline use, one per caller at a time; more are cloned when all are
    /// taken, so there are at most as many as inline calls ever ran at once.
    inline: Arc<Mutex<Vec<Worker>>>,
    prototype: Arc<Tokenizer>,
    /// Set once the v1 pipeline has loaded and passed its check (see [`FastTokenizer`]); until
    /// then, and without it, ids come from the classic tokenizer.
    fast: Arc<OnceLock<FastTokenizer>>,
}

impl TokenizerPool {
    /// Starts `workers` threads, each with its own copy of `tokenizer`; inputs are limited to
    /// `max_input_length` tokens, special tokens included.
    pub fn new(mut tokenizer: Tokenizer, workers: usize, max_input_length: usize) -> TokenizerPool {
        // Published tokenizer.json files often carry padding and a shorter truncation for
        // training; serving packs without padding and truncates per request.
        tokenizer.with_padding(None);
        let _ = tokenizer.with_truncation(None);
        let (jobs, queue) = crossbeam_channel::unbounded::<Job>();
        let workers = workers.max(1);
        let prototype = Arc::new(tokenizer);
        let fast = Arc::new(OnceLock::new());
        for i in 0..workers {
            let queue = queue.clone();
            let prototype = prototype.clone();
            let fast = fast.clone();
            // Each worker copies the tokenizer on its own thread: a large vocabulary takes
            // milliseconds a copy, which one thread doing them all would add to the start.
            thread::Builder::new()
                .name(format!("ivy-tokenizer-{i}"))
                .spawn(move || {
                    let mut worker = Worker::new((*prototype).clone(), fast, max_input_length);
                    queue.iter().for_each(|job| worker.run(job))
                })
                .expect("spawn a tokenization worker");
        }
        TokenizerPool {
            jobs,
            workers,
            max_input_length,
            inline: Arc::default(),
            prototype,
            fast,
        }
    }

    /// Whether ids come from the v1 pipeline (see [`FastTokenizer`]).
    pub fn fast(&self) -> bool {
        self.fast.get().is_some()
    }

    /// Takes ids from `fast` from now on: the same tokenizer.json, checked against this pool's
    /// tokenizer (see [`FastTokenizer::load`] and [`TokenizerPool::reference`]).
    pub fn use_fast(&self, fast: FastTokenizer) {
        let _ = self.fast.set(fast);
    }

    /// A copy of the classic tokenizer, to check the v1 pipeline against.
    pub fn reference(&self) -> Tokenizer {
        (*self.prototype).clone()
    }

    /// How many threads tokenize.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The model's input limit in tokens.
    pub fn max_input_length(&self) -> usize {
        self.max_input_length
    }

    /// Token ids of `options.prompt + text`; `index` names the input in error messages.
    pub async fn encode(
        &self,
        index: usize,
        text: String,
        options: Arc<EncodeOptions>,
    ) -> Result<Vec<u32>, IvyError> {
        if options.inline {
            return self.inline(|worker| worker.encode(index, &text, &options));
        }
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Encode {
            index,
            text,
            options,
            reply,
        })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Token ids of `options.prompt + text` in windows of the model's limit, each with the
    /// model's special tokens, consecutive ones sharing `overlap` tokens (one window when it fits).
    pub async fn encode_windows(
        &self,
        text: String,
        overlap: usize,
        options: Arc<EncodeOptions>,
    ) -> Result<Vec<Vec<u32>>, IvyError> {
        if options.inline {
            return self.inline(|worker| worker.windows(&text, overlap, &options));
        }
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Windows {
            text,
            overlap,
            options,
            reply,
        })?;
        answer.await.map_err(|_| stopped())?
    }

    /// The sequence of the pair (`options.query`, `document`), or with `options.overlap` the
    /// windows of a long document each paired with the query; `index` names the document in
    /// error messages.
    pub async fn encode_pair(
        &self,
        index: usize,
        document: String,
        options: Arc<PairOptions>,
    ) -> Result<Vec<Encoded>, IvyError> {
        if options.inline {
            return self.inline(|worker| worker.pair_windows(index, &document, &options));
        }
        let (reply, answer) = oneshot::channel();
        self.submit(Job::EncodePair {
            index,
            document,
            options,
            reply,
        })?;
        answer.await.map_err(|_| stopped())?
    }

    /// Token ids of `text` as they are (no prompt, no special tokens, no truncation).
    pub fn plain_ids(&self, text: &str) -> Result<Vec<u32>, IvyError> {
        self.inline(|worker| {
            let _ = worker.tokenizer.with_truncation(None);
            worker
                .tokenizer
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| IvyError::Tokenizer(e.to_string()))
        })
    }

    /// The texts of token-id sequences (special tokens left out with `skip_special_tokens`).
    pub fn decode(
        &self,
        sequences: &[Vec<u32>],
        skip_special_tokens: bool,
    ) -> Result<Vec<String>, IvyError> {
        self.inline(|worker| {
            (sequences.iter())
                .map(|ids| {
                    (worker.tokenizer.decode(ids, skip_special_tokens))
                        .map_err(|e| IvyError::Tokenizer(e.to_string()))
                })
                .collect()
        })
    }

    /// Tokens of `options.prompt + text`, with their text and offsets.
    pub async fn tokenize(
        &self,
        text: String,
        options: Arc<EncodeOptions>,
    ) -> Result<Vec<Token>, IvyError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Tokenize {
            text,
            options,
            reply,
        })?;
        answer.await.map_err(|_| stopped())?
    }

    fn inline<R>(&self, run: impl FnOnce(&mut Worker) -> R) -> R {
        let taken = self.lock_inline().pop();
        let mut worker = taken.unwrap_or_else(|| {
            let fast = self.fast.clone();
            Worker::new((*self.prototype).clone(), fast, self.max_input_length)
        });
        let out = run(&mut worker);
        self.lock_inline().push(worker);
        out
    }

    fn lock_inline(&self) -> std::sync::MutexGuard<'_, Vec<Worker>> {
        // The list holds no invariant a panic could break.
        self.inline.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn submit(&self, job: Job) -> Result<(), IvyError> {
        self.jobs.send(job).map_err(|_| stopped())
    }
}

fn stopped() -> IvyError {
    IvyError::Engine("the tokenization workers have stopped".into())
}

struct Worker {
    tokenizer: Tokenizer,
    fast: Arc<OnceLock<FastTokenizer>>,
    max_input_length: usize,
    /// Busy time against wall time times workers says whether tokenization could bottleneck.
    busy_microseconds: metrics::Counter,
}

impl Worker {
    fn new(
        tokenizer: Tokenizer,
        fast: Arc<OnceLock<FastTokenizer>>,
        max_input_length: usize,
    ) -> Worker {
        Worker {
            tokenizer,
            fast,
            max_input_length,
            busy_microseconds: metrics::counter!("ivy_tokenizer_busy_microseconds_total"),
        }
    }

    fn run(&mut self, job: Job) {
        let start = Instant::now();
        match job {
            Job::Encode {
                index,
                text,
                options,
                reply,
            } => {
                let _ = reply.send(self.encode(index, &text, &options));
            }
            Job::Windows {
                text,
                overlap,
                options,
                reply,
            } => {
                let _ = reply.send(self.windows(&text, overlap, &options));
            }
            Job::Tokenize {
                text,
                options,
                reply,
            } => {
                let _ = reply.send(self.tokenize(&text, &options));
            }
            Job::EncodePair {
                index,
                document,
                options,
                reply,
            } => {
                let _ = reply.send(self.pair_windows(index, &document, &options));
            }
        }
        self.busy_microseconds
            .increment(start.elapsed().as_micros() as u64);
    }

    fn encode(
        &mut self,
        index: usize,
        text: &str,
        options: &EncodeOptions,
    ) -> Result<Vec<u32>, IvyError> {
        let templated = format!("{}{text}", options.prompt);
        let limit = options.limit(self.max_input_length);
        let cut = truncation(limit, TruncationStrategy::LongestFirst, options.direction);
        match self.ids(&templated, None, options.add_special_tokens, cut, options.truncate) {
            Ok(ids) => Ok(ids.ids),
            Err(Refused::TooLong) => Err(IvyError::Validation(format!(
                "input {index} is longer than the model's limit of {limit} tokens; shorten it or set truncate to true"
            ))),
            Err(Refused::Failed(e)) => Err(IvyError::Tokenizer(format!(
                "input {index} could not be tokenized: {e}"
            ))),
        }
    }

    /// The ids of `first` (or of the pair `first`, `second`) within `cut`: shortened when
    /// `truncate`, else TooLong past it. Failed where `cut` cannot be met (the first of a pair
    /// alone too long) or tokenizing fails.
    fn ids(
        &mut self,
        first: &str,
        second: Option<&str>,
        specials: bool,
        cut: TruncationParams,
        truncate: bool,
    ) -> Result<Ids, Refused> {
        if let Some(fast) = self.fast.get() {
            if truncate {
                return fast
                    .encode(first, second, specials, Some(&cut))
                    .map_err(Refused::Failed);
            }
            let ids = (fast.encode(first, second, specials, None)).map_err(Refused::Failed)?;
            if ids.ids.len() <= cut.max_length {
                return Ok(ids);
            }
            // Too long either way; cutting says which refusal it is.
            return Err(match fast.encode(first, second, specials, Some(&cut)) {
                Ok(_) => Refused::TooLong,
                Err(e) => Refused::Failed(e),
            });
        }
        (self.tokenizer.with_truncation(Some(cut))).map_err(|e| Refused::Failed(e.to_string()))?;
        let input: EncodeInput = match second {
            Some(second) => (first, second).into(),
            None => first.into(),
        };
        let encoding = (self.tokenizer.encode_fast(input, specials))
            .map_err(|e| Refused::Failed(e.to_string()))?;
        if !truncate && !encoding.get_overflowing().is_empty() {
            return Err(Refused::TooLong);
        }
        Ok(Ids {
            ids: encoding.get_ids().to_vec(),
            types: encoding.get_type_ids().to_vec(),
        })
    }

    fn windows(
        &mut self,
        text: &str,
        overlap: usize,
        options: &EncodeOptions,
    ) -> Result<Vec<Vec<u32>>, IvyError> {
        let templated = format!("{}{text}", options.prompt);
        // Most inputs fit in one window, which v1 finds cheaply; the classic tokenizer's overflow
        // cuts the windows of the rest.
        if self.fast.get().is_some() {
            let whole = truncation(
                self.max_input_length,
                TruncationStrategy::LongestFirst,
                TruncationDirection::Right,
            );
            match self.ids(&templated, None, options.add_special_tokens, whole, false) {
                Ok(ids) => return Ok(vec![ids.ids]),
                Err(Refused::TooLong) => {}
                Err(Refused::Failed(e)) => {
                    return Err(IvyError::Tokenizer(format!(
                        "an input could not be tokenized: {e}"
                    )))
                }
            }
        }
        // The tokenizer's own overflow: each window post-processed with the special tokens.
        let stride = overlap.min(self.max_input_length / 2);
        let params = TruncationParams {
            direction: TruncationDirection::Right,
            max_length: self.max_input_length,
            strategy: TruncationStrategy::LongestFirst,
            stride,
        };
        self.tokenizer
            .with_truncation(Some(params))
            .map_err(|e| IvyError::Tokenizer(format!("cannot cut windows: {e}")))?;
        let encoding = (self.tokenizer)
            .encode_fast(templated.as_str(), options.add_special_tokens)
            .map_err(|e| IvyError::Tokenizer(format!("an input could not be tokenized: {e}")))?;
        let windows = std::iter::once(&encoding).chain(encoding.get_overflowing());
        Ok(windows.map(|w| w.get_ids().to_vec()).collect())
    }

    fn pair_windows(
        &mut self,
        index: usize,
        document: &str,
        options: &PairOptions,
    ) -> Result<Vec<Encoded>, IvyError> {
        // A causal reranker's prompt has the query before the document: its windows would lose
        // it, so such a reranker truncates its documents instead.
        let Some(overlap) = options.overlap.filter(|_| options.rendered.is_none()) else {
            let truncate = options.truncate || options.overlap.is_some();
            let options = PairOptions {
                truncate,
                ..options.clone()
            };
            return Ok(vec![self.encode_pair(index, document, &options)?]);
        };
        let document = match options.max_doc_tokens {
            Some(max) => self.cut(document, max)?,
            None => document,
        };
        let limit = self.max_input_length;
        let no_room = |e| {
            IvyError::Validation(format!(
                "the query does not leave room for document {index} within the model's limit of {limit} tokens: {e}"
            ))
        };
        // As in `windows`: v1 for a pair that fits, the classic overflow for the windows.
        if self.fast.get().is_some() {
            let whole = truncation(
                limit,
                TruncationStrategy::OnlySecond,
                TruncationDirection::Right,
            );
            match self.ids(&options.query, Some(document), true, whole, false) {
                Ok(ids) => return Ok(vec![pair_ids(ids)]),
                Err(Refused::TooLong) => {}
                Err(Refused::Failed(e)) => return Err(no_room(e)),
            }
        }
        let params = TruncationParams {
            direction: TruncationDirection::Right,
            max_length: limit,
            strategy: TruncationStrategy::OnlySecond,
            stride: overlap.min(limit / 4),
        };
        self.tokenizer
            .with_truncation(Some(params))
            .map_err(|e| IvyError::Tokenizer(format!("cannot cut windows: {e}")))?;
        // Not encode_fast: its overflowing windows of a pair come with their type ids all 0.
        let encoding = (self.tokenizer)
            .encode((&*options.query, document), true)
            .map_err(|e| no_room(e.to_string()))?;
        let windows = std::iter::once(&encoding).chain(encoding.get_overflowing());
        Ok(windows
            .map(|w| Encoded {
                ids: w.get_ids().to_vec(),
                types: Some(w.get_type_ids().to_vec()),
            })
            .collect())
    }

    fn encode_pair(
        &mut self,
        index: usize,
        document: &str,
        options: &PairOptions,
    ) -> Result<Encoded, IvyError> {
        let document = match options.max_doc_tokens {
            Some(max) => self.cut(document, max)?,
            None => document,
        };
        let limit = self.max_input_length;
        let too_long = || {
            IvyError::Validation(format!(
                "document {index} with the query is longer than the model's limit of {limit} tokens; shorten it or set truncate to true"
            ))
        };
        if let Some(rendered) = &options.rendered {
            // The document ends the prompt's content, so truncating its end shortens the document.
            let (before, after) = rendered
                .content
                .split_once("{document}")
                .unwrap_or((&rendered.content, ""));
            let text = format!(
                "{}{document}{}",
                before.replace("{query}", &options.query),
                after.replace("{query}", &options.query)
            );
            let room = limit.saturating_sub(rendered.prefix.len() + rendered.suffix.len());
            let room = truncation(
                room,
                TruncationStrategy::LongestFirst,
                TruncationDirection::Right,
            );
            let ids = match self.ids(&text, None, false, room, options.truncate) {
                Ok(ids) => ids.ids,
                Err(Refused::TooLong) => return Err(too_long()),
                Err(Refused::Failed(e)) => {
                    return Err(IvyError::Tokenizer(format!(
                        "document {index} could not be tokenized: {e}"
                    )))
                }
            };
            let ids = [&rendered.prefix[..], &ids, &rendered.suffix[..]].concat();
            return Ok(Encoded { ids, types: None });
        }
        let whole = truncation(
            limit,
            TruncationStrategy::OnlySecond,
            TruncationDirection::Right,
        );
        match self.ids(&options.query, Some(document), true, whole, options.truncate) {
            Ok(ids) => Ok(pair_ids(ids)),
            Err(Refused::TooLong) => Err(too_long()),
            Err(Refused::Failed(e)) => Err(IvyError::Validation(format!(
                "the query does not leave room for document {index} within the model's limit of {limit} tokens: {e}"
            ))),
        }
    }

    /// `text` cut after its first `max` tokens (at the next token's first byte).
    fn cut<'t>(&mut self, text: &'t str, max: usize) -> Result<&'t str, IvyError> {
        let _ = self.tokenizer.with_truncation(None);
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| IvyError::Tokenizer(e.to_string()))?;
        Ok(match encoding.get_offsets().get(max) {
            Some(&(start, _)) => &text[..start],
            None => text,
        })
    }

    fn tokenize(&mut self, text: &str, options: &EncodeOptions) -> Result<Vec<Token>, IvyError> {
        let templated = format!("{}{text}", options.prompt);
        let _ = self.tokenizer.with_truncation(None);
        let encoding = self
            .tokenizer
            .encode(templated.as_str(), options.add_special_tokens)
            .map_err(|e| IvyError::Tokenizer(e.to_string()))?;
        Ok(encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .zip(encoding.get_special_tokens_mask())
            .map(|((&id, &(start, stop)), &special)| {
                let special = special == 1;
                Token {
                    id,
                    text: if special {
                        self.tokenizer.id_to_token(id).unwrap_or_default()
                    } else {
                        templated[start..stop].to_string()
                    },
                    special,
                    start: (!special).then_some(start),
                    stop: (!special).then_some(stop),
                }
            })
            .collect())
    }
}

/// Why an input got no ids (see [`Worker::ids`]).
enum Refused {
    TooLong,
    Failed(String),
}

/// Truncation to `max_length` tokens (special ones included).
fn truncation(
    max_length: usize,
    strategy: TruncationStrategy,
    direction: TruncationDirection,
) -> TruncationParams {
    TruncationParams {
        direction,
        max_length,
        strategy,
        stride: 0,
    }
}

/// A cross-encoder's pair: its ids with their type ids.
fn pair_ids(ids: Ids) -> Encoded {
    Encoded {
        ids: ids.ids,
        types: Some(ids.types),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    /// A word-level tokenizer that wraps inputs in [CLS] ... [SEP], as BERT's does.
    fn tokenizer() -> Tokenizer {
        Tokenizer::from_str(&tokenizer_json()).unwrap()
    }

    /// The pool with the classic tokenizer alone and with v1 beside it: each test runs on both.
    fn pools(workers: usize, max_input_length: usize) -> [TokenizerPool; 2] {
        let fast = TokenizerPool::new(tokenizer(), workers, max_input_length);
        let checked = FastTokenizer::load(tokenizer_json().as_bytes(), fast.reference());
        fast.use_fast(checked.expect("v1 reads the test tokenizer as the classic one does"));
        assert!(fast.fast());
        [
            TokenizerPool::new(tokenizer(), workers, max_input_length),
            fast,
        ]
    }

    fn tokenizer_json() -> String {
        let vocab = r#"{"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "query": 3, "a": 4, "b": 5, "c": 6, "d": 7, "e": 8}"#;
        let special = r#"{"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}"#;
        let json = format!(
            r#"{{"version": "1.0", "added_tokens": [], "normalizer": null, "decoder": null,
                "truncation": {{"max_length": 2, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}},
                "padding": null,
                "pre_tokenizer": {{"type": "Whitespace"}},
                "post_processor": {{"type": "TemplateProcessing",
                    "single": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}],
                    "pair": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}, {{"SpecialToken": {{"id": "[SEP]", "type_id": 1}}}}],
                    "special_tokens": {special}}},
                "model": {{"type": "WordLevel", "vocab": {vocab}, "unk_token": "[UNK]"}}}}"#
        );
        json
    }

    fn options(prompt: &str, truncate: bool, direction: TruncationDirection) -> Arc<EncodeOptions> {
        Arc::new(EncodeOptions {
            prompt: prompt.into(),
            truncate,
            direction,
            add_special_tokens: true,
            inline: false,
            max_length: None,
        })
    }

    fn inline(options: Arc<EncodeOptions>) -> Arc<EncodeOptions> {
        Arc::new(EncodeOptions {
            inline: true,
            ..(*options).clone()
        })
    }

    #[tokio::test]
    async fn encodes_with_prompt_and_special_tokens() {
        for pool in pools(2, 6) {
            let ids = pool
                .encode(
                    0,
                    "a b".into(),
                    options("query ", false, TruncationDirection::Right),
                )
                .await
                .unwrap();
            assert_eq!(ids, [1, 3, 4, 5, 2]);
        }
    }

    #[tokio::test]
    async fn rejects_or_truncates_long_inputs_keeping_special_tokens() {
        for pool in pools(1, 4) {
            let err = pool
                .encode(
                    3,
                    "a b c d".into(),
                    options("", false, TruncationDirection::Right),
                )
                .await
                .unwrap_err();
            assert!(err
                .to_string()
                .contains("input 3 is longer than the model's limit of 4 tokens"));
            let right = pool
                .encode(
                    0,
                    "a b c d".into(),
                    options("", true, TruncationDirection::Right),
                )
                .await
                .unwrap();
            assert_eq!(right, [1, 4, 5, 2]);
            let left = pool
                .encode(
                    0,
                    "a b c d".into(),
                    options("", true, TruncationDirection::Left),
                )
                .await
                .unwrap();
            assert_eq!(left, [1, 6, 7, 2]);
            // Exactly at the limit is not too long.
            let exact = pool
                .encode(
                    0,
                    "a b".into(),
                    options("", false, TruncationDirection::Right),
                )
                .await
                .unwrap();
            assert_eq!(exact, [1, 4, 5, 2]);
        }
    }

    #[tokio::test]
    async fn many_concurrent_inputs_come_back_to_their_callers() {
        for pool in pools(3, 16) {
            let words = ["a", "b", "c", "d", "e"];
            let calls = (0..200).map(|i| {
                let pool = pool.clone();
                let text = words[..i % 5 + 1].join(" ");
                // Inline and pooled calls mixed, as short and long requests come.
                let mut opts = options("", false, TruncationDirection::Right);
                if i % 3 == 0 {
                    opts = inline(opts);
                }
                async move { (i, pool.encode(i, text, opts).await.unwrap()) }
            });
            for (i, ids) in futures::future::join_all(calls).await {
                assert_eq!(ids.len(), i % 5 + 3);
                assert_eq!(ids[ids.len() - 2], (i % 5 + 4) as u32);
            }
        }
    }

    #[tokio::test]
    async fn short_inputs_tokenized_inline_match_the_workers() {
        for pool in pools(1, 4) {
            for text in ["a", "a b", "a b c d e", "zz a"] {
                for truncate in [false, true] {
                    for direction in [TruncationDirection::Right, TruncationDirection::Left] {
                        let opts = options("query ", truncate, direction);
                        let expected = pool.encode(7, text.into(), opts.clone()).await;
                        let got = pool.encode(7, text.into(), inline(opts)).await;
                        assert_eq!(
                            format!("{got:?}"),
                            format!("{expected:?}"),
                            "{text:?} truncate={truncate}"
                        );
                    }
                }
            }
        }
    }

    fn pair(query: &str, truncate: bool, max_doc_tokens: Option<usize>) -> Arc<PairOptions> {
        Arc::new(PairOptions {
            query: query.into(),
            truncate,
            max_doc_tokens,
            rendered: None,
            inline: false,
            overlap: None,
        })
    }

    #[tokio::test]
    async fn pairs_take_the_tokenizer_template_and_shorten_only_the_document() {
        for pool in pools(1, 8) {
            let full = pool
                .encode_pair(0, "c d".into(), pair("a b", false, None))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(full.ids, [1, 4, 5, 2, 6, 7, 2]);
            assert_eq!(full.types, Some(vec![0, 0, 0, 0, 1, 1, 1]));
            let cut = pool
                .encode_pair(0, "c d e e".into(), pair("a b", true, None))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(cut.ids, [1, 4, 5, 2, 6, 7, 8, 2]);
            let err = pool
                .encode_pair(2, "c d e e".into(), pair("a b", false, None))
                .await
                .unwrap_err();
            assert!(err
                .to_string()
                .contains("document 2 with the query is longer"));
            let long_query = pool
                .encode_pair(1, "c".into(), pair("a b c d e a b", true, None))
                .await;
            assert!(long_query
                .unwrap_err()
                .to_string()
                .contains("the query does not leave room for document 1"));
            let capped = pool
                .encode_pair(0, "c d e".into(), pair("a", false, Some(1)))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(capped.ids, [1, 4, 2, 6, 2]);
        }
    }

    #[tokio::test]
    async fn a_long_document_is_paired_with_the_query_in_overlapping_windows() {
        for pool in pools(1, 8) {
            let options = Arc::new(PairOptions {
                overlap: Some(1),
                ..(*pair("a", false, None)).clone()
            });
            let windows = pool
                .encode_pair(0, "c d e c d".into(), options)
                .await
                .unwrap();
            // Every window's document part has type 1, the later windows' too.
            assert_eq!(windows[1].types, Some(vec![0, 0, 0, 1, 1, 1]));
            let ids: Vec<Vec<u32>> = windows.into_iter().map(|w| w.ids).collect();
            // [CLS] a [SEP] + 4 document tokens + [SEP], the next window repeating one token.
            assert_eq!(
                ids,
                vec![vec![1, 4, 2, 6, 7, 8, 6, 2], vec![1, 4, 2, 6, 7, 2]]
            );
        }
    }

    #[tokio::test]
    async fn a_rendered_prompt_puts_the_pair_between_its_prefix_and_suffix() {
        for pool in pools(1, 7) {
            let rendered = Rendered {
                prefix: vec![3].into(),
                content: "e {query} {document}".into(),
                suffix: vec![2].into(),
            };
            let options = |truncate| {
                Arc::new(PairOptions {
                    rendered: Some(rendered.clone()),
                    ..(*pair("a", truncate, None)).clone()
                })
            };
            let got = pool
                .encode_pair(0, "b c".into(), options(false))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(
                got,
                Encoded {
                    ids: vec![3, 8, 4, 5, 6, 2],
                    types: None
                }
            );
            let cut = pool
                .encode_pair(0, "b c d e".into(), options(true))
                .await
                .unwrap()
                .remove(0);
            assert_eq!(cut.ids, [3, 8, 4, 5, 6, 7, 2]);
            assert!(pool
                .encode_pair(0, "b c d e".into(), options(false))
                .await
                .is_err());
        }
    }

    #[test]
    fn decodes_ids_with_or_without_special_tokens() {
        let mut with_specials = tokenizer();
        let specials = ["[CLS]", "[SEP]"].map(|t| tokenizers::AddedToken::from(t, true));
        with_specials.add_special_tokens(&specials);
        let pool = TokenizerPool::new(with_specials, 1, 16);
        assert_eq!(pool.decode(&[vec![1, 4, 5, 2]], true).unwrap(), ["a b"]);
        assert_eq!(
            pool.decode(&[vec![1, 4, 2], vec![6]], false).unwrap(),
            ["[CLS] a [SEP]", "c"]
        );
    }

    #[tokio::test]
    async fn tokenize_reports_text_offsets_and_special_tokens() {
        for pool in pools(1, 16) {
            let tokens = pool
                .tokenize(
                    "a zz".into(),
                    options("", false, TruncationDirection::Right),
                )
                .await
                .unwrap();
            let texts: Vec<_> = tokens
                .iter()
                .map(|t| (t.id, t.text.as_str(), t.special, t.start))
                .collect();
            assert_eq!(
                texts,
                [
                    (1, "[CLS]", true, None),
                    (4, "a", false, Some(0)),
                    (0, "zz", false, Some(2)),
                    (2, "[SEP]", true, None)
                ]
            );
        }
    }
}
