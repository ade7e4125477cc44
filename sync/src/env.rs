//! A container's environment as the kubelet makes it: `HOSTNAME`, then `envFrom` (ConfigMaps and Secrets, with a
//! prefix), then `env` (values with `$(VAR)` references expanded, `fieldRef`, `resourceFieldRef`,
//! `configMapKeyRef`, `secretKeyRef`); a later name replaces an earlier one. The objects come fetched
//! ([`crate::objects::ObjectMap`]); errors are the kubelet's `CreateContainerConfigError` messages.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use nodewarden_resources::Resources;

use crate::objects::{ObjectKind, ObjectMap, ServiceAddress, ServicePort, lookup};
use crate::spec::{PodIps, expand, field_ref};

/// The ConfigMaps and Secrets container `c`'s environment reads.
pub(crate) fn references(c: &Container) -> Vec<(ObjectKind, String)> {
    let mut out = Vec::new();
    for f in c.env_from.iter().flatten() {
        if let Some(cm) = &f.config_map_ref {
            out.push((ObjectKind::ConfigMap, cm.name.clone()));
        }
        if let Some(s) = &f.secret_ref {
            out.push((ObjectKind::Secret, s.name.clone()));
        }
    }
    for e in c.env.iter().flatten() {
        let Some(from) = &e.value_from else { continue };
        if let Some(k) = &from.config_map_key_ref {
            out.push((ObjectKind::ConfigMap, k.name.clone()));
        }
        if let Some(k) = &from.secret_key_ref {
            out.push((ObjectKind::Secret, k.name.clone()));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The Services the environment of a container of a pod names, as the kubelet's service links: the apiserver's
/// own (`kubernetes` among `in_default`, the Services of `default`) always, and with `enableServiceLinks` (`links`)
/// every Service of the pod's namespace (`in_own`; one named `kubernetes` there wins), by name.
pub(crate) fn linked_services(
    in_default: &[ServiceAddress],
    in_own: &[ServiceAddress],
    links: bool,
) -> Vec<ServiceAddress> {
    let mut by_name: BTreeMap<&str, &ServiceAddress> = BTreeMap::new();
    if let Some(master) = in_default.iter().find(|s| s.name == MASTER_SERVICE) {
        by_name.insert(MASTER_SERVICE, master);
    }
    if links {
        by_name.extend(in_own.iter().map(|s| (s.name.as_str(), s)));
    }
    by_name.into_values().cloned().collect()
}

/// The name of the apiserver's own Service, in `default`.
pub(crate) const MASTER_SERVICE: &str = "kubernetes";

/// The variables the kubelet gives every container for `services`: `{NAME}_SERVICE_HOST`, `{NAME}_SERVICE_PORT`
/// (the first port), `{NAME}_SERVICE_PORT_{PORT NAME}`, and the Docker links (`{NAME}_PORT=tcp://ip:port`,
/// `{NAME}_PORT_{port}_{PROTO}` with `_PROTO`, `_PORT`, `_ADDR`); a Service without a cluster IP has none.
pub(crate) fn service_vars(services: &[ServiceAddress]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for s in services {
        let Some(first) = s.ports.first() else { continue };
        if s.cluster_ip.is_empty() || s.cluster_ip == "None" {
            continue;
        }
        let name = s.name.to_ascii_uppercase().replace('-', "_");
        let ip = &s.cluster_ip;
        out.push((format!("{name}_SERVICE_HOST"), ip.clone()));
        out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        for p in s.ports.iter().filter(|p| !p.name.is_empty()) {
            let port_name = p.name.to_ascii_uppercase().replace('-', "_");
            out.push((format!("{name}_SERVICE_PORT_{port_name}"), p.port.to_string()));
        }
        let url = |p: &ServicePort| format!("{}://{ip}:{}", p.protocol.to_ascii_lowercase(), p.port);
        out.push((format!("{name}_PORT"), url(first)));
        for p in &s.ports {
            let prefix = format!("{name}_PORT_{}_{}", p.port, p.protocol.to_ascii_uppercase());
            out.push((prefix.clone(), url(p)));
            out.push((format!("{prefix}_PROTO"), p.protocol.to_ascii_lowercase()));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.clone()));
        }
    }
    out
}

/// Whether an `envFrom` key can be a variable name: printable ASCII without `=` (the relaxed rule of Kubernetes
/// 1.34). Others are skipped, as the kubelet skips them.
fn is_env_name(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic() && b != b'=')
}

/// A container's environment.
#[derive(Debug, Default)]
pub(crate) struct Env {
    /// The variables, in order (values may be a Secret's: never logged).
    pub vars: Vec<(String, String)>,
    /// The `envFrom` keys left out: they are no variable names.
    pub skipped: Vec<String>,
}

