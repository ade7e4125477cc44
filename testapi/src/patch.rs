//! JSON merge patches (RFC 7386) and the strategic merge patches Kubernetes clients send, for the fields the
//! node and pod clients use: lists merged by their key, `$patch` directives.

use serde_json::{Map, Value};

/// Lists merged element by element in a strategic merge patch, by path (from the object's root) and key, as the
/// API's patch strategies say; other lists (taints, images, container statuses) are atomic and replaced.
const MERGE_KEYS: &[(&[&str], &str)] = &[
    (&["status", "conditions"], "type"),
    (&["status", "addresses"], "type"),
    (&["metadata", "ownerReferences"], "uid"),
    (&["spec", "containers"], "name"),
    (&["spec", "initContainers"], "name"),
];

/// Applies an RFC 7386 merge patch.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Applies a strategic merge patch.
pub fn strategic(target: &mut Value, patch: &Value) {
    strategic_at(target, patch, &mut Vec::new());
}

fn strategic_at(target: &mut Value, patch: &Value, path: &mut Vec<String>) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = p.clone();
        replaced.remove("$patch");
        *target = Value::Object(replaced);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        // Ordering and retention directives are accepted; the order of merged lists is not kept.
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k.starts_with("$deleteFromPrimitiveList/") {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        path.push(k.clone());
        let key = MERGE_KEYS.iter().find(|(p, _)| p.iter().eq(path.iter())).map(|(_, key)| *key);
        match (key, v) {
            (Some(key), Value::Array(items)) => {
                let entry = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(entry, items, key);
            }
            _ => strategic_at(t.entry(k.clone()).or_insert(Value::Null), v, path),
        }
        path.pop();
    }
}

/// Merges `items` into the list `target` by `key`: an item whose key matches is merged into the existing one
/// (or removed with `$patch: delete`), others are appended; a lone `{"$patch": "replace"}` item replaces the list.
fn merge_list(target: &mut Value, items: &[Value], key: &str) {
    let replace = items.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace || !target.is_array() {
        *target = Value::Array(Vec::new());
    }
    let Value::Array(list) = target else { return };
    for item in items {
        if item.get("$patch").and_then(Value::as_str) == Some("replace")
            && item.as_object().is_some_and(|o| o.len() == 1)
        {
            continue;
        }
        let id = item.get(key);
        let existing = id.and_then(|id| list.iter().position(|e| e.get(key) == Some(id)));
        match (existing, item.get("$patch").and_then(Value::as_str)) {
            (Some(i), Some("delete")) => {
                list.remove(i);
            }
            (None, Some("delete")) => {}
            (Some(i), _) => merge(&mut list[i], item),
            (None, _) => {
                let mut item = item.clone();
                if let Value::Object(o) = &mut item {
                    o.remove("$patch");
                }
                list.push(item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patches_replace_lists_and_delete_nulls() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge(&mut v, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(v, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn strategic_patches_merge_conditions_by_type() {
        let mut node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
            {"type": "NetworkUnavailable", "status": "False"},
        ]}});
        strategic(
            &mut node,
            &json!({"status": {
                "$setElementOrder/conditions": [{"type": "Ready"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}, {"type": "MemoryPressure", "status": "False"}],
            }}),
        );
        let c = node["status"]["conditions"].as_array().unwrap();
        assert_eq!(c.len(), 3, "{node}");
        assert_eq!(c[0], json!({"type": "Ready", "status": "True", "reason": "KubeletReady"}));
        assert_eq!(c[1]["type"], "NetworkUnavailable", "another writer's condition is kept");
        // `$patch: replace` on a list, and `$patch: delete` on an element.
        strategic(
            &mut node,
            &json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "Hostname", "address": "h"}]}}),
        );
        assert_eq!(node["status"]["addresses"], json!([{"type": "Hostname", "address": "h"}]));
        strategic(&mut node, &json!({"status": {"conditions": [{"type": "MemoryPressure", "$patch": "delete"}]}}));
        assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 2);
        // Other lists are replaced, as in a merge patch.
        strategic(&mut node, &json!({"spec": {"podCIDRs": ["a"]}}));
        strategic(&mut node, &json!({"spec": {"podCIDRs": ["b"]}}));
        assert_eq!(node["spec"]["podCIDRs"], json!(["b"]));
    }
}
