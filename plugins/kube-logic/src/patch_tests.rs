use serde_json::json;

use super::*;

fn spec() -> Value {
    json!({
        "containers": [
            {"name": "build", "image": "alpine", "env": [{"name": "A", "value": "1"}],
             "volumeMounts": [{"name": "builds", "mountPath": "/builds"}]},
            {"name": "helper", "image": "helper:1"}
        ],
        "volumes": [{"name": "builds", "emptyDir": {}}],
        "tolerations": [{"key": "a", "operator": "Exists"}],
        "restartPolicy": "Never"
    })
}

fn entry(kind: &str, text: &str) -> PodSpecPatch {
    PodSpecPatch { name: "p".into(), patch: text.into(), patch_type: kind.into(), ..Default::default() }
}

fn patched(kind: &str, text: &str) -> Result<Value, String> {
    let patch = entry(kind, text).document(|_| Err("no files".into()))?;
    apply_all(spec(), &[patch])
}

#[test]
fn strategic_merges_containers_env_and_volumes_by_their_keys() {
    let out = patched(
        "",
        r#"{"containers": [{"name": "build", "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "9"}],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
            {"name": "sidecar", "image": "busybox"}],
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
            "tolerations": [{"key": "b", "operator": "Exists"}],
            "hostname": "custom"}"#,
    )
    .unwrap();
    let build = &out["containers"][0];
    assert_eq!(build["image"], "alpine");
    assert_eq!(build["env"], json!([{"name": "A", "value": "9"}, {"name": "B", "value": "2"}]));
    assert_eq!(build["volumeMounts"].as_array().unwrap().len(), 2);
    assert_eq!(out["containers"][1]["name"], "helper");
    assert_eq!(out["containers"][2], json!({"name": "sidecar", "image": "busybox"}));
    assert_eq!(out["volumes"].as_array().unwrap().len(), 2);
    // No merge key on tolerations: replaced whole, as Kubernetes does.
    assert_eq!(out["tolerations"], json!([{"key": "b", "operator": "Exists"}]));
    assert_eq!(out["hostname"], "custom");
    assert_eq!(out["restartPolicy"], "Never");
}

#[test]
fn strategic_yaml_with_directives() {
    let yaml = "
containers:
  - name: helper
    $patch: delete
  - name: build
    env:
      - $patch: replace
      - name: ONLY
        value: x
volumes:
  - name: builds
    $retainKeys: [name, hostPath]
    hostPath: {path: /data}
restartPolicy: null
";
    let out = patched("strategic", yaml).unwrap();
    assert_eq!(out["containers"].as_array().unwrap().len(), 1);
    assert_eq!(out["containers"][0]["env"], json!([{"name": "ONLY", "value": "x"}]));
    assert_eq!(out["volumes"][0], json!({"name": "builds", "hostPath": {"path": "/data"}}));
    assert!(out.get("restartPolicy").is_none());
}

