//! The resources served and how a request path names one of them.

/// A resource type the test apiserver serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// The API group (`""` for core).
    pub group: &'static str,
    /// The version.
    pub version: &'static str,
    /// The plural name in paths.
    pub plural: &'static str,
    /// The object kind.
    pub kind: &'static str,
    /// True for namespaced resources.
    pub namespaced: bool,
    /// The subresources served (`status`, `binding`, `eviction`, `token`).
    pub subresources: &'static [&'static str],
    /// Short names kubectl may use.
    pub short: &'static [&'static str],
}

impl Resource {
    /// True when `sub` is a subresource of this resource.
    pub fn serves(&self, sub: &str) -> bool {
        self.subresources.contains(&sub)
    }

    /// True when the resource has a `status` subresource (and so its main resource leaves the status alone).
    pub fn has_status(&self) -> bool {
        self.serves("status")
    }

    /// `v1` or `group/version`, as objects carry it in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_owned() } else { format!("{}/{}", self.group, self.version) }
    }
}

/// A core (`v1`) resource.
const fn core(
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
    short: &'static [&'static str],
) -> Resource {
    Resource { group: "", version: "v1", plural, kind, namespaced, subresources, short }
}

/// Every resource served.
pub const RESOURCES: &[Resource] = &[
    core("nodes", "Node", false, &["status"], &["no"]),
    core("pods", "Pod", true, &["status", "binding", "eviction"], &["po"]),
    core("events", "Event", true, &[], &["ev"]),
    core("namespaces", "Namespace", false, &["status"], &["ns"]),
    core("configmaps", "ConfigMap", true, &[], &["cm"]),
    core("secrets", "Secret", true, &[], &[]),
    core("serviceaccounts", "ServiceAccount", true, &["token"], &["sa"]),
    core("services", "Service", true, &["status"], &["svc"]),
    Resource {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        subresources: &[],
        short: &[],
    },
    Resource {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        kind: "Event",
        namespaced: true,
        subresources: &[],
        short: &["ev"],
    },
];

/// A request path resolved against [`RESOURCES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The resource type.
    pub resource: Resource,
    /// The namespace in the path, if any (a namespaced resource without one is a list across namespaces).
    pub namespace: Option<String>,
    /// The object's name, if the path names one.
    pub name: Option<String>,
    /// The subresource (`status`, `eviction`), if any.
    pub subresource: Option<String>,
}

/// Resolves `/api/v1/...` or `/apis/<group>/<version>/...`; `None` if the path names no served resource.
pub fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => (Some((*ns).to_owned()), [&[*plural][..], tail].concat()),
        other => (None, other.to_vec()),
    };
    let (plural, tail) = rest.split_first()?;
    let resource = *RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == *plural)?;
    let (namespace, name, subresource) = match (resource.namespaced, namespace, tail) {
        (_, None, []) => (None, None, None),
        (false, None, [name]) => (None, Some((*name).to_owned()), None),
        (false, None, [name, sub]) => (None, Some((*name).to_owned()), Some((*sub).to_owned())),
        (true, Some(ns), []) => (Some(ns), None, None),
        (true, Some(ns), [name]) => (Some(ns), Some((*name).to_owned()), None),
        (true, Some(ns), [name, sub]) => (Some(ns), Some((*name).to_owned()), Some((*sub).to_owned())),
        _ => return None,
    };
    Some(Target { resource, namespace, name, subresource })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_resources() {
        let t = parse("/api/v1/nodes/n1/status").unwrap();
        assert_eq!(
            (t.resource.kind, t.name.as_deref(), t.subresource.as_deref()),
            ("Node", Some("n1"), Some("status"))
        );
        let t = parse("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1").unwrap();
        assert_eq!(
            (t.resource.kind, t.namespace.as_deref(), t.name.as_deref()),
            ("Lease", Some("kube-node-lease"), Some("n1"))
        );
        let t = parse("/api/v1/pods").unwrap();
        assert_eq!((t.resource.kind, t.namespace, t.name), ("Pod", None, None));
        assert!(parse("/api/v1/nodes/a/b/c").is_none());
        assert!(parse("/api/v1/widgets").is_none());
        // A namespaced resource named without its namespace is not served.
        assert!(parse("/api/v1/pods/p").is_none());
        let t = parse("/api/v1/namespaces/default").unwrap();
        assert_eq!((t.resource.kind, t.name.as_deref()), ("Namespace", Some("default")));
    }
}
