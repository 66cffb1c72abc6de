//! Sparse vectors from a SPLADE model's vocabulary-wide ones: the non-zero entries, in index
//! order, optionally pruned to the largest or to those above a floor.

/// How a sparse vector is pruned (none by default: every non-zero entry).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pruning {
    /// Keep only this many entries, the largest (ties: the lower index).
    pub top_k: Option<usize>,
    /// Keep only entries of at least this value.
    pub min_value: f32,
}

/// The entries of `row` that are positive and pass `pruning`, as (index, value) by index.
pub fn sparsify(row: &[f32], pruning: Pruning) -> Vec<(u32, f32)> {
    let mut entries: Vec<(u32, f32)> = (row.iter().enumerate())
        .filter(|(_, &v)| v > 0.0 && v >= pruning.min_value)
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if let Some(k) = pruning.top_k {
        if entries.len() > k {
            entries.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            entries.truncate(k);
            entries.sort_unstable_by_key(|e| e.0);
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: [f32; 6] = [0.0, 0.5, 0.0, 2.0, 0.25, 2.0];

    #[test]
    fn every_positive_entry_in_index_order() {
        let all = sparsify(&ROW, Pruning::default());
        assert_eq!(all, vec![(1, 0.5), (3, 2.0), (4, 0.25), (5, 2.0)]);
    }

    #[test]
    fn top_k_keeps_the_largest_then_orders_them_by_index() {
        let top = Pruning {
            top_k: Some(3),
            ..Pruning::default()
        };
        assert_eq!(sparsify(&ROW, top), vec![(1, 0.5), (3, 2.0), (5, 2.0)]);
        let tie = Pruning {
            top_k: Some(1),
            ..Pruning::default()
        };
        assert_eq!(sparsify(&ROW, tie), vec![(3, 2.0)]);
    }

    #[test]
    fn min_value_drops_what_is_below_it() {
        let floor = Pruning {
            min_value: 0.5,
            ..Pruning::default()
        };
        assert_eq!(sparsify(&ROW, floor), vec![(1, 0.5), (3, 2.0), (5, 2.0)]);
    }
}
