//! The scoring path the rerank, predict and similarity routes share: a query against documents
//! (a score model's pairs, or an embedding model's cosines), and sequences scored alone.

use std::sync::Arc;
use std::time::Instant;

use futures::channel::mpsc;
use futures::future::try_join_all;
use futures::stream::{FuturesOrdered, StreamExt, TryStreamExt};
use tokenizers::TruncationDirection;
use tulip::proto::Encoding;

use crate::config::LongInputs;
use crate::error::IvyError;
use crate::gateway::{Admission, Gateway};
use crate::input::Input;
use crate::replicas::floats;
use crate::request::{EmbedCall, Timings};
use crate::template::PairTemplate;
use crate::tokenization::{EncodeOptions, Encoded, PairOptions, Rendered, INLINE_BYTES};

/// Tokens of pairs gathered before they go to Tulip while the rest are still tokenized: about a
/// GPU step's budget. The first group closes sooner (`first_group`): smaller groups start the GPU
/// sooner but make smaller, slower steps, and two halves of a 100-document request beat both
/// 74 + 26 and 34 + 66 documents on the H200 (benches/RESULTS.md).
const PIPELINE_TOKENS: usize = 16384;

/// One input of `/predict`: a text, or a pair of texts.
pub type PredictInput = (String, Option<String>);

/// What a rerank route asks: one query against documents.
#[derive(Debug, Clone, Default)]
pub struct RerankCall {
    pub query: String,
    pub documents: Vec<String>,
    /// A causal reranker's instruction (else the server's default).
    pub instruction: Option<String>,
    /// None follows `--auto-truncate`.
    pub truncate: Option<bool>,
    pub max_tokens_per_doc: Option<usize>,
    /// Logits instead of probabilities (a score model's).
    pub raw_scores: bool,
    /// None follows `--long-inputs`.
    pub long_inputs: Option<LongInputs>,
}

/// One value a document (a score model's probability or logit, or an embedding model's cosine),
/// in the documents' order, with the facts a response reports.
pub struct Scores {
    pub scores: Vec<f32>,
    pub tokens: usize,
    pub timings: Timings,
}

impl Gateway {
    /// Scores each document against the query: a score model scores the pairs; an embedding
    /// model answers the cosine of the query's vector and the document's, as vLLM does; a
    /// ColBERT model their MaxSim (crate::late_interaction).
    pub async fn rerank(&self, route: &'static str, call: RerankCall) -> Result<Scores, IvyError> {
        if call.query.is_empty() {
            return Err(IvyError::Validation("`query` cannot be empty".into()));
        }
        self.check_batch_size(call.documents.len())?;
        if let Some(i) = call.documents.iter().position(String::is_empty) {
            return Err(IvyError::Validation(format!(
                "document {i} is an empty string"
            )));
        }
        if call.max_tokens_per_doc == Some(0) {
            return Err(IvyError::Validation(
                "`max_tokens_per_doc` must be at least 1".into(),
            ));
        }
        let model = self.model();
        if model.task == "score" {
            self.score_pairs(route, call).await
        } else if !model.outputs.iter().any(|o| o == "dense")
            && model.outputs.iter().any(|o| o == "multi_vector")
        {
            self.max_sims(route, call).await
        } else {
            self.cosines(route, call).await
        }
    }

