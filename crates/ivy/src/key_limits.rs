//! Per-key limits: requests a second (governor's GCRA, keyed by the key's position) and tokens a
//! minute, so that one tenant's burst leaves the other keys' budgets alone.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

type Keyed = RateLimiter<usize, DefaultKeyedStateStore<usize>, DefaultClock>;

/// The limits of every key.
pub struct KeyLimits {
    requests: Option<Keyed>,
    tokens_per_minute: Option<NonZeroU32>,
    tokens: Mutex<HashMap<usize, TokenBudget>>,
}

impl KeyLimits {
    /// `requests_per_second` and `tokens_per_minute` for each key (None: unlimited).
    pub fn new(
        requests_per_second: Option<NonZeroU32>,
        tokens_per_minute: Option<NonZeroU32>,
    ) -> KeyLimits {
        KeyLimits {
            requests: requests_per_second.map(|n| RateLimiter::keyed(Quota::per_second(n))),
            tokens_per_minute,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// Admits one request of `key`, or says how long it should wait.
    pub fn admit(&self, key: usize) -> Result<(), Duration> {
        self.with_budget(key, |budget, now| budget.admit(now))
            .unwrap_or(Ok(()))?;
        if let Some(limiter) = &self.requests {
            let clock = DefaultClock::default();
            limiter
                .check_key(&key)
                .map_err(|not_until| not_until.wait_time_from(clock.now()))?;
        }
        Ok(())
    }

    /// Charges `tokens` (what an answer embedded or scored) to `key`.
    pub fn charge(&self, key: usize, tokens: u64) {
        self.with_budget(key, |budget, now| budget.charge(tokens, now));
    }

    /// `f` on `key`'s token budget (made full on first use); None without a tokens limit.
    fn with_budget<T>(
        &self,
        key: usize,
        f: impl FnOnce(&mut TokenBudget, Instant) -> T,
    ) -> Option<T> {
        let per_minute = self.tokens_per_minute?;
        let now = Instant::now();
        let mut budgets = self.tokens.lock().expect("budget lock");
        let budget = budgets
            .entry(key)
            .or_insert_with(|| TokenBudget::new(per_minute, now));
        Some(f(budget, now))
    }
}

/// A bucket of tokens a minute deep that may go into debt: a request's tokens are known only
/// once it is answered (governor's buckets refuse what they cannot hold), so the request that
/// overdraws is served and the key waits until the bucket is above zero again.
#[derive(Debug, Clone)]
struct TokenBudget {
    per_second: f64,
    capacity: f64,
    level: f64,
    at: Instant,
}

impl TokenBudget {
    fn new(per_minute: NonZeroU32, now: Instant) -> TokenBudget {
        let capacity = f64::from(per_minute.get());
        TokenBudget {
            per_second: capacity / 60.0,
            capacity,
            level: capacity,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + elapsed * self.per_second).min(self.capacity);
        self.at = now;
    }

    fn admit(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.level > 0.0 {
            return Ok(());
        }
        Err(Duration::from_secs_f64(-self.level / self.per_second).max(Duration::from_millis(1)))
    }

    fn charge(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.level -= tokens as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_past_its_tokens_waits_for_them_to_refill() {
        let start = Instant::now();
        let mut budget = TokenBudget::new(NonZeroU32::new(600).unwrap(), start);
        assert!(budget.admit(start).is_ok());
        budget.charge(900, start); // 300 in debt, at 10 tokens a second
        let wait = budget.admit(start).unwrap_err();
        assert!((wait.as_secs_f64() - 30.0).abs() < 0.01, "{wait:?}");
        let later = start + Duration::from_secs(31);
        assert!(budget.admit(later).is_ok());
        // It never holds more than a minute's worth.
        budget.refill(later + Duration::from_secs(3600));
        assert_eq!(budget.level, 600.0);
    }

    #[test]
    fn keys_have_budgets_of_their_own() {
        let limits = KeyLimits::new(None, NonZeroU32::new(100));
        limits.charge(0, 1000);
        assert!(limits.admit(0).is_err());
        assert!(limits.admit(1).is_ok());
    }

    #[test]
    fn requests_past_the_rate_wait_and_other_keys_do_not() {
        let limits = KeyLimits::new(NonZeroU32::new(2), None);
        assert!(limits.admit(0).is_ok() && limits.admit(0).is_ok());
        let wait = limits.admit(0).unwrap_err();
        assert!(wait <= Duration::from_millis(500), "{wait:?}");
        assert!(limits.admit(1).is_ok());
        assert!(KeyLimits::new(None, None).admit(7).is_ok());
    }
}
