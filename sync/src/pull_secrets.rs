//! `imagePullSecrets`: the registry credentials of a pod's `kubernetes.io/dockerconfigjson` and
//! `kubernetes.io/dockercfg` Secrets that match an image, most specific first, as the kubelet's keyring finds
//! them. A pull tries each in turn; an image no credential matches is pulled anonymously.

use nodewarden_runtime::RegistryAuth;
use serde_json::Value;

use crate::objects::ObjectData;

/// The key of a `kubernetes.io/dockerconfigjson` Secret.
const DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
/// The key of a legacy `kubernetes.io/dockercfg` Secret.
const DOCKER_CFG: &str = ".dockercfg";

/// An image reference's registry host (with its port) and repository path, as a pull names them: `busybox` is
/// `docker.io`, `library/busybox`.
fn split_image(image: &str) -> (String, String) {
    let name = image.split('@').next().unwrap_or(image);
    // A tag is after the last ':' that follows the last '/'.
    let name = match (name.rfind(':'), name.rfind('/')) {
        (Some(c), Some(s)) if c > s => &name[..c],
        (Some(c), None) => &name[..c],
        _ => name,
    };
    match name.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => {
            (host.to_owned(), rest.to_owned())
        }
        Some(_) => ("docker.io".into(), name.to_owned()),
        None => ("docker.io".into(), format!("library/{name}")),
    }
}

/// The names Docker Hub goes by.
fn is_docker_hub(host: &str) -> bool {
    matches!(host, "docker.io" | "index.docker.io" | "registry-1.docker.io")
}

/// A config key (`https://index.docker.io/v1/`, `registry.example:5000/team`, `*.example.com`) as host and path.
fn split_key(key: &str) -> (String, String) {
    let rest = key.split_once("://").map_or(key, |(_, r)| r);
    let rest = rest.trim_end_matches('/');
    let rest = rest.strip_suffix("/v1").or_else(|| rest.strip_suffix("/v2")).unwrap_or(rest);
    match rest.split_once('/') {
        Some((h, p)) => (h.to_ascii_lowercase(), p.to_owned()),
        None => (rest.to_ascii_lowercase(), String::new()),
    }
}

/// Whether `pattern` (a host, each dot-separated part possibly `*`) matches `host`, ports equal.
fn host_matches(pattern: &str, host: &str) -> bool {
    if is_docker_hub(pattern) && is_docker_hub(host) {
        return true;
    }
    let (p_name, p_port) = pattern.split_once(':').map_or((pattern, ""), |(n, p)| (n, p));
    let (h_name, h_port) = host.split_once(':').map_or((host, ""), |(n, p)| (n, p));
    if p_port != h_port {
        return false;
    }
    let (p, h): (Vec<&str>, Vec<&str>) = (p_name.split('.').collect(), h_name.split('.').collect());
    p.len() == h.len() && p.iter().zip(&h).all(|(p, h)| *p == "*" || p.eq_ignore_ascii_case(h))
}

/// The credentials of one config entry.
fn auth_of(server: &str, entry: &Value) -> Option<RegistryAuth> {
    let s = |k: &str| entry.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut auth = RegistryAuth {
        server_address: server.to_owned(),
        username: s("username"),
        password: s("password"),
        auth: s("auth"),
        identity_token: s("identitytoken"),
        registry_token: s("registrytoken"),
    };
    // `auth` is base64 of `user:password`: given alone, it is split as the kubelet splits it.
    if auth.username.is_empty() && !auth.auth.is_empty() {
        use base64::Engine;
        let decoded = base64::engine::general_purpose::STANDARD.decode(auth.auth.trim()).ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (u, p) = text.split_once(':')?;
        auth.username = u.to_owned();
        auth.password = p.to_owned();
    }
    Some(auth)
}

/// The credentials for `image` in `secrets` (each the data of one pull secret), the most specific key first.
/// A Secret that is not a docker config is skipped.
pub(crate) fn credentials(image: &str, secrets: &[&ObjectData]) -> Vec<RegistryAuth> {
    let (host, path) = split_image(image);
    let mut found: Vec<(usize, RegistryAuth)> = Vec::new();
    for data in secrets {
        let config: Option<Value> = if let Some(json) = data.data.get(DOCKER_CONFIG_JSON) {
            serde_json::from_slice::<Value>(json).ok().and_then(|v| v.get("auths").cloned())
        } else {
            data.data.get(DOCKER_CFG).and_then(|cfg| serde_json::from_slice(cfg).ok())
        };
        let Some(Value::Object(entries)) = config else { continue };
        for (key, entry) in &entries {
            let (k_host, k_path) = split_key(key);
            let path_ok = k_path.is_empty() || path == k_path || path.starts_with(&format!("{k_path}/"));
            if host_matches(&k_host, &host)
                && path_ok
                && let Some(auth) = auth_of(key, entry)
            {
                found.push((key.len(), auth));
            }
        }
    }
    // Stable: among keys of one length, the pod's order of secrets and the config's order stay.
    found.sort_by_key(|(len, _)| std::cmp::Reverse(*len));
    found.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(key: &str, json: &str) -> ObjectData {
        ObjectData { data: [(key.to_owned(), json.as_bytes().to_vec())].into(), binary: Default::default() }
    }

    #[test]
    fn images_name_their_registry_and_repository() {
        assert_eq!(split_image("busybox"), ("docker.io".into(), "library/busybox".into()));
        assert_eq!(split_image("team/app:1.2"), ("docker.io".into(), "team/app".into()));
        assert_eq!(split_image("reg.example:5000/team/app@sha256:ab"), ("reg.example:5000".into(), "team/app".into()));
        assert_eq!(split_image("localhost/app"), ("localhost".into(), "app".into()));
    }

    #[test]
    fn matching_credentials_most_specific_first_and_others_skipped() {
        let hub = secret(
            DOCKER_CONFIG_JSON,
            // `auth` alone: base64 of `hubuser:hubpass`.
            r#"{"auths": {"https://index.docker.io/v1/": {"auth": "aHVidXNlcjpodWJwYXNz"}}}"#,
        );
        let private = secret(
            DOCKER_CONFIG_JSON,
            r#"{"auths": {"reg.example:5000": {"username": "a", "password": "p1"},
                          "reg.example:5000/team": {"username": "b", "password": "p2"},
                          "*.example": {"username": "c", "password": "p3"}}}"#,
        );
        let legacy = secret(DOCKER_CFG, r#"{"other.example": {"username": "d", "password": "p4"}}"#);
        let opaque = secret("token", "nope");
        let all = [&hub, &private, &legacy, &opaque];
        let users = |image: &str| credentials(image, &all).into_iter().map(|a| a.username).collect::<Vec<_>>();
        let hub_auth = credentials("busybox", &all);
        assert_eq!((hub_auth[0].username.as_str(), hub_auth[0].password.as_str()), ("hubuser", "hubpass"));
        assert_eq!(users("reg.example:5000/team/app:1"), ["b", "a"]);
        assert_eq!(users("reg.example:5000/other/app"), ["a"]);
        assert_eq!(users("reg.example/app"), ["c"], "a glob matches one label, ports equal");
        assert_eq!(users("other.example/x"), ["d", "c"], "the longer key first");
        assert!(users("quay.io/x").is_empty());
        // Passwords stay out of Debug.
        assert!(!format!("{:?}", credentials("busybox", &all)).contains("hubpass"));
    }
}
