//! The node lifecycle controller of the controller manager, as far as a kubelet can see it: a Node whose Lease and
//! Ready heartbeat are both older than the node monitor grace period gets its kubelet-owned conditions set to
//! `Unknown` and its pods marked not ready; every pass keeps the node's taints in line with its conditions (the
//! `not-ready` / `unreachable` taints with both effects, the pressure taints with `NoSchedule`), so the
//! `unreachable` taints go only once the kubelet posts `Ready=True` again. Reasons, messages and taint keys are
//! the real controller's.

use std::time::Duration;

use serde_json::{Value, json};

use crate::route::Resource;
use crate::store::{self, Store};

/// The controller manager's `--node-monitor-grace-period` default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(50);
/// How often it looks (`--node-monitor-period`).
pub const PERIOD: Duration = Duration::from_secs(5);

/// The conditions the kubelet owns, which the controller sets to Unknown when the kubelet goes quiet.
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// The `NoSchedule` taint a condition in a status calls for (the controller's `nodeConditionToTaintKeyStatusMap`).
fn no_schedule_key(kind: &str, status: &str) -> Option<&'static str> {
    match (kind, status) {
        ("Ready", "False") => Some("node.kubernetes.io/not-ready"),
        ("Ready", "Unknown") => Some("node.kubernetes.io/unreachable"),
        ("MemoryPressure", "True") => Some("node.kubernetes.io/memory-pressure"),
        ("DiskPressure", "True") => Some("node.kubernetes.io/disk-pressure"),
        ("PIDPressure", "True") => Some("node.kubernetes.io/pid-pressure"),
        ("NetworkUnavailable", "True") => Some("node.kubernetes.io/network-unavailable"),
        _ => None,
    }
}

/// Every taint key the controller manages.
const MANAGED_KEYS: [&str; 6] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
];

fn timestamp(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

fn condition<'a>(node: &'a Value, kind: &str) -> Option<&'a Value> {
    node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

/// When the kubelet was last heard from: its Lease's renewTime or the Ready heartbeat, else the Node's creation.
fn last_heard(node: &Value, lease: Option<&Value>) -> Option<jiff::Timestamp> {
    let renewed = lease.and_then(|l| timestamp(&l["spec"]["renewTime"]));
    let heartbeat = condition(node, "Ready").and_then(|c| timestamp(&c["lastHeartbeatTime"]));
    renewed.max(heartbeat).or_else(|| timestamp(&node["metadata"]["creationTimestamp"]))
}

