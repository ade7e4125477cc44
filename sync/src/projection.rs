//! What the API-object volumes hold (`configMap`, `secret`, `downwardAPI`, `projected` with a service account
//! token), in the kubelet's words where something is missing, and the downward API's values shared with the
//! environment. The files are written by [`crate::atomic_writer`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, ResourceFieldSelector, Volume};
use nodewarden_resources::{Resources, parse_millicores, parse_non_negative};

use crate::atomic_writer::FileProjection;
use crate::objects::{Fetched, ObjectData, ObjectKind, TokenAsk};

/// A volume's files by path.
pub(crate) type Payload = BTreeMap<String, FileProjection>;

/// The mode of a projected file when none is given: `0644`.
pub(crate) const DEFAULT_MODE: u32 = 0o644;
/// A projected service account token's lifetime when none is given (the API's default).
pub(crate) const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// Whether a volume is one of the kinds written from API objects and the pod itself.
pub(crate) fn is_projected(v: &Volume) -> bool {
    v.config_map.is_some() || v.secret.is_some() || v.downward_api.is_some() || v.projected.is_some()
}

/// Whether a volume of this kind is kept in memory (a tmpfs), as the kubelet keeps secrets and tokens.
pub(crate) fn in_memory(v: &Volume) -> bool {
    v.secret.is_some() || v.projected.is_some()
}

/// The directory plugin name the kubelet keeps a volume of this kind under.
pub(crate) fn plugin_dir(v: &Volume) -> &'static str {
    if v.config_map.is_some() {
        "kubernetes.io~configmap"
    } else if v.secret.is_some() {
        "kubernetes.io~secret"
    } else if v.downward_api.is_some() {
        "kubernetes.io~downward-api"
    } else if v.projected.is_some() {
        "kubernetes.io~projected"
    } else {
        "kubernetes.io~empty-dir"
    }
}

fn mode(m: Option<i32>, default: u32) -> u32 {
    m.and_then(|m| u32::try_from(m).ok()).map_or(default, |m| m & 0o7777)
}

/// A ConfigMap's or Secret's keys as files: all keys, or the `items` asked for (a missing key is an error unless
/// the source is optional, in the kubelet's words).
fn object_payload(
    kind: ObjectKind,
    object: &ObjectData,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    out: &mut Payload,
) -> Result<(), String> {
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in &object.data {
                out.insert(k.clone(), FileProjection::new(v.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                let Some(data) = object.data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(match kind {
                        ObjectKind::ConfigMap => format!("configmap references non-existent config key: {}", item.key),
                        ObjectKind::Secret => format!("references non-existent secret key: {}", item.key),
                    });
                };
                out.insert(item.path.clone(), FileProjection::new(data.clone(), mode(item.mode, default_mode)));
            }
        }
    }
    Ok(())
}

/// The files of ConfigMap or Secret `name` into `out`; nothing when it is missing and `optional`.
async fn project_object(
    fetched: &mut Fetched<'_>,
    kind: ObjectKind,
    name: &str,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: Option<bool>,
    out: &mut Payload,
) -> Result<(), String> {
    let optional = optional.unwrap_or(false);
    match fetched.maybe(kind, name, optional).await? {
        Some(o) => object_payload(kind, &o, items, default_mode, optional, out),
        None => Ok(()),
    }
}

/// `metadata.labels` and `metadata.annotations` as files: one `key="value"` per line, sorted, as the kubelet
/// formats them.
fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    let mut lines = Vec::new();
    for (k, v) in m.into_iter().flatten() {
        let mut quoted = String::with_capacity(v.len() + 2);
        quoted.push('"');
        for ch in v.chars() {
            match ch {
                '"' => quoted.push_str("\\\""),
                '\\' => quoted.push_str("\\\\"),
                '\n' => quoted.push_str("\\n"),
                '\t' => quoted.push_str("\\t"),
                '\r' => quoted.push_str("\\r"),
                c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => quoted.push(c),
            }
        }
        quoted.push('"');
        lines.push(format!("{k}={quoted}"));
    }
    lines.join("\n")
}

