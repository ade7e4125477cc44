//! How many image pulls run at once (`serializeImagePulls`, `maxParallelImagePulls`), with a limit that a reload
//! changes while pulls wait or run: a lower one lets no new pull start until enough have ended, a higher one
//! lets waiting pulls start at once.

use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// The gate pulls pass through.
#[derive(Debug)]
pub(super) struct PullGate {
    /// The limit (`None`: none) and the pulls running.
    state: Mutex<(Option<u32>, u32)>,
    changed: Notify,
}

/// A running pull's place; dropping it lets the next one start.
#[derive(Debug)]
pub(super) struct PullTicket<'a>(&'a PullGate);

impl Drop for PullTicket<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.1 = s.1.saturating_sub(1);
        drop(s);
        self.0.changed.notify_waiters();
    }
}

impl PullGate {
    pub(super) fn new(limit: Option<u32>) -> Self {
        Self { state: Mutex::new((limit, 0)), changed: Notify::new() }
    }

    /// Sets the limit; pulls already running go on.
    pub(super) fn set_limit(&self, limit: Option<u32>) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = limit;
        self.changed.notify_waiters();
    }

    /// Waits until a pull may start under the limit in force.
    pub(super) async fn enter(&self) -> PullTicket<'_> {
        loop {
            // Registered before the check, so that a ticket dropped in between is not missed.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if s.0.is_none_or(|limit| s.1 < limit.max(1)) {
                    s.1 += 1;
                    return PullTicket(self);
                }
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pulls_wait_for_the_limit_in_force_and_a_new_limit_applies_at_once() {
        let gate = PullGate::new(Some(1));
        let first = gate.enter().await;
        let second = tokio::time::timeout(Duration::from_secs(1), gate.enter()).await;
        assert!(second.is_err(), "one at a time");
        drop(first);
        let _one = tokio::time::timeout(Duration::from_secs(1), gate.enter()).await.expect("the first ended");
        // Raised while a pull waits: it starts.
        let waiting = async {
            let _t = gate.enter().await;
        };
        let raise = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            gate.set_limit(Some(2));
        };
        tokio::time::timeout(Duration::from_secs(1), async { tokio::join!(waiting, raise) }).await.unwrap();
        gate.set_limit(None);
        let (_a, _b, _c) = (gate.enter().await, gate.enter().await, gate.enter().await);
    }
}
