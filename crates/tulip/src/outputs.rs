//! Encode's outputs (pure logic, no I/O): which step a request needs, and the dense, sparse,
//! multi-vector and token outputs cut from the engine's rows, plus the merge of chunked answers.

use crate::error::{EngineError, TulipError};
use crate::postprocess::{append_row, normalized, Shape};
use crate::proto::{EncodeResponse, Encoding, ModelInfo, Output, SparseVectors, TokenVectors};
use crate::sparse::{sparsify, Pruning};

/// Most bytes of token vectors (multi-vector and hidden states together) one request may ask
/// for: past it the answer would outgrow what a client can take in one message.
pub const MAX_TOKEN_VECTOR_BYTES: usize = 64 << 20;

/// The outputs one Encode request asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted {
    pub dense: bool,
    pub sparse: bool,
    pub multi_vector: bool,
    pub tokens: bool,
}

impl Wanted {
    /// The request's outputs (Output values; empty: dense), each one the model has.
    pub fn parse(outputs: &[i32], model: &ModelInfo) -> Result<Wanted, TulipError> {
        let mut wanted = Wanted::default();
        if outputs.is_empty() {
            wanted.dense = true;
        }
        for &value in outputs {
            let output = Output::try_from(value)
                .map_err(|_| TulipError::Validation(format!("unknown output {value}")))?;
            let name = output.as_str_name().to_ascii_lowercase();
            if !model.outputs.contains(&name) {
                return Err(EngineError::Model(format!(
                    "{} has no {name} output; it has: {}",
                    model.model_id,
                    model.outputs.join(", ")
                ))
                .into());
            }
            let flag = match output {
                Output::Dense => &mut wanted.dense,
                Output::Sparse => &mut wanted.sparse,
                Output::MultiVector => &mut wanted.multi_vector,
                Output::Tokens => &mut wanted.tokens,
            };
            if *flag {
                return Err(TulipError::Validation(format!(
                    "output {name} is asked twice"
                )));
            }
            *flag = true;
        }
        Ok(wanted)
    }

    /// Whether the engine's token step serves it (a row a token), rather than its pooled step.
    pub fn per_token(&self, model: &ModelInfo) -> bool {
        self.multi_vector || self.tokens || (self.sparse && model.lexical_weights)
    }

    /// Whether the dense vector needs a pooled step of its own beside the token step: it can be
    /// pooled from the hidden states only where the model's vector is a plain pooling of them.
    pub fn needs_both_steps(&self, model: &ModelInfo) -> bool {
        self.dense && self.per_token(model) && !pools_hidden_states(model)
    }

    /// Bytes of token vectors a request of `tokens` tokens in `sequences` sequences gets back.
    pub fn token_vector_bytes(&self, model: &ModelInfo, tokens: usize, sequences: usize) -> usize {
        let mut per_token = 0;
        if self.tokens {
            per_token += model.hidden_size as usize;
        }
        if self.multi_vector {
            per_token += model.multi_vector_dimensions as usize;
        }
        // BGE-M3's head leaves the first token out.
        let skipped = self.multi_vector && model.multi_vector_skips_first;
        let multi = (skipped as usize) * sequences * model.multi_vector_dimensions as usize;
        (tokens * per_token).saturating_sub(multi) * 4
    }
}

/// The model's vector is its hidden states pooled by cls, mean or last, with no module after.
fn pools_hidden_states(model: &ModelInfo) -> bool {
    ["cls", "mean", "last"].contains(&model.pooling.as_str())
        && !model.modules.iter().any(|m| m == "Dense")
}

/// One request's sequences as Encode cuts its outputs: token ids and where each sequence starts.
pub struct Cut<'a> {
    pub token_ids: &'a [u32],
    /// `offsets[i]..offsets[i + 1]` are sequence i's tokens (and rows of a token step).
    pub offsets: &'a [usize],
    pub normalize: bool,
    pub pruning: Pruning,
    /// Tokens whose multi-vectors are left out (a ColBERT model's skiplist, for documents).
    pub skip_ids: &'a [u32],
    /// How dense vectors (before normalization) and multi-vectors (after it) are packed.
    pub encoding: Encoding,
}

