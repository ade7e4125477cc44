//! Static pod manifests: parsing a YAML or JSON `v1.Pod`, checking what nodewarden relies on, and the defaults the
//! kubelet gives a static pod (a UID derived from the content, the node name appended to the pod name).

use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use nodewarden_resources::{PodResources, validate_container_name, validate_pod_uid};
use sha2::{Digest, Sha256};

/// The largest manifest read. The kubelet reads files of any size; a pod spec larger than this is a mistake.
pub const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// The annotation that holds a static pod's content hash, as the kubelet sets it.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
use nodewarden_resources::BoundedReadError;
pub use nodewarden_resources::CONFIG_SOURCE_ANNOTATION;

/// Why a manifest was refused. The message is shown in the log and in the pod's `/pods` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The file cannot be read.
    #[error("cannot read the manifest: {0}")]
    Read(String),
    /// The file is larger than [`MAX_MANIFEST_BYTES`].
    #[error("the manifest is {size} bytes; the limit is {max} bytes")]
    TooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The file is empty.
    #[error("the manifest is empty")]
    Empty,
    /// Not YAML or JSON.
    #[error("not valid YAML or JSON: {0}")]
    Syntax(String),
    /// Some other object than a `v1` `Pod`.
    #[error("not a Pod: apiVersion {api_version:?}, kind {kind:?} (expected apiVersion v1, kind Pod)")]
    NotAPod {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
    /// A field does not fit the Pod schema.
    #[error("{path}: {message}")]
    Schema {
        /// The field.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A Pod that Kubernetes would refuse, or that nodewarden cannot run.
    #[error("{field}: {message}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ManifestError {
    ManifestError::Invalid { field: field.into(), message: message.into() }
}

/// Reads a manifest file, refusing large ones before reading them.
pub fn read_manifest(path: &Path) -> Result<Vec<u8>, ManifestError> {
    nodewarden_resources::read_bounded(path, MAX_MANIFEST_BYTES).map_err(|e| match e {
        BoundedReadError::Io(e) => ManifestError::Read(e),
        BoundedReadError::TooLarge { size, max } => ManifestError::TooLarge { size, max },
    })
}

/// Parses and checks a static pod manifest and applies the kubelet's static pod defaults: namespace `default`,
/// name `<name>-<node>`, `spec.nodeName`, and, when the manifest has no UID, one derived from the manifest's
/// content, the node and the file, so that an edit makes a new pod and an unchanged file keeps its pod.
pub fn parse_static_pod(bytes: &[u8], source: &Path, node_name: &str) -> Result<Pod, ManifestError> {
    static_pod(manifest_value(bytes)?, source, node_name, crate::FILE_SOURCE)
}

/// A manifest's text as a value: JSON is YAML, so one parser reads both. Going through a value first lets the kind
/// be checked before the Pod schema, which gives a better message for a Deployment dropped into the directory.
fn manifest_value(bytes: &[u8]) -> Result<serde_json::Value, ManifestError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ManifestError::Syntax(format!("not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(ManifestError::Empty);
    }
    serde_saphyr::from_str(text).map_err(|e| ManifestError::Syntax(e.to_string()))
}

/// [`parse_static_pod`] of a manifest read already, for source `source_name`.
fn static_pod(
    value: serde_json::Value,
    source: &Path,
    node_name: &str,
    source_name: &str,
) -> Result<Pod, ManifestError> {
    let field = |k: &str| value.get(k).and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version != "v1" || kind != "Pod" {
        return Err(ManifestError::NotAPod { api_version, kind });
    }
    let mut pod: Pod = serde_path_to_error::deserialize(&value)
        .map_err(|e| ManifestError::Schema { path: e.path().to_string(), message: e.inner().to_string() })?;
    validate(&pod)?;

    let meta = &mut pod.metadata;
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".into());
    }
    let name = meta.name.clone().unwrap_or_default();
    meta.name = Some(format!("{name}-{node_name}"));
    let uid = match meta.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => content_uid(&value, source, node_name),
    };
    meta.uid = Some(uid.clone());
    let annotations = meta.annotations.get_or_insert_default();
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), uid);
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), source_name.into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node_name.to_owned());
    }
    Ok(pod)
}

