//! The interface between Tulip's scheduler and an inference engine.
//!
//! `step` only enqueues work and returns a [`Pending`] result at once; the scheduler waits on it
//! from another thread while the engine thread prepares the next batch.

use crate::error::EngineError;
use crate::proto::{ModelInfo, TokenizerResponse};

/// A packed batch: all sequences' token ids concatenated, with cumulative offsets (no padding).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub token_ids: Vec<u32>,
    /// `cu_seqlens[i]..cu_seqlens[i + 1]` are sequence i's tokens; starts with 0.
    pub cu_seqlens: Vec<u32>,
    /// One per token id once any sequence has them (the others' are 0); empty: all 0.
    pub token_type_ids: Vec<u32>,
    /// The engine answers a row a token (ModelInfo's token row layout), not a row a sequence.
    pub per_token: bool,
}

impl Batch {
    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// True when the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends one sequence, with its token type ids if it has any (`types`: one per id).
    pub fn push(&mut self, ids: &[u32], types: Option<&[u32]>) {
        if self.cu_seqlens.is_empty() {
            self.cu_seqlens.push(0);
        }
        match types {
            Some(types) => {
                // The sequences before this one had none: theirs are 0.
                self.token_type_ids.resize(self.token_ids.len(), 0);
                self.token_type_ids.extend_from_slice(types);
            }
            None if !self.token_type_ids.is_empty() => self
                .token_type_ids
                .resize(self.token_ids.len() + ids.len(), 0),
            None => {}
        }
        self.token_ids.extend_from_slice(ids);
        self.cu_seqlens.push(self.token_ids.len() as u32);
    }
}

/// Pooled, unnormalized float32 vectors of one batch on the host, row-major `[rows, dim]` (a
/// token step's: a row a token).
#[derive(Debug, Clone, PartialEq)]
pub struct Pooled {
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Pooled {
    /// Row `i` of the matrix.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// What an engine serves, as it reports it after loading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Served {
    pub model: ModelInfo,
    /// The tokenizer and the template that clients tokenize by.
    pub tokenization: TokenizerResponse,
}

/// A batch's result that may still be in flight on the device.
pub trait Pending: Send + 'static {
    /// Blocks until the vectors are on the host.
    fn wait(self) -> Result<Pooled, EngineError>;
}

/// Reads an engine's live state (graph memory, fidelity, idle share) as a JSON object; callable
/// from any thread while the engine thread works.
pub type Probe = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// An inference engine driven by one thread.
pub trait Engine: 'static {
    type Pending: Pending;

    /// Enqueues the forward pass of `batch`; returns without waiting for the device.
    fn step(&mut self, batch: &Batch) -> Result<Self::Pending, EngineError>;

    /// A probe of the engine's live state; by default the engine has none to report.
    fn probe(&self) -> Probe {
        std::sync::Arc::new(|| "{}".to_string())
    }

    /// Runs a thread of the scheduler (the engine's, the waiter's) from start to end; an engine
    /// whose runtime keeps per-thread state (Python's) sets it up here once per thread.
    fn run_thread<F: FnOnce() + Send>(body: F)
    where
        Self: Sized,
    {
        body()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_types_are_kept_once_any_sequence_has_them() {
        let mut batch = Batch::default();
        batch.push(&[1, 2], None);
        assert!(batch.token_type_ids.is_empty());
        batch.push(&[3, 4, 5], Some(&[0, 1, 1]));
        batch.push(&[6], None);
        assert_eq!(batch.token_type_ids, [0, 0, 0, 1, 1, 0]);
        assert_eq!(batch.cu_seqlens, [0, 2, 5, 6]);
    }
}