impl Cut<'_> {
    fn count(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The outputs from a token step's rows ([tokens, width] by the model's token row layout).
    pub fn from_token_rows(
        &self,
        rows: &[f32],
        model: &ModelInfo,
        wanted: Wanted,
    ) -> EncodeResponse {
        let hidden = model.hidden_size as usize;
        let multi = model.multi_vector_dimensions as usize;
        let width = hidden + multi + model.lexical_weights as usize;
        let row = |t: usize| &rows[t * width..(t + 1) * width];
        let sequences = || self.offsets.windows(2).map(|w| w[0]..w[1]);
        let mut out = EncodeResponse {
            count: self.count() as u32,
            ..Default::default()
        };
        if wanted.dense && pools_hidden_states(model) {
            let vectors = sequences().map(|span| {
                let pooled = pool(span.map(|t| &row(t)[..hidden]), &model.pooling, hidden);
                self.shape(pooled)
            });
            out.dense = Some(one_a_sequence(vectors, hidden, self.encoding));
        }
        if wanted.tokens {
            let vectors = sequences().map(|span| span.map(|t| row(t)[..hidden].to_vec()).collect());
            out.tokens = Some(token_vectors(vectors, hidden, Encoding::Float32));
        }
        if wanted.multi_vector {
            let first = model.multi_vector_skips_first as usize;
            let vectors = sequences().map(|span| {
                (span.start + first..span.end)
                    .filter(|&t| !self.skip_ids.contains(&self.token_ids[t]))
                    .map(|t| normalized(&row(t)[hidden..hidden + multi]))
                    .collect()
            });
            out.multi_vector = Some(token_vectors(vectors, multi, self.encoding));
        }
        if wanted.sparse && model.lexical_weights {
            let weights = sequences().map(|span| {
                let ids = &self.token_ids[span.clone()];
                lexical(ids, span.map(|t| row(t)[width - 1]), self.pruning)
            });
            out.sparse = Some(sparse_vectors(weights));
        }
        out
    }

    /// The outputs from a pooled step's rows ([sequences, dim]): the dense vector, or a SPLADE
    /// model's sparse one.
    pub fn from_pooled_rows(
        &self,
        rows: &[f32],
        dim: usize,
        model: &ModelInfo,
        wanted: Wanted,
    ) -> EncodeResponse {
        let row = |i: usize| &rows[i * dim..(i + 1) * dim];
        let mut out = EncodeResponse {
            count: self.count() as u32,
            ..Default::default()
        };
        if wanted.dense {
            let vectors = (0..self.count()).map(|i| self.shape(row(i).to_vec()));
            out.dense = Some(one_a_sequence(vectors, dim, self.encoding));
        }
        if wanted.sparse && !model.lexical_weights {
            let vectors = (0..self.count()).map(|i| sparsify(row(i), self.pruning));
            out.sparse = Some(sparse_vectors(vectors));
        }
        out
    }

    /// A dense vector normalized as asked (a quantized one is left as pooled, as Embed's).
    fn shape(&self, vector: Vec<f32>) -> Vec<f32> {
        if self.normalize && self.encoding == Encoding::Float32 {
            normalized(&vector)
        } else {
            vector
        }
    }
}

/// The hidden states of one sequence pooled as the model pools them (cls, mean or last).
fn pool<'a>(
    mut states: impl ExactSizeIterator<Item = &'a [f32]>,
    mode: &str,
    dim: usize,
) -> Vec<f32> {
    let count = states.len();
    match mode {
        "cls" => states.next().map_or(vec![0.0; dim], <[f32]>::to_vec),
        "last" => states.last().map_or(vec![0.0; dim], <[f32]>::to_vec),
        _ => {
            let mut sum = vec![0.0; dim];
            states.for_each(|s| sum.iter_mut().zip(s).for_each(|(a, b)| *a += b));
            sum.iter_mut().for_each(|v| *v /= count.max(1) as f32);
            sum
        }
    }
}

/// BGE-M3's lexical weights of one sequence: the largest weight of each token id (special tokens
/// come from the engine at 0 and are left out with every other entry that is not positive).
pub fn lexical(
    ids: &[u32],
    weights: impl Iterator<Item = f32>,
    pruning: Pruning,
) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = ids.iter().copied().zip(weights).collect();
    best.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
    best.dedup_by_key(|e| e.0);
    best.retain(|&(_, w)| w > 0.0 && w >= pruning.min_value);
    if let Some(k) = pruning.top_k {
        if best.len() > k {
            best.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            best.truncate(k);
            best.sort_unstable_by_key(|e| e.0);
        }
    }
    best
}

fn one_a_sequence(
    vectors: impl Iterator<Item = Vec<f32>>,
    dim: usize,
    encoding: Encoding,
) -> TokenVectors {
    token_vectors(vectors.map(|v| vec![v]), dim, encoding)
}

fn token_vectors(
    sequences: impl Iterator<Item = Vec<Vec<f32>>>,
    dim: usize,
    encoding: Encoding,
) -> TokenVectors {
    let shape = Shape {
        dimensions: dim,
        normalize: false,
        encoding,
    };
    let mut out = TokenVectors {
        dimensions: dim as u32,
        offsets: vec![0],
        data: Vec::new(),
        encoding: encoding as i32,
    };
    for rows in sequences {
        for row in &rows {
            append_row(row, shape, &mut out.data);
        }
        out.offsets
            .push(out.offsets.last().unwrap() + rows.len() as u32);
    }
    out
}

