//! The node status loop: every `nodeStatusUpdateFrequency`, or at once when the daemon says a condition or
//! readiness changed, the status is built (from facts read on a blocking thread); it is patched (a strategic
//! merge patch of `nodes/<name>/status`, on the heartbeat client as the kubelet's) only when it differs from the
//! last one sent (compared at second precision, heartbeats left out) or `nodeStatusReportFrequency` has passed.
//! A transition's events are posted once its patch is accepted.
//!
//! What was sent is only known to be the apiserver's Node while requests succeed: after a failed heartbeat or
//! patch the Node is read first (the node lifecycle controller marks a quiet node `Unknown` and taints it
//! `unreachable`, and only a `Ready=True` from the node lifts that), its conditions give the transitions, and the
//! status is patched at once, as soon as a heartbeat is accepted again. Steady state adds no read.
//!
//! A Node deleted after registration is not registered again (an operator deletes a Node to fence or
//! decommission it; kubernetes #71398): the daemon says so in its log and `/readyz` and reports again only if
//! the Node comes back.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::conditions::{self, Transition};
use crate::{Ctx, NODE_DELETED, NodeFacts, node, register};

/// Patches tried in a row for one update (the kubelet's `nodeStatusUpdateRetry`).
const UPDATE_RETRIES: usize = 5;

/// The patch body for `status`: conditions merge by type, addresses are replaced whole.
fn patch_body(status: &NodeStatus) -> Value {
    let mut s = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Some(Value::Array(addresses)) = s.get_mut("addresses") {
        addresses.insert(0, json!({"$patch": "replace"}));
    }
    json!({"status": s})
}

/// What was last accepted.
struct Sent {
    comparable: Value,
    at: Instant,
    conditions: Vec<NodeCondition>,
}

impl Sent {
    /// The conditions the apiserver holds, as the last accepted: their transition times are kept, and a
    /// comparable that matches nothing built sends the next report.
    fn from_server(conditions: Option<Vec<NodeCondition>>) -> Sent {
        Sent { comparable: Value::Null, at: Instant::now(), conditions: conditions.unwrap_or_default() }
    }
}

/// The daemon's facts, read on a blocking thread: they may touch cgroupfs, and no async thread may wait on it.
pub async fn read_facts(ctx: &Ctx) -> NodeFacts {
    let source = ctx.facts.clone();
    match tokio::task::spawn_blocking(move || source.facts()).await {
        Ok(f) => f,
        Err(e) => {
            NodeFacts { not_ready: vec![format!("the node's facts could not be read: {e}")], ..NodeFacts::default() }
        }
    }
}

/// Posts the events of `transitions` (once the status that carries them was accepted).
fn post(ctx: &Ctx, transitions: Vec<Transition>) {
    let name = &ctx.settings.node_name;
    for t in transitions {
        tracing::info!(node = %name, event = t.event, "node condition changed");
        // As the kubelet's recordNodeStatusEvent words it: "Node n1 status is now: NodeReady".
        ctx.events.record("Normal", t.event, format!("Node {name} status is now: {}", t.event));
    }
}

/// Builds the status now, with the transitions since the last one sent and whether it must be sent.
async fn due(ctx: &Ctx, last: Option<&Sent>) -> (NodeStatus, Vec<Transition>, bool) {
    let facts = read_facts(ctx).await;
    let previous = last.map(|l| l.conditions.as_slice()).unwrap_or(&[]);
    let (conds, transitions) = conditions::build(&facts, previous, jiff::Timestamp::now());
    let status = node::status(&ctx.settings, &ctx.host, &facts, conds);
    let send = match last {
        None => true,
        Some(l) => l.comparable != node::comparable(&status) || l.at.elapsed() >= ctx.settings.status_report_frequency,
    };
    (status, transitions, send)
}

/// What the apiserver's Node now is, as the base of the next report: `Ok(None)` when the Node is gone.
async fn read_back(api: &Api<Node>, name: &str) -> Result<Option<Sent>, kube::Error> {
    let node = api.get_opt(name).await?;
    Ok(node.map(|n| Sent::from_server(n.status.and_then(|s| s.conditions))))
}

/// Records that the Node is gone (once in the log).
fn gone(ctx: &Ctx) {
    if ctx.status.set_deleted(true) {
        tracing::error!(node = %ctx.settings.node_name, "{NODE_DELETED}");
    }
}

/// Records that the Node is there (again).
fn present(ctx: &Ctx) {
    if ctx.status.set_deleted(false) {
        tracing::info!(node = %ctx.settings.node_name, "the Node is back in the apiserver; reporting its status again");
    }
}

/// Registers the Node, then keeps its status current until `shutdown`.
pub async fn run(ctx: Arc<Ctx>, mut changed: watch::Receiver<u64>, shutdown: CancellationToken) {
    ctx.events.record("Normal", "Starting", format!("Starting nodewarden {}.", env!("CARGO_PKG_VERSION")));
    let Some((registered, created)) = register::register(&ctx, &shutdown).await else { return };
    post(&ctx, created);
    let name = ctx.settings.node_name.clone();
    // The registered Node's conditions give the transition times to keep (a restart is not a transition).
    let mut last = registered.status.as_ref().map(|s| Sent::from_server(s.conditions.clone()));
    let mut tick = tokio::time::interval(ctx.settings.status_update_frequency);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut told = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            // A sender gone (the daemon stopping) leaves only the ticks.
            r = changed.changed(), if told => told = r.is_ok(),
            () = ctx.status.reconnected.notified() => {}
        }
        let api: Api<Node> = Api::all(ctx.clients.heartbeat());
        if ctx.status.take_stale() {
            let read = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = read_back(&api, &name) => r,
            };
            match read {
                Ok(Some(server)) => {
                    present(&ctx);
                    last = Some(server);
                }
                Ok(None) => {
                    gone(&ctx);
                    // Read again next time: an operator may make the Node again.
                    ctx.status.mark_stale();
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the Node back after a failed request");
                    ctx.status.mark_stale();
                    continue;
                }
            }
        }
        let (status, transitions, send) = due(&ctx, last.as_ref()).await;
        if !send {
            continue;
        }
        let body = patch_body(&status);
        let (params, patch) = (PatchParams::default(), Patch::Strategic(&body));
        let mut accepted = false;
        for attempt in 1..=UPDATE_RETRIES {
            let r = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = api.patch_status(&name, &params, &patch) => r,
            };
            match r {
                Ok(_) => {
                    present(&ctx);
                    accepted = true;
                    break;
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {
                    gone(&ctx);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "cannot update the node status");
                    if let Some(wait) = crate::backoff::retry_after(&e).filter(|_| attempt < UPDATE_RETRIES) {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            }
        }
        if !accepted {
            ctx.status.mark_stale();
            continue;
        }
        post(&ctx, transitions);
        last = Some(Sent {
            comparable: node::comparable(&status),
            at: Instant::now(),
            conditions: status.conditions.clone().unwrap_or_default(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeAddress;

    #[test]
    fn addresses_are_replaced_whole_and_conditions_merge() {
        let s = NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "Hostname".into(), address: "h".into() }]),
            ..NodeStatus::default()
        };
        let b = patch_body(&s);
        assert_eq!(b["status"]["addresses"][0], json!({"$patch": "replace"}));
        assert_eq!(b["status"]["addresses"][1]["address"], "h");
    }
}
