//! The discovery documents kubectl reads before anything else, and the Tables it asks for when printing.

use serde_json::{Value, json};

use crate::route::{RESOURCES, Resource};

/// The Kubernetes version the test apiserver claims.
pub const VERSION: (&str, &str) = ("1", "34");

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": VERSION.0, "minor": VERSION.1, "gitVersion": format!("v{}.{}.0", VERSION.0, VERSION.1),
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
}

fn groups() -> Vec<&'static str> {
    let mut g: Vec<&str> = RESOURCES.iter().map(|r| r.group).filter(|g| !g.is_empty()).collect();
    g.dedup();
    g
}

/// `/apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = groups()
        .into_iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>` for a served group.
pub fn group(name: &str) -> Option<Value> {
    groups().contains(&name).then(|| {
        let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [gv.clone()], "preferredVersion": gv})
    })
}

fn singular(r: &Resource) -> String {
    r.kind.to_lowercase()
}

/// `/api/v1` or `/apis/<group>/<version>`: the resources of one group version, with their subresources.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let served: Vec<&Resource> = RESOURCES.iter().filter(|r| r.group == group && r.version == version).collect();
    if served.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in served {
        resources.push(json!({
            "name": r.plural, "singularName": singular(r), "namespaced": r.namespaced, "kind": r.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "shortNames": r.short,
        }));
        for sub in r.subresources {
            let (kind, group, verbs): (&str, &str, &[&str]) = match *sub {
                "status" => (r.kind, "", &["get", "patch", "update"]),
                "binding" => ("Binding", "", &["create"]),
                "eviction" => ("Eviction", "policy", &["create"]),
                "token" => ("TokenRequest", "authentication.k8s.io", &["create"]),
                _ => continue,
            };
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": kind, "verbs": verbs,
            });
            if !group.is_empty() {
                entry["group"] = json!(group);
                entry["version"] = json!("v1");
            }
            resources.push(entry);
        }
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

/// True when the client asked for a `meta.k8s.io` Table (as `kubectl get` does).
pub fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

fn age(object: &Value) -> String {
    since(&object["metadata"]["creationTimestamp"])
}

/// How long ago the timestamp `t` was, as kubectl shows ages (`45s`, `3m`, `2h`, `5d`).
fn since(t: &Value) -> String {
    let Some(created) = t.as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now() - created).get_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// What `kubectl get nodes` shows in STATUS: Ready, NotReady or Unknown, with SchedulingDisabled.
fn node_status(node: &Value) -> String {
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    let mut s = match ready {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if node["spec"]["unschedulable"] == true {
        s.push_str(",SchedulingDisabled");
    }
    s
}

fn node_roles(node: &Value) -> String {
    let mut roles: Vec<&str> = node["metadata"]["labels"]
        .as_object()
        .map(|l| l.keys().filter_map(|k| k.strip_prefix("node-role.kubernetes.io/")).collect())
        .unwrap_or_default();
    roles.sort_unstable();
    if roles.is_empty() { "<none>".into() } else { roles.join(",") }
}

/// The node's first address of `kind`, or `<none>`.
fn address(node: &Value, kind: &str) -> String {
    node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == kind))
        .and_then(|a| a["address"].as_str())
        .unwrap_or("<none>")
        .to_owned()
}

/// What `kubectl get pods` shows in STATUS: the pod's reason (`Evicted`), else a container's waiting or
/// terminated reason, else the phase; `Terminating` once deletion is asked.
fn pod_status(pod: &Value) -> String {
    let status = &pod["status"];
    let mut shown = status["reason"].as_str().or_else(|| status["phase"].as_str()).unwrap_or("Pending").to_owned();
    for c in status["containerStatuses"].as_array().into_iter().flatten() {
        let state = &c["state"];
        if let Some(r) = state["waiting"]["reason"].as_str().filter(|r| !r.is_empty()) {
            shown = r.to_owned();
        } else if let Some(r) = state["terminated"]["reason"].as_str().filter(|r| !r.is_empty()) {
            shown = r.to_owned();
        }
    }
    if pod["metadata"]["deletionTimestamp"].is_string() && status["reason"] != "NodeLost" {
        shown = "Terminating".to_owned();
    }
    shown
}

/// How a Table's cells are read off an object.
type Cells = Box<dyn Fn(&Value) -> Vec<Value>>;

/// A Table of `items` for `r` (NAME and AGE, plus the columns `kubectl get` shows for nodes, pods, events and
/// leases).
pub fn table(r: &Resource, items: &[Value], rv: u64) -> Value {
    let col = |name: &str, ty: &str| json!({"name": name, "type": ty, "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": 0});
    // Columns `kubectl get -o wide` adds.
    let wide = |name: &str| json!({"name": name, "type": "string", "format": "", "description": "", "priority": 1});
    let (columns, cells): (Vec<Value>, Cells) = match r.kind {
        "Node" => (
            vec![
                col("Name", "string"),
                col("Status", "string"),
                col("Roles", "string"),
                col("Age", "string"),
                col("Version", "string"),
                wide("Internal-IP"),
                wide("External-IP"),
                wide("OS-Image"),
                wide("Kernel-Version"),
                wide("Container-Runtime"),
            ],
            Box::new(|n: &Value| {
                let info = &n["status"]["nodeInfo"];
                vec![
                    n["metadata"]["name"].clone(),
                    json!(node_status(n)),
                    json!(node_roles(n)),
                    json!(age(n)),
                    info["kubeletVersion"].clone(),
                    json!(address(n, "InternalIP")),
                    json!(address(n, "ExternalIP")),
                    info["osImage"].clone(),
                    info["kernelVersion"].clone(),
                    info["containerRuntimeVersion"].clone(),
                ]
            }),
        ),
        "Pod" => (
            vec![
                col("Name", "string"),
                col("Ready", "string"),
                col("Status", "string"),
                col("Restarts", "string"),
                col("Age", "string"),
                wide("IP"),
                wide("Node"),
                wide("Nominated Node"),
                wide("Readiness Gates"),
            ],
            Box::new(|p: &Value| {
                let statuses = p["status"]["containerStatuses"].as_array().cloned().unwrap_or_default();
                let total = p["spec"]["containers"].as_array().map_or(0, Vec::len);
                let ready = statuses.iter().filter(|c| c["ready"] == true).count();
                let restarts: i64 = statuses.iter().filter_map(|c| c["restartCount"].as_i64()).sum();
                let or_none = |v: &Value| v.as_str().filter(|s| !s.is_empty()).unwrap_or("<none>").to_owned();
                vec![
                    p["metadata"]["name"].clone(),
                    json!(format!("{ready}/{total}")),
                    json!(pod_status(p)),
                    json!(restarts.to_string()),
                    json!(age(p)),
                    json!(or_none(&p["status"]["podIP"])),
                    json!(or_none(&p["spec"]["nodeName"])),
                    json!(or_none(&p["status"]["nominatedNodeName"])),
                    json!("<none>"),
                ]
            }),
        ),
        // The core group's Event, as the apiserver prints it for `kubectl get events`.
        "Event" if r.group.is_empty() => (
            vec![
                col("Last Seen", "string"),
                col("Type", "string"),
                col("Reason", "string"),
                col("Object", "string"),
                wide("Subobject"),
                wide("Source"),
                col("Message", "string"),
                wide("First Seen"),
                wide("Count"),
                wide("Name"),
            ],
            Box::new(|e: &Value| {
                let last = [&e["lastTimestamp"], &e["eventTime"], &e["metadata"]["creationTimestamp"]]
                    .into_iter()
                    .find(|t| t.is_string())
                    .map_or_else(|| "<unknown>".to_owned(), since);
                let first = since(&e["firstTimestamp"]);
                let count = e["count"].as_i64().unwrap_or(0);
                let last_seen = if count > 1 { format!("{last} (x{count} over {first})") } else { last };
                let o = &e["involvedObject"];
                let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
                let object = format!("{}/{}", text(&o["kind"]).to_lowercase(), text(&o["name"]));
                let source = match (text(&e["source"]["component"]), text(&e["source"]["host"])) {
                    (c, h) if h.is_empty() => c,
                    (c, h) => format!("{c}, {h}"),
                };
                vec![
                    json!(last_seen),
                    e["type"].clone(),
                    e["reason"].clone(),
                    json!(object),
                    json!(text(&o["fieldPath"])),
                    json!(source),
                    json!(text(&e["message"]).trim()),
                    json!(first),
                    json!(count.to_string()),
                    e["metadata"]["name"].clone(),
                ]
            }),
        ),
        "Lease" => (
            vec![col("Name", "string"), col("Holder", "string"), col("Age", "string")],
            Box::new(|l: &Value| {
                vec![l["metadata"]["name"].clone(), l["spec"]["holderIdentity"].clone(), json!(age(l))]
            }),
        ),
        _ => (
            vec![col("Name", "string"), col("Age", "string")],
            Box::new(|o: &Value| vec![o["metadata"]["name"].clone(), json!(age(o))]),
        ),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let meta =
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]});
            json!({"cells": cells(o), "object": meta})
        })
        .collect();
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns, "rows": rows,
    })
}