fn sparse_vectors(sequences: impl Iterator<Item = Vec<(u32, f32)>>) -> SparseVectors {
    let mut out = SparseVectors {
        offsets: vec![0],
        ..Default::default()
    };
    for entries in sequences {
        for (index, value) in entries {
            out.indices.push(index);
            out.values.push(value);
        }
        out.offsets.push(out.indices.len() as u32);
    }
    out
}

/// Answers to consecutive chunks of one request joined into one, in order: counts and offsets
/// continue, times are the slowest chunk's.
pub fn merge(parts: impl IntoIterator<Item = EncodeResponse>) -> EncodeResponse {
    let mut out = EncodeResponse::default();
    for part in parts {
        out.count += part.count;
        out.queue_us = out.queue_us.max(part.queue_us);
        out.inference_us = out.inference_us.max(part.inference_us);
        for (into, from) in [
            (&mut out.dense, part.dense),
            (&mut out.multi_vector, part.multi_vector),
            (&mut out.tokens, part.tokens),
        ] {
            if let Some(from) = from {
                let into = into.get_or_insert_with(|| TokenVectors {
                    dimensions: from.dimensions,
                    offsets: vec![0],
                    data: Vec::new(),
                    encoding: from.encoding,
                });
                continue_offsets(&mut into.offsets, &from.offsets);
                into.data.extend_from_slice(&from.data);
            }
        }
        if let Some(from) = part.sparse {
            let into = out.sparse.get_or_insert_with(|| SparseVectors {
                offsets: vec![0],
                ..Default::default()
            });
            continue_offsets(&mut into.offsets, &from.offsets);
            into.indices.extend(from.indices);
            into.values.extend(from.values);
        }
    }
    out
}

