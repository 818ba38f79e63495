//! Exponential backoff between reconnect attempts, with jitter so that a fleet of relays
//! restarted by one broker outage does not reconnect in lockstep.
//!
//! It only computes delays: it never sleeps and never decides whether to retry (the caller
//! knows the error's class). A delay may exceed the maximum by the jitter (at most 20 %).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The delay before the next attempt: doubles up to the maximum, ±20% jitter.
    pub fn next_delay(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        // A cheap jitter source is enough: it only spreads reconnects.
        let factor = 0.8 + f64::from(nanos % 400) / 1000.0;
        base.mul_f64(factor)
    }

    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        let delays: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        for (d, base) in delays.iter().zip([500u64, 1000, 2000, 4000, 4000, 4000]) {
            let base = Duration::from_millis(base);
            assert!(
                *d >= base.mul_f64(0.8) && *d <= base.mul_f64(1.2),
                "{d:?} vs {base:?}"
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(600));
    }
}
