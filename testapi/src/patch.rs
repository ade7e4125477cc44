//! The patch formats the apiserver takes: JSON merge patches (RFC 7386), JSON patches (RFC 6902) and strategic
//! merge patches, the last with the list strategies the Go types of core/v1 and meta/v1 declare for the kinds
//! served here (lists merged by a key, sets of scalars, atomic lists) and the `$patch`, `$retainKeys`,
//! `$setElementOrder/…` and `$deleteFromPrimitiveList/…` directives.

use serde_json::{Map, Value};

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

// The strategic merge patch.

/// How a list field is patched, after its Go field's `patchStrategy` and `patchMergeKey` tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lists {
    /// No strategy: the patch's list replaces the object's whole.
    Atomic,
    /// `patchStrategy:"merge"` on scalars: a set; the patch's values are added to the object's.
    Set,
    /// `patchStrategy:"merge"` with a `patchMergeKey`: elements with the same key are merged, others added.
    Key(&'static str),
}

/// A field of an API type that has a list strategy, or holds fields that have one.
#[derive(Debug, Clone, Copy)]
struct Field {
    /// The JSON name.
    name: &'static str,
    /// How the field is patched when it is a list (maps are always merged).
    lists: Lists,
    /// The fields of the struct this field holds, or of the elements of its list.
    fields: &'static [Field],
}

impl Field {
    /// A field holding a struct.
    const fn holding(name: &'static str, fields: &'static [Field]) -> Field {
        Field { name, lists: Lists::Atomic, fields }
    }

    /// A list merged by `key`.
    const fn keyed(name: &'static str, key: &'static str) -> Field {
        Field { name, lists: Lists::Key(key), fields: &[] }
    }

    /// A list merged by `key` whose elements hold fields with a strategy.
    const fn keyed_holding(name: &'static str, key: &'static str, fields: &'static [Field]) -> Field {
        Field { name, lists: Lists::Key(key), fields }
    }

    /// A set of scalars.
    const fn set(name: &'static str) -> Field {
        Field { name, lists: Lists::Set, fields: &[] }
    }

    /// The merge key of the list, if it has one.
    fn key(&self) -> Option<&'static str> {
        match self.lists {
            Lists::Key(k) => Some(k),
            Lists::Atomic | Lists::Set => None,
        }
    }

    /// The field `name` of the struct this field holds; one without a strategy if the schema names none.
    fn child(&self, name: &str) -> Field {
        self.fields.iter().find(|f| f.name == name).copied().unwrap_or(Field::holding("", &[]))
    }
}

/// meta/v1 `ObjectMeta`.
const METADATA: Field = Field::holding("metadata", &[Field::keyed("ownerReferences", "uid"), Field::set("finalizers")]);

/// core/v1 `Container` and `EphemeralContainerCommon` (the same fields and tags).
const CONTAINER: &[Field] = &[
    Field::keyed("ports", "containerPort"),
    Field::keyed("env", "name"),
    Field::keyed("volumeMounts", "mountPath"),
    Field::keyed("volumeDevices", "devicePath"),
];

/// core/v1 `PodSpec`. `volumes` and `resourceClaims` are `merge,retainKeys`: the `retainKeys` half only tells
/// clients to send `$retainKeys`, which is applied wherever it comes.
const POD_SPEC: &[Field] = &[
    Field::keyed("volumes", "name"),
    Field::keyed_holding("initContainers", "name", CONTAINER),
    Field::keyed_holding("containers", "name", CONTAINER),
    Field::keyed_holding("ephemeralContainers", "name", CONTAINER),
    Field::keyed("imagePullSecrets", "name"),
    Field::keyed("hostAliases", "ip"),
    Field::keyed("topologySpreadConstraints", "topologyKey"),
    Field::keyed("schedulingGates", "name"),
    Field::keyed("resourceClaims", "name"),
];

/// core/v1 `PodStatus`; the container statuses are atomic.
const POD_STATUS: &[Field] = &[
    Field::keyed("conditions", "type"),
    Field::keyed("podIPs", "ip"),
    Field::keyed("hostIPs", "ip"),
    Field::keyed("resourceClaimStatuses", "name"),
];

const POD: &[Field] = &[METADATA, Field::holding("spec", POD_SPEC), Field::holding("status", POD_STATUS)];

/// core/v1 `Node`: taints, images, volumesInUse and volumesAttached are atomic.
const NODE: &[Field] = &[
    METADATA,
    Field::holding("spec", &[Field::set("podCIDRs")]),
    Field::holding("status", &[Field::keyed("conditions", "type"), Field::keyed("addresses", "type")]),
];

/// core/v1 `Service`.
const SERVICE: &[Field] = &[
    METADATA,
    Field::holding("spec", &[Field::keyed("ports", "port")]),
    Field::holding("status", &[Field::keyed("conditions", "type")]),
];

/// core/v1 `ServiceAccount`: `secrets` merges by name, `imagePullSecrets` (unlike a pod's) is atomic.
const SERVICE_ACCOUNT: &[Field] = &[METADATA, Field::keyed("secrets", "name")];

/// core/v1 `Namespace`: `spec.finalizers` is atomic, unlike `metadata.finalizers`.
const NAMESPACE: &[Field] = &[METADATA, Field::holding("status", &[Field::keyed("conditions", "type")])];

/// ConfigMap, Secret, Event (core and events.k8s.io), Lease: no list with a strategy outside the metadata.
const OTHER: &[Field] = &[METADATA];

