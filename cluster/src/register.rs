//! Registration: create the Node, or on AlreadyExists take the existing one and set its default labels again
//! (taints and other labels are left alone); retried with the kubelet's back-off (100 ms doubling to 7 s)
//! forever. A Node whose boot ID differs from this boot's posts the `Rebooted` warning.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::conditions::Transition;
use crate::{Ctx, conditions, node};

/// The Node as first registered, with the status built from the facts now, and the transitions from Unknown
/// that its conditions are.
async fn build(ctx: &Ctx) -> (Node, Vec<Transition>) {
    let facts = crate::status::read_facts(ctx).await;
    let (conds, transitions) = conditions::build(&facts, &[], jiff::Timestamp::now());
    (node::initial(&ctx.settings, &ctx.host, node::status(&ctx.settings, &ctx.host, &facts, conds)), transitions)
}

/// One try: the Node as the apiserver has it afterwards, with the transitions to post when it was created.
async fn try_register(ctx: &Ctx, api: &Api<Node>, rebooted: &mut bool) -> Result<(Node, Vec<Transition>), kube::Error> {
    let name = &ctx.settings.node_name;
    let mut refused = None;
    if ctx.settings.register_node {
        ctx.clients.limiter.acquire().await;
        let (node, transitions) = build(ctx).await;
        match api.create(&PostParams::default(), &node).await {
            Ok(n) => {
                tracing::info!(node = %name, "node registered");
                return Ok((n, transitions));
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            // As kubelets since 1.32: a policy that forbids creating Nodes (pre-provisioned ones) may still let
            // this one be read; if it is not there, the refusal is the error.
            Err(kube::Error::Api(s)) if s.is_forbidden() => refused = Some(kube::Error::Api(s)),
            Err(e) => return Err(e),
        }
    }
    ctx.clients.limiter.acquire().await;
    let existing = match refused {
        None => api.get(name).await?,
        Some(refusal) => api.get_opt(name).await?.ok_or(refusal)?,
    };
    let old_boot = existing.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| i.boot_id.clone());
    if let Some(old) = old_boot.filter(|b| !b.is_empty() && *b != ctx.host.boot_id && !*rebooted) {
        *rebooted = true;
        tracing::info!(node = %name, old_boot_id = %old, boot_id = %ctx.host.boot_id, "the node was rebooted");
        ctx.events.record(
            "Warning",
            "Rebooted",
            format!("Node {name} has been rebooted, boot id: {}", ctx.host.boot_id),
        );
    }
    let drift = node::drifted_labels(&existing, &ctx.host.hostname);
    if drift.is_empty() {
        tracing::info!(node = %name, "node already registered");
        return Ok((existing, Vec::new()));
    }
    tracing::info!(node = %name, labels = ?drift, "node already registered; setting its default labels again");
    ctx.clients.limiter.acquire().await;
    let patch = json!({"metadata": {"labels": drift}});
    Ok((api.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch)).await?, Vec::new()))
}

/// Registers (or finds) the Node, retrying until it succeeds; `None` on shutdown. A Node created now comes with
/// the transitions of its first conditions (from Unknown), whose events are the caller's to post.
pub async fn register(ctx: &Ctx, shutdown: &CancellationToken) -> Option<(Node, Vec<Transition>)> {
    let api: Api<Node> = Api::all(ctx.clients.main());
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(7));
    let mut rebooted = false;
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = try_register(ctx, &api, &mut rebooted) => r,
        };
        match result {
            Ok((n, transitions)) => {
                ctx.status.registered(n.metadata.uid.clone());
                return Some((n, transitions));
            }
            Err(e) => {
                let wait = backoff.fail();
                tracing::warn!(error = %e, retry_in = ?wait, "cannot register the node");
                ctx.status.register_failed(format!("registration: {e}"));
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}
