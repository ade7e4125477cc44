//! Dead containers: an exited container is kept (for `crictl ps -a`, its writable layer, its exit in
//! `lastState`) and removed under the kubelet's container garbage collection policy: its minimum age
//! (`--minimum-container-ttl-duration`), how many dead containers each container of a pod keeps
//! (`--maximum-dead-containers-per-container`, the newest) and how many the node keeps
//! (`--maximum-dead-containers`). A pod's dead containers go with the pod's end. As the kubelet's, ages and order
//! count from each container's creation (its run's start), not its exit.
//!
//! A pod that ended on its own and is still listed keeps its dead containers (and its sandbox, stopped) until it is
//! deleted, or disk pressure reclaims them (the kubelet's `DeleteAllUnusedContainers`): such pods are noted here
//! once their clean-up is done, so that a reclaim never takes a pod whose sidecars are still being stopped.
//!
//! The policy is applied when a container dies and on every tick of the pod manager (for the ones that were too
//! young), in the order the kubelet's `evictContainers` applies it: only containers past the minimum age count;
//! each container keeps its newest up to its limit; over the node's limit, each container's share is that limit
//! divided among the containers (at least one), then the oldest on the node go.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use nodewarden_runtime::ContainerId;

/// The container garbage collection policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadContainerPolicy {
    /// A dead container created less than this ago is kept, whatever the limits (counted from its creation, as
    /// the kubelet counts).
    pub min_age: Duration,
    /// Dead containers kept per container of a pod, the newest; `None`: no limit.
    pub max_per_container: Option<usize>,
    /// Dead containers kept on the node; `None`: no limit.
    pub max_containers: Option<usize>,
}

impl Default for DeadContainerPolicy {
    /// The kubelet's defaults: any age, one per container, no node-wide limit.
    fn default() -> Self {
        Self { min_age: Duration::ZERO, max_per_container: Some(1), max_containers: None }
    }
}

/// One dead container.
#[derive(Debug, Clone)]
struct Dead {
    id: ContainerId,
    created: Instant,
}

/// The node's dead containers by pod UID and container name, oldest first.
#[derive(Debug, Default)]
pub(crate) struct DeadContainers {
    policy: DeadContainerPolicy,
    units: Mutex<BTreeMap<(String, String), Vec<Dead>>>,
    /// The pods over and cleaned up whose sandbox and dead containers are kept, by UID.
    over: Mutex<BTreeSet<String>>,
}

impl DeadContainers {
    /// No dead container yet, under `policy`.
    pub(crate) fn new(policy: DeadContainerPolicy) -> Self {
        Self { policy, units: Mutex::default(), over: Mutex::default() }
    }

    fn units(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), Vec<Dead>>> {
        self.units.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Container `id`, container `name` of pod `uid`, created at `created`, died: returns the dead containers to
    /// remove `now`.
    pub(crate) fn died(
        &self,
        uid: &str,
        name: &str,
        id: ContainerId,
        created: Instant,
        now: Instant,
    ) -> Vec<ContainerId> {
        let mut units = self.units();
        units.entry((uid.to_owned(), name.to_owned())).or_default().push(Dead { id, created });
        evict(&mut units, &self.policy, now)
    }

    /// How many dead containers container `name` of pod `uid` keeps now.
    pub(crate) fn kept(&self, uid: &str, name: &str) -> usize {
        self.units().get(&(uid.to_owned(), name.to_owned())).map_or(0, Vec::len)
    }

    /// Pod `uid` has ended: every dead container of it, to remove.
    pub(crate) fn pod_gone(&self, uid: &str) -> Vec<ContainerId> {
        self.over.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
        let mut units = self.units();
        let keys: Vec<_> = units.keys().filter(|(u, _)| u == uid).cloned().collect();
        keys.into_iter().flat_map(|k| units.remove(&k).unwrap_or_default()).map(|d| d.id).collect()
    }

    /// Pod `uid` ended on its own and is cleaned up: it keeps its dead containers and its sandbox until it is
    /// deleted or [`DeadContainers::reclaim_over`] takes them.
    pub(crate) fn pod_over(&self, uid: &str) {
        self.over.lock().unwrap_or_else(PoisonError::into_inner).insert(uid.to_owned());
    }

    /// Disk pressure: every pod noted by [`DeadContainers::pod_over`], each with its dead containers, to remove
    /// with its sandboxes.
    pub(crate) fn reclaim_over(&self) -> Vec<(String, Vec<ContainerId>)> {
        let pods = std::mem::take(&mut *self.over.lock().unwrap_or_else(PoisonError::into_inner));
        pods.into_iter().map(|uid| (uid.clone(), self.pod_gone(&uid))).collect()
    }

    /// The dead containers the policy no longer keeps at `now` (those that were too young before).
    pub(crate) fn collect(&self, now: Instant) -> Vec<ContainerId> {
        evict(&mut self.units(), &self.policy, now)
    }

    /// How many dead containers are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.units().values().map(Vec::len).sum()
    }
}

