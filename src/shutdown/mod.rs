//! Graceful node shutdown, as the kubelet's: with a shutdown period configured, the daemon takes a logind delay
//! lock at start; when logind announces a shutdown (`PrepareForShutdown`), the node reports it is shutting down,
//! the pods are terminated group by group in ascending priority, each group within its share of the period (a
//! pod's own grace period if shorter), critical pods last; they end `Failed` with the kubelet's reason and
//! message; then the lock is released and the shutdown goes on. A cancelled shutdown takes the lock again. A
//! daemon that starts while a shutdown is under way terminates its pods at once; a lost connection to the system
//! bus is made again every second.

mod logind;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use nodewarden_sync::RunningPod;
use tokio_util::sync::CancellationToken;

use nodewarden_resources::Ledger;
use nodewarden_runtime::SelectedRuntime;
use nodewarden_sync::PodManager;

use crate::health::NodeShutdown;

/// What a node shutdown changes: the ledger admits no more pods, the pods are terminated, and the node says so.
pub struct Node {
    /// Refuses new pods while the node shuts down.
    pub ledger: Ledger,
    /// Terminates the pods.
    pub pods: Arc<PodManager<SelectedRuntime>>,
    /// What `/readyz` and the Node's `Ready` say.
    pub shutting_down: NodeShutdown,
}
use logind::Logind;

/// How long past its share a group may take (the kill and the clean-up that follow the grace period).
const GROUP_SLACK: Duration = Duration::from_secs(1);

/// The pods of one group, each with the grace period it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Step {
    /// The group's lowest priority.
    priority: i32,
    /// The group's share of the shutdown.
    grace: Duration,
    pods: Vec<(RunningPod, Duration)>,
}

/// The pods in their groups, in the order they are terminated: a pod belongs to the group with the highest
/// priority at or below its own (the first group if none is), and gets its own grace period if shorter than its
/// group's share. Groups without pods are left out.
fn plan(pods: Vec<RunningPod>, groups: &[(i32, Duration)]) -> Vec<Step> {
    let mut steps: Vec<Step> =
        groups.iter().map(|&(priority, grace)| Step { priority, grace, pods: Vec::new() }).collect();
    for pod in pods {
        let Some(i) = groups.iter().rposition(|(p, _)| *p <= pod.priority).or((!groups.is_empty()).then_some(0)) else {
            continue;
        };
        let grace = pod.grace.min(steps[i].grace);
        steps[i].pods.push((pod, grace));
    }
    for s in &mut steps {
        s.pods.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    }
    steps.retain(|s| !s.pods.is_empty());
    steps
}

/// How long to wait before connecting to logind again after the connection was lost (the kubelet's
/// `dbusReconnectPeriod`).
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// How long a shutdown that finds the pod sources not yet synced (a daemon started meanwhile) waits for them.
const SYNC_WAIT: Duration = Duration::from_secs(5);

/// Runs the node's graceful shutdown until `cancel`: takes the delay lock and handles `PrepareForShutdown`. When
/// logind cannot be reached, or the connection to the system bus is lost (a D-Bus restart), it connects again
/// every second, as the kubelet does; a node shutdown meanwhile does not wait for the pods.
pub async fn run(node: Node, groups: Vec<(i32, Duration)>, cancel: CancellationToken) {
    // Each group ends a little after its share (the kill and clean-up after the grace period): logind is asked
    // to wait a second more per group, so it never cuts the last (critical) group short.
    let total: Duration =
        groups.iter().map(|g| g.1).sum::<Duration>() + GROUP_SLACK * u32::try_from(groups.len()).unwrap_or(u32::MAX);
    // The lock is logind's, not the bus connection's: it holds across a reconnect.
    let mut lock = None;
    let mut failures = 0u32;
    loop {
        let lost = match Logind::connect().await {
            Ok(logind) => match watch(&node, &groups, total, &logind, &mut lock, &mut failures, &cancel).await {
                Some(lost) => lost,
                None => return,
            },
            Err(e) => format!("logind does not answer on the system bus: {e}"),
        };
        // Said once at warning level; while it stays so, the retries are quiet.
        if failures == 0 {
            tracing::warn!(reason = %lost, "graceful node shutdown is off until logind can be reached again");
        } else {
            tracing::debug!(reason = %lost, attempt = failures, "logind still cannot be reached");
        }
        failures = failures.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(RECONNECT_AFTER) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// Watches one connection to logind until `cancel` (`None`) or until the connection is lost (why). The signals
/// are subscribed to before the lock is taken, so no announcement between the two is missed; the lock is taken
/// before anything slower; logind's `PreparingForShutdown` says what happened while the daemon was not
/// listening (it started during a shutdown, or a cancel came while the bus was away).
async fn watch(
    node: &Node,
    groups: &[(i32, Duration)],
    total: Duration,
    logind: &Logind,
    lock: &mut Option<zbus::zvariant::OwnedFd>,
    failures: &mut u32,
    cancel: &CancellationToken,
) -> Option<String> {
    let mut signals = match logind.shutdown_signals().await {
        Ok(s) => s,
        Err(e) => return Some(format!("cannot watch logind's signals: {e}")),
    };
    if *failures > 0 {
        tracing::info!("logind answers again; graceful node shutdown is on");
    }
    *failures = 0;
    let shutting_down = node.shutting_down.get();
    let mut pending = match logind.preparing_for_shutdown().await {
        Ok(true) if !shutting_down => {
            tracing::warn!("logind is already shutting the node down");
            Some(true)
        }
        Ok(false) if shutting_down => Some(false),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read logind's PreparingForShutdown");
            None
        }
    };
    if lock.is_none() && !shutting_down {
        *lock = take_lock(logind).await;
    }
    if pending.is_none() {
        check_inhibit_delay(logind, total).await;
    }
    loop {
        let start = match pending.take() {
            Some(start) => start,
            None => {
                let signal = tokio::select! {
                    s = signals.next() => s,
                    () = cancel.cancelled() => return None,
                };
                let Some(start) = signal else { return Some("logind's signals ended".to_owned()) };
                start
            }
        };
        if start {
            if node.shutting_down.get() {
                continue; // announced again: the pods are terminated already
            }
            tracing::warn!(period = ?total, "the node is shutting down; terminating the pods in priority order");
            // Admission first: once /readyz says so, no new pod gets in.
            if let Err(e) = node.ledger.call(|m| m.set_shutting_down(true)).await {
                tracing::warn!(error = %e, "cannot stop admitting pods");
            }
            node.shutting_down.set(true);
            // A daemon that has just started knows its pods once their source's first snapshot is applied (for a
            // few seconds at most: a source that cannot be listed must not hold the running pods up).
            let synced = tokio::time::Instant::now() + SYNC_WAIT;
            while node.pods.synced().is_err() && tokio::time::Instant::now() < synced {
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = cancel.cancelled() => return None,
                }
            }
            terminate_in_order(node, groups).await;
            drop(lock.take());
            tracing::info!("the pods are terminated; released the shutdown delay lock");
        } else {
            tracing::info!("the node's shutdown was cancelled");
            node.shutting_down.set(false);
            if let Err(e) = node.ledger.call(|m| m.set_shutting_down(false)).await {
                tracing::warn!(error = %e, "cannot admit pods again");
            }
            if lock.is_none() {
                *lock = take_lock(logind).await;
            }
        }
    }
}

