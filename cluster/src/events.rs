//! core/v1 Events about the Node and its pods, posted by a task of their own so that no loop waits on them, correlated as
//! client-go's recorder does ([`crate::correlate`]: repeats counted, similar events combined, a spam filter per
//! object) and within `eventRecordQPS`/`eventBurst`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Clients;
use crate::backoff::random_part;
use crate::client::RateLimiter;
use crate::correlate::{Correlated, Correlator};

/// Events waiting to be posted (client-go's broadcaster queues as many); more are dropped (with a log line)
/// rather than stall a loop.
const QUEUE: usize = 1000;
/// Tries of an event whose post failed on its way (the apiserver away, a connection cut), as client-go's.
const MAX_TRIES: u32 = 12;
/// The wait between them; the first is a random part of it, so nodes that lost the apiserver together do not
/// come back together.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// The `source.component` and `reportingComponent`, as the kubelet's: what `kubectl describe node` shows in
/// FROM, and what dashboards filter on.
pub const COMPONENT: &str = "kubelet";

/// One event the node posts, about itself or one of its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// The reason (`NodeReady`, `Rebooted`, ...).
    pub reason: String,
    /// The message.
    pub message: String,
    /// The pod it is about; `None` for the node.
    pub pod: Option<PodRef>,
    /// When it happened: its first and last timestamps (client-go stamps an event when it is recorded, not when
    /// it is posted).
    pub at: jiff::Timestamp,
    /// When it happened, on the clock the correlation's windows are measured by.
    pub seen: Instant,
}

impl NodeEvent {
    /// An event about `pod` (`None` for the node) happening now.
    pub fn now(kind: &'static str, reason: &str, message: String, pod: Option<PodRef>) -> Self {
        Self { kind, reason: reason.to_owned(), message, pod, at: jiff::Timestamp::now(), seen: Instant::now() }
    }
}

/// The pod an event is about, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's namespace, where its events are.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// Where in the pod (`involvedObject.fieldPath`: `spec.containers{name}`, `spec.initContainers{name}`), if
    /// it is about a container.
    pub field_path: Option<String>,
}

/// Where the loops hand events over.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: mpsc::Sender<NodeEvent>,
}

impl Recorder {
    /// A recorder and the task that posts what it is given, for node `node`, at most as fast as `limit` allows
    /// (`eventRecordQPS`, `eventBurst`; `None` for no limit).
    pub fn new(node: &str, clients: Clients, limit: Option<RateLimiter>) -> (Recorder, Poster) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let poster = Poster { node: node.to_owned(), clients, limit, correlator: Correlator::default(), rx };
        (Recorder { tx }, poster)
    }

    /// Queues an event about the node, happening now; never waits.
    pub fn record(&self, kind: &'static str, reason: &str, message: String) {
        self.send(NodeEvent::now(kind, reason, message, None));
    }

    /// Queues an event (about a pod, or one recorded earlier); never waits.
    pub fn send(&self, e: NodeEvent) {
        if let Err(e) = self.tx.try_send(e) {
            tracing::warn!(reason = %e.into_inner().reason, "event dropped: too many waiting to be posted");
        }
    }
}

/// The task posting events.
pub struct Poster {
    node: String,
    clients: Clients,
    limit: Option<RateLimiter>,
    correlator: Correlator,
    rx: mpsc::Receiver<NodeEvent>,
}