/// The conditions of a node gone quiet: the kubelet's set to Unknown (kept heartbeat, new transition), added as
/// never updated where missing. `None` when they are Unknown already.
fn quiet_conditions(node: &Value, now: &str) -> Option<Value> {
    let mut conditions = node["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut changed = false;
    for kind in KUBELET_CONDITIONS {
        match conditions.iter_mut().find(|c| c["type"] == kind) {
            Some(c) if c["status"] != "Unknown" => {
                c["status"] = json!("Unknown");
                c["reason"] = json!("NodeStatusUnknown");
                c["message"] = json!("Kubelet stopped posting node status.");
                c["lastTransitionTime"] = json!(now);
                changed = true;
            }
            Some(_) => {}
            None => {
                conditions.push(json!({
                    "type": kind, "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                    "message": "Kubelet never posted node status.", "lastHeartbeatTime": node["metadata"]["creationTimestamp"],
                    "lastTransitionTime": now,
                }));
                changed = true;
            }
        }
    }
    changed.then_some(Value::Array(conditions))
}

/// The node's taints with the managed ones made to follow its conditions; `None` when nothing changes.
fn taints_for(node: &Value, now: &str) -> Option<Value> {
    let current = node["spec"]["taints"].as_array().cloned().unwrap_or_default();
    let mut wanted: Vec<(&str, &str)> = Vec::new();
    for c in node["status"]["conditions"].as_array().into_iter().flatten() {
        if let (Some(kind), Some(status)) = (c["type"].as_str(), c["status"].as_str())
            && let Some(key) = no_schedule_key(kind, status)
        {
            wanted.push((key, "NoSchedule"));
            if kind == "Ready" {
                wanted.push((key, "NoExecute"));
            }
        }
    }
    let managed = |t: &Value| MANAGED_KEYS.iter().any(|k| t["key"] == *k);
    let is = |t: &Value, (key, effect): (&str, &str)| t["key"] == key && t["effect"] == effect;
    let mut taints: Vec<Value> =
        current.iter().filter(|t| !managed(t) || wanted.iter().any(|w| is(t, *w))).cloned().collect();
    for w in &wanted {
        if !taints.iter().any(|t| is(t, *w)) {
            let mut t = json!({"key": w.0, "effect": w.1});
            if w.1 == "NoExecute" {
                t["timeAdded"] = json!(now);
            }
            taints.push(t);
        }
    }
    (taints != current).then_some(Value::Array(taints))
}

/// One pass over every Node.
pub(crate) fn pass(store: &Store, nodes: &Resource, leases: &Resource, pods: &Resource, grace: Duration) {
    let now = jiff::Timestamp::now();
    let stamp = store::now();
    let (all, _) = store.list(nodes, None, &crate::select::Selector::default());
    for node in all {
        let Some(name) = node["metadata"]["name"].as_str().map(str::to_owned) else { continue };
        let lease = store.get(leases, Some("kube-node-lease"), &name).ok();
        let quiet =
            last_heard(&node, lease.as_ref()).is_none_or(|t| now.duration_since(t).unsigned_abs() > grace && t < now);
        if quiet && let Some(conditions) = quiet_conditions(&node, &stamp) {
            let set = |old: &Value| {
                let mut n = old.clone();
                n["status"]["conditions"] = conditions.clone();
                Ok(n)
            };
            if store.update(nodes, None, &name, set, true).is_ok() {
                mark_pods_not_ready(store, pods, &name, &stamp);
            }
        }
        let Ok(node) = store.get(nodes, None, &name) else { continue };
        if let Some(taints) = taints_for(&node, &stamp) {
            let set = |old: &Value| {
                let mut n = old.clone();
                n["spec"]["taints"] = taints.clone();
                Ok(n)
            };
            let _ = store.update(nodes, None, &name, set, false);
        }
    }
}

/// The controller's `MarkPodsNotReady`: every pod on `node` gets `Ready=False`.
fn mark_pods_not_ready(store: &Store, pods: &Resource, node: &str, now: &str) {
    let (on_node, _) = store.scan(pods, None, |p| {
        let (ns, name) = (p["metadata"]["namespace"].as_str()?, p["metadata"]["name"].as_str()?);
        (p["spec"]["nodeName"] == node).then(|| (ns.to_owned(), name.to_owned()))
    });
    for (ns, name) in &on_node {
        let (ns, name) = (ns.as_str(), name.as_str());
        let set = |old: &Value| {
            let mut p = old.clone();
            let conditions = p.get_mut("status").and_then(|s| s.get_mut("conditions")).and_then(Value::as_array_mut);
            let Some(conditions) = conditions else { return Ok(p) };
            for c in conditions.iter_mut().filter(|c| c["type"] == "Ready" && c["status"] != "False") {
                c["status"] = json!("False");
                c["lastTransitionTime"] = json!(now);
            }
            Ok(p)
        };
        let _ = store.update(pods, Some(ns), name, set, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str, heartbeat: &str, taints: Value) -> Value {
        json!({
            "metadata": {"name": "n", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"taints": taints},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False", "lastHeartbeatTime": heartbeat},
                {"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat, "reason": "KubeletReady"},
            ]},
        })
    }

    #[test]
    fn a_quiet_node_goes_unknown_and_unreachable_until_it_posts_ready() {
        let n = node("True", "2026-01-01T00:00:00Z", json!([{"key": "team", "effect": "NoSchedule"}]));
        let lease = json!({"spec": {"renewTime": "2026-01-01T00:00:30.000000Z"}});
        assert_eq!(last_heard(&n, Some(&lease)), Some("2026-01-01T00:00:30Z".parse().unwrap()), "the newer of both");
        let conditions = quiet_conditions(&n, "2026-01-01T00:02:00Z").unwrap();
        let ready = conditions.as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("Unknown"), Some("NodeStatusUnknown")));
        assert_eq!(ready["lastHeartbeatTime"], "2026-01-01T00:00:00Z", "the heartbeat is the kubelet's");
        let never = conditions.as_array().unwrap().iter().find(|c| c["type"] == "PIDPressure").unwrap();
        assert_eq!(never["reason"], "NodeStatusNeverUpdated");
        let mut quiet = n.clone();
        quiet["status"]["conditions"] = conditions;
        assert!(quiet_conditions(&quiet, "2026-01-01T00:03:00Z").is_none(), "Unknown already");
        let taints = taints_for(&quiet, "2026-01-01T00:02:00Z").unwrap();
        let keys: Vec<(String, String)> = taints
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["key"].as_str().unwrap().to_owned(), t["effect"].as_str().unwrap().to_owned()))
            .collect();
        let u = "node.kubernetes.io/unreachable".to_owned();
        assert_eq!(
            keys,
            [("team".into(), "NoSchedule".into()), (u.clone(), "NoSchedule".into()), (u, "NoExecute".into())]
        );
        // Ready=True again: the unreachable taints go, the operator's stays.
        let mut back = node("True", "2026-01-01T00:04:00Z", taints);
        assert_eq!(taints_for(&back, "x").unwrap(), json!([{"key": "team", "effect": "NoSchedule"}]));
        back["spec"]["taints"] = json!([{"key": "team", "effect": "NoSchedule"}]);
        assert!(taints_for(&back, "x").is_none());
        // Ready=False is not-ready; a pressure condition taints NoSchedule only.
        let mut low = node("False", "2026-01-01T00:04:00Z", json!(null));
        low["status"]["conditions"][0]["status"] = json!("True");
        let t = taints_for(&low, "x").unwrap();
        assert_eq!(t.as_array().unwrap().len(), 3, "{t}");
        assert!(t.as_array().unwrap().iter().any(|t| t["key"] == "node.kubernetes.io/memory-pressure"));
    }

    #[test]
    fn a_quiet_node_s_pods_are_marked_not_ready_and_no_other() {
        let (store, pods) = (Store::default(), crate::resource("pods"));
        for (name, node) in [("here", "n1"), ("there", "n2")] {
            let pod = json!({"metadata": {"name": name}, "spec": {"nodeName": node},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]}});
            store.create(pods, Some("default"), pod).unwrap();
        }
        mark_pods_not_ready(&store, pods, "n1", "2026-01-01T00:02:00Z");
        let status = |name: &str, kind: &str| {
            let pod = store.get(pods, Some("default"), name).unwrap();
            let c = pod["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == kind).unwrap().clone();
            (c["status"].as_str().unwrap().to_owned(), c["lastTransitionTime"].clone())
        };
        assert_eq!(status("here", "Ready"), ("False".into(), json!("2026-01-01T00:02:00Z")));
        assert_eq!(status("here", "PodScheduled").0, "True", "only Ready is the controller's");
        assert_eq!(status("there", "Ready"), ("True".into(), Value::Null), "a pod of another node");
        // A second pass changes nothing: the transition time is the first one's.
        mark_pods_not_ready(&store, pods, "n1", "2026-01-01T00:03:00Z");
        assert_eq!(status("here", "Ready").1, json!("2026-01-01T00:02:00Z"));
    }
}