/// Appends a later chunk's offsets (which start at 0) after `into`'s last one.
fn continue_offsets(into: &mut Vec<u32>, from: &[u32]) {
    let base = *into.last().unwrap_or(&0);
    into.extend(from.iter().skip(1).map(|o| o + base));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BGE-M3-like model: hidden 2, multi-vector 2, lexical weights.
    fn m3() -> ModelInfo {
        ModelInfo {
            model_id: "m3".into(),
            pooling: "cls".into(),
            hidden_size: 2,
            multi_vector_dimensions: 2,
            lexical_weights: true,
            multi_vector_skips_first: true,
            outputs: ["dense", "sparse", "multi_vector", "tokens"]
                .map(String::from)
                .to_vec(),
            ..Default::default()
        }
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        (bytes.chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn parses_outputs_and_names_the_ones_the_model_lacks() {
        let dense_only = ModelInfo {
            outputs: vec!["dense".into(), "tokens".into()],
            ..m3()
        };
        assert_eq!(
            Wanted::parse(&[], &dense_only).unwrap(),
            Wanted {
                dense: true,
                ..Default::default()
            }
        );
        let err = Wanted::parse(&[Output::Sparse as i32], &dense_only).unwrap_err();
        assert!(
            err.to_string()
                .contains("no sparse output; it has: dense, tokens"),
            "{err}"
        );
        assert!(Wanted::parse(&[3, 3], &m3())
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(Wanted::parse(&[9], &m3())
            .unwrap_err()
            .to_string()
            .contains("unknown output 9"));
    }

    #[test]
    fn cuts_all_outputs_from_one_token_step() {
        // Two sequences: ids [0, 7, 7, 2] and [0, 5]; rows [h0 h1 | m0 m1 | w].
        let rows = [
            [1.0, 0.0, 9.0, 9.0, 0.0], // CLS: the dense vector, no multi-vector
            [0.0, 1.0, 3.0, 4.0, 0.5],
            [0.0, 2.0, 0.0, 2.0, 0.75], // id 7 again: the larger weight counts
            [0.0, 3.0, 1.0, 0.0, 0.0],  // a special token, its weight 0
            [0.0, 2.0, 9.0, 9.0, 0.0],
            [4.0, 0.0, 0.0, 5.0, 0.25],
        ]
        .concat();
        let cut = Cut {
            token_ids: &[0, 7, 7, 2, 0, 5],
            offsets: &[0, 4, 6],
            normalize: true,
            pruning: Pruning::default(),
            skip_ids: &[],
            encoding: Encoding::Float32,
        };
        let all = Wanted {
            dense: true,
            sparse: true,
            multi_vector: true,
            tokens: true,
        };
        let out = cut.from_token_rows(&rows, &m3(), all);
        let dense = out.dense.unwrap();
        assert_eq!(
            (dense.offsets, floats(&dense.data)),
            (vec![0, 1, 2], vec![1.0, 0.0, 0.0, 1.0])
        );
        let multi = out.multi_vector.unwrap();
        assert_eq!(multi.offsets, [0, 3, 4]);
        assert_eq!(
            floats(&multi.data),
            [0.6, 0.8, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
        );
        let sparse = out.sparse.unwrap();
        assert_eq!(
            (sparse.offsets, sparse.indices, sparse.values),
            (vec![0, 1, 2], vec![7, 5], vec![0.75, 0.25])
        );
        let tokens = out.tokens.unwrap();
        assert_eq!((tokens.dimensions, tokens.offsets), (2, vec![0, 4, 6]));
        assert_eq!(floats(&tokens.data)[..4], [1.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn a_model_with_a_dense_module_pools_in_a_step_of_its_own() {
        let dense_module = ModelInfo {
            modules: vec!["Transformer".into(), "Pooling".into(), "Dense".into()],
            ..m3()
        };
        let both = Wanted {
            dense: true,
            tokens: true,
            ..Default::default()
        };
        assert!(both.needs_both_steps(&dense_module) && !both.needs_both_steps(&m3()));
    }

    #[test]
    fn token_vector_bytes_count_the_multi_vectors_without_the_first_token() {
        let wanted = Wanted {
            multi_vector: true,
            tokens: true,
            ..Default::default()
        };
        // 10 tokens in 2 sequences: 10 hidden rows and 8 multi-vectors of 2 values.
        assert_eq!(
            wanted.token_vector_bytes(&m3(), 10, 2),
            (10 * 2 + 8 * 2) * 4
        );
    }

    /// A ColBERT-like model: hidden 1, multi-vectors of 2 for every token.
    fn colbert() -> ModelInfo {
        ModelInfo {
            model_id: "colbert".into(),
            hidden_size: 1,
            multi_vector_dimensions: 2,
            outputs: vec!["multi_vector".into(), "tokens".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_colbert_model_keeps_the_first_token_and_leaves_out_the_skipped_ids() {
        // ids [1, 9, 4, 2]: 9 is in the skiplist; rows [h | m0 m1].
        let rows = [
            [0.0, 2.0, 0.0],
            [0.0, 1.0, 1.0],
            [0.0, 0.0, -3.0],
            [0.0, 3.0, 4.0],
        ]
        .concat();
        let wanted = Wanted {
            multi_vector: true,
            ..Default::default()
        };
        let mut cut = Cut {
            token_ids: &[1, 9, 4, 2],
            offsets: &[0, 4],
            normalize: true,
            pruning: Pruning::default(),
            skip_ids: &[9],
            encoding: Encoding::Float32,
        };
        let multi = cut.from_token_rows(&rows, &colbert(), wanted).multi_vector;
        let multi = multi.unwrap();
        assert_eq!(multi.offsets, [0, 3]);
        assert_eq!(floats(&multi.data), [1.0, 0.0, 0.0, -1.0, 0.6, 0.8]);
        // Quantized after normalizing: round(tanh(x) * 127), or the signs' bits.
        cut.encoding = Encoding::Int8;
        let int8 = cut.from_token_rows(&rows, &colbert(), wanted).multi_vector;
        let int8 = int8.unwrap();
        let expected = |x: f32| ((x.tanh() * 127.0).round() as i8) as u8;
        assert_eq!(int8.encoding, Encoding::Int8 as i32);
        assert_eq!(
            int8.data,
            [1.0, 0.0, 0.0, -1.0, 0.6, 0.8].map(expected).to_vec()
        );
        cut.encoding = Encoding::Binary;
        let bits = cut.from_token_rows(&rows, &colbert(), wanted).multi_vector;
        assert_eq!(bits.unwrap().data, [0b1000_0000, 0, 0b1100_0000]);
        let bytes = wanted.token_vector_bytes(&colbert(), 4, 1);
        assert_eq!(bytes, 4 * 2 * 4);
    }

    #[test]
    fn merged_chunks_continue_the_offsets() {
        let part = |ids: Vec<u32>| EncodeResponse {
            count: 1,
            sparse: Some(SparseVectors {
                offsets: vec![0, ids.len() as u32],
                values: vec![1.0; ids.len()],
                indices: ids,
            }),
            ..Default::default()
        };
        let merged = merge([part(vec![1, 2]), part(vec![3])]);
        let sparse = merged.sparse.unwrap();
        assert_eq!(
            (merged.count, sparse.offsets, sparse.indices),
            (2, vec![0, 2, 3], vec![1, 2, 3])
        );
    }
}