/// A pod metadata field the downward API gives both volumes and the environment: its name, namespace, UID, and
/// one label or annotation (`metadata.labels['k']`); `None` for any other path.
pub(crate) fn metadata_field(pod: &Pod, path: &str) -> Option<String> {
    let m = &pod.metadata;
    let keyed = |prefix: &str, map: Option<&BTreeMap<String, String>>| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|l| l.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(m.name.clone().unwrap_or_default()),
        "metadata.namespace" => Some(m.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Some(m.uid.clone().unwrap_or_default()),
        _ => keyed("metadata.labels['", m.labels.as_ref())
            .or_else(|| keyed("metadata.annotations['", m.annotations.as_ref())),
    }
}

/// A downward API file's pod field: the metadata a volume may project, the whole label and annotation maps too.
fn volume_field(pod: &Pod, path: &str) -> Result<String, String> {
    let m = &pod.metadata;
    match path {
        "metadata.labels" => Ok(format_map(m.labels.as_ref())),
        "metadata.annotations" => Ok(format_map(m.annotations.as_ref())),
        other => metadata_field(pod, other).ok_or_else(|| format!("unsupported fieldPath: {other}")),
    }
}

/// A container resource as the downward API gives it (`resourceFieldRef`): the container's limit, the node's
/// allocatable where it sets none, or its request; divided by `divisor` and rounded up, as the kubelet does.
pub(crate) fn resource_value(
    pod: &Pod,
    container: &str,
    selector: &ResourceFieldSelector,
    node: &Resources,
) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or("pod has no spec")?;
    let c = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container)
        .ok_or_else(|| format!("container {container:?} not found in the pod"))?;
    let res = c.resources.as_ref();
    let (list, name) = match selector.resource.split_once('.') {
        Some(("limits", n)) => (res.and_then(|r| r.limits.as_ref()), n),
        Some(("requests", n)) => (res.and_then(|r| r.requests.as_ref()), n),
        _ => return Err(format!("unsupported container resource : {}", selector.resource)),
    };
    let set = list.and_then(|l| l.get(name)).map(|q| q.0.as_str());
    let limits = selector.resource.starts_with("limits.");
    let divisor = selector.divisor.as_ref().map(|q| q.0.as_str()).filter(|d| !d.is_empty());
    let ceil_div = |v: u64, d: u64| v.div_ceil(d.max(1)).to_string();
    match name {
        "cpu" => {
            let millis = match set {
                Some(q) => parse_millicores(q).map_err(|e| e.to_string())?,
                None if limits => node.cpu_millis,
                None => 0,
            };
            let d = divisor.map(parse_millicores).transpose().map_err(|e| e.to_string())?.unwrap_or(1000);
            Ok(ceil_div(millis, d))
        }
        "memory" | "ephemeral-storage" => {
            let bytes = match set {
                Some(q) => parse_non_negative(q).map_err(|e| e.to_string())?,
                None if limits && name == "memory" => node.memory,
                None if limits => node.ephemeral_storage,
                None => 0,
            };
            let d = divisor.map(parse_non_negative).transpose().map_err(|e| e.to_string())?.unwrap_or(1);
            Ok(ceil_div(bytes, d))
        }
        n if n.starts_with("hugepages-") => {
            let bytes = set.map(parse_non_negative).transpose().map_err(|e| e.to_string())?.unwrap_or(0);
            let d = divisor.map(parse_non_negative).transpose().map_err(|e| e.to_string())?.unwrap_or(1);
            Ok(ceil_div(bytes, d))
        }
        _ => Err(format!("unsupported container resource : {}", selector.resource)),
    }
}

