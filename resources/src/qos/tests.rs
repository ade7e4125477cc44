use super::*;
use proptest::prelude::*;
use serde_json::json;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "uid": "u1"}, "spec": spec}),
    )
    .expect("test pod")
}

fn c(name: &str, requests: serde_json::Value, limits: serde_json::Value) -> serde_json::Value {
    json!({"name": name, "image": "busybox", "resources": {"requests": requests, "limits": limits}})
}

fn class(spec: serde_json::Value) -> QosClass {
    PodResources::from_pod(&pod(spec)).expect("valid pod").qos_class()
}

#[test]
fn qos_classes() {
    let none = json!({});
    assert_eq!(class(json!({"containers": [c("a", none.clone(), none.clone())]})), QosClass::BestEffort);
    // Limits only: requests default to limits, so the pod is Guaranteed.
    let lim = json!({"cpu": "500m", "memory": "128Mi"});
    assert_eq!(class(json!({"containers": [c("a", none.clone(), lim.clone())]})), QosClass::Guaranteed);
    assert_eq!(class(json!({"containers": [c("a", lim.clone(), lim.clone())]})), QosClass::Guaranteed);
    // Memory only is not Guaranteed: both cpu and memory limits are required.
    assert_eq!(class(json!({"containers": [c("a", none.clone(), json!({"memory": "1Gi"}))]})), QosClass::Burstable);
    assert_eq!(class(json!({"containers": [c("a", json!({"cpu": "100m"}), lim.clone())]})), QosClass::Burstable);
    // One BestEffort container next to a Guaranteed one makes the pod Burstable.
    assert_eq!(
        class(json!({"containers": [c("a", none.clone(), lim.clone()), c("b", none.clone(), none.clone())]})),
        QosClass::Burstable
    );
    // Init containers count: a Guaranteed app with a request-only init container is Burstable.
    assert_eq!(
        class(
            json!({"initContainers": [c("i", json!({"cpu": "1"}), none.clone())], "containers": [c("a", none.clone(), lim.clone())]})
        ),
        QosClass::Burstable
    );
    // Zero quantities do not count as requests.
    assert_eq!(class(json!({"containers": [c("a", json!({"cpu": "0"}), none)]})), QosClass::BestEffort);
}

#[test]
fn pod_totals_with_init_and_sidecars() {
    let p = pod(json!({
        "initContainers": [
            c("init-big", json!({"cpu": "2", "memory": "1Gi"}), json!({})),
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            c("init-late", json!({"cpu": "1"}), json!({})),
        ],
        "containers": [c("a", json!({"cpu": "250m", "memory": "128Mi"}), json!({"cpu": "500m", "memory": "256Mi"})),
                       c("b", json!({"cpu": "250m", "memory": "128Mi"}), json!({"memory": "256Mi"}))]
    }));
    let r = PodResources::from_pod(&p).unwrap();
    // init-big alone (2000m) beats init-late + sidecar (1100m) and apps + sidecar (600m).
    assert_eq!(r.cpu_request(), 2000);
    assert_eq!(r.memory_request(), 1 << 30);
    assert_eq!(r.cpu_limit(), None, "b and the init containers have no cpu limit");
    assert_eq!(r.memory_limit(), None);
}

#[test]
fn pod_limits_when_all_containers_have_them() {
    let l = json!({"cpu": "500m", "memory": "256Mi"});
    let r = PodResources::from_pod(&pod(json!({"containers": [c("a", json!({}), l.clone()), c("b", json!({}), l)]})))
        .unwrap();
    assert_eq!(r.cpu_limit(), Some(1000));
    assert_eq!(r.memory_limit(), Some(512 << 20));
    assert_eq!(r.qos_class(), QosClass::Guaranteed);
}

