//! Splitting a client batch into chunks for Tulip, and choosing a replica (pure logic).

use std::ops::Range;

/// Splits sequences, given their lengths, into contiguous chunks of at most `max_tokens` tokens
/// and `max_sequences` sequences. A sequence longer than `max_tokens` forms a chunk of its own.
pub fn split(lengths: &[usize], max_tokens: usize, max_sequences: usize) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, &len) in lengths.iter().enumerate() {
        let full = tokens + len > max_tokens || i - start >= max_sequences;
        if full && i > start {
            chunks.push(start..i);
            (start, tokens) = (i, 0);
        }
        tokens += len;
    }
    if start < lengths.len() {
        chunks.push(start..lengths.len());
    }
    chunks
}

/// Index of the replica with the least work in flight; the first one on ties.
pub fn least_loaded(loads: impl IntoIterator<Item = usize>) -> usize {
    loads
        .into_iter()
        .enumerate()
        .min_by_key(|&(_, load)| load)
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_sequence_in_order() {
        assert_eq!(split(&[4, 4, 4, 4, 4], 8, 100), [0..2, 2..4, 4..5]);
        assert_eq!(split(&[4, 4, 4, 4, 4], 100, 2), [0..2, 2..4, 4..5]);
        assert_eq!(split(&[3, 5, 1], 8, 100), [0..2, 2..3]);
    }

    #[test]
    fn a_long_sequence_goes_alone() {
        assert_eq!(split(&[2, 20, 2], 8, 100), [0..1, 1..2, 2..3]);
    }

    #[test]
    fn nothing_to_split() {
        assert!(split(&[], 8, 8).is_empty());
        assert_eq!(split(&[1], 8, 8), vec![Range { start: 0, end: 1 }]);
    }

    #[test]
    fn picks_the_least_loaded_replica() {
        assert_eq!(least_loaded([5, 2, 9, 2]), 1);
        assert_eq!(least_loaded([0]), 0);
        assert_eq!(least_loaded([]), 0);
    }
}
