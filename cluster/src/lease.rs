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
use crate::backoff::{Backoff, jittered};

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

/// Renews `lease`, re-reading it on a conflict; up to [`MAX_UPDATE_RETRIES`] tries.
async fn renew(ctx: &Ctx, api: &Api<Lease>, mut lease: Lease) -> Result<Lease, kube::Error> {
    let s = &ctx.settings;
    let mut tries = 0;
    loop {
        tries += 1;
        let uid = ctx.status.node_uid();
        let next = renewed(lease.clone(), &s.node_name, s.lease_duration, uid.as_deref());
        let error = match api.replace(&s.node_name, &PostParams::default(), &next).await {
            Ok(l) => return Ok(l),
            Err(kube::Error::Api(st)) if st.is_not_found() => return ensure(ctx, api).await.map(|(l, _)| l),
            Err(kube::Error::Api(st)) if st.is_conflict() => {
                lease = api.get(&s.node_name).await?;
                kube::Error::Api(st)
            }
            Err(e) => e,
        };
        if tries >= MAX_UPDATE_RETRIES {
            return Err(error);
        }
    }
}

/// Keeps the Lease renewed until `shutdown`.
pub async fn run(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    let api: Api<Lease> = Api::namespaced(ctx.clients.heartbeat.clone(), NAMESPACE);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(7));
    let mut lease: Option<Lease> = None;
    let mut failures = 0u32;
    loop {
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
                jittered(ctx.settings.renew_interval(), 0.04)
            }
            Err(e) => {
                failures += 1;
                let wait = backoff.fail();
                tracing::warn!(error = %e, failures, retry_in = ?wait, "cannot renew the node lease");
                ctx.status.heartbeat_failed(format!("node lease: {e}"));
                wait
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
