//! A ColBERT model's reranking: the query's and each document's multi-vectors from Encode, scored
//! by MaxSim (each query vector's best dot product with the document's vectors, summed), as
//! PyLate's `colbert_scores`.

use std::time::Instant;

use futures::try_join;
use tokenizers::TruncationDirection;
use tulip::proto::{Encoding, Output, TokenVectors};
use tulip::sparse::Pruning;

use crate::encode::{EncodeCall, Encoded};
use crate::error::IvyError;
use crate::gateway::Gateway;
use crate::input::Input;
use crate::replicas::floats;
use crate::request::{TextOptions, Timings};
use crate::score::{RerankCall, Scores};
use crate::template::Role;

impl Gateway {
    /// Scores each document against the query by MaxSim over their multi-vectors.
    pub(crate) async fn max_sims(
        &self,
        route: &'static str,
        call: RerankCall,
    ) -> Result<Scores, IvyError> {
        let start = Instant::now();
        let request = |inputs: Vec<String>, role| EncodeCall {
            inputs: inputs.into_iter().map(Input::Text).collect(),
            text: TextOptions {
                prompt_name: None,
                truncate: call.truncate,
                direction: TruncationDirection::Right,
                max_length: None,
            },
            outputs: vec![Output::MultiVector],
            normalize: true,
            pruning: Pruning::default(),
            encoding: Encoding::Float32,
            role: Some(role),
        };
        let (query, documents) = try_join!(
            self.encode_unrecorded(request(vec![call.query.clone()], Role::Query)),
            self.encode_unrecorded(request(call.documents.clone(), Role::Document)),
        )?;
        let vectors = |e: &Encoded| e.outputs.multi_vector.clone().unwrap_or_default();
        let scores = max_sim_scores(&vectors(&query), &vectors(&documents));
        let timings = joined(&query.timings, &documents.timings, start);
        crate::metrics::record(route, scores.len(), &timings);
        Ok(Scores {
            scores,
            tokens: timings.tokens,
            timings,
        })
    }
}

/// The timings of two requests run side by side as one.
fn joined(a: &Timings, b: &Timings, start: Instant) -> Timings {
    Timings {
        tokenization: a.tokenization.max(b.tokenization),
        queue: a.queue.max(b.queue),
        inference: a.inference.max(b.inference),
        transfer: a.transfer.max(b.transfer),
        total: start.elapsed(),
        tokens: a.tokens + b.tokens,
        characters: a.characters + b.characters,
    }
}

/// Each document's MaxSim against the query (the first sequence of `query`); float32 rows.
pub fn max_sim_scores(query: &TokenVectors, documents: &TokenVectors) -> Vec<f32> {
    let dim = query.dimensions as usize;
    let query_rows = floats(&query.data);
    let query_rows = &query_rows[..query.offsets.get(1).map_or(0, |&end| end as usize) * dim];
    let document_rows = floats(&documents.data);
    (documents.offsets.windows(2))
        .map(|w| {
            max_sim(
                query_rows,
                &document_rows[w[0] as usize * dim..w[1] as usize * dim],
                dim,
            )
        })
        .collect()
}

/// MaxSim of one query and one document, their vectors as rows of `dim` values: a query vector
/// with no document vector to match adds nothing.
pub fn max_sim(query: &[f32], document: &[f32], dim: usize) -> f32 {
    (query.chunks_exact(dim))
        .map(|q| {
            (document.chunks_exact(dim))
                .map(|d| q.iter().zip(d).map(|(a, b)| a * b).sum::<f32>())
                .reduce(f32::max)
                .unwrap_or(0.0)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_sim_sums_each_query_vectors_best_match() {
        let query = [1.0, 0.0, 0.0, 1.0];
        let document = [0.5, 0.5, 1.0, 0.0, 0.0, -1.0];
        // Row (1, 0) best matches (1, 0): 1; row (0, 1) best matches (0.5, 0.5): 0.5.
        assert_eq!(max_sim(&query, &document, 2), 1.5);
        assert_eq!(max_sim(&query, &[], 2), 0.0);
    }

    #[test]
    fn scores_every_document_against_the_first_query() {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let vectors = |offsets: Vec<u32>, rows: &[f32]| TokenVectors {
            dimensions: 2,
            offsets,
            data: bytes(rows),
            encoding: 0,
        };
        let query = vectors(vec![0, 1], &[0.0, 2.0]);
        let documents = vectors(vec![0, 2, 3], &[1.0, 1.0, 0.0, 3.0, 1.0, 0.0]);
        assert_eq!(max_sim_scores(&query, &documents), [6.0, 0.0]);
    }
}
