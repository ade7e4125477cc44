//! What the apiserver does to an object between the request and the store, where a kubelet or kubectl would
//! notice: the namespace lifecycle (no object in a namespace that is missing or terminating; the system
//! namespaces cannot be deleted), the pod create strategy (defaults, validation, the status reset to `Pending`
//! with its QoS class), the ServiceAccount plugin (the default service account and its `kube-api-access-*`
//! projected volume mounted in every container), DefaultTolerationSeconds, the pod update rules (a pod's spec is
//! immutable but for images, `activeDeadlineSeconds`, added tolerations and removed scheduling gates), and the
//! controllers that give every namespace its `default` ServiceAccount and `kube-root-ca.crt` ConfigMap.

use serde_json::{Value, json};

use crate::route::Resource;
use crate::store::{ApiError, Store, deleting};

/// The namespaces a cluster starts with; NamespaceLifecycle refuses to delete them.
pub const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
/// The ConfigMap every namespace gets with the cluster's CA (the root CA publisher).
pub const ROOT_CA: &str = "kube-root-ca.crt";
/// The cluster IP of the `default/kubernetes` Service (the first of kubeadm's default service range).
pub const MASTER_SERVICE_IP: &str = "10.96.0.1";
/// Where the ServiceAccount plugin mounts the API credentials.
pub const SA_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token lifetime the plugin asks for (an hour and 7 s: the apiserver extends tokens of exactly this).
pub const TOKEN_SECONDS: i64 = 3607;
/// The annotation that makes a pod a mirror pod.
pub const MIRROR: &str = "kubernetes.io/config.mirror";
/// The tolerations DefaultTolerationSeconds adds, with their seconds.
const DEFAULT_TOLERATIONS: [&str; 2] = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"];
/// The CA bundle `kube-root-ca.crt` carries when the test apiserver serves plain HTTP: a stand-in.
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nbm9kZXdhcmRlbiB0ZXN0IGFwaXNlcnZlcjogcGxhaW4gSFRUUCwgbm8gQ0E=\n-----END CERTIFICATE-----\n";

/// A 422 Invalid naming the object and the fields at fault, as the apiserver's field errors read.
pub fn invalid(kind: &str, name: &str, errors: &[String]) -> ApiError {
    let list = if errors.len() == 1 { errors[0].clone() } else { format!("[{}]", errors.join(", ")) };
    ApiError::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {list}"))
}

fn forbidden(r: &Resource, name: &str, why: &str) -> ApiError {
    ApiError::new(403, "Forbidden", format!("{} \"{name}\" is forbidden: {why}", r.plural))
}

/// NamespaceLifecycle for a create in `namespace`: the namespace must exist and not be terminating.
pub fn check_namespace(store: &Store, r: &Resource, namespace: Option<&str>, name: &str) -> Result<(), ApiError> {
    let (Some(ns), true) = (namespace, r.namespaced) else { return Ok(()) };
    let namespaces = crate::resource("namespaces");
    match store.get(namespaces, None, ns) {
        Err(_) => Err(ApiError::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))),
        Ok(n) if deleting(&n) => Err(forbidden(
            r,
            name,
            &format!("unable to create new content in namespace {ns} because it is being terminated"),
        )),
        Ok(_) => Ok(()),
    }
}

/// NamespaceLifecycle for a delete: the system namespaces stay.
pub fn check_delete(r: &Resource, name: &str) -> Result<(), ApiError> {
    if r.kind == "Namespace" && SYSTEM_NAMESPACES.contains(&name) {
        return Err(forbidden(r, name, "this namespace may not be deleted"));
    }
    Ok(())
}