async fn take_lock(logind: &Logind) -> Option<zbus::zvariant::OwnedFd> {
    match logind.delay_shutdown().await {
        Ok(fd) => {
            tracing::info!("took logind's delay lock on shutdown");
            Some(fd)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot take logind's delay lock: a shutdown will not wait for the pods");
            None
        }
    }
}

/// Makes sure logind waits the whole shutdown period for the lock: a shorter `InhibitDelayMaxSec` is raised
/// with a drop-in, as the kubelet does; if logind keeps the shorter one, the pods get only that.
async fn check_inhibit_delay(logind: &Logind, total: Duration) {
    let max = match logind.inhibit_delay_max().await {
        Ok(m) => m,
        Err(e) => return tracing::warn!(error = %e, "cannot read logind's InhibitDelayMaxUSec"),
    };
    if max >= total {
        return;
    }
    tracing::info!(current = ?max, wanted = ?total, drop_in = logind::LOGIND_DROP_IN, "raising logind's InhibitDelayMaxSec");
    if let Err(e) = logind.raise_inhibit_delay(total).await {
        tracing::warn!(error = %e, "cannot raise logind's InhibitDelayMaxSec");
    }
    // logind reads its configuration again after the signal, soon but not at once.
    let mut now = max;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = logind.inhibit_delay_max().await.unwrap_or(now);
        if now >= total {
            return;
        }
    }
    tracing::warn!(inhibit_delay_max = ?now, shutdown_grace_period = ?total, "logind waits less than the shutdown period for the pods");
}

/// Terminates the pods group by group, each group within its share.
async fn terminate_in_order(node: &Node, groups: &[(i32, Duration)]) {
    for step in plan(node.pods.running_pods(), groups) {
        let names: Vec<&str> = step.pods.iter().map(|(p, _)| p.name.as_str()).collect();
        tracing::info!(priority = step.priority, share = ?step.grace, pods = ?names, "terminating a shutdown group");
        let started = tokio::time::Instant::now();
        let mut waits = Vec::new();
        for (pod, grace) in &step.pods {
            match node.pods.shut_down(&pod.uid, *grace) {
                Ok(e) => waits.push(e.terminated),
                Err(e) => tracing::warn!(pod = %pod.name, error = %e, "cannot terminate a pod for the shutdown"),
            }
        }
        let all = futures_util::future::join_all(waits);
        if tokio::time::timeout(step.grace + GROUP_SLACK, all).await.is_err() {
            tracing::warn!(priority = step.priority, "pods still terminating after their group's share; going on");
        }
        tracing::info!(priority = step.priority, took = ?started.elapsed(), "shutdown group terminated");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32, grace: u64) -> RunningPod {
        RunningPod { uid: name.into(), name: format!("default/{name}"), priority, grace: Duration::from_secs(grace) }
    }

    #[test]
    fn pods_are_grouped_by_priority_and_get_the_shorter_grace() {
        let s = Duration::from_secs;
        let groups = [(0, s(20)), (100_000, s(5)), (2_000_000_000, s(10))];
        let pods =
            vec![pod("critical", 2_000_001_000, 30), pod("low", -5, 60), pod("quick", 10, 2), pod("high", 100_000, 30)];
        let steps = plan(pods, &groups);
        let got: Vec<(i32, Vec<(&str, Duration)>)> =
            steps.iter().map(|st| (st.priority, st.pods.iter().map(|(p, g)| (p.uid.as_str(), *g)).collect())).collect();
        assert_eq!(
            got,
            [
                (0, vec![("low", s(20)), ("quick", s(2))]),
                (100_000, vec![("high", s(5))]),
                (2_000_000_000, vec![("critical", s(10))]),
            ]
        );
        // A group without pods is skipped; without groups nothing is planned.
        assert_eq!(plan(vec![pod("a", 1, 30)], &groups).len(), 1);
        assert!(plan(vec![pod("a", 1, 30)], &[]).is_empty());
    }
}