/// The top-level fields of `kind`.
fn schema(kind: &str) -> Field {
    let fields = match kind {
        "Pod" => POD,
        "Node" => NODE,
        "Service" => SERVICE,
        "ServiceAccount" => SERVICE_ACCOUNT,
        "Namespace" => NAMESPACE,
        _ => OTHER,
    };
    Field::holding("", fields)
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder";
const DELETE_FROM: &str = "$deleteFromPrimitiveList";

const BAD_DOCUMENT: &str = "invalid JSON document";
const BAD_PRIMITIVE_LIST: &str = "invalid patch format of primitive list";
const BAD_RETAIN_KEYS: &str = "invalid patch format of retainKeys";
const BAD_SET_ORDER: &str = "invalid patch format of setElementOrder list";
const LIST_OF_LISTS: &str = "lists of lists are not supported";

/// Applies a strategic merge patch to an object of `kind`. On an error `target` is left as it was.
pub fn strategic(kind: &str, target: &mut Value, patch: &Value) -> Result<(), String> {
    if !patch.is_object() {
        return Err(BAD_DOCUMENT.to_owned());
    }
    let merged = merge_value(Some(target.clone()), patch, schema(kind))?;
    *target = merged.unwrap_or_else(|| Value::Object(Map::new()));
    Ok(())
}

/// What `patch` makes of `original` (absent when `None`), for a value of `field`; `None` when the value goes.
fn merge_value(original: Option<Value>, patch: &Value, field: Field) -> Result<Option<Value>, String> {
    match patch {
        Value::Null => Ok(None),
        Value::Object(p) => match p.get(DIRECTIVE) {
            // The patch's map, directives applied, replaces the object's.
            Some(Value::String(d)) if d == "replace" => {
                merge_object(Map::new(), p, field).map(|m| Some(Value::Object(m)))
            }
            // An existing map is emptied; a map that was not there stays away.
            Some(Value::String(d)) if d == "delete" => {
                Ok(original.filter(Value::is_object).map(|_| Value::Object(Map::new())))
            }
            Some(d) => Err(format!("unknown patch type: {d} in map: {patch}")),
            None => {
                let base = match original {
                    Some(Value::Object(m)) => m,
                    _ => Map::new(),
                };
                merge_object(base, p, field).map(|m| Some(Value::Object(m)))
            }
        },
        Value::Array(items) => match (original, field.lists) {
            (Some(Value::Array(o)), Lists::Set | Lists::Key(_)) => {
                merge_list(o, items, field).map(|l| Some(Value::Array(l)))
            }
            _ => new_list(items, field).map(|l| Some(Value::Array(l))),
        },
        scalar => Ok(Some(scalar.clone())),
    }
}

/// Merges the map `patch` into `original`, the fields of both being those of `field`.
fn merge_object(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    field: Field,
) -> Result<Map<String, Value>, String> {
    if let Some(keep) = patch.get(RETAIN_KEYS) {
        retain_keys(&mut original, patch, keep)?;
    }
    // Lists with an order to follow are merged first, and only once.
    let mut ordered: Vec<&str> = Vec::new();
    for (k, order) in patch {
        if let Some(rest) = k.strip_prefix(SET_ORDER) {
            let name = rest.strip_prefix('/').ok_or(BAD_SET_ORDER)?;
            set_element_order(&mut original, patch, name, order, field.child(name))?;
            ordered.push(name);
        }
    }
    for (k, v) in patch {
        if k == DIRECTIVE || k == RETAIN_KEYS || k.starts_with(SET_ORDER) || ordered.contains(&k.as_str()) {
            continue;
        }
        if let Some(rest) = k.strip_prefix(DELETE_FROM) {
            let name = rest.strip_prefix('/').ok_or(BAD_PRIMITIVE_LIST)?;
            delete_from_list(&mut original, name, v)?;
            continue;
        }
        let old = original.remove(k);
        if let Some(new) = merge_value(old, v, field.child(k))? {
            original.insert(k.clone(), new);
        }
    }
    Ok(original)
}

/// `$retainKeys`: every key the patch sets must be listed, and the object keeps only the listed keys.
fn retain_keys(original: &mut Map<String, Value>, patch: &Map<String, Value>, keep: &Value) -> Result<(), String> {
    let Value::Array(keep) = keep else { return Err(BAD_RETAIN_KEYS.to_owned()) };
    let listed = |k: &str| keep.iter().any(|x| x.as_str() == Some(k));
    let unlisted = patch.iter().any(|(k, v)| {
        !(v.is_null()
            || k == RETAIN_KEYS
            || k == DIRECTIVE
            || k.starts_with(SET_ORDER)
            || k.starts_with(DELETE_FROM)
            || listed(k))
    });
    if unlisted {
        return Err(BAD_RETAIN_KEYS.to_owned());
    }
    original.retain(|k, _| listed(k));
    Ok(())
}

/// `$deleteFromPrimitiveList/<name>`: the listed values leave the object's list (whatever its strategy).
fn delete_from_list(original: &mut Map<String, Value>, name: &str, values: &Value) -> Result<(), String> {
    let Value::Array(gone) = values else { return Err(BAD_PRIMITIVE_LIST.to_owned()) };
    if gone.iter().any(|v| v.is_object() || v.is_array()) {
        return Err(BAD_PRIMITIVE_LIST.to_owned());
    }
    if let Some(Value::Array(list)) = original.get_mut(name) {
        list.retain(|v| !gone.contains(v));
    }
    Ok(())
}

/// The list a patch brings where the object had none (or had it atomic): directives applied, elements that are
/// only directives dropped.
fn new_list(items: &[Value], field: Field) -> Result<Vec<Value>, String> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Value::Null => out.push(Value::Null),
            Value::Object(o) if o.contains_key(DIRECTIVE) => {}
            _ => out.extend(merge_value(None, item, Field::holding(field.name, field.fields))?),
        }
    }
    Ok(out)
}

/// The kind of a JSON value as Go's decoder types it, for the rule that a merged list holds one type.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "map",
    }
}

/// The type of the elements of both lists: `None` when both are empty; an error for mixed types or lists of lists.
fn element_type(original: &[Value], patch: &[Value]) -> Result<Option<&'static str>, String> {
    let mut seen = None;
    for v in original.iter().chain(patch) {
        let t = type_name(v);
        if t == "list" {
            return Err(LIST_OF_LISTS.to_owned());
        }
        match seen {
            None => seen = Some(t),
            Some(s) if s != t => {
                return Err(format!(
                    "list element types are not identical: {} and {}",
                    Value::Array(original.to_vec()),
                    Value::Array(patch.to_vec())
                ));
            }
            Some(_) => {}
        }
    }
    Ok(seen)
}

fn no_merge_key(item: &Value, key: &str) -> String {
    format!("map: {item} does not contain declared merge key: {key}")
}

/// Merges the list `patch` into the list `original` of a field with the merge strategy.
fn merge_list(original: Vec<Value>, patch: &[Value], field: Field) -> Result<Vec<Value>, String> {
    let Some(t) = element_type(&original, patch)? else { return Ok(original) };
    if t != "map" {
        // A set of scalars: the union, without duplicates.
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (listed, rest) = partition(merged, patch, None)?;
        return Ok(arrange(listed, rest, patch, &original, None));
    }
    let Some(key) = field.key() else {
        return Err(format!("cannot merge lists without merge key for {}", field.name));
    };
    let mut merged = original;
    let mut plain: Vec<Value> = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        match item.get(DIRECTIVE) {
            None => plain.push(item.clone()),
            Some(Value::String(d)) if d == "delete" => {
                let id = item.get(key).ok_or_else(|| no_merge_key(item, key))?;
                merged.retain(|e| e.get(key) != Some(id));
            }
            Some(Value::String(d)) if d == "replace" => replace = true,
            Some(Value::String(d)) if d == "merge" => {
                return Err("merging lists cannot yet be specified in the patch".to_owned());
            }
            Some(d) => return Err(format!("unknown patch type: {d} in map: {item}")),
        }
    }
    if replace {
        // The patch's other elements are the list.
        return new_list(&plain, field);
    }
    let before = merged.clone();
    let element = Field::holding(field.name, field.fields);
    for item in &plain {
        let id = item.get(key).ok_or_else(|| no_merge_key(item, key))?;
        match merged.iter().position(|e| e.get(key) == Some(id)) {
            Some(i) => {
                let old = std::mem::take(&mut merged[i]);
                merged[i] = merge_value(Some(old), item, element)?.unwrap_or_else(|| Value::Object(Map::new()));
            }
            None => merged.extend(merge_value(None, item, element)?),
        }
    }
    let (listed, rest) = partition(merged, &plain, Some(key))?;
    Ok(arrange(listed, rest, &plain, &before, Some(key)))
}

