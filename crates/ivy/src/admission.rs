//! How fast a model's queued work drains, measured as requests finish, so that admission refuses
//! at once what could not be answered before its deadline (instead of queueing it to a 504).
//!
//! The estimate errs towards admitting: an estimate held low (a first step that compiled kernels
//! for minutes) would otherwise refuse every request that could show it wrong.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest span a drain-rate sample covers: shorter ones are dominated by one step's jitter.
const WINDOW: Duration = Duration::from_secs(1);
/// The weight of a new sample slower than the running estimate (a faster one replaces it).
const NEW_SAMPLE_WEIGHT: f64 = 0.3;
/// The shortest time a request's own rate is measured over (a clock's resolution, not a step).
const MIN_REQUEST_TIME: Duration = Duration::from_millis(1);
/// The longest Retry-After a backlog refusal asks for: the wait comes from the estimate, and a
/// client sent away for minutes by a wrong one costs far more than one refused early retry.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Tokens answered per second while the queue was busy, as a running estimate.
#[derive(Debug)]
pub struct DrainRate {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    since: Instant,
    tokens: u64,
    per_second: Option<f64>,
}

impl DrainRate {
    /// No estimate until the first busy window closes: until then nothing is refused by it.
    pub fn new(now: Instant) -> Self {
        let state = State {
            since: now,
            tokens: 0,
            per_second: None,
        };
        Self {
            state: Mutex::new(state),
        }
    }

    /// A request of `tokens`, admitted at `admitted`, was answered at `now`; `busy`: other large
    /// requests were still queued then. Only windows that end busy are samples: an idle gap
    /// would read as slowness. The request itself shows that the queue drains at least its
    /// tokens over its own wait: an estimate below that is raised to it at once.
    pub fn finished(&self, tokens: usize, busy: bool, admitted: Instant, now: Instant) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let took = now.saturating_duration_since(admitted).as_secs_f64();
        let shown = tokens as f64 / took.max(MIN_REQUEST_TIME.as_secs_f64());
        if let Some(rate) = state.per_second.as_mut() {
            *rate = rate.max(shown);
        }
        if state.tokens == 0 {
            // A window's first answer: the queue held nothing of it before its admission, so
            // an idle stretch since the last window (the server's start, a quiet hour) is not
            // counted as time the queue took.
            state.since = state.since.max(admitted);
        }
        state.tokens += tokens as u64;
        let elapsed = now.saturating_duration_since(state.since);
        if elapsed < WINDOW {
            return;
        }
        if busy {
            let sample = state.tokens as f64 / elapsed.as_secs_f64();
            // A rate the server has shown it can do is taken at once: a slow window is mostly
            // transient (the first steps' kernel compiles and graph captures), and an estimate
            // held low by it would refuse requests that the server can answer in time.
            state.per_second = Some(match state.per_second {
                Some(rate) if sample < rate => rate + NEW_SAMPLE_WEIGHT * (sample - rate),
                _ => sample.max(shown),
            });
        }
        state.since = now;
        state.tokens = 0;
    }

    /// How long `queued` tokens take to drain at the estimated rate (None: no estimate yet).
    pub fn wait(&self, queued: usize) -> Option<Duration> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let rate = state.per_second.filter(|r| *r > 0.0)?;
        Some(Duration::from_secs_f64(queued as f64 / rate))
    }
}

/// The longest a large request may expect to wait in the queue: half its deadline, leaving the
/// other half for the estimate's error and for its own inference.
pub fn longest_wait(request_timeout: Duration) -> Duration {
    request_timeout / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn no_estimate_until_a_busy_window_closes() {
        let start = Instant::now();
        let rate = DrainRate::new(start);
        rate.finished(1000, true, start, at(start, 500));
        assert_eq!(rate.wait(1000), None);
        rate.finished(1000, true, start, at(start, 1000));
        // 2,000 tokens in one second: 4,000 queued tokens drain in two.
        assert_eq!(rate.wait(4000), Some(Duration::from_secs(2)));
    }

    #[test]
    fn a_window_that_ends_idle_is_not_a_sample() {
        let start = Instant::now();
        let rate = DrainRate::new(start);
        rate.finished(100, false, start, at(start, 5000));
        assert_eq!(rate.wait(100), None);
        rate.finished(3000, true, at(start, 5000), at(start, 6000));
        assert_eq!(rate.wait(3000), Some(Duration::from_secs(1)));
    }

    #[test]
    fn slower_samples_move_the_estimate_part_of_the_way() {
        let start = Instant::now();
        let rate = DrainRate::new(start);
        rate.finished(2000, true, start, at(start, 1000));
        rate.finished(1000, true, start, at(start, 2000));
        // 2,000 + 0.3 * (1,000 - 2,000) = 1,700 tokens/s.
        let wait = rate.wait(1700).unwrap().as_secs_f64();
        assert!((wait - 1.0).abs() < 1e-9, "{wait}");
    }

    #[test]
    fn a_faster_sample_replaces_a_slow_start() {
        let start = Instant::now();
        let rate = DrainRate::new(start);
        // The first window spent on compiling kernels: 100 tokens/s.
        rate.finished(100, true, start, at(start, 1000));
        rate.finished(5000, true, at(start, 1000), at(start, 2000));
        assert_eq!(rate.wait(5000), Some(Duration::from_secs(1)));
    }

    #[test]
    fn a_request_answered_faster_than_the_estimate_raises_it() {
        let start = Instant::now();
        let rate = DrainRate::new(start);
        // Three minutes of kernel compiles in the first busy window: about 5.6 tokens/s.
        rate.finished(1000, true, start, at(start, 180_000));
        // Then a request of 5,000 tokens, alone (no busy window closes), answered in 50 ms.
        rate.finished(5000, false, at(start, 200_000), at(start, 200_050));
        assert_eq!(rate.wait(100_000), Some(Duration::from_secs(1)));
    }

    #[test]
    fn idle_time_before_a_window_s_first_request_is_not_a_slow_drain() {
        let start = Instant::now();
        let rate = DrainRate::new(start);
        // The server idled ten minutes after its start; then 4,000 tokens drained in a second,
        // in two answers (counted from the start, the first window would read 1,000 tokens in
        // ten minutes, and the estimate would rest on the answers' own rates, 3,000 tokens/s).
        rate.finished(1000, true, at(start, 600_000), at(start, 600_500));
        rate.finished(3000, true, at(start, 600_000), at(start, 601_000));
        assert_eq!(rate.wait(4000), Some(Duration::from_secs(1)));
    }

    #[test]
    fn the_longest_wait_is_half_the_deadline() {
        assert_eq!(
            longest_wait(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
    }
}
