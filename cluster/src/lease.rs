//! The node Lease in `kube-node-lease`: got or created first (back-off 200 ms doubling to 7 s), then renewed
//! every quarter of its duration with 4 % jitter by a PUT of the last Lease returned (a 409 re-reads it), with
//! an owner reference to the Node once its UID is known.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use crate::Ctx;
use crate::backoff::{Backoff, jittered, retry_after};

/// The namespace of node Leases.
pub const NAMESPACE: &str = "kube-node-lease";
/// Renewals tried in a row before waiting for the back-off (the kubelet's `maxUpdateRetries`).
const MAX_UPDATE_RETRIES: usize = 5;

fn owner(node: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_owned(),
        uid: uid.to_owned(),
        ..OwnerReference::default()
    }
}

/// `lease` renewed now by `node` for `duration`, owned by the Node if its UID is known.
fn renewed(mut lease: Lease, node: &str, duration: Duration, node_uid: Option<&str>) -> Lease {
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_owned());
    spec.lease_duration_seconds = Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX));
    spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
    // Set once, while the Lease has no owner (as the kubelet does; another owner set meanwhile is kept).
    if let Some(uid) = node_uid
        && lease.metadata.owner_references.as_ref().is_none_or(Vec::is_empty)
    {
        lease.metadata.owner_references = Some(vec![owner(node, uid)]);
    }
    lease
}

fn new_lease(node: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            namespace: Some(NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec: None,
    }
}

/// Gets the Lease, creating it if missing.
async fn ensure(ctx: &Ctx, api: &Api<Lease>) -> Result<(Lease, bool), kube::Error> {
    let s = &ctx.settings;
    if let Some(l) = api.get_opt(&s.node_name).await? {
        return Ok((l, false));
    }
    let uid = ctx.status.node_uid();
    let lease = renewed(new_lease(&s.node_name), &s.node_name, s.lease_duration, uid.as_deref());
    Ok((api.create(&PostParams::default(), &lease).await?, true))
}

/// Renews `lease`, re-reading it on a conflict; up to [`MAX_UPDATE_RETRIES`] tries. Other errors end it.
async fn renew(ctx: &Ctx, api: &Api<Lease>, mut lease: Lease) -> Result<Lease, kube::Error> {
    let s = &ctx.settings;
    let mut tries = 0;
    loop {
        tries += 1;
        let uid = ctx.status.node_uid();
        let next = renewed(lease.clone(), &s.node_name, s.lease_duration, uid.as_deref());
        let error = match api.replace(&s.node_name, &PostParams::default(), &next).await {
            Ok(l) => return Ok(l),
            Err(kube::Error::Api(st)) if st.is_not_found() => {
                // A Lease gone is often its Node gone (the garbage collector follows the owner reference): the
                // status loop reads the Node before its next report.
                ctx.status.mark_stale();
                return ensure(ctx, api).await.map(|(l, _)| l);
            }
            Err(kube::Error::Api(st)) if st.is_conflict() => {
                lease = api.get(&s.node_name).await?;
                kube::Error::Api(st)
            }
            // Anything else (an answer past its deadline, a refused connection, a 5xx) goes to the caller at
            // once, which says so and backs off: retrying here held renewals for five deadlines without a word.
            Err(e) => return Err(e),
        };
        if tries >= MAX_UPDATE_RETRIES {
            return Err(error);
        }
    }
}