#[test]
fn bad_specs_are_named() {
    let e = PodResources::from_pod(&pod(json!({"containers": [c("a", json!({"memory": "lots"}), json!({}))]})))
        .unwrap_err();
    assert!(
        matches!(&e, PodSpecError::Quantity { container, field, .. } if container == "a" && field == "resources.requests.memory"),
        "{e}"
    );
    let e = PodResources::from_pod(&pod(
        json!({"containers": [c("a", json!({}), json!({})), c("a", json!({}), json!({}))]}),
    ))
    .unwrap_err();
    assert_eq!(e, PodSpecError::DuplicateContainer("a".into()));
    let e = PodResources::from_pod(&pod(json!({"containers": [c("../etc", json!({}), json!({}))]}))).unwrap_err();
    assert!(matches!(e, PodSpecError::Name(_)));
    assert_eq!(PodResources::from_pod(&pod(json!({"containers": []}))).unwrap_err(), PodSpecError::NoContainers);
    let e = PodResources::from_pod(&pod(json!({"containers": [c("a", json!({"cpu": "-1"}), json!({}))]}))).unwrap_err();
    assert!(e.to_string().contains("negative"), "{e}");
}

#[test]
fn cpu_conversions() {
    assert_eq!(cpu_shares(0), 2);
    assert_eq!(cpu_shares(1), 2);
    assert_eq!(cpu_shares(1000), 1024);
    assert_eq!(cpu_shares(250), 256);
    assert_eq!(cpu_shares(1_000_000), MAX_SHARES);
    assert_eq!(shares_to_weight(2), 1);
    assert_eq!(shares_to_weight(1024), 39);
    assert_eq!(shares_to_weight(MAX_SHARES), 10_000);
    assert_eq!(cpu_quota(500, 100_000), 50_000);
    assert_eq!(cpu_quota(1, 100_000), MIN_QUOTA_US);
    assert_eq!(cpu_quota(2500, 50_000), 125_000);
}

#[test]
fn oom_scores() {
    let gib = 1u64 << 30;
    assert_eq!(oom_score_adj(QosClass::Guaranteed, false, gib, 4 * gib), -997);
    assert_eq!(oom_score_adj(QosClass::BestEffort, false, 0, 4 * gib), 1000);
    assert_eq!(oom_score_adj(QosClass::BestEffort, true, 0, 4 * gib), -997);
    assert_eq!(oom_score_adj(QosClass::Burstable, false, gib, 4 * gib), 750);
    assert_eq!(oom_score_adj(QosClass::Burstable, false, 0, 4 * gib), 999, "never equal to BestEffort");
    assert_eq!(oom_score_adj(QosClass::Burstable, false, 4 * gib, 4 * gib), 3);
    assert_eq!(oom_score_adj(QosClass::Burstable, false, 8 * gib, 4 * gib), 3);
}

#[test]
fn memory_qos_high() {
    let mib = 1u64 << 20;
    // 100Mi request, 200Mi limit, factor 0.9: 190Mi.
    assert_eq!(memory_high(100 * mib, 200 * mib, 0.9), Some(190 * mib));
    assert_eq!(memory_high(100 * mib, 100 * mib, 0.9), None);
    assert_eq!(memory_high(0, 1000, 0.9), None, "900 rounds down to page 0");
    assert_eq!(memory_high(0, 10_000, 0.9).map(|h| h % PAGE_SIZE), Some(0));
}

proptest! {
    #[test]
    fn weight_is_monotonic_and_in_range(a in 0u64..2_000_000, b in 0u64..2_000_000) {
        let (wa, wb) = (shares_to_weight(cpu_shares(a)), shares_to_weight(cpu_shares(b)));
        prop_assert!((1..=10_000).contains(&wa));
        if a <= b { prop_assert!(wa <= wb); }
    }

    #[test]
    fn burstable_oom_adj_stays_between_classes(req in 0u64..(1 << 40), cap in 1u64..(1 << 40)) {
        let adj = oom_score_adj(QosClass::Burstable, false, req, cap);
        prop_assert!((3..=999).contains(&adj));
    }

    #[test]
    fn memory_high_is_between_request_and_limit(req in 0u64..(1 << 36), extra in 0u64..(1 << 36), f in 0.0f64..=1.0) {
        if let Some(h) = memory_high(req, req + extra, f) {
            prop_assert!(h > req && h <= req + extra && h % PAGE_SIZE == 0);
        }
    }

    #[test]
    fn quota_never_below_minimum(m in 0u64..1_000_000, p in 1000u64..1_000_000) {
        prop_assert!(cpu_quota(m, p) >= MIN_QUOTA_US);
    }
}