#[test]
fn strategic_replace_delete_and_primitive_list_directives() {
    let out = patched("", r#"{"$patch": "replace", "containers": [{"name": "x"}]}"#).unwrap();
    assert_eq!(out, json!({"containers": [{"name": "x"}]}));
    let out = patched(
        "",
        r#"{"containers": [{"name": "build", "args": ["a", "b", "c"]}],
            "$setElementOrder/containers": [{"name": "helper"}, {"name": "build"}]}"#,
    )
    .unwrap();
    assert_eq!(out["containers"][0]["name"], "helper");
    let mut original = spec();
    original["containers"][0]["args"] = json!(["a", "b", "c"]);
    let doc = json!({"containers": [{"name": "build", "$deleteFromPrimitiveList/args": ["b"]}]});
    let out = strategic(original, &doc).unwrap();
    assert_eq!(out["containers"][0]["args"], json!(["a", "c"]));
    let err = patched("", r#"{"containers": [{"image": "no-name"}]}"#).unwrap_err();
    assert!(err.contains("spec.containers: an element without its merge key \"name\""), "{err}");
}

#[test]
fn json_patch_operations() {
    let out = patched(
        "json",
        r#"[{"op": "add", "path": "/containers/0/env/-", "value": {"name": "B", "value": "2"}},
            {"op": "replace", "path": "/containers/1/image", "value": "helper:2"},
            {"op": "remove", "path": "/tolerations/0"},
            {"op": "copy", "from": "/containers/1/image", "path": "/hostname"},
            {"op": "move", "from": "/restartPolicy", "path": "/x~1y"},
            {"op": "test", "path": "/x~1y", "value": "Never"},
            {"op": "add", "path": "/containers/0", "value": {"name": "first"}}]"#,
    )
    .unwrap();
    assert_eq!(out["containers"][1]["env"][1], json!({"name": "B", "value": "2"}));
    assert_eq!(out["containers"][0]["name"], "first");
    assert_eq!(out["containers"][2]["image"], "helper:2");
    assert_eq!(out["tolerations"], json!([]));
    assert_eq!(out["hostname"], "helper:2");
    assert_eq!(out["x/y"], "Never");
    assert!(out.get("restartPolicy").is_none());
    for (ops, want) in [
        (r#"[{"op": "test", "path": "/restartPolicy", "value": "Always"}]"#, "operation 0: test failed"),
        (r#"[{"op": "remove", "path": "/nothing"}]"#, "no member \"nothing\""),
        (r#"[{"op": "add", "path": "/containers/9", "value": 1}]"#, "out of range"),
        (r#"[{"op": "move", "from": "/containers", "path": "/containers/0"}]"#, "into itself"),
        (r#"{"op": "add"}"#, "a list of operations"),
        (r#"[{"op": "frobnicate", "path": ""}]"#, "unknown op"),
    ] {
        let err = patched("json", ops).unwrap_err();
        assert!(err.starts_with("pod_spec \"p\": ") && err.contains(want), "{ops}: {err}");
    }
}

#[test]
fn merge_patch_replaces_lists_and_deletes_nulls() {
    let out = patched(
        "merge",
        "containers:\n  - name: only\n    image: busybox\nrestartPolicy: null\nsecurityContext: {runAsUser: 1000}\n",
    )
    .unwrap();
    assert_eq!(out["containers"], json!([{"name": "only", "image": "busybox"}]));
    assert!(out.get("restartPolicy").is_none());
    assert_eq!(out["securityContext"]["runAsUser"], 1000);
    // RFC 7386's own examples.
    assert_eq!(merge_patch(json!({"a": "b"}), &json!({"a": "c"})), json!({"a": "c"}));
    assert_eq!(merge_patch(json!({"a": [{"b": "c"}]}), &json!({"a": [1]})), json!({"a": [1]}));
    assert_eq!(merge_patch(json!({"e": null}), &json!({"a": 1})), json!({"e": null, "a": 1}));
    assert_eq!(merge_patch(json!(["a", "b"]), &json!({"a": "b", "c": null})), json!({"a": "b"}));
    assert_eq!(merge_patch(json!({}), &json!({"a": {"bb": {"ccc": null}}})), json!({"a": {"bb": {}}}));
}

#[test]
fn patches_apply_in_order_and_bad_entries_are_named() {
    let first = entry("merge", r#"{"hostname": "one"}"#).document(|_| unreachable!()).unwrap();
    let second = PodSpecPatch { name: "file".into(), patch_path: "/p.yaml".into(), ..Default::default() }
        .document(|path| {
            assert_eq!(path, "/p.yaml");
            Ok("hostname: two\n".into())
        })
        .unwrap();
    let out = apply_all(spec(), &[first, second]).unwrap();
    assert_eq!(out["hostname"], "two");
    let both = PodSpecPatch { name: "both".into(), patch: "{}".into(), patch_path: "/x".into(), ..Default::default() };
    assert_eq!(both.validate().unwrap_err(), "pod_spec \"both\": set either patch or patch_path, not both");
    assert!(entry("xml", "{}").validate().unwrap_err().contains("unsupported patch type \"xml\""));
    let unreadable = PodSpecPatch { name: "f".into(), patch_path: "/nope".into(), ..Default::default() };
    let err = unreadable.document(|_| Err("No such file or directory".into())).unwrap_err();
    assert_eq!(err, "pod_spec \"f\": patch_path \"/nope\": No such file or directory");
    let err = entry("", "containers: [unclosed").document(|_| unreachable!()).unwrap_err();
    assert!(err.contains("neither JSON nor YAML"), "{err}");
    assert!(patched("", "[1]").unwrap_err().contains("a strategic merge patch is an object"));
}