/// The create strategy and admission of `object`, about to be stored in `namespace`.
pub fn on_create(store: &Store, r: &Resource, namespace: Option<&str>, mut object: Value) -> Result<Value, ApiError> {
    let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
    check_namespace(store, r, namespace, &name)?;
    match r.kind {
        "Pod" => pod(store, namespace.unwrap_or("default"), object),
        "Namespace" => {
            object["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            if object["spec"]["finalizers"].is_null() {
                object["spec"]["finalizers"] = json!(["kubernetes"]);
            }
            object["status"] = json!({"phase": "Active"});
            Ok(object)
        }
        "Secret" => {
            // stringData is write-only: folded into data, base64-encoded, as the Secret's conversion does.
            if let Some(Value::Object(strings)) = object.as_object_mut().and_then(|o| o.remove("stringData")) {
                for (k, v) in strings {
                    let text = v.as_str().unwrap_or("").to_owned();
                    object["data"][k] = json!(crate::b64::encode(text.as_bytes(), false));
                }
            }
            if object["type"].as_str().is_none_or(str::is_empty) {
                object["type"] = json!("Opaque");
            }
            Ok(object)
        }
        "Service" => {
            if object["spec"]["type"].is_null() {
                object["spec"]["type"] = json!("ClusterIP");
            }
            // As the real apiserver's allocator: a Service that is not headless nor `ExternalName` gets the next
            // free address of the service range (10.96.0.0/12, as kubeadm's default).
            let external = object["spec"]["type"] == "ExternalName";
            let unset = object["spec"]["clusterIP"].as_str().is_none_or(str::is_empty);
            if !external && unset {
                let ip = free_cluster_ip(store, r).ok_or_else(|| {
                    invalid("Service", &name, &["spec.clusterIPs: Internal error: the service range is full".into()])
                })?;
                object["spec"]["clusterIP"] = json!(ip);
                object["spec"]["clusterIPs"] = json!([ip]);
            }
            Ok(object)
        }
        _ => Ok(object),
    }
}

/// The first address of the service range (10.96.0.0/12) no Service holds, after the apiserver's own.
fn free_cluster_ip(store: &Store, services: &Resource) -> Option<String> {
    let (all, _) = store.list(services, None, &crate::select::Selector::default());
    let taken: std::collections::BTreeSet<&str> = all.iter().filter_map(|s| s["spec"]["clusterIP"].as_str()).collect();
    (2u32..(1 << 20))
        .map(|n| std::net::Ipv4Addr::from(0x0a60_0000 + n).to_string())
        .find(|ip| !taken.contains(ip.as_str()))
}

/// What the controllers add once `created` is stored: a namespace's `default` ServiceAccount and its
/// `kube-root-ca.crt` ConfigMap, with the server's CA (what `ca` gives, under TLS) or a stand-in.
pub fn after_create(store: &Store, created: &Value, ca: impl FnOnce() -> Option<String>) {
    if created["kind"] != "Namespace" {
        return;
    }
    let Some(ns) = created["metadata"]["name"].as_str() else { return };
    let _ = store.create(crate::resource("serviceaccounts"), Some(ns), json!({"metadata": {"name": "default"}}));
    let (pem, description) = match ca() {
        Some(pem) => (pem, "The CA bundle of this cluster's apiserver."),
        None => (CA_PEM.to_owned(), "The CA bundle of this cluster's apiserver (a stand-in: plain HTTP, no CA)."),
    };
    let _ = store.create(
        crate::resource("configmaps"),
        Some(ns),
        json!({"metadata": {"name": ROOT_CA, "annotations": {"kubernetes.io/description": description}},
               "data": {"ca.crt": pem}}),
    );
}