/// The environment of container `c` of `pod`, in order, with the `envFrom` keys skipped for their names. Without
/// `objects` (a container adopted from an earlier daemon, whose environment is only kept for its execs) what
/// objects would give is left out.
pub(crate) fn container_env(
    pod: &Pod,
    c: &Container,
    ips: PodIps<'_>,
    node: &Resources,
    objects: Option<&ObjectMap>,
    services: &[(String, String)],
) -> Result<Env, String> {
    let namespace = nodewarden_resources::pod::namespace(pod);
    let mut env: Vec<(String, String)> = Vec::new();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut skipped = Vec::new();
    if let Some(h) = pod.metadata.name.as_deref() {
        env.push(("HOSTNAME".into(), h.to_owned()));
    }
    // Service variables first: the container's own take their names, and `$(VAR)` references read them.
    for (k, v) in services {
        set(&mut env, &mut vars, k.clone(), v.clone());
    }
    for f in c.env_from.iter().flatten() {
        let prefix = f.prefix.as_deref().unwrap_or_default();
        let (kind, name, optional) = match (&f.config_map_ref, &f.secret_ref) {
            (Some(cm), _) => (ObjectKind::ConfigMap, &cm.name, cm.optional.unwrap_or(false)),
            (None, Some(s)) => (ObjectKind::Secret, &s.name, s.optional.unwrap_or(false)),
            (None, None) => continue,
        };
        let Some(objects) = objects else { continue };
        let Some(object) = lookup(objects, kind, name, optional)? else { continue };
        for k in object.data.keys() {
            let Some(v) = object.env_value(k) else { continue };
            let full = format!("{prefix}{k}");
            if is_env_name(&full) {
                set(&mut env, &mut vars, full, v);
            } else {
                skipped.push(full);
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_ref(pod, &f.field_path, ips)?
                } else if let Some(r) = &from.resource_field_ref {
                    let container = r.container_name.as_deref().filter(|n| !n.is_empty()).unwrap_or(&c.name);
                    crate::projection::resource_value(pod, container, r, node)?
                } else {
                    // An adopted container's environment leaves out what objects give.
                    let Some(objects) = objects else { continue };
                    let (kind, name, key, optional) = match (&from.config_map_key_ref, &from.secret_key_ref) {
                        (Some(k), _) => (ObjectKind::ConfigMap, &k.name, &k.key, k.optional.unwrap_or(false)),
                        (None, Some(k)) => (ObjectKind::Secret, &k.name, &k.key, k.optional.unwrap_or(false)),
                        (None, None) => return Err(format!("env {}: valueFrom names no source", e.name)),
                    };
                    let Some(o) = lookup(objects, kind, name, optional)? else { continue };
                    match o.env_value(key) {
                        Some(v) => v,
                        None if optional => continue,
                        None => {
                            return Err(format!("couldn't find key {key} in {} {namespace}/{name}", kind.kind()));
                        }
                    }
                }
            }
            (Some(v), None) => expand(v, &vars),
            (None, None) => String::new(),
        };
        set(&mut env, &mut vars, e.name.clone(), value);
    }
    Ok(Env { vars: env, skipped })
}