/// Keeps the Lease renewed until `shutdown`.
pub async fn run(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
    let mut lease: Option<Lease> = None;
    let mut failures = 0u32;
    let mut credentials = ctx.clients.replaced();
    loop {
        let api: Api<Lease> = Api::namespaced(ctx.clients.heartbeat(), NAMESPACE);
        let attempt = async {
            match lease.take() {
                Some(l) => renew(&ctx, &api, l).await,
                None => match ensure(&ctx, &api).await? {
                    (l, true) => Ok(l),
                    (l, false) => renew(&ctx, &api, l).await,
                },
            }
        };
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = attempt => r,
        };
        let wait = match result {
            Ok(l) => {
                if failures > 0 {
                    tracing::info!(failures, "node lease renewed again");
                }
                failures = 0;
                lease = Some(l);
                ctx.status.heartbeat_ok();
                backoff.reset();
                // A change while renewals succeed wakes nothing later.
                credentials.mark_unchanged();
                jittered(ctx.settings.renew_interval(), 0.04)
            }
            Err(e) => {
                failures += 1;
                let wait = backoff.fail().max(retry_after(&e).unwrap_or_default());
                tracing::warn!(error = %e, failures, retry_in = ?wait, "cannot renew the node lease");
                ctx.status.heartbeat_failed(format!("node lease: {e}"));
                wait
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            // New credentials after refusals (a renewed certificate): tried at once, not after the back-off.
            Ok(()) = credentials.changed(), if failures > 0 => backoff.reset(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::time::Instant;

    use crate::{Clients, ClusterSettings, ClusterStatus, FactSource, HostInfo, NodeFacts, RateLimiter, events};

    /// An apiserver in the test's own runtime (no sockets, so the paused clock is exact): each request is logged
    /// with the time it came, and `answer` gives (status, body) for the n-th request of its method.
    struct Apiserver {
        log: Mutex<Vec<(Instant, String)>>,
        answer: Box<Answer>,
    }

    /// (status, body) for the n-th request of a method.
    type Answer = dyn Fn(&str, usize) -> (u16, String) + Send + Sync;

    const LEASE: &str = r#"{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"n1","namespace":"kube-node-lease","resourceVersion":"7"},"spec":{"holderIdentity":"n1","leaseDurationSeconds":40}}"#;

    fn status(code: u16, reason: &str) -> (u16, String) {
        let body = format!(
            r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","message":"{reason}","reason":"{reason}","code":{code}}}"#
        );
        (code, body)
    }

    struct NoFacts;
    impl FactSource for NoFacts {
        fn facts(&self) -> NodeFacts {
            NodeFacts::default()
        }
    }

    /// Runs the Lease loop against `api` for `secs` of paused time; returns the requests as (seconds since the
    /// start, method).
    async fn heartbeats(api: Arc<Apiserver>, secs: u64) -> (Vec<(f64, String)>, Arc<ClusterStatus>) {
        let server = api.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let server = server.clone();
            async move {
                let method = req.method().as_str().to_owned();
                let n = {
                    let mut log = server.log.lock().unwrap();
                    log.push((Instant::now(), method.clone()));
                    log.iter().filter(|(_, m)| *m == method).count() - 1
                };
                let (code, body) = (server.answer)(&method, n);
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.into_bytes()))
            }
        });
        let client = kube::Client::new(service, "default");
        let clients = Clients::new(client.clone(), client, Arc::new(RateLimiter::new(100.0, 100)));
        let settings = ClusterSettings {
            node_name: "n1".into(),
            register_node: true,
            register_with_taints: Vec::new(),
            node_labels: Default::default(),
            provider_id: None,
            lease_duration: Duration::from_secs(40),
            status_update_frequency: Duration::from_secs(10),
            status_report_frequency: Duration::from_secs(300),
            daemon_port: 0,
            node_ip: None,
            max_images: None,
            event_qps: None,
            event_burst: 100,
        };
        let status = Arc::new(ClusterStatus::new(settings.lease_duration));
        let (events, _poster) = events::Recorder::new("n1", clients.clone(), None);
        let facts: Arc<dyn FactSource> = Arc::new(NoFacts);
        let ctx = Arc::new(Ctx { settings, clients, host: HostInfo::default(), facts, status: status.clone(), events });
        let start = Instant::now();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(ctx, shutdown.clone()));
        tokio::time::sleep(Duration::from_secs(secs)).await;
        shutdown.cancel();
        task.await.unwrap();
        let log = api.log.lock().unwrap().iter().map(|(t, m)| ((*t - start).as_secs_f64(), m.clone())).collect();
        (log, status)
    }

    fn gaps(times: &[f64]) -> Vec<f64> {
        times.windows(2).map(|w| ((w[1] - w[0]) * 1000.0).round() / 1000.0).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_is_renewed_every_quarter_of_its_duration_with_a_little_jitter() {
        let api = Arc::new(Apiserver { log: Mutex::default(), answer: Box::new(|_, _| (200, LEASE.into())) });
        let (log, _) = heartbeats(api, 61).await;
        assert_eq!(log[0], (0.0, "GET".to_owned()), "{log:?}");
        let puts: Vec<f64> = log.iter().filter(|(_, m)| m == "PUT").map(|(t, _)| *t).collect();
        assert_eq!(puts[0], 0.0, "the Lease that is there is renewed at once");
        assert!(puts.len() >= 6, "{log:?}");
        for gap in gaps(&puts) {
            assert!((10.0..=10.4).contains(&gap), "renewed {gap} s after the last: {log:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failed_renewals_back_off_from_200_ms_doubling_to_7_s() {
        // Ten failures (the apiserver answering 500), then it is back.
        let api = Arc::new(Apiserver {
            log: Mutex::default(),
            answer: Box::new(
                |m, n| if m == "GET" && n < 10 { status(500, "InternalError") } else { (200, LEASE.into()) },
            ),
        });
        let (log, _) = heartbeats(api, 60).await;
        let gets: Vec<f64> = log.iter().filter(|(_, m)| m == "GET").map(|(t, _)| *t).collect();
        assert_eq!(gaps(&gets[..11]), [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 7.0, 7.0, 7.0, 7.0], "{log:?}");
        // Back within one attempt: the renewal comes with the first answer, the next one a renew interval later.
        let puts: Vec<f64> = log.iter().filter(|(_, m)| m == "PUT").map(|(t, _)| *t).collect();
        assert_eq!(puts[0], gets[10], "{log:?}");
        assert!(puts.len() == 1 || (10.0..=10.4).contains(&(puts[1] - puts[0])), "{log:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_reads_the_lease_again_and_retries_at_once() {
        let api = Arc::new(Apiserver {
            log: Mutex::default(),
            answer: Box::new(|m, n| if m == "PUT" && n == 0 { status(409, "Conflict") } else { (200, LEASE.into()) }),
        });
        let (log, _) = heartbeats(api, 5).await;
        let methods: Vec<(f64, &str)> = log.iter().map(|(t, m)| (*t, m.as_str())).collect();
        assert_eq!(methods, [(0.0, "GET"), (0.0, "PUT"), (0.0, "GET"), (0.0, "PUT")]);
    }

    #[test]
    fn a_renewal_sets_holder_duration_time_and_owner_once() {
        let l = renewed(new_lease("n1"), "n1", Duration::from_secs(40), None);
        let spec = l.spec.clone().unwrap();
        assert_eq!((spec.holder_identity.as_deref(), spec.lease_duration_seconds), (Some("n1"), Some(40)));
        assert!(spec.renew_time.is_some());
        assert!(l.metadata.owner_references.is_none(), "no owner before the Node's UID is known");
        let l = renewed(l, "n1", Duration::from_secs(40), Some("u1"));
        let l = renewed(l, "n1", Duration::from_secs(40), Some("u1"));
        let owners = l.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!((owners[0].kind.as_str(), owners[0].uid.as_str()), ("Node", "u1"));
    }
}
