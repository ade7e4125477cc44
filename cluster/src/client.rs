//! The clients the kubelet keeps: the main one, rate limited by `kubeAPIQPS`/`kubeAPIBurst`, and the heartbeat
//! one, unlimited and with a short timeout, so that a busy or slow main client never delays a Lease renewal or a
//! status report; and one for watches, whose answers stream for minutes. Each request is bounded as a whole, to
//! its last byte, by its client's timeout, and each answer by its client's size cap.

use std::path::Path;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::ClusterError;
use crate::bounded::Bounds;

/// A token bucket: `qps` tokens a second, at most `burst` saved.
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// A bucket that starts full.
    pub fn new(qps: f64, burst: u32) -> RateLimiter {
        let burst = f64::from(burst.max(1));
        RateLimiter { qps: qps.max(0.001), burst, state: Mutex::new((burst, Instant::now())) }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        loop {
            let wait = {
                let mut s = self.state.lock().await;
                let now = Instant::now();
                let refilled = (s.0 + (now - s.1).as_secs_f64() * self.qps).min(self.burst);
                *s = (refilled, now);
                if refilled >= 1.0 {
                    s.0 -= 1.0;
                    return;
                }
                Duration::from_secs_f64((1.0 - refilled) / self.qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// The clients of one node. Clones share them: [`Clients::replace`] (new credentials) reaches every holder, and
/// each request takes the clients in force when it starts.
#[derive(Clone)]
pub struct Clients {
    pair: Arc<RwLock<Pair>>,
    /// The main client's rate limit (kept across a change of credentials).
    pub limiter: Arc<RateLimiter>,
    /// Counts the changes of credentials.
    replaced: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Clone)]
struct Pair {
    main: kube::Client,
    heartbeat: kube::Client,
    watch: kube::Client,
}

/// How long the main client waits to connect and for a whole answer.
const MAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the apiserver keeps a watch open (`timeoutSeconds`): it ends it, and the watcher starts the next.
pub const WATCH_SECONDS: u32 = 290;
/// The watch client's bound on a whole watch: past the apiserver's own end of it.
const WATCH_DEADLINE: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 30);
/// The longest a watch may stay silent: the apiserver sends a bookmark about every minute to a watch that asks
/// for them (kube's watcher does), so a connection silent for longer is dead (a half-open one after a network
/// cut) and a new watch starts, instead of one blind until the watch's end.
const WATCH_IDLE: Duration = Duration::from_secs(120);
/// The most bytes one watch streams before it is cut (and the watcher starts the next from where it was).
const MAX_WATCH_BYTES: usize = 64 << 20;
/// The largest answer either client takes: above the largest object etcd stores by default (1.5 MiB) with room
/// for a list of the node's own objects, far below what would grow the daemon's locked memory much.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

impl Clients {
    /// The apiserver and credentials of the kubeconfig at `path` (a client certificate or a token).
    pub async fn read_kubeconfig(path: &Path) -> Result<kube::Config, ClusterError> {
        let bad = |reason: String| ClusterError::Kubeconfig { path: path.display().to_string(), reason };
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| bad(e.to_string()))
    }

    /// The clients for the kubeconfig at `path`.
    pub async fn from_kubeconfig(
        path: &Path,
        qps: f64,
        burst: u32,
        heartbeat_timeout: Duration,
    ) -> Result<Clients, ClusterError> {
        Clients::from_config(Clients::read_kubeconfig(path).await?, qps, burst, heartbeat_timeout)
    }

    /// The clients for `config`. Building one loads the system's root certificates, which takes a while on a
    /// slow machine: call it off the async threads.
    pub fn from_config(
        config: kube::Config,
        qps: f64,
        burst: u32,
        heartbeat_timeout: Duration,
    ) -> Result<Clients, ClusterError> {
        let client = |timeout: Duration, idle: Duration, deadline: Duration, max_bytes: usize| {
            let mut c = config.clone();
            // Retries are the loops' own, with the kubelet's back-offs: the client's retry layer would hold a
            // status update for minutes while the apiserver answers 503.
            c.default_retry = false;
            c.connect_timeout = Some(timeout);
            c.read_timeout = Some(idle);
            c.write_timeout = Some(timeout);
            c.reset_reader_on_write = true;
            let builder = kube::client::ClientBuilder::try_from(c).map_err(|e| ClusterError::Client(e.to_string()))?;
            Ok(builder.with_layer(&Bounds { deadline, max_bytes }).build())
        };
        let main = client(MAIN_TIMEOUT, MAIN_TIMEOUT, MAIN_TIMEOUT, MAX_ANSWER_BYTES)?;
        let heartbeat = client(heartbeat_timeout, heartbeat_timeout, heartbeat_timeout, MAX_ANSWER_BYTES)?;
        let watch = client(MAIN_TIMEOUT, WATCH_IDLE, WATCH_DEADLINE, MAX_WATCH_BYTES)?;
        let pair = Pair { main, heartbeat, watch };
        Ok(Clients::of(pair, Arc::new(RateLimiter::new(qps, burst))))
    }

    /// Clients from a main and a heartbeat client; watches go through the main one.
    pub fn new(main: kube::Client, heartbeat: kube::Client, limiter: Arc<RateLimiter>) -> Clients {
        let watch = main.clone();
        Clients::of(Pair { main, heartbeat, watch }, limiter)
    }

    fn pair(&self) -> Pair {
        self.pair.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Registration, events: rate limited by [`Clients::limiter`].
    pub fn main(&self) -> kube::Client {
        self.pair().main
    }

    /// Lease renewals and node status: no rate limit, timeout min(nodeStatusUpdateFrequency,
    /// nodeLeaseDurationSeconds).
    pub fn heartbeat(&self) -> kube::Client {
        self.pair().heartbeat
    }

    /// List and watch: no rate limit (a watch is one long request), the answer bounded by the watch's duration.
    pub fn watch(&self) -> kube::Client {
        self.pair().watch
    }

    fn of(pair: Pair, limiter: Arc<RateLimiter>) -> Clients {
        Clients { pair: Arc::new(RwLock::new(pair)), limiter, replaced: Arc::new(tokio::sync::watch::Sender::new(0)) }
    }

    /// Takes `other`'s clients (new credentials) for every request from now on; the rate limit stays. Those
    /// waiting on [`Clients::replaced`] are woken.
    pub fn replace(&self, other: &Clients) {
        let pair = other.pair();
        *self.pair.write().unwrap_or_else(PoisonError::into_inner) = pair;
        self.replaced.send_modify(|n| *n += 1);
    }

    /// Changes when the credentials are replaced: a loop backing off after refused requests tries again at once.
    pub fn replaced(&self) -> tokio::sync::watch::Receiver<u64> {
        self.replaced.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_a_burst_then_the_rate() {
        let l = RateLimiter::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            l.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        for _ in 0..10 {
            l.acquire().await;
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(990) && took <= Duration::from_millis(1010), "{took:?}");
    }
}