/// The update rules of `r`: a pod's spec is immutable but for what the pod update validation allows.
pub fn on_update(r: &Resource, old: &Value, new: &Value, status: bool) -> Result<(), ApiError> {
    if r.kind != "Pod" || status {
        return Ok(());
    }
    let name = old["metadata"]["name"].as_str().unwrap_or("");
    let mut allowed = new["spec"].clone();
    let old_spec = &old["spec"];
    for list in ["containers", "initContainers"] {
        if let (Some(a), Some(o)) = (allowed.get_mut(list).and_then(Value::as_array_mut), old_spec[list].as_array())
            && a.len() == o.len()
        {
            for (c, oc) in a.iter_mut().zip(o) {
                c["image"] = oc["image"].clone();
            }
        }
    }
    let mut errors = Vec::new();
    match (old_spec["activeDeadlineSeconds"].as_i64(), new["spec"]["activeDeadlineSeconds"].as_i64()) {
        (Some(o), Some(n)) if n > o => {
            errors.push(format!(
                "spec.activeDeadlineSeconds: Invalid value: {n}: must be less than or equal to the previous value {o}"
            ));
        }
        (Some(_), None) => errors.push("spec.activeDeadlineSeconds: Invalid value: null: must not be removed".into()),
        _ => {}
    }
    copy(&mut allowed, old_spec, "activeDeadlineSeconds");
    let old_tolerations = old_spec["tolerations"].as_array().cloned().unwrap_or_default();
    let new_tolerations = new["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        copy(&mut allowed, old_spec, "tolerations");
    }
    let old_gates = old_spec["schedulingGates"].as_array().cloned().unwrap_or_default();
    let new_gates = new["spec"]["schedulingGates"].as_array().cloned().unwrap_or_default();
    if new_gates.iter().all(|g| old_gates.contains(g)) {
        copy(&mut allowed, old_spec, "schedulingGates");
    }
    if &allowed != old_spec {
        errors.push(
            "spec: Forbidden: a pod's spec may change only in spec.containers[*].image, spec.initContainers[*].image, spec.activeDeadlineSeconds (set or lowered), spec.tolerations (additions) and spec.schedulingGates (removals)".into(),
        );
    }
    if errors.is_empty() { Ok(()) } else { Err(invalid("Pod", name, &errors)) }
}

fn copy(to: &mut Value, from: &Value, field: &str) {
    match (from.get(field), to) {
        (Some(v), to) => to[field] = v.clone(),
        (None, Value::Object(o)) => {
            o.remove(field);
        }
        (None, _) => {}
    }
}

/// A DNS-1123 label: at most 63 lowercase letters, digits and `-`, alphanumeric at both ends.
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: at most 253 characters of dot-separated labels.
fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// A quantity's value (`100m`, `1Gi`, `2`, `1e3`), for comparisons; `None` if it does not parse.
pub fn quantity(q: &Value) -> Option<f64> {
    if let Some(n) = q.as_f64() {
        return Some(n);
    }
    let s = q.as_str()?.trim();
    const SUFFIXES: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("Ei", 1_152_921_504_606_846_976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    s.parse::<f64>().ok()
}

/// The pod's QoS class, as the kubelet and the apiserver compute it from its containers' requests and limits.
pub fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> =
        ["containers", "initContainers"].iter().flat_map(|l| spec[*l].as_array().into_iter().flatten()).collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let (requests, limits) = (&c["resources"]["requests"], &c["resources"]["limits"]);
        for res in ["cpu", "memory"] {
            let (rq, lm) = (quantity(&requests[res]), quantity(&limits[res]));
            any |= rq.is_some_and(|v| v != 0.0) || lm.is_some_and(|v| v != 0.0);
            match (rq, lm) {
                (Some(r), Some(l)) if r == l => {}
                (None, Some(_)) => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The field errors of a pod about to be created.
fn validate_pod(pod: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    if !is_subdomain(name) {
        errors.push(format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
    }
    let spec = &pod["spec"];
    if spec["containers"].as_array().is_none_or(Vec::is_empty) {
        errors.push("spec.containers: Required value".into());
    }
    let volumes: Vec<&str> =
        spec["volumes"].as_array().into_iter().flatten().filter_map(|v| v["name"].as_str()).collect();
    for (i, v) in volumes.iter().enumerate() {
        if volumes[..i].contains(v) {
            errors.push(format!("spec.volumes[{i}].name: Duplicate value: {v:?}"));
        }
    }
    let mut names = Vec::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            let at = format!("spec.{list}[{i}]");
            match c["name"].as_str() {
                None | Some("") => errors.push(format!("{at}.name: Required value")),
                Some(n) if !is_label(n) => errors.push(format!("{at}.name: Invalid value: {n:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character")),
                Some(n) if names.contains(&n) => errors.push(format!("{at}.name: Duplicate value: {n:?}")),
                Some(n) => names.push(n),
            }
            if c["image"].as_str().is_none_or(|i| i.trim().is_empty()) {
                errors.push(format!("{at}.image: Required value"));
            }
            for (j, m) in c["volumeMounts"].as_array().into_iter().flatten().enumerate() {
                let v = m["name"].as_str().unwrap_or("");
                if !volumes.contains(&v) {
                    errors.push(format!("{at}.volumeMounts[{j}].name: Not found: {v:?}"));
                }
            }
            for res in ["cpu", "memory"] {
                let (rq, lm) = (&c["resources"]["requests"][res], &c["resources"]["limits"][res]);
                if let (Some(r), Some(l)) = (quantity(rq), quantity(lm))
                    && r > l
                {
                    errors.push(format!(
                        "{at}.resources.requests: Invalid value: {rq}: must be less than or equal to {res} limit of {lm}"
                    ));
                }
            }
        }
    }
    if let Some(p) = spec["restartPolicy"].as_str()
        && !["Always", "OnFailure", "Never"].contains(&p)
    {
        errors.push(format!(
            "spec.restartPolicy: Unsupported value: {p:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
        ));
    }
    errors
}

/// The registry's defaults for a pod and its containers.
fn default_pod(pod: &mut Value) {
    let spec = &mut pod["spec"];
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
    ];
    for (field, value) in defaults {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
    if spec["priority"].is_null() {
        spec["priority"] = json!(match spec["priorityClassName"].as_str() {
            Some("system-node-critical") => 2_000_001_000,
            Some("system-cluster-critical") => 2_000_000_000,
            _ => 0,
        });
    }
    for list in ["initContainers", "containers"] {
        for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if c["terminationMessagePath"].is_null() {
                c["terminationMessagePath"] = json!("/dev/termination-log");
            }
            if c["terminationMessagePolicy"].is_null() {
                c["terminationMessagePolicy"] = json!("File");
            }
            if c["imagePullPolicy"].is_null() {
                let image = c["image"].as_str().unwrap_or("");
                let tag = image.rsplit('/').next().and_then(|last| last.split_once(':')).map(|(_, t)| t);
                let always = !image.contains('@') && tag.is_none_or(|t| t == "latest");
                c["imagePullPolicy"] = json!(if always { "Always" } else { "IfNotPresent" });
            }
            if c["resources"].is_null() {
                c["resources"] = json!({});
            }
            // Requests default to the limits they leave out.
            if let Some(limits) = c["resources"]["limits"].as_object().cloned() {
                for (res, q) in limits {
                    if c["resources"]["requests"][&res].is_null() {
                        c["resources"]["requests"][&res] = q;
                    }
                }
            }
        }
    }
}

/// A short suffix for generated names, from the apiserver's alphabet (no vowels, no look-alikes), seeded by
/// `seed` and the clock.
pub fn suffix(seed: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let nanos = u64::from(jiff::Timestamp::now().subsec_nanosecond().unsigned_abs());
    let mut x = seed ^ nanos.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    (0..5)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let i = usize::try_from((x >> 33) % 27).unwrap_or(0);
            char::from(ALPHABET[i])
        })
        .collect()
}

