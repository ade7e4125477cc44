//! Field and label selectors: `key=value`, `key==value`, `key!=value`, comma-separated (all must hold).

use serde_json::Value;

/// The field paths a field selector may name, per kind; anything else is refused with 400 as the real
/// apiserver does.
fn field_path(kind: &str, field: &str) -> Option<&'static [&'static str]> {
    Some(match (kind, field) {
        (_, "metadata.name") => &["metadata", "name"],
        (_, "metadata.namespace") => &["metadata", "namespace"],
        ("Pod", "spec.nodeName") => &["spec", "nodeName"],
        ("Pod", "status.phase") => &["status", "phase"],
        ("Event", "involvedObject.name") => &["involvedObject", "name"],
        ("Event", "involvedObject.kind") => &["involvedObject", "kind"],
        ("Event", "involvedObject.namespace") => &["involvedObject", "namespace"],
        ("Event", "involvedObject.uid") => &["involvedObject", "uid"],
        ("Event", "reason") => &["reason"],
        ("Event", "type") => &["type"],
        _ => return None,
    })
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    value: String,
    equal: bool,
}

/// A parsed selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    fields: Vec<(&'static [&'static str], Requirement)>,
    labels: Vec<Requirement>,
}

fn requirements(text: &str) -> Result<Vec<Requirement>, String> {
    let mut out = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (key, value, equal) = if let Some((k, v)) = term.split_once("!=") {
            (k, v, false)
        } else if let Some((k, v)) = term.split_once("==") {
            (k, v, true)
        } else if let Some((k, v)) = term.split_once('=') {
            (k, v, true)
        } else {
            return Err(format!("invalid selector: {term:?}: only =, == and != are supported"));
        };
        out.push(Requirement { key: key.trim().to_owned(), value: value.trim().to_owned(), equal });
    }
    Ok(out)
}

impl Selector {
    /// Parses the `fieldSelector` and `labelSelector` of a request for objects of `kind`.
    pub fn parse(kind: &str, fields: Option<&str>, labels: Option<&str>) -> Result<Selector, String> {
        let mut s = Selector::default();
        for r in requirements(fields.unwrap_or(""))? {
            let Some(path) = field_path(kind, &r.key) else {
                return Err(format!("field label not supported: {}", r.key));
            };
            s.fields.push((path, r));
        }
        s.labels = requirements(labels.unwrap_or(""))?;
        Ok(s)
    }

    /// True when `object` matches every requirement (a missing field or label reads as empty).
    pub fn matches(&self, object: &Value) -> bool {
        let fields = self.fields.iter().all(|(path, r)| {
            let v = path.iter().try_fold(object, |v, k| v.get(k)).and_then(Value::as_str).unwrap_or("");
            (v == r.value) == r.equal
        });
        let labels = self.labels.iter().all(|r| {
            let v = object["metadata"]["labels"].get(&r.key).and_then(Value::as_str);
            match (v, r.equal) {
                (Some(v), eq) => (v == r.value) == eq,
                (None, eq) => !eq,
            }
        });
        fields && labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_fields_and_labels() {
        let pod = json!({"metadata": {"name": "p", "labels": {"app": "web"}}, "spec": {"nodeName": "n1"}});
        let s = |f, l| Selector::parse("Pod", f, l).unwrap();
        assert!(s(Some("spec.nodeName=n1"), None).matches(&pod));
        assert!(s(Some("spec.nodeName==n1,metadata.name!=q"), Some("app=web")).matches(&pod));
        assert!(!s(Some("spec.nodeName=n2"), None).matches(&pod));
        assert!(!s(None, Some("app!=web")).matches(&pod));
        assert!(s(None, Some("tier!=db")).matches(&pod));
        assert!(Selector::parse("Pod", Some("spec.hostname=x"), None).is_err());
        assert!(Selector::parse("Node", Some("spec.nodeName=x"), None).is_err());
    }
}