/// `$setElementOrder/<name>`: merges the field's list (if the patch has one) and orders it as listed.
fn set_element_order(
    original: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    name: &str,
    order: &Value,
    field: Field,
) -> Result<(), String> {
    let Value::Array(order) = order else { return Err(BAD_SET_ORDER.to_owned()) };
    let key = field.key();
    let before = match original.get(name) {
        None => None,
        Some(Value::Array(a)) => Some(a.clone()),
        Some(other) => return Err(format!("{name} is not a list: {other}")),
    };
    let patch_list = match patch.get(name) {
        None => None,
        Some(Value::Array(a)) => Some(a.as_slice()),
        Some(_) => return Err(BAD_SET_ORDER.to_owned()),
    };
    check_order(patch_list.unwrap_or(&[]), order, key)?;
    let merged = match (before.clone(), patch_list) {
        (None, None) => return Ok(()),
        (Some(o), None) => o,
        (None, Some(p)) => new_list(p, field)?,
        (Some(o), Some(p)) => match field.lists {
            Lists::Atomic => new_list(p, field)?,
            Lists::Set | Lists::Key(_) => merge_list(o, p, field)?,
        },
    };
    let before = before.unwrap_or_default();
    // A key only orders maps; scalars in a keyed list are ordered by value.
    let key = key.filter(|_| merged.iter().chain(&before).all(Value::is_object));
    let (listed, rest) = partition(merged, order, key)?;
    original.insert(name.to_owned(), Value::Array(arrange(listed, rest, order, &before, key)));
    Ok(())
}

/// The patch's list must name its elements in the order `$setElementOrder` lists them (deletions aside).
fn check_order(patch: &[Value], order: &[Value], key: Option<&str>) -> Result<(), String> {
    if patch.is_empty() || order.is_empty() {
        return Ok(());
    }
    let items: Vec<&Value> = match key {
        Some(_) => {
            if patch.iter().any(|i| !i.is_object()) {
                return Err(BAD_SET_ORDER.to_owned());
            }
            patch.iter().filter(|i| i.get(DIRECTIVE).and_then(Value::as_str) != Some("delete")).collect()
        }
        None => patch.iter().collect(),
    };
    let same = |a: &Value, b: &Value| -> Result<bool, String> {
        let Some(key) = key else { return Ok(a == b) };
        let ka = a.get(key).ok_or_else(|| no_merge_key(a, key))?;
        let kb = b.get(key).ok_or_else(|| no_merge_key(b, key))?;
        Ok(ka == kb)
    };
    let (mut i, mut j) = (0, 0);
    while i < items.len() && j < order.len() {
        if items[i].get(DIRECTIVE).is_some() {
            i += 1;
            continue;
        }
        if same(items[i], &order[j])? {
            i += 1;
        }
        j += 1;
    }
    if i < items.len() {
        return Err(format!(
            "the order in patch list {} doesn't match {SET_ORDER} list {}",
            Value::Array(patch.to_vec()),
            Value::Array(order.to_vec())
        ));
    }
    Ok(())
}

/// Where `item` is in `list`: by its merge key, or by value.
fn position(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    match key {
        Some(k) => list.iter().position(|e| e.get(k) == item.get(k)),
        None => list.iter().position(|e| e == item),
    }
}

/// Splits `merged` into the elements `by` names and the others, keeping their order.
fn partition(merged: Vec<Value>, by: &[Value], key: Option<&str>) -> Result<(Vec<Value>, Vec<Value>), String> {
    let mut listed = Vec::new();
    let mut rest = Vec::new();
    for v in merged {
        if let Some(k) = key
            && v.get(k).is_none()
        {
            return Err(no_merge_key(&v, k));
        }
        if position(by, &v, key).is_some() {
            listed.push(v);
        } else {
            rest.push(v);
        }
    }
    Ok((listed, rest))
}

/// Orders a merged list: the patch's elements as `patch_order` has them, the object's other elements as they
/// were in `before`, and the two interleaved so that an object's element goes before a patch element that came
/// after it in `before` (elements new to the list go where the patch puts them, ahead of the later ones).
fn arrange(
    mut listed: Vec<Value>,
    mut rest: Vec<Value>,
    patch_order: &[Value],
    before: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    listed.sort_by_key(|v| position(patch_order, v, key).unwrap_or(usize::MAX));
    rest.sort_by_key(|v| position(before, v, key).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(listed.len() + rest.len());
    let mut listed = listed.into_iter().peekable();
    let mut rest = rest.into_iter().peekable();
    loop {
        let take_rest = match (rest.peek(), listed.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(r), Some(l)) => {
                matches!((position(before, r, key), position(before, l, key)), (Some(a), Some(b)) if a < b)
            }
        };
        out.extend(if take_rest { rest.next() } else { listed.next() });
    }
    out
}

// JSON patches (RFC 6902).

/// The JSON pointer `path` as reference tokens, `~1` and `~0` decoded.
fn pointer(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(format!("invalid JSON pointer {path:?}: it must be empty or begin with '/'"));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => return Err(format!("invalid JSON pointer {path:?}: '~' must be followed by 0 or 1")),
                }
            }
            Ok(out)
        })
        .collect()
}

/// The array index `token` names in an array of `len` elements; `-` (the end) and `len` itself only if
/// `appending`. No sign, no leading zero.
fn array_index(token: &str, len: usize, appending: bool) -> Option<usize> {
    if token == "-" {
        return appending.then_some(len);
    }
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    let i: usize = token.parse().ok()?;
    (i < len || (appending && i == len)).then_some(i)
}

fn walk<'a>(mut v: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    for t in tokens {
        v = match v {
            Value::Object(m) => m.get(t)?,
            Value::Array(a) => a.get(array_index(t, a.len(), false)?)?,
            _ => return None,
        };
    }
    Some(v)
}

fn walk_mut<'a>(mut v: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    for t in tokens {
        v = match v {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = array_index(t, a.len(), false)?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(v)
}