/// The ServiceAccount plugin: the pod's service account (`default` unless named) must exist, and unless
/// automounting is off (on the pod, else on the account) a `kube-api-access-*` projected volume with a token,
/// the cluster CA and the namespace is added and mounted read-only in every container.
fn service_account(store: &Store, namespace: &str, pod: &mut Value) -> Result<(), ApiError> {
    let r = crate::resource("pods");
    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let account = pod["spec"]["serviceAccountName"]
        .as_str()
        .or_else(|| pod["spec"]["serviceAccount"].as_str())
        .filter(|a| !a.is_empty())
        .unwrap_or("default")
        .to_owned();
    let sa = store.get(crate::resource("serviceaccounts"), Some(namespace), &account).map_err(|_| {
        forbidden(
            r,
            &name,
            &format!("error looking up service account {namespace}/{account}: serviceaccount \"{account}\" not found"),
        )
    })?;
    pod["spec"]["serviceAccountName"] = json!(account);
    pod["spec"]["serviceAccount"] = json!(account);
    let automount =
        pod["spec"]["automountServiceAccountToken"].as_bool().or(sa["automountServiceAccountToken"].as_bool());
    if automount == Some(false) {
        return Ok(());
    }
    let mounted = |c: &Value| {
        c["volumeMounts"].as_array().into_iter().flatten().any(|m| m["mountPath"].as_str() == Some(SA_MOUNT))
    };
    let seed = name.bytes().fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b));
    let volume = format!("kube-api-access-{}", suffix(seed));
    let source = json!({
        "name": volume,
        "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
            {"configMap": {"name": ROOT_CA, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]},
    });
    let mut used = false;
    for list in ["initContainers", "containers"] {
        for c in pod["spec"].get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if !mounted(c) {
                let mount = json!({"name": volume, "readOnly": true, "mountPath": SA_MOUNT});
                match c["volumeMounts"].as_array_mut() {
                    Some(m) => m.push(mount),
                    None => c["volumeMounts"] = json!([mount]),
                }
                used = true;
            }
        }
    }
    if used {
        match pod["spec"]["volumes"].as_array_mut() {
            Some(v) => v.push(source),
            None => pod["spec"]["volumes"] = json!([source]),
        }
    }
    Ok(())
}