/// The name of `staticPodURL` as a source (the `kubernetes.io/config.source` of its pods).
pub const HTTP_SOURCE: &str = "http";

/// Parses what `staticPodURL` served: a pod manifest or a `v1.PodList` (YAML or JSON), each pod a static pod of
/// `url` as [`parse_static_pod`] makes one (its UID from its content, the node and the URL), marked
/// `kubernetes.io/config.source: http`. An empty answer is no pods; one invalid pod refuses the whole answer, as
/// the kubelet refuses it (the set served before stands).
pub fn parse_url_pods(bytes: &[u8], url: &str, node_name: &str) -> Result<Vec<Pod>, ManifestError> {
    let value = match manifest_value(bytes) {
        Err(ManifestError::Empty) => return Ok(Vec::new()),
        v => v?,
    };
    let source = Path::new(url);
    let pods = if value.get("kind").and_then(serde_json::Value::as_str) == Some("PodList") {
        let items = value.get("items").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
        let mut pods = Vec::with_capacity(items.len());
        for (i, mut item) in items.into_iter().enumerate() {
            // A list's items often leave out their apiVersion and kind.
            if let Some(o) = item.as_object_mut() {
                o.entry("apiVersion").or_insert_with(|| "v1".into());
                o.entry("kind").or_insert_with(|| "Pod".into());
            }
            let pod = static_pod(item, source, node_name, HTTP_SOURCE)
                .map_err(|e| invalid(format!("items[{i}]"), e.to_string()))?;
            pods.push(pod);
        }
        pods
    } else {
        vec![static_pod(value, source, node_name, HTTP_SOURCE)?]
    };
    let mut names = BTreeSet::new();
    if let Some(dup) = pods.iter().filter_map(|p| p.metadata.name.as_deref()).find(|n| !names.insert(*n)) {
        return Err(invalid("items", format!("two pods named {dup:?}")));
    }
    Ok(pods)
}

/// A static pod's UID: a hash of the manifest's content (not its formatting), the node and the file, as the
/// kubelet derives one, in the 32 hex digits of the kubelet's.
fn content_uid(value: &serde_json::Value, source: &Path, node_name: &str) -> String {
    let mut h = Sha256::new();
    // serde_json's Value keeps object keys sorted, so this text is canonical.
    h.update(value.to_string().as_bytes());
    h.update(format!("host:{node_name}").as_bytes());
    h.update(format!("file:{}", source.display()).as_bytes());
    h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Checks a pod from the apiserver (which validated it already) for what nodewarden builds paths, cgroups and
/// requests from: its UID (required), names, containers, probes and resources. Its volumes' kinds are not
/// checked here: a volume nodewarden cannot make fails the pod's mount (`FailedMount`), as on a kubelet.
pub fn check_api_pod(pod: &Pod) -> Result<(), ManifestError> {
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        return Err(invalid("metadata.uid", "required"));
    }
    validate_common(pod)
}

/// The checks Kubernetes' API validation makes that nodewarden depends on, for a manifest.
fn validate(pod: &Pod) -> Result<(), ManifestError> {
    validate_common(pod)?;
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        crate::volumes::VolumeSource::from_volume(v).map_err(|m| invalid(format!("spec.volumes[{}]", v.name), m))?;
    }
    Ok(())
}

