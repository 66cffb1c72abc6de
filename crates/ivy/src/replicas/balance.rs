//! Which replica takes the next chunk, and which failures another replica may retry (pure logic).

use tonic::Code;

/// The ready replica with the fewest tokens in flight; `loads[i]` is None for one that may not
/// take it. Ties go round-robin: the search starts at `turn` (a counter the caller advances), so
/// that idle replicas share single queries instead of the first one taking them all.
pub fn pick(loads: &[Option<usize>], turn: usize) -> Option<usize> {
    let n = loads.len();
    (0..n)
        .map(|k| (turn + k) % n.max(1))
        .filter_map(|i| loads[i].map(|load| (load, i)))
        .min_by_key(|&(load, _)| load)
        .map(|(_, i)| i)
}

/// Whether a chunk that failed with `code` may go to another replica: the replica could not be
/// reached, went away mid-call, or did not answer in time. Embedding and scoring are idempotent;
/// a client's mistake (or a model that cannot serve the call) fails the same everywhere.
pub fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_loaded_ready_replica() {
        assert_eq!(pick(&[Some(5), Some(2), None, Some(9)], 0), Some(1));
        assert_eq!(pick(&[None, Some(7)], 0), Some(1));
        assert_eq!(pick(&[None, None], 3), None);
        assert_eq!(pick(&[], 0), None);
    }

    #[test]
    fn ties_go_round_robin() {
        let idle = [Some(0), Some(0), Some(0)];
        let picked: Vec<_> = (0..6).map(|turn| pick(&idle, turn).unwrap()).collect();
        assert_eq!(picked, [0, 1, 2, 0, 1, 2]);
        // A busier replica is passed over whatever the turn.
        assert_eq!(pick(&[Some(0), Some(64), Some(0)], 1), Some(2));
    }

    #[test]
    fn only_transport_failures_are_retried() {
        assert!(retryable(Code::Unavailable));
        assert!(retryable(Code::DeadlineExceeded));
        assert!(retryable(Code::Unknown));
        assert!(!retryable(Code::InvalidArgument));
        assert!(!retryable(Code::FailedPrecondition));
        assert!(!retryable(Code::ResourceExhausted));
        assert!(!retryable(Code::Internal));
    }
}