fn downward_items(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    node: &Resources,
    out: &mut Payload,
) -> Result<(), String> {
    let mut errors = Vec::new();
    for item in items {
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), _) => volume_field(pod, &f.field_path),
            (None, Some(r)) => match r.container_name.as_deref().filter(|n| !n.is_empty()) {
                Some(c) => resource_value(pod, c, r, node),
                None => Err(format!("{}: resourceFieldRef needs a containerName in a volume", item.path)),
            },
            (None, None) => Err(format!("{}: neither fieldRef nor resourceFieldRef", item.path)),
        };
        match value {
            Ok(v) => {
                out.insert(item.path.clone(), FileProjection::new(v.into_bytes(), mode(item.mode, default_mode)));
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join(", ")) }
}

/// The files of volume `v` of `pod`, or `None` for a volume that is not written from objects (emptyDir,
/// hostPath). Errors are the kubelet's `MountVolume.SetUp` messages.
pub(crate) async fn volume_payload(
    v: &Volume,
    pod: &Pod,
    fetched: &mut Fetched<'_>,
    node: &Resources,
) -> Result<Option<Payload>, String> {
    let fs_group = nodewarden_runtime::security::fs_group(pod)?;
    let fs_user = nodewarden_runtime::security::fs_user(pod);
    let mut out = Payload::new();
    if let Some(cm) = &v.config_map {
        let m = mode(cm.default_mode, DEFAULT_MODE);
        project_object(fetched, ObjectKind::ConfigMap, &cm.name, cm.items.as_deref(), m, cm.optional, &mut out).await?;
    } else if let Some(s) = &v.secret {
        let (name, m) = (s.secret_name.as_deref().unwrap_or_default(), mode(s.default_mode, DEFAULT_MODE));
        project_object(fetched, ObjectKind::Secret, name, s.items.as_deref(), m, s.optional, &mut out).await?;
    } else if let Some(d) = &v.downward_api {
        downward_items(
            pod,
            d.items.as_deref().unwrap_or_default(),
            mode(d.default_mode, DEFAULT_MODE),
            node,
            &mut out,
        )?;
    } else if let Some(p) = &v.projected {
        let default_mode = mode(p.default_mode, DEFAULT_MODE);
        let mut errors = Vec::new();
        for source in p.sources.iter().flatten() {
            let done = if let Some(cm) = &source.config_map {
                let items = cm.items.as_deref();
                project_object(fetched, ObjectKind::ConfigMap, &cm.name, items, default_mode, cm.optional, &mut out)
                    .await
            } else if let Some(s) = &source.secret {
                let items = s.items.as_deref();
                project_object(fetched, ObjectKind::Secret, &s.name, items, default_mode, s.optional, &mut out).await
            } else if let Some(d) = &source.downward_api {
                downward_items(pod, d.items.as_deref().unwrap_or_default(), default_mode, node, &mut out)
            } else if let Some(t) = &source.service_account_token {
                let ask = token_ask(pod, t.audience.as_deref(), t.expiration_seconds);
                match fetched.port().token(&ask).await {
                    Ok(token) => {
                        // As the kubelet's: where the pod names a group or a user for its files, the token is
                        // theirs alone (0600, owned by the containers' common user).
                        let owned = fs_group.is_some() || fs_user.is_some();
                        let mut file =
                            FileProjection::new(token.token.into_bytes(), if owned { 0o600 } else { default_mode });
                        file.owner = fs_user;
                        out.insert(t.path.clone(), file);
                        Ok(())
                    }
                    Err(e) => Err(format!("failed to fetch token: {e}")),
                }
            } else {
                Err("projected volume source is not supported by nodewarden (clusterTrustBundle, podCertificate)"
                    .into())
            };
            if let Err(e) = done {
                errors.push(e);
            }
        }
        if !errors.is_empty() {
            return Err(errors.join(", "));
        }
    } else {
        return Ok(None);
    }
    // As the kubelet's ownership change of a read-only volume: the pod's `fsGroup` owns every file and can read it.
    if let Some(group) = fs_group {
        for file in out.values_mut() {
            file.mode |= 0o440;
            file.group = Some(group);
        }
    }
    Ok(Some(out))
}

