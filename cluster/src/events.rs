//! core/v1 Events about the Node, posted by a task of their own so that no loop waits on them, through a spam
//! filter like client-go's: a burst of 25 per object, then one every 5 minutes.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Clients;

/// The events a node may post in a burst.
const BURST: f64 = 25.0;
/// One more event allowed per this long.
const REFILL: Duration = Duration::from_secs(300);
/// Events waiting to be posted; more are dropped (with a log line) rather than stall a loop.
const QUEUE: usize = 256;
/// The `source.component` and `reportingComponent`, as the kubelet's: what `kubectl describe node` shows in
/// FROM, and what dashboards filter on.
pub const COMPONENT: &str = "kubelet";

/// One event to post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// The reason (`NodeReady`, `Rebooted`, ...).
    pub reason: String,
    /// The message.
    pub message: String,
}

/// Where the loops hand events over.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::Sender<NodeEvent>,
}

impl Recorder {
    /// A recorder and the task that posts what it is given, for node `node`.
    pub fn new(node: &str, clients: Clients) -> (Recorder, Poster) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Recorder { tx }, Poster { node: node.to_owned(), clients, rx })
    }

    /// Queues an event; never waits.
    pub fn record(&self, kind: &'static str, reason: &str, message: String) {
        if self.tx.try_send(NodeEvent { kind, reason: reason.to_owned(), message }).is_err() {
            tracing::warn!(reason, "node event dropped: too many waiting to be posted");
        }
    }
}

/// The task posting events.
pub struct Poster {
    node: String,
    clients: Clients,
    rx: mpsc::Receiver<NodeEvent>,
}

/// The Event object for `e` about node `node`: in namespace `default`, referring to the Node by name with the
/// name as its UID (as the kubelet refers to its Node).
pub fn event_object(node: &str, e: &NodeEvent, now: jiff::Timestamp) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{node}.{:x}", now.as_nanosecond())),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("Node".into()),
            name: Some(node.to_owned()),
            uid: Some(node.to_owned()),
            ..ObjectReference::default()
        },
        reason: Some(e.reason.clone()),
        message: Some(e.message.clone()),
        type_: Some(e.kind.to_owned()),
        source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(node.to_owned()) }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(node.to_owned()),
        ..Event::default()
    }
}

impl Poster {
    /// Posts events until `shutdown`; a failed post is logged and dropped (events are best effort, as in the
    /// kubelet).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let (mut tokens, mut at) = (BURST, Instant::now());
        loop {
            let e = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = self.rx.recv() => match e { Some(e) => e, None => return },
            };
            tokens = (tokens + at.elapsed().as_secs_f64() / REFILL.as_secs_f64()).min(BURST);
            at = Instant::now();
            if tokens < 1.0 {
                tracing::debug!(reason = %e.reason, "node event filtered as spam");
                continue;
            }
            tokens -= 1.0;
            self.clients.limiter.acquire().await;
            let object = event_object(&self.node, &e, jiff::Timestamp::now());
            let params = PostParams::default();
            let api: Api<Event> = Api::namespaced(self.clients.main(), "default");
            let posted = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = api.create(&params, &object) => r,
            };
            match posted {
                Ok(_) => tracing::debug!(reason = %e.reason, "node event posted"),
                Err(err) => tracing::warn!(reason = %e.reason, error = %err, "cannot post a node event"),
            }
        }
    }
}
