use super::*;

const NODE: &str = "node1";

fn parse(text: &str) -> Result<Pod, ManifestError> {
    parse_static_pod(text.as_bytes(), Path::new("/etc/kubernetes/manifests/web.yaml"), NODE)
}

const WEB: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: app
    image: busybox
    command: [sleep, infinity]
    resources:
      limits: {cpu: 100m, memory: 64Mi}
";

#[test]
fn applies_static_pod_defaults() {
    let pod = parse(WEB).unwrap();
    assert_eq!(pod.metadata.name.as_deref(), Some("web-node1"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    let uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 32);
    assert!(uid.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(pod.metadata.annotations.as_ref().unwrap()[CONFIG_HASH_ANNOTATION], uid);
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
}

#[test]
fn uid_follows_content_not_formatting() {
    let uid = |t: &str| parse(t).unwrap().metadata.uid.unwrap();
    let a = uid(WEB);
    // The same pod as JSON, keys reordered: the same content, so the same pod.
    let json = r#"{"kind":"Pod","apiVersion":"v1","spec":{"containers":[{"image":"busybox","name":"app",
        "command":["sleep","infinity"],"resources":{"limits":{"memory":"64Mi","cpu":"100m"}}}]},
        "metadata":{"name":"web"}}"#;
    assert_eq!(uid(json), a);
    // An edit is a new pod.
    assert_ne!(uid(&WEB.replace("64Mi", "65Mi")), a);
    // The same content in another file, or on another node, is another pod.
    let other = parse_static_pod(WEB.as_bytes(), Path::new("/etc/kubernetes/manifests/b.yaml"), NODE).unwrap();
    assert_ne!(other.metadata.uid.unwrap(), a);
    // A UID given in the manifest is kept.
    let given = WEB.replace("  name: web\n", "  name: web\n  uid: 0b4c6f8e-1111-2222-3333-444455556666\n");
    assert_eq!(uid(&given), "0b4c6f8e-1111-2222-3333-444455556666");
}

#[test]
fn bad_manifests_get_clear_reasons() {
    let cases: &[(&str, &str)] = &[
        ("", "the manifest is empty"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, livenessProbe: {httpGet: {port: 80, path: \"/h\\r\\nX-Evil: 1\"}}}]}\n",
            "livenessProbe.httpGet.path",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, readinessProbe: {httpGet: {port: 80, httpHeaders: [{name: A, value: \"v\\nB: 2\"}]}}}]}\n",
            "readinessProbe.httpGet.httpHeaders[A]",
        ),
        ("{ not yaml: [", "not valid YAML or JSON"),
        ("apiVersion: apps/v1\nkind: Deployment\n", "not a Pod: apiVersion \"apps/v1\", kind \"Deployment\""),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: 7}\n", "spec.containers:"),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n", "spec: required"),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: X_Y}\nspec: {containers: [{name: a, image: b}]}\n",
            "metadata.name",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x, uid: ../../etc}\nspec: {containers: [{name: a, image: b}]}\n",
            "metadata.uid",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b}, {name: a, image: b}]}\n",
            "duplicate container name \"a\"",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: ../a, image: b}]}\n",
            "spec.containers[../a].name",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a}]}\n",
            "spec.containers[a].image: required",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, resources: {limits: {memory: lots}}}]}\n",
            "memory",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {restartPolicy: Sometimes, containers: [{name: a, image: b}]}\n",
            "spec.restartPolicy",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {volumes: [{name: c, persistentVolumeClaim: {claimName: c}}], containers: [{name: a, image: b}]}\n",
            "only emptyDir, hostPath",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, volumeMounts: [{name: v, mountPath: /v}]}]}\n",
            "no volume of that name",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, image: b, livenessProbe: {periodSeconds: 3}}]}\n",
            "exactly one of exec",
        ),
    ];
    for (text, want) in cases {
        let err = parse(text).expect_err(text).to_string();
        assert!(err.contains(want), "{text:?}: got {err:?}, want {want:?}");
    }
}

#[test]
fn huge_files_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_MANIFEST_BYTES + 1).unwrap();
    assert_eq!(
        read_manifest(&path),
        Err(ManifestError::TooLarge { size: MAX_MANIFEST_BYTES + 1, max: MAX_MANIFEST_BYTES })
    );
    std::fs::write(&path, WEB).unwrap();
    assert_eq!(read_manifest(&path).unwrap(), WEB.as_bytes());
}

#[test]
fn a_url_serves_a_manifest_or_a_pod_list_of_static_pods() {
    let url = "http://config.example/pods";
    let one = parse_url_pods(
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec: {containers: [{name: a, image: b}]}\n",
        url,
        "n1",
    )
    .unwrap();
    assert_eq!(one.len(), 1);
    let annotations = one[0].metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[CONFIG_SOURCE_ANNOTATION], "http");
    assert_eq!(one[0].metadata.name.as_deref(), Some("web-n1"));
    let list = r#"{"apiVersion": "v1", "kind": "PodList", "items": [
        {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        {"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}]}"#;
    let pods = parse_url_pods(list.as_bytes(), url, "n1").unwrap();
    let names: Vec<_> = pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["a-n1", "b-n1"]);
    // The UID follows the URL too: the same manifest from another URL is another pod.
    let elsewhere = parse_url_pods(list.as_bytes(), "http://other.example/pods", "n1").unwrap();
    assert_ne!(pods[0].metadata.uid, elsewhere[0].metadata.uid);
    assert_eq!(parse_url_pods(b"  \n", url, "n1").unwrap(), Vec::<Pod>::new(), "an empty answer is no pods");
    // One bad item refuses the whole answer.
    let bad = list.replace(
        r#""name": "b"}, "spec": {"containers": [{"name": "c", "image": "i"}]}"#,
        r#""name": "b"}, "spec": {"containers": []}"#,
    );
    let e = parse_url_pods(bad.as_bytes(), url, "n1").unwrap_err().to_string();
    assert!(e.starts_with("items[1]"), "{e}");
    let twice = list.replace(r#""name": "b""#, r#""name": "a""#);
    assert!(parse_url_pods(twice.as_bytes(), url, "n1").unwrap_err().to_string().contains("two pods named"));
}