/// Applies `policy` at `now`; returns what it removed from `units`.
fn evict(
    units: &mut BTreeMap<(String, String), Vec<Dead>>,
    policy: &DeadContainerPolicy,
    now: Instant,
) -> Vec<ContainerId> {
    let old_enough = |d: &Dead| now.saturating_duration_since(d.created) >= policy.min_age;
    let mut out = Vec::new();
    // Per container: the oldest of those old enough go beyond `keep`.
    let trim = |units: &mut BTreeMap<(String, String), Vec<Dead>>, keep: usize, out: &mut Vec<ContainerId>| {
        for unit in units.values_mut() {
            let evictable = unit.iter().filter(|d| old_enough(d)).count();
            let mut over = evictable.saturating_sub(keep);
            unit.retain(|d| {
                let go = over > 0 && old_enough(d);
                if go {
                    over -= 1;
                    out.push(d.id.clone());
                }
                !go
            });
        }
        units.retain(|_, u| !u.is_empty());
    };
    if let Some(keep) = policy.max_per_container {
        trim(units, keep, &mut out);
    }
    if let Some(max) = policy.max_containers {
        let evictable = |units: &BTreeMap<_, Vec<Dead>>| units.values().flatten().filter(|d| old_enough(d)).count();
        let with_some = units.values().filter(|u| u.iter().any(old_enough)).count();
        if evictable(units) > max && with_some > 0 {
            trim(units, (max / with_some).max(1), &mut out);
        }
        let over = evictable(units).saturating_sub(max);
        if over > 0 {
            // The oldest on the node go.
            let mut all: Vec<(Instant, ContainerId)> =
                units.values().flatten().filter(|d| old_enough(d)).map(|d| (d.created, d.id.clone())).collect();
            all.sort_by_key(|(created, _)| *created);
            let gone: Vec<ContainerId> = all.into_iter().take(over).map(|(_, id)| id).collect();
            for unit in units.values_mut() {
                unit.retain(|d| !gone.contains(&d.id));
            }
            units.retain(|_, u| !u.is_empty());
            out.extend(gone);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ContainerId {
        ContainerId::new(s.to_owned())
    }

    fn ids(v: &[&str]) -> Vec<ContainerId> {
        v.iter().map(|s| id(s)).collect()
    }

    #[test]
    fn by_default_each_container_keeps_its_newest_dead_one() {
        let dead = DeadContainers::new(DeadContainerPolicy::default());
        let t = Instant::now();
        assert!(dead.died("u1", "app", id("a1"), t, t).is_empty(), "the first dead one is kept");
        assert!(dead.died("u1", "side", id("s1"), t, t).is_empty(), "each container has its own");
        assert!(dead.died("u2", "app", id("b1"), t, t).is_empty(), "and each pod");
        assert_eq!(dead.died("u1", "app", id("a2"), t, t), ids(&["a1"]), "the older goes");
        assert_eq!(dead.died("u1", "app", id("a3"), t, t), ids(&["a2"]));
        assert_eq!(dead.len(), 3);
        assert_eq!((dead.kept("u1", "app"), dead.kept("u1", "nope")), (1, 0));
        let mut gone = dead.pod_gone("u1");
        gone.sort();
        assert_eq!(gone, ids(&["a3", "s1"]), "a pod's end takes all of its own");
        assert_eq!(dead.len(), 1);
        assert!(dead.pod_gone("u1").is_empty());
    }

    #[test]
    fn a_reclaim_takes_the_pods_over_and_only_those() {
        let dead = DeadContainers::new(DeadContainerPolicy::default());
        let t = Instant::now();
        for (uid, c) in [("over", "o1"), ("running", "r1"), ("ending", "e1")] {
            assert!(dead.died(uid, "app", id(c), t, t).is_empty());
        }
        // `ending` is over by its phase but its clean-up (its sidecars' grace) is not done: not noted yet.
        dead.pod_over("over");
        dead.pod_over("bare");
        assert_eq!(
            dead.reclaim_over(),
            [("bare".to_owned(), vec![]), ("over".to_owned(), ids(&["o1"]))],
            "a pod over whose dead containers are gone still has its sandbox to remove"
        );
        assert!(dead.reclaim_over().is_empty(), "each once");
        assert_eq!((dead.kept("running", "app"), dead.kept("ending", "app")), (1, 1));
        dead.pod_over("running");
        assert_eq!(dead.pod_gone("running"), ids(&["r1"]));
        assert!(dead.reclaim_over().is_empty(), "a deletion takes the note too");
    }

    #[test]
    fn a_dead_container_younger_than_the_minimum_age_is_kept_until_it_is_old_enough() {
        let policy = DeadContainerPolicy { min_age: Duration::from_secs(60), ..DeadContainerPolicy::default() };
        let dead = DeadContainers::new(policy);
        let t = Instant::now();
        assert!(dead.died("u", "app", id("c1"), t, t).is_empty());
        let (c2, later) = (t + Duration::from_secs(30), t + Duration::from_secs(30));
        assert!(dead.died("u", "app", id("c2"), c2, later).is_empty(), "c1 was created only 30 s ago");
        // c1 reaches its minimum age; c2 is not counted yet, so c1 is the only evictable one, and kept.
        assert!(dead.collect(t + Duration::from_secs(60)).is_empty());
        assert_eq!(dead.collect(t + Duration::from_secs(90)), ids(&["c1"]), "both old enough: the newest stays");
        assert_eq!(dead.len(), 1);
    }

    #[test]
    fn the_minimum_age_counts_from_the_creation_not_the_exit() {
        let policy =
            DeadContainerPolicy { min_age: Duration::from_secs(60), max_per_container: Some(0), max_containers: None };
        let dead = DeadContainers::new(policy);
        let t = Instant::now();
        // Created at t, it ran 50 s: 10 s after its exit it is old enough, as the kubelet counts.
        assert!(dead.died("u", "app", id("c1"), t, t + Duration::from_secs(50)).is_empty());
        assert!(dead.collect(t + Duration::from_secs(59)).is_empty());
        assert_eq!(dead.collect(t + Duration::from_secs(60)), ids(&["c1"]));
    }

    #[test]
    fn no_limit_per_container_keeps_every_one_and_zero_keeps_none() {
        let t = Instant::now();
        let all = DeadContainers::new(DeadContainerPolicy { max_per_container: None, ..Default::default() });
        for i in 0..5 {
            assert!(all.died("u", "app", id(&format!("c{i}")), t, t).is_empty());
        }
        assert_eq!(all.len(), 5);
        let none = DeadContainers::new(DeadContainerPolicy { max_per_container: Some(0), ..Default::default() });
        assert_eq!(none.died("u", "app", id("c0"), t, t), ids(&["c0"]));
        assert_eq!(none.len(), 0);
    }

    #[test]
    fn over_the_node_limit_each_container_gets_a_share_then_the_oldest_on_the_node_go() {
        let t = Instant::now();
        let at = |s: u64| t + Duration::from_secs(s);
        let policy = DeadContainerPolicy { min_age: Duration::ZERO, max_per_container: None, max_containers: Some(3) };
        let dead = DeadContainers::new(policy);
        for (i, s) in [0, 1, 2].into_iter().enumerate() {
            assert!(dead.died("u1", "app", id(&format!("a{i}")), at(s), at(s)).is_empty());
        }
        // Four over a limit of three, two containers: each keeps its share, 3 / 2 = 1 (the newest).
        assert_eq!(dead.died("u2", "app", id("b0"), at(3), at(3)), ids(&["a0", "a1"]));
        assert_eq!(dead.len(), 2);
        let dead = DeadContainers::new(policy);
        // Four containers with one dead each, limit three: a share of at least one each, then the oldest goes.
        for (i, s) in [5, 1, 7, 3].into_iter().enumerate() {
            let _ = dead.died(&format!("u{i}"), "app", id(&format!("c{i}")), at(s), at(s));
        }
        assert_eq!(dead.len(), 3);
        assert_eq!(dead.pod_gone("u1"), Vec::<ContainerId>::new(), "c1 died first and went");
    }
}