/// Sets `k` to `v`: it replaces an earlier value and is what later `$(k)` references read.
fn set(env: &mut Vec<(String, String)>, vars: &mut BTreeMap<String, String>, k: String, v: String) {
    vars.insert(k.clone(), v.clone());
    env.retain(|(name, _)| *name != k);
    env.push((k, v));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::MemObjects;
    use crate::objects::{NoObjects, fetch_into};
    use serde_json::json;

    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [container]}
        }))
        .unwrap()
    }

    async fn env_of(port: &dyn crate::objects::PodObjects, p: &Pod) -> Result<Vec<(String, String)>, String> {
        let c = &p.spec.as_ref().unwrap().containers[0];
        let mut map = ObjectMap::new();
        fetch_into(port, "ns", references(c), &mut map).await;
        let node = Resources { cpu_millis: 2000, memory: 1 << 30, pids: 100, ephemeral_storage: 1 << 34 };
        container_env(p, c, PodIps::default(), &node, Some(&map), &[]).map(|e| e.vars)
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[tokio::test]
    async fn env_from_then_env_with_references_and_overrides() {
        let objects = MemObjects::default();
        objects.put(ObjectKind::ConfigMap, "ns", "cfg", &[("LEVEL", "debug"), ("MODE", "fast"), ("bad=key", "x")]);
        objects.put(ObjectKind::Secret, "ns", "db", &[("password", "hunter2")]);
        let p = pod(json!({"name": "app", "image": "busybox",
        "resources": {"limits": {"memory": "128Mi"}},
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "APP_"}],
        "env": [
            {"name": "APP_MODE", "value": "slow"},
            {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
            {"name": "MSG", "value": "$(APP_LEVEL)-$(PASS)"},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "none", "key": "k", "optional": true}}}
        ]}));
        let env = env_of(&objects, &p).await.unwrap();
        assert_eq!(
            env,
            pairs(&[
                ("HOSTNAME", "web"),
                ("APP_LEVEL", "debug"),
                ("APP_MODE", "slow"),
                ("PASS", "hunter2"),
                ("MSG", "debug-hunter2"),
                ("MEM", "128"),
                ("NS", "ns"),
            ])
        );
    }

    #[test]
    fn service_links_name_the_apiserver_always_and_the_pods_namespace_when_enabled() {
        let svc = |name: &str, ip: &str| ServiceAddress {
            name: name.into(),
            cluster_ip: ip.into(),
            ports: vec![ServicePort { name: String::new(), port: 80, protocol: "TCP".into() }],
        };
        let in_default = [svc("kubernetes", "10.96.0.1"), svc("web", "10.96.0.2")];
        let in_own = [svc("redis-main", "10.96.0.3"), svc("kubernetes", "10.96.0.9")];
        let names = |v: Vec<ServiceAddress>| v.into_iter().map(|s| (s.name, s.cluster_ip)).collect::<Vec<_>>();
        let pairs = |v: &[(&str, &str)]| v.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect::<Vec<_>>();
        assert_eq!(names(linked_services(&in_default, &in_own, false)), pairs(&[("kubernetes", "10.96.0.1")]));
        assert_eq!(
            names(linked_services(&in_default, &in_own, true)),
            pairs(&[("kubernetes", "10.96.0.9"), ("redis-main", "10.96.0.3")]),
            "the pod's namespace's own `kubernetes` wins"
        );
        assert_eq!(
            names(linked_services(&in_default, &in_default, true)),
            pairs(&[("kubernetes", "10.96.0.1"), ("web", "10.96.0.2")])
        );
        let vars = service_vars(&linked_services(&in_default, &in_own, true));
        assert!(vars.contains(&("REDIS_MAIN_SERVICE_HOST".to_owned(), "10.96.0.3".to_owned())), "{vars:?}");
    }

    #[test]
    fn the_apiserver_service_gives_the_variables_in_cluster_clients_read() {
        let master = ServiceAddress {
            name: "kubernetes".into(),
            cluster_ip: "10.96.0.1".into(),
            ports: vec![ServicePort { name: "https".into(), port: 443, protocol: "TCP".into() }],
        };
        let headless = ServiceAddress { name: "db".into(), cluster_ip: "None".into(), ..master.clone() };
        let vars = service_vars(&[master, headless]);
        assert_eq!(
            vars,
            pairs(&[
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
                ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
                ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
                ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
                ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
                ("KUBERNETES_PORT_443_TCP_PORT", "443"),
                ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ])
        );
        // The container's own variables come after them, may replace them and read them.
        let p = pod(json!({"name": "app", "env": [
            {"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let node = Resources::default();
        let env = container_env(&p, c, PodIps::default(), &node, None, &vars).unwrap().vars;
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("API"), Some("https://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("6443"));
        assert_eq!(env[0].0, "HOSTNAME");
    }

    #[tokio::test]
    async fn missing_objects_and_keys_are_the_kubelets_errors() {
        let objects = MemObjects::default();
        objects.put(ObjectKind::ConfigMap, "ns", "cfg", &[("a", "1")]);
        let env = |from: serde_json::Value| pod(json!({"name": "app", "env": [{"name": "X", "valueFrom": from}]}));
        let missing = env(json!({"configMapKeyRef": {"name": "gone", "key": "a"}}));
        assert_eq!(env_of(&objects, &missing).await.unwrap_err(), "configmap \"gone\" not found");
        let key = env(json!({"configMapKeyRef": {"name": "cfg", "key": "b"}}));
        assert_eq!(env_of(&objects, &key).await.unwrap_err(), "couldn't find key b in ConfigMap ns/cfg");
        let optional_key = env(json!({"configMapKeyRef": {"name": "cfg", "key": "b", "optional": true}}));
        assert_eq!(env_of(&objects, &optional_key).await.unwrap(), pairs(&[("HOSTNAME", "web")]));
        let secret = env(json!({"secretKeyRef": {"name": "s", "key": "a"}}));
        assert_eq!(env_of(&objects, &secret).await.unwrap_err(), "secret \"s\" not found");
        let from = pod(json!({"name": "app", "envFrom": [{"secretRef": {"name": "s"}}]}));
        assert_eq!(env_of(&objects, &from).await.unwrap_err(), "secret \"s\" not found");
        assert_eq!(env_of(&NoObjects, &key).await.unwrap_err(), "couldn't get configMap ns/cfg, no kubeClient defined");
    }
}