/// The Event object for `e` from node `node`. About the node: in namespace `default`, referring to the Node by
/// name with the name as its UID (as the kubelet refers to its Node). About a pod: in the pod's namespace.
pub fn event_object(node: &str, e: &NodeEvent) -> Event {
    let now = e.at;
    let (namespace, involved_object) = match &e.pod {
        None => (
            "default".to_owned(),
            ObjectReference {
                kind: Some("Node".into()),
                name: Some(node.to_owned()),
                uid: Some(node.to_owned()),
                ..ObjectReference::default()
            },
        ),
        Some(pod) => (
            pod.namespace.clone(),
            ObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                namespace: Some(pod.namespace.clone()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
                field_path: pod.field_path.clone(),
                ..ObjectReference::default()
            },
        ),
    };
    let object = involved_object.name.clone().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object,
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
    /// Posts events until `shutdown`, one after the other. A post the apiserver refused is logged and dropped;
    /// one that failed on its way is tried again every [`RETRY_AFTER`], [`MAX_TRIES`] times in all, as client-go
    /// does (events are best effort, as in the kubelet).
    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            let e = tokio::select! {
                _ = shutdown.cancelled() => return,
                e = self.rx.recv() => match e { Some(e) => e, None => return },
            };
            let object = event_object(&self.node, &e);
            let correlated = self.correlator.correlate(object, e.seen, e.at);
            let Some(posted) = self.post_with_retries(&correlated, &e.reason, &shutdown).await else { return };
            match posted {
                Ok(Some(answer)) => {
                    tracing::debug!(reason = %e.reason, count = answer.count, "node event posted");
                    self.correlator.posted(&answer);
                }
                Ok(None) => tracing::debug!(reason = %e.reason, "node event filtered as spam"),
                Err(err) => tracing::warn!(reason = %e.reason, error = %err, "cannot post a node event"),
            }
        }
    }

    /// [`Poster::post`], tried again while it fails on its way; `None` once `shutdown` comes.
    async fn post_with_retries(
        &self,
        correlated: &Correlated,
        reason: &str,
        shutdown: &CancellationToken,
    ) -> Option<Result<Option<Event>, kube::Error>> {
        for tries in 1.. {
            let posted = tokio::select! {
                _ = shutdown.cancelled() => return None,
                r = self.post(correlated.clone()) => r,
            };
            match posted {
                Err(err) if !matches!(err, kube::Error::Api(_)) && tries < MAX_TRIES => {
                    tracing::debug!(reason, error = %err, tries, "cannot post an event; trying again");
                    let wait = if tries == 1 { random_part(RETRY_AFTER) } else { RETRY_AFTER };
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                done => return Some(done),
            }
        }
        None
    }

    /// Creates or patches the event as correlated; what the apiserver answered, or `None` for an event skipped.
    async fn post(&self, correlated: Correlated) -> Result<Option<Event>, kube::Error> {
        let (mut event, patch) = match correlated {
            Correlated::Skip => return Ok(None),
            Correlated::Create(event) => (event, None),
            Correlated::Patch(event, patch) => (event, Some(patch)),
        };
        // Events have a limit of their own, as the kubelet's event client has, apart from kubeAPIQPS.
        if let Some(limit) = &self.limit {
            limit.acquire().await;
        }
        let namespace = event.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let api: Api<Event> = Api::namespaced(self.clients.main(), &namespace);
        let name = event.metadata.name.clone().unwrap_or_default();
        if let Some(patch) = patch {
            match api.patch(&name, &PatchParams::default(), &Patch::Strategic(patch)).await {
                Ok(answer) => return Ok(Some(answer)),
                // The event was removed (its TTL passed): it is made again, with its count.
                Err(kube::Error::Api(s)) if s.code == 404 => event.metadata.resource_version = None,
                Err(e) => return Err(e),
            }
        }
        api.create(&PostParams::default(), &event).await.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    use nodewarden_testapi::TestApi;
    use serde_json::Value;

    async fn recorder(
        api: &TestApi,
        dir: &std::path::Path,
        limit: Option<RateLimiter>,
    ) -> (Recorder, CancellationToken) {
        api.add_token("token-e1", Some("e1"));
        let kubeconfig = api.write_kubeconfig(dir, "token-e1").unwrap();
        let clients = Clients::from_kubeconfig(&kubeconfig, 50.0, 100, Duration::from_secs(5)).await.unwrap();
        let (recorder, poster) = Recorder::new("e1", clients, limit);
        let stop = CancellationToken::new();
        tokio::spawn(poster.run(stop.clone()));
        (recorder, stop)
    }

    fn with_reason(api: &TestApi, reason: &str) -> Vec<Value> {
        api.list("events", Some("default")).into_iter().filter(|e| e["reason"] == reason).collect()
    }

    async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_repeated_event_is_counted_on_one_object_and_made_again_if_it_was_removed() {
        let api = TestApi::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (events, stop) = recorder(&api, dir.path(), None).await;
        for _ in 0..3 {
            events.record("Warning", "ContainerGCFailed", "rpc error".into());
        }
        wait_for("one event counted 3 times", || {
            let found = with_reason(&api, "ContainerGCFailed");
            found.len() == 1 && found[0]["count"] == 3
        })
        .await;
        let found = with_reason(&api, "ContainerGCFailed");
        assert_ne!(found[0]["firstTimestamp"], Value::Null);
        let patches = api.requests().iter().filter(|r| r.method == "PATCH" && r.path.contains("/events/")).count();
        assert_eq!(patches, 2, "the repeats are patches of the first");
        // Removed meanwhile (an event's TTL): the next repeat makes it again, with its count.
        let name = found[0]["metadata"]["name"].as_str().unwrap().to_owned();
        api.delete("events", Some("default"), &name, None).unwrap();
        events.record("Warning", "ContainerGCFailed", "rpc error".into());
        wait_for("the event made again", || {
            with_reason(&api, "ContainerGCFailed").first().is_some_and(|e| e["count"] == 4)
        })
        .await;
        stop.cancel();
    }

    #[tokio::test]
    async fn events_are_posted_within_their_rate() {
        let api = TestApi::start(0).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (events, stop) = recorder(&api, dir.path(), Some(RateLimiter::new(1.0, 2))).await;
        let start = Instant::now();
        for i in 0..4 {
            events.record("Normal", &format!("Reason{i}"), "m".into());
        }
        wait_for("four events", || api.list("events", Some("default")).len() == 4).await;
        // Two at once, then one a second.
        assert!(start.elapsed() >= Duration::from_millis(1500), "posted in {:?}", start.elapsed());
        stop.cancel();
    }

    /// The times (since the start) of the requests of a fake apiserver whose n-th request (from 1) `answer`
    /// answers: `None` for a connection that fails, else (status, body).
    async fn posts(answer: fn(usize) -> Option<(u16, &'static str)>, events: usize, secs: u64) -> Vec<f64> {
        let log: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let seen = log.clone();
        let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            async move {
                let n = {
                    let mut l = seen.lock().unwrap();
                    l.push(Instant::now());
                    l.len()
                };
                let Some((code, body)) = answer(n) else {
                    return Err(std::io::Error::other("connection reset by peer"));
                };
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.as_bytes().to_vec()))
                    .map_err(std::io::Error::other)
            }
        });
        let client = kube::Client::new(service, "default");
        let clients = Clients::new(client.clone(), client, Arc::new(RateLimiter::new(100.0, 100)));
        let (recorder, poster) = Recorder::new("n1", clients, None);
        let stop = CancellationToken::new();
        let start = Instant::now();
        let task = tokio::spawn(poster.run(stop.clone()));
        for i in 0..events {
            recorder.record("Normal", &format!("Reason{i}"), "m".into());
        }
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.cancel();
        task.await.unwrap();
        log.lock().unwrap().iter().map(|t| (*t - start).as_secs_f64()).collect()
    }

    const CREATED: &str = r#"{"apiVersion":"v1","kind":"Event","metadata":{"name":"n1.1","namespace":"default","resourceVersion":"1"},"involvedObject":{},"count":1}"#;
    const FORBIDDEN: &str =
        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no","reason":"Forbidden","code":403}"#;

    #[tokio::test(start_paused = true)]
    async fn a_post_that_fails_on_its_way_is_tried_again_every_10_s_and_a_refused_one_is_not() {
        // Two connections fail, then the event is created.
        let times = posts(|n| (n > 2).then_some((201, CREATED)), 1, 60).await;
        assert_eq!(times.len(), 3, "{times:?}");
        assert!(times[1] - times[0] < 10.0 + 1e-6, "the first wait is a part of 10 s: {times:?}");
        assert!((times[2] - times[1] - 10.0).abs() < 0.01, "then 10 s: {times:?}");
        // An apiserver that stays away: 12 tries in all, then the next event.
        let times = posts(|_| None, 2, 300).await;
        assert_eq!(times.len(), 24, "{times:?}");
        // A refusal is the apiserver's answer: not tried again.
        let times = posts(|_| Some((403, FORBIDDEN)), 2, 60).await;
        assert_eq!(times.len(), 2, "{times:?}");
    }
}
