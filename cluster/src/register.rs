//! Registration: create the Node, or on AlreadyExists take the existing one and set its default labels again
//! (taints and other labels are left alone); retried with the kubelet's back-off (100 ms doubling to 7 s)
//! forever. A Node whose boot ID differs from this boot's posts the `Rebooted` warning.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::{Ctx, conditions, node};

/// The Node as first registered, with the status built from the facts now.
fn build(ctx: &Ctx) -> Node {
    let facts = ctx.facts.facts();
    let (conds, _) = conditions::build(&facts, &[], jiff::Timestamp::now());
    node::initial(&ctx.settings, &ctx.host, node::status(&ctx.settings, &ctx.host, &facts, conds))
}

/// One try: the Node as the apiserver has it afterwards.
async fn try_register(ctx: &Ctx, api: &Api<Node>) -> Result<Node, kube::Error> {
    let name = &ctx.settings.node_name;
    if ctx.settings.register_node {
        ctx.clients.limiter.acquire().await;
        match api.create(&PostParams::default(), &build(ctx)).await {
            Ok(n) => {
                tracing::info!(node = %name, "node registered");
                return Ok(n);
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e),
        }
    }
    ctx.clients.limiter.acquire().await;
    let existing = api.get(name).await?;
    let old_boot = existing.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| i.boot_id.clone());
    if let Some(old) = old_boot.filter(|b| !b.is_empty() && *b != ctx.host.boot_id) {
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
        return Ok(existing);
    }
    tracing::info!(node = %name, labels = ?drift, "node already registered; setting its default labels again");
    ctx.clients.limiter.acquire().await;
    api.patch_status(name, &PatchParams::default(), &Patch::Strategic(json!({"metadata": {"labels": drift}}))).await
}

/// Registers (or finds) the Node, retrying until it succeeds; `None` on shutdown.
pub async fn register(ctx: &Ctx, shutdown: &CancellationToken) -> Option<Node> {
    let api: Api<Node> = Api::all(ctx.clients.main.clone());
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(7));
    loop {
        let result = tokio::select! {
            _ = shutdown.cancelled() => return None,
            r = try_register(ctx, &api) => r,
        };
        match result {
            Ok(n) => {
                if let Some(uid) = &n.metadata.uid {
                    ctx.status.node_uid.send_replace(Some(uid.clone()));
                }
                return Some(n);
            }
            Err(e) => {
                let wait = backoff.fail();
                tracing::warn!(error = %e, retry_in = ?wait, "cannot register the node");
                ctx.status.failed(format!("registration: {e}"));
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}
