//! TokenRequest (`serviceaccounts/<name>/token`): a token for a service account, bound to a pod, a secret or a
//! node, as the apiserver issues them: the API audience unless others are asked, at least 10 minutes, an hour by
//! default, and the kubelet's 3607 s extended to a year with a `warnafter` claim, as
//! `--service-account-extend-token-expiration` does. The token has a JWT's shape and claims; its signature is not
//! a real one (nothing here verifies tokens).

use serde_json::{Value, json};

use crate::store::{ApiError, Store};

/// The audience tokens carry unless the request names others (`--api-audiences`).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The lifetime asked for when none is.
const DEFAULT_SECONDS: i64 = 3600;
/// The shortest lifetime a request may ask for.
const MIN_SECONDS: i64 = 600;
/// What an extended token really lives.
const EXTENDED_SECONDS: i64 = 365 * 24 * 3600;

fn invalid(why: &str) -> ApiError {
    ApiError::new(422, "Invalid", format!("TokenRequest.authentication.k8s.io \"\" is invalid: {why}"))
}

/// Issues the token `request` asks for `account` in `namespace`; the answer is the TokenRequest with its status.
pub fn issue(store: &Store, namespace: &str, account: &str, mut request: Value) -> Result<Value, ApiError> {
    let sa = store.get(crate::resource("serviceaccounts"), Some(namespace), account)?;
    let seconds = request["spec"]["expirationSeconds"].as_i64().unwrap_or(DEFAULT_SECONDS);
    if seconds < MIN_SECONDS {
        return Err(invalid("spec.expirationSeconds: Invalid value: may not specify a duration less than 10 minutes"));
    }
    if seconds > i64::from(u32::MAX) {
        return Err(invalid(
            "spec.expirationSeconds: Invalid value: may not specify a duration larger than 2^32 seconds",
        ));
    }
    let audiences = match request["spec"]["audiences"].as_array() {
        Some(a) if !a.is_empty() => a.clone(),
        _ => vec![json!(API_AUDIENCE)],
    };
    let now = jiff::Timestamp::now().as_second();
    let mut scope = json!({
        "namespace": namespace,
        "serviceaccount": {"name": account, "uid": sa["metadata"]["uid"]},
    });
    let bound = &request["spec"]["boundObjectRef"];
    if !bound.is_null() {
        let (kind, name) = (bound["kind"].as_str().unwrap_or(""), bound["name"].as_str().unwrap_or(""));
        let plural = match kind {
            "Pod" => "pods",
            "Secret" => "secrets",
            "Node" => "nodes",
            other => {
                return Err(ApiError::new(
                    400,
                    "BadRequest",
                    format!("cannot bind a token to a {other:?}: supported kinds are Pod, Secret and Node"),
                ));
            }
        };
        let r = crate::resource(plural);
        let object = store.get(r, if r.namespaced { Some(namespace) } else { None }, name)?;
        let uid = object["metadata"]["uid"].as_str().unwrap_or("");
        if bound["uid"].as_str().is_some_and(|u| !u.is_empty() && u != uid) {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "the UID in the bound object reference ({}) does not match the UID in record ({uid}); the object was deleted and made again",
                    bound["uid"].as_str().unwrap_or("")
                ),
            ));
        }
        scope[kind.to_lowercase()] = json!({"name": name, "uid": uid});
        // A pod-bound token also names the pod's node.
        if kind == "Pod"
            && let Some(node) = object["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())
            && let Ok(n) = store.get(crate::resource("nodes"), None, node)
        {
            scope["node"] = json!({"name": node, "uid": n["metadata"]["uid"]});
        }
    }
    // Only the kubelet's pod-bound token for the API is extended.
    let for_api = audiences.iter().any(|a| a == API_AUDIENCE);
    let lives = if seconds == crate::admission::TOKEN_SECONDS && for_api && scope.get("pod").is_some() {
        scope["warnafter"] = json!(now + seconds);
        EXTENDED_SECONDS
    } else {
        seconds
    };
    let claims = json!({
        "aud": audiences, "exp": now + lives, "iat": now, "nbf": now,
        "iss": API_AUDIENCE, "jti": format!("{now:x}-{account}"),
        "sub": format!("system:serviceaccount:{namespace}:{account}"),
        "kubernetes.io": scope,
    });
    let header = json!({"alg": "RS256", "kid": "nodewarden-testapi"});
    let token = format!(
        "{}.{}.{}",
        crate::b64::encode(header.to_string().as_bytes(), true),
        crate::b64::encode(claims.to_string().as_bytes(), true),
        crate::b64::encode(b"not a signature: the test apiserver signs nothing", true)
    );
    let expires = jiff::Timestamp::from_second(now + seconds).unwrap_or_else(|_| jiff::Timestamp::now());
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"]["name"] = json!(account);
    request["metadata"]["namespace"] = json!(namespace);
    request["metadata"]["creationTimestamp"] = Value::Null;
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] =
        json!({"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()});
    Ok(request)
}

/// The claims of a token this module issued.
#[cfg(test)]
fn claims(token: &str) -> Value {
    fn decode(s: &str) -> Vec<u8> {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let bits: Vec<u8> =
            s.bytes().map(|c| u8::try_from(ALPHABET.iter().position(|a| *a == c).unwrap()).unwrap()).collect();
        let mut out = Vec::new();
        for chunk in bits.chunks(4) {
            let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (18 - 6 * i)));
            for i in 0..chunk.len() - 1 {
                out.push(u8::try_from((n >> (16 - 8 * i)) & 255).unwrap());
            }
        }
        out
    }
    serde_json::from_slice(&decode(token.split('.').nth(1).unwrap())).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_bound_and_extended_as_the_apiserver_issues_them() {
        let store = Store::default();
        let sa = crate::resource("serviceaccounts");
        store.create(sa, Some("default"), json!({"metadata": {"name": "default"}})).unwrap();
        let node = store.create(crate::resource("nodes"), None, json!({"metadata": {"name": "n1"}})).unwrap();
        let pod = store
            .create(
                crate::resource("pods"),
                Some("default"),
                json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}),
            )
            .unwrap();
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        let asked = json!({"spec": {"expirationSeconds": 3607, "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": uid}}});
        let answer = issue(&store, "default", "default", asked.clone()).unwrap();
        let c = claims(answer["status"]["token"].as_str().unwrap());
        assert_eq!(c["sub"], "system:serviceaccount:default:default");
        assert_eq!(c["aud"], json!([API_AUDIENCE]));
        assert_eq!(c["kubernetes.io"]["pod"]["uid"], uid);
        assert_eq!(c["kubernetes.io"]["node"]["uid"], node["metadata"]["uid"]);
        let lives = c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap();
        assert_eq!(lives, EXTENDED_SECONDS, "3607 s is extended");
        assert_eq!(c["kubernetes.io"]["warnafter"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 3607);
        // A recreated pod's old UID, a missing account, too short a lifetime.
        let mut stale = asked.clone();
        stale["spec"]["boundObjectRef"]["uid"] = json!("other");
        assert_eq!(issue(&store, "default", "default", stale).unwrap_err().code, 409);
        assert_eq!(issue(&store, "default", "nope", asked).unwrap_err().code, 404);
        assert_eq!(
            issue(&store, "default", "default", json!({"spec": {"expirationSeconds": 60}})).unwrap_err().code,
            422
        );
        let plain = issue(&store, "default", "default", json!({"spec": {"audiences": ["vault"]}})).unwrap();
        let c = claims(plain["status"]["token"].as_str().unwrap());
        assert_eq!(
            (c["aud"].clone(), c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap()),
            (json!(["vault"]), 3600)
        );
    }
}
