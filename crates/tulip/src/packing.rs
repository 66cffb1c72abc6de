//! First-come first-served packing under a token budget (pure logic, no I/O): the one rule by
//! which Tulip's queue fills an engine step and Ivy cuts a client batch into chunks; small
//! requests form a class of their own, packed first.

use std::collections::VecDeque;
use std::ops::Range;

/// The limits of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Most tokens in one batch (`--max-batch-tokens`).
    pub max_tokens: usize,
    /// Most sequences in one batch (`--max-batch-requests`).
    pub max_sequences: usize,
}

impl Budget {
    /// Whether a batch of `tokens` in `sequences` takes one more sequence of `next` tokens. An
    /// empty batch takes any sequence, even over budget, so that packing cannot stall.
    pub fn admits(&self, tokens: usize, sequences: usize, next: usize) -> bool {
        sequences == 0 || (tokens + next <= self.max_tokens && sequences < self.max_sequences)
    }
}

/// Cuts sequences of these `lengths`, in order, into contiguous ranges that each fill a batch
/// as far as `budget` admits.
pub fn split(lengths: &[usize], budget: Budget) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, &len) in lengths.iter().enumerate() {
        if !budget.admits(tokens, i - start, len) {
            ranges.push(start..i);
            (start, tokens) = (i, 0);
        }
        tokens += len;
    }
    if start < lengths.len() {
        ranges.push(start..lengths.len());
    }
    ranges
}

/// Something that waits in the queue.
pub trait Queued {
    /// Its token count.
    fn tokens(&self) -> usize;
    /// False once nobody waits for its result any more; it is then dropped unserved.
    fn is_wanted(&self) -> bool;
    /// Whether it wants a row a token (a token step): a batch holds one kind of step only.
    fn per_token(&self) -> bool {
        false
    }
}

/// Takes entries from the front of `queue` in arrival order until the next one would break the
/// budget. Entries nobody waits for are dropped on the way. The first wanted entry is always
/// taken, even over budget, so that the queue cannot stall.
///
/// Packing stops at the first entry that does not fit, or that wants the other kind of step,
/// rather than skipping ahead to one that would: later arrivals never overtake earlier ones.
pub fn take_batch<T: Queued>(queue: &mut VecDeque<T>, budget: Budget) -> Vec<T> {
    let mut batch = Vec::new();
    fill(&mut batch, queue, budget);
    batch
}

/// A batch from two queues: `small` (the sequences of small requests: queries) first, then
/// `bulk` (large requests, a client batch's chunks) in what budget is left, each queue first come
/// first served. A flood of large batches then delays a query by at most the step in progress.
pub fn take_batch_small_first<T: Queued>(
    small: &mut VecDeque<T>,
    bulk: &mut VecDeque<T>,
    budget: Budget,
) -> Vec<T> {
    let mut batch = take_batch(small, budget);
    if small.iter().all(|s| !s.is_wanted()) {
        fill(&mut batch, bulk, budget);
    }
    batch
}