/// DefaultTolerationSeconds: a pod that does not tolerate the not-ready and unreachable `NoExecute` taints
/// tolerates them for 300 s.
fn default_tolerations(pod: &mut Value) {
    for key in DEFAULT_TOLERATIONS {
        let tolerated = pod["spec"]["tolerations"].as_array().into_iter().flatten().any(|t| {
            let k = t["key"].as_str().unwrap_or("");
            let effect = t["effect"].as_str().unwrap_or("");
            (k == key || k.is_empty()) && (effect == "NoExecute" || effect.is_empty())
        });
        if tolerated {
            continue;
        }
        let t = json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300});
        match pod["spec"]["tolerations"].as_array_mut() {
            Some(list) => list.push(t),
            None => pod["spec"]["tolerations"] = json!([t]),
        }
    }
}

/// A pod's create: defaults, validation, the ServiceAccount plugin (not for mirror pods, which may reference
/// nothing), DefaultTolerationSeconds, and the status reset.
fn pod(store: &Store, namespace: &str, mut pod: Value) -> Result<Value, ApiError> {
    if !pod["spec"].is_object() {
        pod["spec"] = json!({});
    }
    default_pod(&mut pod);
    // The mutating plugins run before validation, as in the apiserver's chain.
    let mirror = pod["metadata"]["annotations"][MIRROR].is_string();
    if !mirror {
        service_account(store, namespace, &mut pod)?;
    }
    default_tolerations(&mut pod);
    let errors = validate_pod(&pod);
    if !errors.is_empty() {
        return Err(invalid("Pod", pod["metadata"]["name"].as_str().unwrap_or(""), &errors));
    }
    let qos = qos_class(&pod["spec"]);
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_qos_classes() {
        assert_eq!(quantity(&json!("100m")), Some(0.1));
        assert_eq!(quantity(&json!("1Gi")), Some(1_073_741_824.0));
        assert_eq!(quantity(&json!("2")), Some(2.0));
        assert_eq!(quantity(&json!("x")), None);
        let c = |res: Value| json!({"containers": [{"name": "a", "resources": res}]});
        assert_eq!(qos_class(&c(json!({}))), "BestEffort");
        assert_eq!(qos_class(&c(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))), "Guaranteed");
        assert_eq!(
            qos_class(&c(
                json!({"requests": {"cpu": "1000m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}})
            )),
            "Guaranteed"
        );
        assert_eq!(qos_class(&c(json!({"requests": {"cpu": "100m"}}))), "Burstable");
        assert_eq!(qos_class(&c(json!({"limits": {"memory": "1Gi"}}))), "Burstable");
    }

    #[test]
    fn services_get_the_next_free_cluster_ip_unless_headless_or_external() {
        let store = Store::default();
        let ns = crate::resource("namespaces");
        store.create(ns, None, on_create(&store, ns, None, json!({"metadata": {"name": "default"}})).unwrap()).unwrap();
        let services = crate::resource("services");
        let create = |name: &str, spec: Value| {
            let admitted =
                on_create(&store, services, Some("default"), json!({"metadata": {"name": name}, "spec": spec}));
            store.create(services, Some("default"), admitted.unwrap()).unwrap()["spec"].clone()
        };
        let master = create("kubernetes", json!({"clusterIP": MASTER_SERVICE_IP, "ports": [{"port": 443}]}));
        assert_eq!(master["clusterIP"], MASTER_SERVICE_IP);
        assert_eq!(create("web", json!({"ports": [{"port": 80}]}))["clusterIPs"], json!(["10.96.0.2"]));
        assert_eq!(create("db", json!({"ports": [{"port": 5432}]}))["clusterIP"], "10.96.0.3");
        assert_eq!(create("peers", json!({"clusterIP": "None"}))["clusterIP"], "None");
        assert!(create("out", json!({"type": "ExternalName", "externalName": "x.example"}))["clusterIP"].is_null());
    }

    #[test]
    fn a_pod_is_admitted_as_the_apiserver_admits_it() {
        let store = Store::default();
        let ns = crate::resource("namespaces");
        let created = store.create(ns, None, on_create(&store, ns, None, json!({"metadata": {"name": "x"}})).unwrap());
        after_create(&store, &created.unwrap(), || None);
        let pod = on_create(
            &store,
            crate::resource("pods"),
            Some("x"),
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}], "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]}, "status": {"phase": "Running"}}),
        )
        .unwrap();
        assert_eq!(pod["status"], json!({"phase": "Pending", "qosClass": "BestEffort"}));
        assert_eq!(pod["spec"]["serviceAccountName"], "default");
        let volume = &pod["spec"]["volumes"][0];
        assert!(volume["name"].as_str().unwrap().starts_with("kube-api-access-"), "{volume}");
        assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"], 3607);
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"][0]["mountPath"], SA_MOUNT);
        assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "Always");
        let tolerations = pod["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(
            tolerations.len(),
            2,
            "the pod's own unreachable toleration stays, not-ready is added: {tolerations:?}"
        );
        assert_eq!(tolerations[1]["tolerationSeconds"], 300);
        // A named service account that is missing is refused; a mirror pod gets no account.
        let refused = on_create(
            &store,
            crate::resource("pods"),
            Some("x"),
            json!({"metadata": {"name": "q"}, "spec": {"serviceAccountName": "nope", "containers": [{"name": "c", "image": "i"}]}}),
        )
        .unwrap_err();
        assert_eq!(refused.code, 403);
        let mirror = on_create(
            &store,
            crate::resource("pods"),
            Some("x"),
            json!({"metadata": {"name": "m", "annotations": {MIRROR: "h"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}),
        )
        .unwrap();
        assert!(mirror["spec"]["volumes"].is_null() && mirror["spec"]["serviceAccountName"].is_null());
        // Validation, and the namespace lifecycle.
        let bad = on_create(
            &store,
            crate::resource("pods"),
            Some("x"),
            json!({"metadata": {"name": "Bad"}, "spec": {"containers": [{"name": "c"}, {"name": "c", "image": "i"}]}}),
        )
        .unwrap_err();
        assert_eq!(bad.code, 422);
        assert!(
            bad.message.contains("metadata.name")
                && bad.message.contains("spec.containers[0].image: Required value")
                && bad.message.contains("Duplicate"),
            "{}",
            bad.message
        );
        let missing = on_create(&store, crate::resource("pods"), Some("nowhere"), json!({"metadata": {"name": "p"}}))
            .unwrap_err();
        assert_eq!((missing.code, missing.message.as_str()), (404, "namespaces \"nowhere\" not found"));
    }

    #[test]
    fn a_pod_spec_changes_only_where_allowed() {
        let r = crate::resource("pods");
        let old = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "", "containers": [{"name": "c", "image": "a"}], "tolerations": [{"key": "k"}]}});
        let mut new = old.clone();
        new["spec"]["containers"][0]["image"] = json!("b");
        new["spec"]["tolerations"] = json!([{"key": "k"}, {"key": "l"}]);
        new["spec"]["activeDeadlineSeconds"] = json!(10);
        assert!(on_update(r, &old, &new, false).is_ok());
        let mut bound = old.clone();
        bound["spec"]["nodeName"] = json!("n1");
        let e = on_update(r, &old, &bound, false).unwrap_err();
        assert_eq!(e.code, 422, "{}", e.message);
        let mut dropped = old.clone();
        dropped["spec"]["tolerations"] = json!([]);
        assert!(on_update(r, &old, &dropped, false).is_err(), "tolerations are only added");
        assert!(on_update(r, &old, &bound, true).is_ok(), "a status write keeps the spec anyway");
    }
}