    async fn score_pairs(&self, route: &'static str, call: RerankCall) -> Result<Scores, IvyError> {
        let start = Instant::now();
        let _permit = self.admit()?;
        let characters = call.query.chars().count() * call.documents.len()
            + call
                .documents
                .iter()
                .map(|d| d.chars().count())
                .sum::<usize>();
        let bytes: usize = call.query.len() * call.documents.len()
            + call.documents.iter().map(String::len).sum::<usize>();
        let options = Arc::new(PairOptions {
            query: call.query.into(),
            truncate: call.truncate.unwrap_or(self.args().auto_truncate),
            max_doc_tokens: call.max_tokens_per_doc,
            rendered: self.rendered(call.instruction.as_deref())?,
            inline: bytes <= INLINE_BYTES,
            overlap: (call.long_inputs.unwrap_or(self.args().long_inputs) == LongInputs::Chunk)
                .then_some(self.args().chunk_overlap),
        });
        // Pairs go to Tulip in groups as they come out of the tokenizer pool (in order), so the
        // first steps run while the rest are still being tokenized. The first group is admitted
        // as any request is; the later ones join it in the queue.
        let (groups, grouped) = mpsc::unbounded::<(Vec<Encoded>, usize, Option<Admission>)>();
        let workers = self.tokenizer().workers();
        let first = first_group(call.documents.len(), workers);
        let tokenize = async move {
            let mut tokenized: FuturesOrdered<_> = (call.documents.into_iter().enumerate())
                .map(|(i, document)| self.tokenizer().encode_pair(i, document, options.clone()))
                .collect();
            let mut gather = Gather::new(PIPELINE_TOKENS, first);
            let mut counts = Vec::new();
            let mut total = 0;
            let mut send = async |group: Vec<Encoded>| {
                let tokens: usize = group.iter().map(|e| e.ids.len()).sum();
                let admission = if total == 0 {
                    self.admit_tokens(tokens)?
                } else {
                    self.join_queue(tokens, total + tokens).await?
                };
                total += tokens;
                let _ = groups.unbounded_send((group, tokens, admission));
                Ok::<_, IvyError>(())
            };
            while let Some(windows) = tokenized.try_next().await? {
                counts.push(windows.len());
                if let Some(group) = gather.push(windows) {
                    send(group).await?;
                }
            }
            if let Some(group) = gather.finish() {
                send(group).await?;
            }
            Ok::<_, IvyError>((counts, start.elapsed()))
        };
        let score = grouped
            .map(|(pairs, tokens, queued)| async move {
                let scored = self.score_encoded(pairs, call.raw_scores).await?;
                drop(queued);
                Ok::<_, IvyError>((tokens, scored))
            })
            .buffered(usize::MAX)
            .try_collect::<Vec<_>>();
        let ((counts, tokenization), answers) = futures::try_join!(tokenize, score)?;
        let tokens = answers.iter().map(|(tokens, _)| tokens).sum();
        let labels = answers.first().map_or(1, |(_, (_, labels, _))| *labels);
        if labels != 1 {
            return Err(IvyError::Unsupported(format!(
                "{} scores {labels} labels; reranking needs one (use /predict)",
                self.model().model_id
            )));
        }
        let mut timings = (answers.iter().map(|(_, (_, _, t))| *t))
            .max_by_key(|t| t.queue + t.inference + t.transfer)
            .unwrap_or_default();
        let window_scores: Vec<f32> = answers.into_iter().flat_map(|(_, (s, _, _))| s).collect();
        let scores = best_windows(&window_scores, &counts);
        timings.characters = characters;
        Ok(self.finish(route, scores, tokens, tokenization, timings, start))
    }

    /// Scores sequences alone or as pairs (`/predict`): every label's score a sequence.
    pub async fn predict(
        &self,
        inputs: Vec<PredictInput>,
        truncate: Option<bool>,
        raw_scores: bool,
    ) -> Result<(Vec<f32>, usize, usize, Timings), IvyError> {
        let start = Instant::now();
        let _permit = self.admit()?;
        self.require_task("score")?;
        self.check_batch_size(inputs.len())?;
        let characters = (inputs.iter())
            .map(|(a, b)| a.chars().count() + b.as_deref().map_or(0, |b| b.chars().count()))
            .sum();
        let truncate = truncate.unwrap_or(self.args().auto_truncate);
        let single = Arc::new(EncodeOptions {
            prompt: "".into(),
            truncate,
            direction: TruncationDirection::Right,
            add_special_tokens: true,
            inline: false,
            max_length: None,
        });
        let encoded = try_join_all(inputs.into_iter().enumerate().map(|(i, (first, second))| {
            let single = single.clone();
            async move {
                match second {
                    Some(second) => {
                        let options = Arc::new(PairOptions {
                            query: first.into(),
                            truncate,
                            max_doc_tokens: None,
                            rendered: None,
                            inline: false,
                            overlap: None,
                        });
                        let mut window = self.tokenizer().encode_pair(i, second, options).await?;
                        Ok::<_, IvyError>(window.remove(0))
                    }
                    None => {
                        let ids = self.tokenizer().encode(i, first, single).await?;
                        Ok(Encoded { ids, types: None })
                    }
                }
            }
        }))
        .await?;
        let tokens = encoded.iter().map(|e| e.ids.len()).sum();
        let tokenization = start.elapsed();
        let _queued = self.admit_tokens(tokens)?;
        let (scores, labels, mut timings) = self.score_encoded(encoded, raw_scores).await?;
        timings.tokenization = tokenization;
        timings.total = start.elapsed();
        timings.tokens = tokens;
        timings.characters = characters;
        crate::metrics::record("tei_predict", scores.len() / labels.max(1), &timings);
        Ok((scores, labels, tokens, timings))
    }