fn invalid_index(op: &str, path: &str, token: &str) -> String {
    format!("error in {op} for path: '{path}': Unable to access invalid index: {token}: invalid index referenced")
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let tokens = pointer(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    let missing = || format!("add operation does not apply: doc is missing path: \"{path}\": missing value");
    match walk_mut(doc, parents).ok_or_else(missing)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), true).ok_or_else(|| invalid_index("add", path, last))?;
            a.insert(i, value);
        }
        _ => return Err(missing()),
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let tokens = pointer(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        return Err("remove operation does not apply: the whole document cannot be removed".to_owned());
    };
    let missing = || format!("remove operation does not apply: doc is missing path: \"{path}\": missing value");
    match walk_mut(doc, parents).ok_or_else(missing)? {
        Value::Object(m) => m.remove(last).ok_or_else(|| {
            format!("error in remove for path: '{path}': Unable to remove nonexistent key: {last}: missing value")
        }),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false).ok_or_else(|| invalid_index("remove", path, last))?;
            Ok(a.remove(i))
        }
        _ => Err(missing()),
    }
}

fn replace(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let tokens = pointer(path)?;
    let Some((_, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    if !walk(doc, parents).is_some_and(|p| p.is_object() || p.is_array()) {
        return Err(format!("replace operation does not apply: doc is missing path: {path}: missing value"));
    }
    let slot = walk_mut(doc, &tokens)
        .ok_or_else(|| format!("replace operation does not apply: doc is missing key: {path}: missing value"))?;
    *slot = value;
    Ok(())
}

/// Applies an RFC 6902 JSON patch: `add`, `remove`, `replace`, `move`, `copy` and `test` operations, in order, all
/// or none (on an error `target` is left as it was). The errors read as the apiserver's, which answers them with
/// 422; a patch that is not a list of objects it refuses with 400 before applying anything.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let Some(ops) = ops.as_array().filter(|ops| ops.iter().all(Value::is_object)) else {
        return Err("a JSON patch must be a list of operations (JSON objects)".to_owned());
    };
    let mut doc = target.clone();
    let mut copied = 0usize;
    for op in ops {
        if op.get("op").and_then(Value::as_str) == Some("copy")
            && let Some(from) = op.get("from").and_then(Value::as_str)
            && let Some(v) = pointer(from).ok().and_then(|p| walk(&doc, &p))
        {
            copied += serde_json::to_vec(v).map_or(0, |b| b.len());
            if copied > MAX_COPIED_BYTES {
                return Err(format!("{TOO_MUCH_COPIED}: {copied} bytes, the limit is {MAX_COPIED_BYTES}"));
            }
        }
        apply_op(&mut doc, op)?;
    }
    *target = doc;
    Ok(())
}