/// Moves entries from the front of `queue` onto `batch` while `budget` admits them.
fn fill<T: Queued>(batch: &mut Vec<T>, queue: &mut VecDeque<T>, budget: Budget) {
    let mut tokens: usize = batch.iter().map(Queued::tokens).sum();
    while let Some(next) = queue.front() {
        if !next.is_wanted() {
            queue.pop_front();
            continue;
        }
        let other_kind = batch
            .first()
            .is_some_and(|b| b.per_token() != next.per_token());
        if other_kind || !budget.admits(tokens, batch.len(), next.tokens()) {
            break;
        }
        tokens += next.tokens();
        batch.extend(queue.pop_front());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Seq {
        id: usize,
        tokens: usize,
        wanted: bool,
        per_token: bool,
    }

    impl Queued for Seq {
        fn tokens(&self) -> usize {
            self.tokens
        }
        fn is_wanted(&self) -> bool {
            self.wanted
        }
        fn per_token(&self) -> bool {
            self.per_token
        }
    }

    fn queue(lengths: &[usize]) -> VecDeque<Seq> {
        lengths
            .iter()
            .enumerate()
            .map(|(id, &tokens)| Seq {
                id,
                tokens,
                wanted: true,
                per_token: false,
            })
            .collect()
    }

    fn ids(batch: &[Seq]) -> Vec<usize> {
        batch.iter().map(|s| s.id).collect()
    }

    const BUDGET: Budget = Budget {
        max_tokens: 100,
        max_sequences: 3,
    };

    #[test]
    fn packs_in_arrival_order_up_to_the_token_budget() {
        let mut q = queue(&[40, 50, 20, 5]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0, 1]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [2, 3]);
        assert!(take_batch(&mut q, BUDGET).is_empty());
    }

    #[test]
    fn a_batch_may_fill_the_budget_exactly() {
        let mut q = queue(&[60, 40, 1]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0, 1]);
    }

    #[test]
    fn later_small_entries_never_overtake_a_large_one() {
        let mut q = queue(&[60, 70, 10]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [1, 2]);
    }

    #[test]
    fn caps_the_sequence_count() {
        let mut q = queue(&[1, 1, 1, 1, 1]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0, 1, 2]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [3, 4]);
    }

    #[test]
    fn an_entry_over_budget_goes_alone() {
        let mut q = queue(&[150, 10]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [1]);
    }

    #[test]
    fn entries_nobody_waits_for_are_dropped() {
        let mut q = queue(&[10, 90, 10, 10]);
        q[0].wanted = false;
        q[1].wanted = false;
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [2, 3]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_batch_holds_one_kind_of_step_and_the_next_kind_waits_its_turn() {
        let mut q = queue(&[10, 10, 10, 10]);
        q[1].per_token = true;
        q[2].per_token = true;
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [1, 2]);
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [3]);
    }

    #[test]
    fn split_cuts_lengths_by_the_same_rule() {
        let budget = |max_tokens, max_sequences| Budget {
            max_tokens,
            max_sequences,
        };
        assert_eq!(split(&[4, 4, 4, 4, 4], budget(8, 100)), [0..2, 2..4, 4..5]);
        assert_eq!(split(&[4, 4, 4, 4, 4], budget(100, 2)), [0..2, 2..4, 4..5]);
        assert_eq!(split(&[3, 5, 1], budget(8, 100)), [0..2, 2..3]);
        assert_eq!(split(&[2, 20, 2], budget(8, 100)), [0..1, 1..2, 2..3]);
        assert!(split(&[], budget(8, 8)).is_empty());
        let lengths = [40, 50, 20, 5];
        let mut q = queue(&lengths);
        let taken: Vec<usize> = std::iter::from_fn(|| Some(take_batch(&mut q, BUDGET).len()))
            .take_while(|&n| n > 0)
            .collect();
        let cut: Vec<usize> = split(&lengths, BUDGET).iter().map(|r| r.len()).collect();
        assert_eq!(taken, cut);
    }

    #[test]
    fn unwanted_entries_do_not_count_against_the_budget() {
        let mut q = queue(&[90, 90, 10]);
        q[1].wanted = false;
        assert_eq!(ids(&take_batch(&mut q, BUDGET)), [0, 2]);
    }

    #[test]
    fn small_requests_go_first_and_bulk_fills_what_is_left() {
        let mut bulk = queue(&[60, 60, 60]);
        let mut small: VecDeque<Seq> = [(10, 5), (11, 5)]
            .into_iter()
            .map(|(id, tokens)| Seq {
                id,
                tokens,
                wanted: true,
                per_token: false,
            })
            .collect();
        let batch = take_batch_small_first(&mut small, &mut bulk, BUDGET);
        assert_eq!(ids(&batch), vec![10, 11, 0]);
        let batch = take_batch_small_first(&mut small, &mut bulk, BUDGET);
        assert_eq!(ids(&batch), vec![1]);
        // Bulk waits while small sequences are left over (they filled the step).
        let mut small = queue(&[70, 70]);
        let mut bulk = queue(&[10]);
        assert_eq!(
            ids(&take_batch_small_first(&mut small, &mut bulk, BUDGET)),
            vec![0]
        );
        assert_eq!(bulk.len(), 1);
    }
}
