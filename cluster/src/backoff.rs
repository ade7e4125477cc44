//! Doubling back-off with a cap, and the kubelet's jitter for periodic loops.

use std::time::Duration;

/// A back-off that doubles from `initial` up to `max` on each failure.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A back-off starting at `initial`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, next: initial }
    }

    /// The wait after one more failure.
    pub fn fail(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Starts again from `initial` after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// The longest `Retry-After` taken as asked; a longer one is waited for this long.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The wait an apiserver asked for with a refusal (429, or a 5xx while it starts), as client-go honours it:
/// `details.retryAfterSeconds`, which the apiserver sends with its `Retry-After` header.
pub fn retry_after(e: &kube::Error) -> Option<Duration> {
    let kube::Error::Api(s) = e else { return None };
    let asked = s.details.as_ref().map_or(0, |d| d.retry_after_seconds);
    (asked > 0 && (s.code == 429 || s.code >= 500)).then(|| Duration::from_secs(u64::from(asked)).min(MAX_RETRY_AFTER))
}

/// `period` plus up to `fraction` of it, drawn at random ([`random_part`]).
pub fn jittered(period: Duration, fraction: f64) -> Duration {
    period + random_part(period.mul_f64(fraction))
}

/// A part of `period`, from none to nearly all of it, drawn from the clock's nanoseconds (good enough to spread
/// nodes apart; nothing depends on its quality).
pub fn random_part(period: Duration) -> Duration {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    period.mul_f64(f64::from(nanos % 1_000_000) / 1_000_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn back_off_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(7));
        let waits: Vec<u128> = (0..8).map(|_| b.fail().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 6400, 7000]);
        b.reset();
        assert_eq!(b.fail(), Duration::from_millis(100));
        let j = jittered(Duration::from_secs(10), 0.04);
        assert!(j >= Duration::from_secs(10) && j <= Duration::from_millis(10_400), "{j:?}");
    }
}