/// What a JSON patch may copy in all, as the apiserver bounds it (its request body limit).
pub const MAX_COPIED_BYTES: usize = 3 << 20;
/// The start of the error of a patch that copies more.
pub const TOO_MUCH_COPIED: &str = "the values a JSON patch copies are too large";
/// The most operations a JSON patch may have.
pub const MAX_OPERATIONS: usize = 10_000;

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let kind = op.get("op").and_then(Value::as_str).unwrap_or("unknown");
    let string = |name: &str| {
        op.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{kind} operation failed to decode {name}: operation missing {name} field"))
    };
    let value =
        || op.get("value").cloned().ok_or_else(|| format!("{kind} operation, missing value field: missing value"));
    match kind {
        "add" => add(doc, string("path")?, value()?),
        "remove" => remove(doc, string("path")?).map(drop),
        "replace" => replace(doc, string("path")?, value()?),
        "move" => {
            let (from, path) = (string("from")?, string("path")?);
            if walk(doc, &pointer(from)?).is_none() {
                return Err(format!("move operation does not apply: doc is missing from path: {from}: missing value"));
            }
            if from == path {
                return Ok(());
            }
            if path.starts_with(from) && path[from.len()..].starts_with('/') {
                return Err(format!("move operation does not apply: {path} is inside {from}"));
            }
            let v = remove(doc, from)?;
            add(doc, path, v)
        }
        "copy" => {
            let (from, path) = (string("from")?, string("path")?);
            let v = walk(doc, &pointer(from)?).cloned().ok_or_else(|| {
                format!("copy operation does not apply: doc is missing from path: {from}: missing value")
            })?;
            add(doc, path, v)
        }
        "test" => {
            let path = string("path")?;
            let expected = value()?;
            let found = walk(doc, &pointer(path)?)
                .ok_or_else(|| format!("test operation does not apply: is missing path: {path}: missing value"))?;
            if *found == expected { Ok(()) } else { Err(format!("testing value {path} failed: test failed")) }
        }
        other => Err(format!("Unexpected kind: {other}")),
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
        merge(&mut v, &json!({"n": {"x": null, "y": 1}}));
        assert_eq!(v["n"], json!({"y": 1}), "nulls in a new map are dropped");
    }

    fn smp(kind: &str, target: Value, patch: Value) -> Value {
        let mut t = target;
        strategic(kind, &mut t, &patch).unwrap();
        t
    }

    fn smp_err(kind: &str, target: Value, patch: Value) -> String {
        let mut t = target.clone();
        let e = strategic(kind, &mut t, &patch).unwrap_err();
        assert_eq!(t, target, "a failed patch leaves the object alone");
        e
    }

    #[test]
    fn strategic_patches_merge_conditions_by_type() {
        let mut node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
            {"type": "NetworkUnavailable", "status": "False"},
        ]}});
        strategic(
            "Node",
            &mut node,
            &json!({"status": {
                "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "MemoryPressure"}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}, {"type": "MemoryPressure", "status": "False"}],
            }}),
        )
        .unwrap();
        let c = node["status"]["conditions"].as_array().unwrap();
        assert_eq!(c.len(), 3, "{node}");
        assert_eq!(c[0], json!({"type": "Ready", "status": "True", "reason": "KubeletReady"}));
        assert_eq!(c[1]["type"], "MemoryPressure");
        assert_eq!(c[2]["type"], "NetworkUnavailable", "another writer's condition is kept");
        // `$patch: replace` on a list, and `$patch: delete` on an element.
        strategic(
            "Node",
            &mut node,
            &json!({"status": {"addresses": [{"$patch": "replace"}, {"type": "Hostname", "address": "h"}]}}),
        )
        .unwrap();
        assert_eq!(node["status"]["addresses"], json!([{"type": "Hostname", "address": "h"}]));
        strategic(
            "Node",
            &mut node,
            &json!({"status": {"conditions": [{"type": "MemoryPressure", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 2);
        // podCIDRs is a set: a patch adds to it (new values go first, as the apiserver orders them).
        strategic("Node", &mut node, &json!({"spec": {"podCIDRs": ["a"]}})).unwrap();
        strategic("Node", &mut node, &json!({"spec": {"podCIDRs": ["b"]}})).unwrap();
        assert_eq!(node["spec"]["podCIDRs"], json!(["b", "a"]));
        strategic("Node", &mut node, &json!({"spec": {"podCIDRs": ["a", "b"]}})).unwrap();
        assert_eq!(node["spec"]["podCIDRs"], json!(["a", "b"]), "the patch's order wins for the values it names");
    }

    #[test]
    fn keyed_lists_merge_their_elements_and_add_new_ones() {
        let pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}], "ports": [{"containerPort": 80, "name": "http"}]},
            {"name": "b", "image": "b:1"},
        ]}});
        let out = smp(
            "Pod",
            pod,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}], "ports": [{"containerPort": 80, "protocol": "TCP"}]},
                {"name": "c", "image": "c:1"},
            ]}}),
        );
        let c = &out["spec"]["containers"];
        // b is the object's and came after a: it keeps its place after a; c is new and comes where the patch has it.
        assert_eq!(c.as_array().unwrap().iter().map(|c| c["name"].clone()).collect::<Vec<_>>(), ["a", "c", "b"]);
        assert_eq!(c[0]["image"], "a:2");
        assert_eq!(
            c[0]["env"],
            json!([{"name": "Y", "value": "2"}, {"name": "X", "value": "1"}]),
            "env merged by name"
        );
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"}]),
            "by containerPort"
        );
        assert_eq!(c[2], json!({"name": "b", "image": "b:1"}));
    }

    #[test]
    fn new_elements_go_first_unless_ordered() {
        // Without $setElementOrder the apiserver puts elements new to the list ahead of the object's.
        let node = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        let out = smp("Node", node.clone(), json!({"status": {"conditions": [{"type": "C"}]}}));
        assert_eq!(out["status"]["conditions"], json!([{"type": "C"}, {"type": "A"}, {"type": "B"}]));
        // The patch's own order wins for what it names; the rest keeps its place relative to it.
        let out = smp("Node", node.clone(), json!({"status": {"conditions": [{"type": "B", "x": 1}, {"type": "A"}]}}));
        assert_eq!(out["status"]["conditions"], json!([{"type": "B", "x": 1}, {"type": "A"}]));
        let three = json!({"status": {"conditions": [{"type": "1"}, {"type": "2", "v": "b"}, {"type": "3"}]}});
        let out =
            smp("Node", three, json!({"status": {"conditions": [{"type": "3", "v": "c"}, {"type": "1", "v": "a"}]}}));
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "2", "v": "b"}, {"type": "3", "v": "c"}, {"type": "1", "v": "a"}])
        );
        // With $setElementOrder the new element goes where the order puts it.
        let out = smp(
            "Node",
            node,
            json!({"status": {"$setElementOrder/conditions": [{"type": "A"}, {"type": "C"}, {"type": "B"}], "conditions": [{"type": "C"}]}}),
        );
        assert_eq!(out["status"]["conditions"], json!([{"type": "A"}, {"type": "C"}, {"type": "B"}]));
    }

    #[test]
    fn set_element_order_alone_reorders_and_keeps_unlisted_elements() {
        let node = json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "Hostname", "address": "n1"},
            {"type": "ExternalIP", "address": "1.2.3.4"},
        ]}});
        let out = smp(
            "Node",
            node,
            json!({"status": {"$setElementOrder/addresses": [{"type": "Hostname"}, {"type": "InternalIP"}]}}),
        );
        let types: Vec<_> = out["status"]["addresses"].as_array().unwrap().iter().map(|a| a["type"].clone()).collect();
        assert_eq!(types, ["Hostname", "InternalIP", "ExternalIP"]);
        // Scalars: the order and a deletion together.
        let out = smp(
            "Pod",
            json!({"metadata": {"finalizers": ["1", "2", "3"]}}),
            json!({"metadata": {"$setElementOrder/finalizers": ["2", "1"], "$deleteFromPrimitiveList/finalizers": ["3"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["2", "1"]));
        // An order naming something the list lacks is no error; a list is created from the patch where none was.
        let out = smp(
            "Node",
            json!({}),
            json!({"spec": {"$setElementOrder/podCIDRs": ["x", "y", "z"], "podCIDRs": ["x", "z"]}}),
        );
        assert_eq!(out["spec"]["podCIDRs"], json!(["x", "z"]));
        let out = smp("Node", json!({}), json!({"spec": {"$setElementOrder/podCIDRs": ["x"]}}));
        assert_eq!(out, json!({"spec": {}}), "nor does an order alone create the list");
        // ... but the patch's list must follow the order it gives.
        let e = smp_err(
            "Node",
            json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}}),
            json!({"status": {"$setElementOrder/conditions": [{"type": "A"}, {"type": "B"}], "conditions": [{"type": "B"}, {"type": "A"}]}}),
        );
        assert!(e.contains("doesn't match"), "{e}");
        assert_eq!(
            smp_err("Node", json!({}), json!({"status": {"$setElementOrder/conditions": {"type": "A"}}})),
            BAD_SET_ORDER
        );
        assert_eq!(smp_err("Node", json!({}), json!({"status": {"$setElementOrder": []}})), BAD_SET_ORDER);
    }

    #[test]
    fn set_element_order_interleaves_the_objects_other_elements() {
        let conditions = |types: &[&str]| Value::Array(types.iter().map(|t| json!({"type": t})).collect());
        let order = |types: &[&str]| json!({"status": {"$setElementOrder/conditions": conditions(types)}});
        let types = |v: &Value| -> Vec<String> {
            v["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["type"].as_str().unwrap().to_owned())
                .collect()
        };
        // An element the order leaves out stays just before the first ordered element that followed it.
        let node = json!({"status": {"conditions": conditions(&["a", "b", "x", "c", "d"])}});
        assert_eq!(types(&smp("Node", node, order(&["b", "a", "d", "c"]))), ["b", "a", "x", "d", "c"]);
        let node = json!({"status": {"conditions": conditions(&["a", "b", "x", "y", "z", "c", "d"])}});
        assert_eq!(types(&smp("Node", node, order(&["b", "a", "d", "c"]))), ["b", "a", "x", "y", "z", "d", "c"]);
        // ... or at the end when nothing ordered followed it.
        let node = json!({"status": {"conditions": conditions(&["a", "c", "d", "b", "x"])}});
        assert_eq!(types(&smp("Node", node, order(&["d", "b", "c", "a"]))), ["d", "b", "c", "a", "x"]);
        // New elements from the patch go where the order says, among the object's.
        let node = json!({"status": {"conditions": conditions(&["a", "x", "b"])}});
        let mut patch = order(&["n", "a", "b", "m"]);
        patch["status"]["conditions"] = conditions(&["n", "m"]);
        assert_eq!(types(&smp("Node", node, patch)), ["n", "a", "x", "b", "m"]);
    }

    #[test]
    fn finalizers_are_a_set() {
        let pod = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = smp("Pod", pod.clone(), json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out = smp("ConfigMap", pod.clone(), json!({"metadata": {"finalizers": ["a"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]), "no duplicates, for every kind");
        let out = smp("Pod", pod.clone(), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a", "zz"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        // $deleteFromPrimitiveList never creates the list, and works on an atomic list too.
        let out = smp("Pod", json!({}), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}));
        assert_eq!(out, json!({"metadata": {}}));
        let out = smp(
            "Namespace",
            json!({"spec": {"finalizers": ["kubernetes", "x"]}}),
            json!({"spec": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
        );
        assert_eq!(out["spec"]["finalizers"], json!(["kubernetes"]));
        // Malformed: not a list, a list of maps, no field name.
        assert_eq!(
            smp_err("Pod", pod.clone(), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}})),
            BAD_PRIMITIVE_LIST
        );
        assert_eq!(
            smp_err("Pod", pod.clone(), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [{"a": 1}]}})),
            BAD_PRIMITIVE_LIST
        );
        assert_eq!(smp_err("Pod", pod, json!({"metadata": {"$deleteFromPrimitiveList": ["a"]}})), BAD_PRIMITIVE_LIST);
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let o = json!({"metadata": {"ownerReferences": [{"uid": "1", "kind": "ReplicaSet", "name": "rs"}]}});
        let out = smp(
            "Pod",
            o.clone(),
            json!({"metadata": {"ownerReferences": [{"uid": "1", "controller": true}, {"uid": "2", "kind": "Node", "name": "n"}]}}),
        );
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "1", "kind": "ReplicaSet", "name": "rs", "controller": true}, {"uid": "2", "kind": "Node", "name": "n"}])
        );
        let out = smp("Secret", out, json!({"metadata": {"ownerReferences": [{"uid": "1", "$patch": "delete"}]}}));
        assert_eq!(out["metadata"]["ownerReferences"], json!([{"uid": "2", "kind": "Node", "name": "n"}]));
    }

    #[test]
    fn atomic_lists_are_replaced() {
        let pod = json!({
            "spec": {"tolerations": [{"key": "a"}], "containers": [{"name": "c", "args": ["x", "y"]}]},
            "status": {"containerStatuses": [{"name": "c", "ready": false}, {"name": "d", "ready": false}]},
        });
        let out = smp(
            "Pod",
            pod,
            json!({
                "spec": {"tolerations": [{"key": "b"}], "containers": [{"name": "c", "args": ["z"]}]},
                "status": {"containerStatuses": [{"name": "c", "ready": true}]},
            }),
        );
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "b"}]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["z"]), "args are atomic");
        assert_eq!(out["status"]["containerStatuses"], json!([{"name": "c", "ready": true}]));
        let node = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}, "status": {"images": [{"names": ["x"]}]}});
        let out = smp(
            "Node",
            node,
            json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}, "status": {"images": []}}),
        );
        assert_eq!(out["spec"]["taints"], json!([{"key": "b", "effect": "NoSchedule"}]));
        assert_eq!(out["status"]["images"], json!([]));
        // A ServiceAccount's imagePullSecrets are atomic, a pod's merge by name.
        let sa = json!({"imagePullSecrets": [{"name": "a"}], "secrets": [{"name": "s1"}]});
        let out = smp("ServiceAccount", sa, json!({"imagePullSecrets": [{"name": "b"}], "secrets": [{"name": "s2"}]}));
        assert_eq!(out["imagePullSecrets"], json!([{"name": "b"}]));
        assert_eq!(out["secrets"], json!([{"name": "s2"}, {"name": "s1"}]));
        let pod = json!({"spec": {"imagePullSecrets": [{"name": "a"}]}});
        let out = smp("Pod", pod, json!({"spec": {"imagePullSecrets": [{"name": "b"}]}}));
        assert_eq!(out["spec"]["imagePullSecrets"], json!([{"name": "b"}, {"name": "a"}]));
    }

    #[test]
    fn the_key_depends_on_the_kind() {
        // spec.ports: a Service's merge by port; a Pod has no such list (atomic there).
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443, "name": "https"}]}});
        let out = smp("Service", svc.clone(), json!({"spec": {"ports": [{"port": 443, "targetPort": 8443}]}}));
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "name": "http"}, {"port": 443, "name": "https", "targetPort": 8443}])
        );
        let out = smp("Pod", svc, json!({"spec": {"ports": [{"port": 443}]}}));
        assert_eq!(out["spec"]["ports"], json!([{"port": 443}]));
        // status.conditions merge by type for pods, nodes, namespaces and services; a Lease has none.
        for kind in ["Pod", "Node", "Namespace", "Service"] {
            let o = json!({"status": {"conditions": [{"type": "A", "status": "True"}]}});
            let out = smp(kind, o, json!({"status": {"conditions": [{"type": "B", "status": "True"}]}}));
            assert_eq!(out["status"]["conditions"].as_array().unwrap().len(), 2, "{kind}");
        }
        let out = smp(
            "Lease",
            json!({"status": {"conditions": [{"type": "A"}]}}),
            json!({"status": {"conditions": [{"type": "B"}]}}),
        );
        assert_eq!(out["status"]["conditions"], json!([{"type": "B"}]));
        // Pod IPs by ip; volumes, volumeMounts by their keys; init and ephemeral containers by name.
        let pod = json!({
            "spec": {
                "volumes": [{"name": "v", "emptyDir": {}}],
                "initContainers": [{"name": "i", "volumeMounts": [{"mountPath": "/a", "name": "v"}]}],
                "ephemeralContainers": [{"name": "e", "env": [{"name": "A", "value": "1"}]}],
            },
            "status": {"podIPs": [{"ip": "10.0.0.1"}], "hostIPs": [{"ip": "192.168.0.1"}]},
        });
        let out = smp(
            "Pod",
            pod,
            json!({
                "spec": {
                    "volumes": [{"name": "w", "emptyDir": {}}],
                    "initContainers": [{"name": "i", "volumeMounts": [{"mountPath": "/b", "name": "w"}]}],
                    "ephemeralContainers": [{"name": "e", "env": [{"name": "A", "value": "2"}]}],
                },
                "status": {"podIPs": [{"ip": "fd00::1"}], "hostIPs": [{"ip": "192.168.0.1"}]},
            }),
        );
        assert_eq!(out["spec"]["volumes"].as_array().unwrap().len(), 2);
        assert_eq!(out["spec"]["initContainers"][0]["volumeMounts"].as_array().unwrap().len(), 2);
        assert_eq!(out["spec"]["ephemeralContainers"][0]["env"], json!([{"name": "A", "value": "2"}]));
        assert_eq!(out["status"]["podIPs"], json!([{"ip": "fd00::1"}, {"ip": "10.0.0.1"}]));
        assert_eq!(out["status"]["hostIPs"], json!([{"ip": "192.168.0.1"}]));
    }

    #[test]
    fn patch_directives_on_maps() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"nodeSelector": {"x": "y"}}});
        // replace: the map is the patch's, directives applied.
        let out = smp("Pod", pod.clone(), json!({"metadata": {"labels": {"$patch": "replace", "c": "3", "d": null}}}));
        assert_eq!(out["metadata"]["labels"], json!({"c": "3"}));
        // delete: an existing map is emptied; a missing one is not created.
        let out = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"nodeSelector": {"$patch": "delete"}, "affinity": {"$patch": "delete"}}}),
        );
        assert_eq!(out["spec"], json!({"nodeSelector": {}}));
        // Replacing the whole object.
        let out = smp("Pod", pod.clone(), json!({"$patch": "replace", "metadata": {"name": "p"}}));
        assert_eq!(out, json!({"metadata": {"name": "p"}}));
        // A replace where the object had nothing.
        let out = smp("Pod", pod.clone(), json!({"spec": {"affinity": {"$patch": "replace", "nodeAffinity": {}}}}));
        assert_eq!(out["spec"]["affinity"], json!({"nodeAffinity": {}}));
        // Nulls delete; nulls in new maps are dropped; a map replaces a scalar.
        let out =
            smp("Pod", pod.clone(), json!({"metadata": {"labels": {"a": null}, "annotations": {"k": "v", "n": null}}}));
        assert_eq!(out["metadata"], json!({"labels": {"b": "2"}, "annotations": {"k": "v"}}));
        let e = smp_err("Pod", pod.clone(), json!({"metadata": {"labels": {"$patch": "merge"}}}));
        assert!(e.starts_with("unknown patch type: \"merge\""), "{e}");
        assert_eq!(smp_err("Pod", pod, json!([1])), BAD_DOCUMENT);
    }

    #[test]
    fn patch_directives_in_lists() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "a", "dup": true}]}});
        // delete removes every element with the key, and the patch's other elements still merge.
        let out = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}, {"name": "b", "image": "i"}]}}),
        );
        assert_eq!(out["spec"]["containers"], json!([{"name": "b", "image": "i"}]));
        // Deleting what is not there is no error.
        let out = smp("Pod", pod.clone(), json!({"spec": {"containers": [{"name": "zz", "$patch": "delete"}]}}));
        assert_eq!(out["spec"]["containers"].as_array().unwrap().len(), 3);
        // replace: the list is the patch's other elements; alone, it empties the list.
        let out = smp("Pod", pod.clone(), json!({"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}]}}));
        assert_eq!(out["spec"]["containers"], json!([{"name": "c"}]));
        let out = smp("Pod", pod.clone(), json!({"spec": {"containers": [{"$patch": "replace"}]}}));
        assert_eq!(out["spec"]["containers"], json!([]));
        // Directive elements in a list the object lacks are dropped.
        let out =
            smp("Pod", json!({}), json!({"spec": {"containers": [{"name": "x", "$patch": "delete"}, {"name": "y"}]}}));
        assert_eq!(out["spec"]["containers"], json!([{"name": "y"}]));
        // Errors: merge in a list, an unknown directive, a missing merge key, mixed element types, lists of lists.
        let e = smp_err("Pod", pod.clone(), json!({"spec": {"containers": [{"$patch": "merge"}]}}));
        assert_eq!(e, "merging lists cannot yet be specified in the patch");
        let e = smp_err("Pod", pod.clone(), json!({"spec": {"containers": [{"name": "a", "$patch": "bogus"}]}}));
        assert!(e.starts_with("unknown patch type"), "{e}");
        let e = smp_err("Pod", pod.clone(), json!({"spec": {"containers": [{"image": "x"}]}}));
        assert!(e.ends_with("does not contain declared merge key: name"), "{e}");
        let e = smp_err("Pod", pod.clone(), json!({"spec": {"containers": [{"$patch": "delete"}]}}));
        assert!(e.ends_with("does not contain declared merge key: name"), "{e}");
        let e = smp_err("Pod", pod.clone(), json!({"spec": {"containers": ["x"]}}));
        assert!(e.starts_with("list element types are not identical"), "{e}");
        let e =
            smp_err("Pod", json!({"metadata": {"finalizers": [["a"]]}}), json!({"metadata": {"finalizers": ["b"]}}));
        assert_eq!(e, LIST_OF_LISTS);
        // A set never holds maps.
        let e = smp_err("Node", json!({"spec": {"podCIDRs": [{"a": 1}]}}), json!({"spec": {"podCIDRs": [{"b": 1}]}}));
        assert!(e.starts_with("cannot merge lists without merge key"), "{e}");
    }

    #[test]
    fn retain_keys_clears_what_is_not_listed() {
        let pod = json!({"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/x"}, "extra": 1}]}});
        let out = smp(
            "Pod",
            pod.clone(),
            json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}]}}),
        );
        assert_eq!(out["spec"]["volumes"], json!([{"name": "v", "emptyDir": {}}]));
        // On any map, after which the patch merges as usual.
        let out = smp(
            "Pod",
            json!({"spec": {"strategy": {"type": "A", "rollingUpdate": {"x": 1}, "other": 2}}}),
            json!({"spec": {"strategy": {"$retainKeys": ["type", "other"], "type": "B", "gone": null}}}),
        );
        assert_eq!(out["spec"]["strategy"], json!({"type": "B", "other": 2}));
        // Every key the patch sets must be listed; the directive must be a list.
        let e = smp_err(
            "Pod",
            pod.clone(),
            json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name"], "emptyDir": {}}]}}),
        );
        assert_eq!(e, BAD_RETAIN_KEYS);
        let e = smp_err("Pod", pod, json!({"spec": {"$retainKeys": "volumes"}}));
        assert_eq!(e, BAD_RETAIN_KEYS);
    }

    #[test]
    fn what_kubectl_sends_for_an_edited_list() {
        // kubectl edit removing finalizer "a", adding "c", keeping "b" first.
        let o = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = smp(
            "Pod",
            o,
            json!({"metadata": {
                "$setElementOrder/finalizers": ["b", "c"],
                "$deleteFromPrimitiveList/finalizers": ["a"],
                "finalizers": ["c"],
            }}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "c"]));
        // kubectl label / annotate style: a merge patch of the metadata maps.
        let out = smp(
            "Node",
            json!({"metadata": {"labels": {"a": "1"}}, "spec": {"taints": [{"key": "t"}]}}),
            json!({"metadata": {"labels": {"b": "2"}}}),
        );
        assert_eq!(out, json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"taints": [{"key": "t"}]}}));
    }

    fn jp(doc: Value, ops: Value) -> Result<Value, String> {
        let mut d = doc.clone();
        let r = json_patch(&mut d, &ops);
        if r.is_err() {
            assert_eq!(d, doc, "a failed JSON patch leaves the document alone");
        }
        r.map(|()| d)
    }

    #[test]
    fn json_patch_add_remove_replace() {
        let doc = json!({"a": {"b": [1, 2]}, "c": "x"});
        assert_eq!(jp(doc.clone(), json!([{"op": "add", "path": "/a/d", "value": 3}])).unwrap()["a"]["d"], 3);
        assert_eq!(
            jp(doc.clone(), json!([{"op": "add", "path": "/a/b/0", "value": 0}])).unwrap()["a"]["b"],
            json!([0, 1, 2])
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "add", "path": "/a/b/-", "value": 3}])).unwrap()["a"]["b"],
            json!([1, 2, 3])
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "add", "path": "/a/b/2", "value": 3}])).unwrap()["a"]["b"],
            json!([1, 2, 3])
        );
        assert_eq!(jp(doc.clone(), json!([{"op": "add", "path": "/c", "value": null}])).unwrap()["c"], json!(null));
        assert_eq!(jp(doc.clone(), json!([{"op": "add", "path": "", "value": {"z": 1}}])).unwrap(), json!({"z": 1}));
        assert_eq!(
            jp(doc.clone(), json!([{"op": "add", "path": "/a/b/3", "value": 3}])).unwrap_err(),
            "error in add for path: '/a/b/3': Unable to access invalid index: 3: invalid index referenced"
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "add", "path": "/x/y", "value": 3}])).unwrap_err(),
            "add operation does not apply: doc is missing path: \"/x/y\": missing value"
        );
        assert!(jp(doc.clone(), json!([{"op": "add", "path": "/a/b/01", "value": 3}])).is_err(), "no leading zeros");
        assert!(jp(doc.clone(), json!([{"op": "add", "path": "/a/b/-1", "value": 3}])).is_err());
        assert!(jp(doc.clone(), json!([{"op": "add", "path": "/a"}])).unwrap_err().contains("missing value"));

        assert_eq!(jp(doc.clone(), json!([{"op": "remove", "path": "/a/b/0"}])).unwrap()["a"]["b"], json!([2]));
        assert_eq!(jp(doc.clone(), json!([{"op": "remove", "path": "/c"}])).unwrap(), json!({"a": {"b": [1, 2]}}));
        assert_eq!(
            jp(doc.clone(), json!([{"op": "remove", "path": "/zz"}])).unwrap_err(),
            "error in remove for path: '/zz': Unable to remove nonexistent key: zz: missing value"
        );
        assert!(jp(doc.clone(), json!([{"op": "remove", "path": "/a/b/-"}])).is_err());
        assert!(jp(doc.clone(), json!([{"op": "remove", "path": "/a/b/2"}])).is_err());

        assert_eq!(jp(doc.clone(), json!([{"op": "replace", "path": "/c", "value": [1]}])).unwrap()["c"], json!([1]));
        assert_eq!(
            jp(doc.clone(), json!([{"op": "replace", "path": "/a/b/1", "value": 9}])).unwrap()["a"]["b"],
            json!([1, 9])
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "replace", "path": "/zz", "value": 1}])).unwrap_err(),
            "replace operation does not apply: doc is missing key: /zz: missing value"
        );
        assert_eq!(
            jp(doc, json!([{"op": "replace", "path": "/q/zz", "value": 1}])).unwrap_err(),
            "replace operation does not apply: doc is missing path: /q/zz: missing value"
        );
    }

    #[test]
    fn json_patch_move_copy_test() {
        let doc = json!({"a": {"b": 1}, "l": [1, 2, 3]});
        assert_eq!(
            jp(doc.clone(), json!([{"op": "move", "from": "/a/b", "path": "/c"}])).unwrap(),
            json!({"a": {}, "c": 1, "l": [1, 2, 3]})
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "move", "from": "/l/0", "path": "/l/-"}])).unwrap()["l"],
            json!([2, 3, 1])
        );
        assert_eq!(jp(doc.clone(), json!([{"op": "move", "from": "/a", "path": "/a"}])).unwrap(), doc);
        assert!(jp(doc.clone(), json!([{"op": "move", "from": "/a", "path": "/a/x"}])).is_err(), "not into itself");
        assert_eq!(
            jp(doc.clone(), json!([{"op": "move", "from": "/zz", "path": "/y"}])).unwrap_err(),
            "move operation does not apply: doc is missing from path: /zz: missing value"
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "copy", "from": "/a", "path": "/l/1"}])).unwrap()["l"],
            json!([1, {"b": 1}, 2, 3])
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "copy", "from": "/zz", "path": "/y"}])).unwrap_err(),
            "copy operation does not apply: doc is missing from path: /zz: missing value"
        );
        assert!(jp(doc.clone(), json!([{"op": "test", "path": "/a", "value": {"b": 1}}])).is_ok());
        assert!(jp(doc.clone(), json!([{"op": "test", "path": "", "value": doc.clone()}])).is_ok());
        assert_eq!(
            jp(doc.clone(), json!([{"op": "test", "path": "/a/b", "value": 2}])).unwrap_err(),
            "testing value /a/b failed: test failed"
        );
        assert_eq!(
            jp(doc.clone(), json!([{"op": "test", "path": "/zz", "value": 2}])).unwrap_err(),
            "test operation does not apply: is missing path: /zz: missing value"
        );
        // All or nothing: a failing test after a change leaves the document as it was.
        assert!(
            jp(
                doc.clone(),
                json!([{"op": "replace", "path": "/a/b", "value": 5}, {"op": "test", "path": "/l/0", "value": 9}])
            )
            .is_err()
        );
        assert_eq!(jp(doc.clone(), json!([{"op": "frob", "path": "/a"}])).unwrap_err(), "Unexpected kind: frob");
        assert!(jp(doc.clone(), json!([{"path": "/a"}])).unwrap_err().starts_with("Unexpected kind: unknown"));
        assert!(jp(doc.clone(), json!([{"op": "remove"}])).unwrap_err().contains("missing path"));
        assert!(jp(doc.clone(), json!({"op": "remove", "path": "/a"})).unwrap_err().contains("list of operations"));
        assert!(jp(doc, json!(["remove"])).unwrap_err().contains("list of operations"));
    }

    #[test]
    fn json_pointers_unescape() {
        let doc = json!({"metadata": {"labels": {"kubernetes.io/hostname": "n1", "a~b": "x"}}});
        let out = jp(
            doc.clone(),
            json!([
                {"op": "test", "path": "/metadata/labels/kubernetes.io~1hostname", "value": "n1"},
                {"op": "remove", "path": "/metadata/labels/a~0b"},
                {"op": "add", "path": "/metadata/labels/c~01", "value": "y"},
            ]),
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"kubernetes.io/hostname": "n1", "c~1": "y"}));
        assert!(jp(doc.clone(), json!([{"op": "remove", "path": "/metadata/labels/a~2b"}])).is_err());
        assert!(jp(doc, json!([{"op": "remove", "path": "metadata"}])).is_err());
    }
}