/// The TokenRequest a projected `serviceAccountToken` source makes for `pod`.
pub(crate) fn token_ask(pod: &Pod, audience: Option<&str>, seconds: Option<i64>) -> TokenAsk {
    let spec = pod.spec.as_ref();
    TokenAsk {
        namespace: nodewarden_resources::pod::namespace(pod).to_owned(),
        service_account: spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into()),
        audience: audience.filter(|a| !a.is_empty()).map(str::to_owned),
        expiration_seconds: seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::MemObjects;
    use serde_json::json;

    fn pod(volumes: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"b": "2", "a": "x\"y"}},
            "spec": {"serviceAccountName": "robot", "containers": [{"name": "app", "image": "busybox",
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}}], "volumes": volumes}
        }))
        .unwrap()
    }

    fn node() -> Resources {
        Resources { cpu_millis: 2000, memory: 1 << 30, pids: 1000, ephemeral_storage: 10 << 30 }
    }

    fn text(p: &Payload, path: &str) -> (String, u32) {
        let f = &p[path];
        (String::from_utf8(f.data.clone()).unwrap(), f.mode)
    }

    async fn payload_of(objects: &MemObjects, p: &Pod) -> Result<Option<Payload>, String> {
        let mut fetched = Fetched::new(objects, "ns");
        volume_payload(&p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0], p, &mut fetched, &node()).await
    }

    #[tokio::test]
    async fn config_maps_and_secrets_project_all_keys_or_the_items_asked_for() {
        let objects = MemObjects::default();
        objects.put(ObjectKind::ConfigMap, "ns", "cfg", &[("a", "1"), ("b", "2")]);
        objects.put(ObjectKind::Secret, "ns", "s", &[("password", "hunter2")]);
        let all = pod(json!([{"name": "v", "configMap": {"name": "cfg"}}]));
        let p = payload_of(&objects, &all).await.unwrap().unwrap();
        assert_eq!(text(&p, "a"), ("1".into(), 0o644));
        assert_eq!(p.len(), 2);
        let items = pod(json!([{"name": "v", "configMap": {"name": "cfg", "defaultMode": 0o400,
            "items": [{"key": "b", "path": "dir/b.txt"}, {"key": "a", "path": "a", "mode": 0o600}]}}]));
        let p = payload_of(&objects, &items).await.unwrap().unwrap();
        assert_eq!(text(&p, "dir/b.txt"), ("2".into(), 0o400));
        assert_eq!(text(&p, "a"), ("1".into(), 0o600));
        let secret = pod(json!([{"name": "v", "secret": {"secretName": "s"}}]));
        assert_eq!(text(&payload_of(&objects, &secret).await.unwrap().unwrap(), "password").0, "hunter2");
    }

    #[tokio::test]
    async fn missing_objects_and_keys_fail_in_the_kubelets_words_unless_optional() {
        let objects = MemObjects::default();
        objects.put(ObjectKind::ConfigMap, "ns", "cfg", &[("a", "1")]);
        let missing = pod(json!([{"name": "v", "configMap": {"name": "nope"}}]));
        assert_eq!(payload_of(&objects, &missing).await.unwrap_err(), "configmap \"nope\" not found");
        let optional = pod(json!([{"name": "v", "configMap": {"name": "nope", "optional": true}}]));
        assert!(payload_of(&objects, &optional).await.unwrap().unwrap().is_empty());
        let key = pod(json!([{"name": "v", "configMap": {"name": "cfg", "items": [{"key": "zz", "path": "z"}]}}]));
        assert_eq!(payload_of(&objects, &key).await.unwrap_err(), "configmap references non-existent config key: zz");
        let secret = pod(json!([{"name": "v", "secret": {"secretName": "gone"}}]));
        assert_eq!(payload_of(&objects, &secret).await.unwrap_err(), "secret \"gone\" not found");
        let skey = pod(json!([{"name": "v", "projected": {"sources": [
            {"secret": {"name": "cfg", "items": [{"key": "k", "path": "k"}]}}]}}]));
        assert_eq!(payload_of(&objects, &skey).await.unwrap_err(), "secret \"cfg\" not found");
    }

    #[tokio::test]
    async fn the_service_account_volume_has_its_token_ca_and_namespace() {
        let objects = MemObjects::default();
        objects.put(ObjectKind::ConfigMap, "ns", "kube-root-ca.crt", &[("ca.crt", "PEM")]);
        let p = pod(json!([{"name": "kube-api-access-abcde", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}}]));
        let got = payload_of(&objects, &p).await.unwrap().unwrap();
        assert_eq!(text(&got, "token"), ("token-robot-1".into(), 0o644));
        assert_eq!(text(&got, "ca.crt").0, "PEM");
        assert_eq!(text(&got, "namespace").0, "ns");
        let asked = objects.tokens.lock().unwrap()[0].clone();
        assert_eq!((asked.expiration_seconds, asked.pod_uid.as_str(), asked.audience), (3607, "u1", None));

        // A pod with an fsGroup and one user for all its containers: the group reads every file, and the token is
        // the user's alone (0600 plus the group's read), as the kubelet writes it.
        let mut owned = p.clone();
        let spec = owned.spec.as_mut().unwrap();
        spec.security_context = Some(serde_json::from_value(json!({"fsGroup": 2000, "runAsUser": 1000})).unwrap());
        let got = payload_of(&objects, &owned).await.unwrap().unwrap();
        let token = &got["token"];
        assert_eq!((token.mode, token.owner, token.group), (0o640, Some(1000), Some(2000)));
        let ca = &got["ca.crt"];
        assert_eq!((ca.mode, ca.owner, ca.group), (0o644, None, Some(2000)));
        let secret = pod(json!([{"name": "v", "secret": {"secretName": "s", "defaultMode": 0o400}}]));
        objects.put(ObjectKind::Secret, "ns", "s", &[("k", "v")]);
        let mut grouped = secret.clone();
        grouped.spec.as_mut().unwrap().security_context = Some(serde_json::from_value(json!({"fsGroup": 7})).unwrap());
        assert_eq!(payload_of(&objects, &secret).await.unwrap().unwrap()["k"].mode, 0o400);
        let k = &payload_of(&objects, &grouped).await.unwrap().unwrap()["k"];
        assert_eq!((k.mode, k.owner, k.group), (0o440, None, Some(7)), "a 0400 Secret readable by the fsGroup");
    }

    #[tokio::test]
    async fn downward_api_files_format_maps_and_resources_as_the_kubelet() {
        let objects = MemObjects::default();
        let p = pod(json!([{"name": "v", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}},
            {"path": "req", "resourceFieldRef": {"containerName": "app", "resource": "requests.cpu", "divisor": "1m"}}
        ]}}]));
        let got = payload_of(&objects, &p).await.unwrap().unwrap();
        assert_eq!(text(&got, "labels").0, "a=\"x\\\"y\"\nb=\"2\"");
        assert_eq!(text(&got, "mem").0, "64");
        // No CPU limit: the node's allocatable, in whole cores rounded up.
        assert_eq!(text(&got, "cpu").0, "2");
        assert_eq!(text(&got, "req").0, "250");
        let bad = pod(json!([{"name": "v", "downwardAPI": {"items": [
            {"path": "x", "fieldRef": {"fieldPath": "status.podIP"}}]}}]));
        assert_eq!(payload_of(&objects, &bad).await.unwrap_err(), "unsupported fieldPath: status.podIP");
    }

    #[tokio::test]
    async fn a_node_in_no_cluster_says_so() {
        let p = pod(json!([{"name": "v", "configMap": {"name": "cfg"}}]));
        let mut fetched = Fetched::new(&crate::objects::NoObjects, "ns");
        let v = &p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
        let err = volume_payload(v, &p, &mut fetched, &node()).await.unwrap_err();
        assert_eq!(err, "couldn't get configMap ns/cfg, no kubeClient defined");
        let empty = pod(json!([{"name": "v", "emptyDir": {}}]));
        let v = &empty.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
        assert_eq!(volume_payload(v, &empty, &mut fetched, &node()).await, Ok(None));
    }
}