    /// Sends encoded sequences (admitted by the caller) to the replicas' Score: the scores,
    /// labels a sequence, timings.
    async fn score_encoded(
        &self,
        encoded: Vec<Encoded>,
        raw: bool,
    ) -> Result<(Vec<f32>, usize, Timings), IvyError> {
        // A model with one token type (RoBERTa's kind, ModernBERT) takes none, whatever the
        // tokenizer says of the pair's second part.
        let typed = self.model().type_vocab_size > 1 && encoded.iter().any(|e| e.types.is_some());
        let types: Vec<Vec<u32>> = if typed {
            encoded
                .iter()
                .map(|e| e.types.clone().unwrap_or_else(|| vec![0; e.ids.len()]))
                .collect()
        } else {
            Vec::new()
        };
        let sequences: Vec<Vec<u32>> = encoded.into_iter().map(|e| e.ids).collect();
        let (scores, labels, chunk) = self.replicas().score(&sequences, &types, raw).await?;
        let timings = Timings {
            queue: chunk.queue,
            inference: chunk.inference,
            transfer: chunk.transfer,
            ..Timings::default()
        };
        Ok((scores, labels, timings))
    }

    /// An embedding model's rerank: the cosine of the query's and each document's normalized vectors.
    async fn cosines(&self, route: &'static str, call: RerankCall) -> Result<Scores, IvyError> {
        let start = Instant::now();
        let inputs = std::iter::once(call.query)
            .chain(call.documents)
            .map(Input::Text)
            .collect();
        let embedded = self
            .embed(
                route,
                EmbedCall {
                    inputs,
                    prompt_name: None,
                    truncate: call.truncate,
                    direction: TruncationDirection::Right,
                    normalize: true,
                    dimensions: None,
                    encoding: Encoding::Float32,
                    long_inputs: None,
                },
            )
            .await?;
        let v = &embedded.vectors;
        let query = floats(v.row(0));
        let scores = (1..v.count)
            .map(|i| {
                floats(v.row(i))
                    .iter()
                    .zip(&query)
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect();
        let mut timings = embedded.timings;
        timings.total = start.elapsed();
        Ok(Scores {
            scores,
            tokens: embedded.tokens,
            timings,
        })
    }

    /// A causal reranker's prompt for `instruction` (else the default); None for the
    /// tokenizer's own pair template.
    fn rendered(&self, instruction: Option<&str>) -> Result<Option<Rendered>, IvyError> {
        let Some(PairTemplate::Rendered {
            content,
            default_instruction,
            ..
        }) = self.pair_template()
        else {
            return Ok(None);
        };
        let (prefix, suffix) = self.affixes().clone();
        let instruction = instruction.unwrap_or(default_instruction);
        Ok(Some(Rendered {
            prefix,
            content: content.replace("{instruction}", instruction),
            suffix,
        }))
    }

    fn finish(
        &self,
        route: &'static str,
        scores: Vec<f32>,
        tokens: usize,
        tokenization: std::time::Duration,
        mut timings: Timings,
        start: Instant,
    ) -> Scores {
        timings.tokenization = tokenization;
        timings.total = start.elapsed();
        timings.tokens = tokens;
        crate::metrics::record(route, scores.len(), &timings);
        Scores {
            scores,
            tokens,
            timings,
        }
    }
}

/// Documents ranked best first, the first `top_n` of them (all when None): (index, score).
pub fn rank(scores: &[f32], top_n: Option<usize>) -> Vec<(usize, f32)> {
    let mut ranked: Vec<(usize, f32)> = scores.iter().copied().enumerate().collect();
    // Stable: ties keep the documents' order.
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(top_n.unwrap_or(ranked.len()));
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_best_first_keeping_the_order_of_ties_and_cuts_at_top_n() {
        let scores = [0.1, 0.9, 0.5, 0.9];
        assert_eq!(
            rank(&scores, None),
            [(1, 0.9), (3, 0.9), (2, 0.5), (0, 0.1)]
        );
        assert_eq!(rank(&scores, Some(2)), [(1, 0.9), (3, 0.9)]);
        assert_eq!(rank(&scores, Some(10)).len(), 4);
    }
}

/// Documents in the first group of a request of `documents`, tokenized `workers` at a time: half
/// of them, so that the GPU starts once half are tokenized and the rest are tokenized meanwhile,
/// but no fewer than one round of the workers (an earlier group would save no time).
fn first_group(documents: usize, workers: usize) -> usize {
    documents.div_ceil(2).max(workers)
}

/// Encoded pairs gathered, in order, into groups of at least `limit` tokens (the last smaller),
/// the first closing early once it holds `first` documents.
struct Gather {
    limit: usize,
    /// Documents still to come before the first group closes; None once a group has gone.
    first: Option<usize>,
    pending: Vec<Encoded>,
    tokens: usize,
}

impl Gather {
    fn new(limit: usize, first: usize) -> Gather {
        Gather {
            limit,
            first: Some(first),
            pending: Vec::new(),
            tokens: 0,
        }
    }

    /// Adds a document's windows; returns a group once it holds `limit` tokens (the first group
    /// also once it holds `first` documents).
    fn push(&mut self, windows: Vec<Encoded>) -> Option<Vec<Encoded>> {
        self.tokens += windows.iter().map(|e| e.ids.len()).sum::<usize>();
        self.pending.extend(windows);
        self.first = self.first.map(|left| left.saturating_sub(1));
        (self.first == Some(0) || self.tokens >= self.limit).then(|| {
            self.first = None;
            self.tokens = 0;
            std::mem::take(&mut self.pending)
        })
    }

    /// What is left, if anything.
    fn finish(self) -> Option<Vec<Encoded>> {
        (!self.pending.is_empty()).then_some(self.pending)
    }
}

#[cfg(test)]
mod gather_tests {
    use super::{Encoded, Gather};

    fn pair(tokens: usize) -> Vec<Encoded> {
        vec![Encoded {
            ids: vec![0; tokens],
            types: None,
        }]
    }

    #[test]
    fn groups_close_at_the_limit_in_order_and_the_rest_comes_last() {
        let mut gather = Gather::new(10, 100);
        assert!(gather.push(pair(4)).is_none());
        let group = gather.push(pair(6)).expect("10 tokens close a group");
        assert_eq!(
            group.iter().map(|e| e.ids.len()).collect::<Vec<_>>(),
            [4, 6]
        );
        assert_eq!(gather.push(pair(30)).map(|g| g.len()), Some(1));
        assert!(gather.push(pair(3)).is_none());
        assert_eq!(gather.finish().map(|g| g[0].ids.len()), Some(3));
        assert!(Gather::new(10, 100).finish().is_none());
    }

    #[test]
    fn the_first_group_closes_at_its_documents_and_the_later_ones_at_the_limit() {
        let mut gather = Gather::new(10, 2);
        assert!(gather.push(pair(1)).is_none());
        assert_eq!(gather.push(pair(1)).map(|g| g.len()), Some(2));
        assert!(gather.push(pair(1)).is_none());
        assert!(gather.push(pair(1)).is_none());
        assert_eq!(gather.push(pair(8)).map(|g| g.len()), Some(3));
    }

    #[test]
    fn the_first_group_is_half_the_documents_but_at_least_a_round_of_workers() {
        assert_eq!(super::first_group(100, 16), 50);
        assert_eq!(super::first_group(101, 16), 51);
        assert_eq!(super::first_group(20, 16), 16);
        assert_eq!(super::first_group(3, 16), 16);
    }
}

/// A document's score from its windows' (`counts[i]` windows a document, in order): the best.
fn best_windows(scores: &[f32], counts: &[usize]) -> Vec<f32> {
    let mut rest = scores;
    (counts.iter())
        .map(|&n| {
            let (windows, after) = rest.split_at(n);
            rest = after;
            windows.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        })
        .collect()
}

#[cfg(test)]
mod window_tests {
    use super::best_windows;

    #[test]
    fn a_document_scores_its_best_window() {
        assert_eq!(
            best_windows(&[0.1, 0.7, 0.3, 0.2], &[1, 2, 1]),
            vec![0.1, 0.7, 0.2]
        );
    }
}
