//! The kubelet's crash-loop back-off for restarting containers: the first restart is immediate, then each restart
//! waits twice as long as the previous one, from 10 s up to 5 min, counted from when the container exited. A
//! container that ran for 10 min before exiting starts over.

use std::time::Duration;

use tokio::time::Instant;

/// The first back-off.
pub const INITIAL: Duration = Duration::from_secs(10);
/// The longest back-off.
pub const MAX: Duration = Duration::from_secs(300);
/// A container that ran this long before exiting has its back-off reset.
pub const RESET_AFTER: Duration = Duration::from_secs(600);

/// One container's back-off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    /// The wait before the next restart; zero before the first restart.
    next: Duration,
}

impl Backoff {
    /// When a container that started at `started` and exited at `finished` may start again. Advances the back-off.
    pub fn restart_at(&mut self, started: Instant, finished: Instant) -> Instant {
        if finished.saturating_duration_since(started) >= RESET_AFTER {
            self.next = Duration::ZERO;
        }
        let wait = self.next;
        self.next = if wait.is_zero() { INITIAL } else { (wait * 2).min(MAX) };
        finished + wait
    }

    /// When a failed image pull may be tried again, failing at `now`: 10 s after the first failure, doubling to
    /// 5 min (the kubelet's image back-off). Advances the back-off.
    pub fn pull_retry_at(&mut self, now: Instant) -> Instant {
        self.next = if self.next.is_zero() { INITIAL } else { (self.next * 2).min(MAX) };
        now + self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pulls_wait_ten_seconds_first_then_double() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..7).map(|_| (b.pull_retry_at(t0) - t0).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn doubles_to_five_minutes_and_resets_after_ten() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let mut waits = Vec::new();
        for _ in 0..9 {
            let at = b.restart_at(t0, t0 + Duration::from_secs(1));
            waits.push((at - (t0 + Duration::from_secs(1))).as_secs());
        }
        assert_eq!(waits, [0, 10, 20, 40, 80, 160, 300, 300, 300]);
        // Ten minutes of running: back to an immediate restart, then 10 s.
        let long = t0 + RESET_AFTER;
        assert_eq!(b.restart_at(t0, long), long);
        assert_eq!(b.restart_at(long, long + Duration::from_secs(1)), long + Duration::from_secs(1) + INITIAL);
    }
}