/// The checks of both a manifest and a pod from the apiserver.
fn validate_common(pod: &Pod) -> Result<(), ManifestError> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if !is_dns_subdomain(name) {
        return Err(invalid(
            "metadata.name",
            format!("{name:?} is not a DNS subdomain (lower case a-z, 0-9, '-', '.')"),
        ));
    }
    if let Some(ns) = pod.metadata.namespace.as_deref().filter(|n| !n.is_empty())
        && !is_dns_label(ns)
    {
        return Err(invalid("metadata.namespace", format!("{ns:?} is not a DNS label")));
    }
    if let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
        validate_pod_uid(uid).map_err(|e| invalid("metadata.uid", e.to_string()))?;
    }
    let spec = pod.spec.as_ref().ok_or_else(|| invalid("spec", "required"))?;
    if spec.containers.is_empty() {
        return Err(invalid("spec.containers", "at least one container is required"));
    }
    let mut names = BTreeSet::new();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("spec.initContainers", c))
        .chain(spec.containers.iter().map(|c| ("spec.containers", c)));
    let volumes: BTreeSet<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    for (list, c) in all {
        let at = format!("{list}[{}]", c.name);
        if !is_dns_label(&c.name) {
            return Err(invalid(format!("{at}.name"), "a container name must be a DNS label (a-z, 0-9, '-')"));
        }
        validate_container_name(&c.name).map_err(|e| invalid(format!("{at}.name"), e.to_string()))?;
        if !names.insert(c.name.as_str()) {
            return Err(invalid(format!("{at}.name"), format!("duplicate container name {:?}", c.name)));
        }
        if c.image.as_deref().is_none_or(str::is_empty) {
            return Err(invalid(format!("{at}.image"), "required"));
        }
        validate_container(c, &at, &volumes)?;
    }
    let mut seen = BTreeSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if !is_dns_label(&v.name) || !seen.insert(v.name.as_str()) {
            return Err(invalid(format!("spec.volumes[{i}].name"), format!("{:?} is not a unique DNS label", v.name)));
        }
    }
    match spec.restart_policy.as_deref() {
        None | Some("Always" | "OnFailure" | "Never") => {}
        Some(other) => {
            return Err(invalid("spec.restartPolicy", format!("{other:?}: must be Always, OnFailure or Never")));
        }
    }
    if spec.termination_grace_period_seconds.is_some_and(|g| g < 0) {
        return Err(invalid("spec.terminationGracePeriodSeconds", "must not be negative"));
    }
    PodResources::from_pod(pod).map_err(|e| invalid("spec", e.to_string()))?;
    Ok(())
}

fn validate_container(c: &Container, at: &str, volumes: &BTreeSet<&str>) -> Result<(), ManifestError> {
    for m in c.volume_mounts.iter().flatten() {
        if !volumes.contains(m.name.as_str()) {
            return Err(invalid(format!("{at}.volumeMounts[{}]", m.name), "no volume of that name"));
        }
        if !m.mount_path.starts_with('/') {
            return Err(invalid(format!("{at}.volumeMounts[{}].mountPath", m.name), "must be an absolute path"));
        }
    }
    for (kind, probe) in [("livenessProbe", &c.liveness_probe), ("readinessProbe", &c.readiness_probe)]
        .into_iter()
        .chain([("startupProbe", &c.startup_probe)])
    {
        if let Some(p) = probe {
            validate_probe(p, &format!("{at}.{kind}"))?;
        }
    }
    Ok(())
}

fn validate_probe(p: &Probe, at: &str) -> Result<(), ManifestError> {
    let handlers = [p.exec.is_some(), p.http_get.is_some(), p.tcp_socket.is_some(), p.grpc.is_some()];
    if handlers.iter().filter(|h| **h).count() != 1 {
        return Err(invalid(at, "exactly one of exec, httpGet, tcpSocket or grpc is required"));
    }
    if p.grpc.is_some() {
        return Err(invalid(format!("{at}.grpc"), "gRPC probes are not supported by nodewarden"));
    }
    for (field, v) in [
        ("initialDelaySeconds", p.initial_delay_seconds),
        ("periodSeconds", p.period_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        if v.is_some_and(|v| v < 0) {
            return Err(invalid(format!("{at}.{field}"), "must not be negative"));
        }
    }
    // The path and header values go into the request as they are: a CR or LF would end a line and let the
    // manifest write its own headers or a second request.
    if let Some(h) = &p.http_get {
        let control = |s: &str| s.chars().any(char::is_control);
        if h.path.as_deref().is_some_and(control) {
            return Err(invalid(format!("{at}.httpGet.path"), "must not contain control characters (CR, LF)"));
        }
        for header in h.http_headers.iter().flatten() {
            if control(&header.name) || control(&header.value) || header.name.contains(':') {
                return Err(invalid(
                    format!("{at}.httpGet.httpHeaders[{}]", header.name.escape_debug()),
                    "a header name or value must not contain control characters (CR, LF), nor a name ':'",
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
