//! The kube-controller-manager's part fake-kube needs: the Deployment controller (a
//! ReplicaSet `<deployment>-<pod-template-hash>` per pod template, older ones scaled to 0, the
//! Deployment's status), the ReplicaSet controller (pods `<replicaset>-xxxxx` made from the
//! template through the same admission as the API's creates, with the `pod-template-hash`
//! label and a controller ownerReference, extra pods deleted) and the garbage collector
//! (a ReplicaSet or pod whose controlling owner is gone is deleted, pods with their grace
//! period, as after `kubectl delete deployment` with background propagation). Also the
//! defaults and validation of a Deployment at create. Knows nothing of HTTP or Docker.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::resources::{DEPLOYMENTS, PODS, REPLICASETS};
use crate::status::ApiError;
use crate::store::Store;

/// Follow the store and reconcile on each change (and every half second).
pub(crate) async fn run(store: std::sync::Arc<Store>) {
    let mut changes = store.subscribe();
    loop {
        reconcile(&store);
        tokio::select! {
            change = changes.recv() => {
                if let Err(tokio::sync::broadcast::error::RecvError::Closed) = change {
                    return;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Defaults and validation of a Deployment at create, as the apiserver's.
pub(crate) fn prepare_deployment(object: &mut Value) -> Result<(), ApiError> {
    let name = object["metadata"]["name"].as_str().unwrap_or("").to_string();
    let selector = object["spec"]["selector"]["matchLabels"].as_object().cloned().unwrap_or_default();
    let labels = object["spec"]["template"]["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    if selector.is_empty() {
        return Err(ApiError::invalid("Deployment", &name, &[("spec.selector".into(), "Required value".into())]));
    }
    if selector.iter().any(|(k, v)| labels.get(k) != Some(v)) {
        let message = "Invalid value: map[string]string(nil): `selector` does not match template `labels`";
        return Err(ApiError::invalid(
            "Deployment",
            &name,
            &[("spec.template.metadata.labels".into(), message.into())],
        ));
    }
    let spec = &mut object["spec"];
    for (key, value) in [
        ("replicas", json!(1)),
        ("revisionHistoryLimit", json!(10)),
        ("progressDeadlineSeconds", json!(600)),
        ("strategy", json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})),
    ] {
        if spec[key].is_null() {
            spec[key] = value;
        }
    }
    object["metadata"]["generation"] = json!(1);
    object["status"] = json!({});
    Ok(())
}

/// The controller's `pod-template-hash`: FNV-1a (32 bits) of the template, its decimal digits
/// mapped onto the apiserver's safe alphabet (as `rand.SafeEncodeString`).
fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hash: u32 = 0x811c_9dc5;
    for byte in template.to_string().bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash.to_string().bytes().map(|b| ALPHABET[usize::from(b) % ALPHABET.len()] as char).collect()
}

fn owner(object: &Value) -> Value {
    json!({"apiVersion": object["apiVersion"], "kind": object["kind"], "name": object["metadata"]["name"],
        "uid": object["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true})
}

/// The uid of the controlling owner of `object`, with its kind.
fn controller_of(object: &Value) -> Option<(String, String)> {
    object["metadata"]["ownerReferences"].as_array().into_iter().flatten().find(|r| r["controller"] == true).map(|r| {
        (r["kind"].as_str().unwrap_or_default().to_string(), r["uid"].as_str().unwrap_or_default().to_string())
    })
}

fn uid(object: &Value) -> String {
    object["metadata"]["uid"].as_str().unwrap_or_default().to_string()
}

fn meta_str<'a>(object: &'a Value, key: &str) -> &'a str {
    object["metadata"][key].as_str().unwrap_or_default()
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Ask the kubelet to delete `pod` with its grace period (as the API's delete does).
fn delete_pod(store: &Store, pod: &Value) {
    if pod["metadata"]["deletionTimestamp"].is_string() {
        return;
    }
    let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
    let at = chrono::Utc::now() + chrono::Duration::seconds(grace as i64);
    let _ = store.update(PODS, meta_str(pod, "namespace"), meta_str(pod, "name"), |p| {
        p["metadata"]["deletionTimestamp"] = json!(at.format("%Y-%m-%dT%H:%M:%SZ").to_string());
        p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        Ok(())
    });
}

fn reconcile(store: &Store) {
    let (deployments, _) = store.list(DEPLOYMENTS, None);
    let (replica_sets, _) = store.list(REPLICASETS, None);
    let (pods, _) = store.list(PODS, None);
    for deployment in &deployments {
        deployment_step(store, deployment, &replica_sets, &pods);
    }
    let deployment_uids: BTreeSet<String> = deployments.iter().map(uid).collect();
    for rs in &replica_sets {
        match controller_of(rs) {
            Some((kind, owner)) if kind == "Deployment" && !deployment_uids.contains(&owner) => {
                store.delete(REPLICASETS, meta_str(rs, "namespace"), meta_str(rs, "name"));
            }
            _ => replica_set_step(store, rs, &pods),
        }
    }
    let (replica_sets, _) = store.list(REPLICASETS, None);
    let rs_uids: BTreeSet<String> = replica_sets.iter().map(uid).collect();
    for pod in &pods {
        if let Some((kind, owner)) = controller_of(pod) {
            if kind == "ReplicaSet" && !rs_uids.contains(&owner) {
                delete_pod(store, pod);
            }
        }
    }
}

fn deployment_step(store: &Store, deployment: &Value, replica_sets: &[Value], pods: &[Value]) {
    let ns = meta_str(deployment, "namespace");
    let name = meta_str(deployment, "name");
    let spec = &deployment["spec"];
    let replicas = spec["replicas"].as_u64().unwrap_or(1);
    let hash = template_hash(&spec["template"]);
    let current_name = format!("{name}-{hash}");
    let owned: Vec<&Value> =
        replica_sets.iter().filter(|rs| controller_of(rs).is_some_and(|(_, o)| o == uid(deployment))).collect();
    if !owned.iter().any(|rs| meta_str(rs, "name") == current_name) {
        let mut template = spec["template"].clone();
        template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
        let mut selector = spec["selector"].clone();
        selector["matchLabels"]["pod-template-hash"] = json!(hash);
        let revision = owned.len() + 1;
        let rs = json!({
            "metadata": {"name": current_name, "labels": template["metadata"]["labels"], "ownerReferences": [owner(deployment)],
                "annotations": {"deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                    "deployment.kubernetes.io/max-replicas": replicas.to_string(),
                    "deployment.kubernetes.io/revision": revision.to_string()}},
            "spec": {"replicas": replicas, "selector": selector, "template": template},
            "status": {"replicas": 0}
        });
        let _ = store.create(REPLICASETS, ns, rs);
    }
    for rs in &owned {
        let want = if meta_str(rs, "name") == current_name { replicas } else { 0 };
        if rs["spec"]["replicas"].as_u64() != Some(want) {
            let _ = store.update(REPLICASETS, ns, meta_str(rs, "name"), |r| {
                r["spec"]["replicas"] = json!(want);
                Ok(())
            });
        }
    }
    let mine: Vec<&Value> = pods
        .iter()
        .filter(|p| {
            meta_str(p, "namespace") == ns
                && p["metadata"]["deletionTimestamp"].is_null()
                && controller_of(p).is_some_and(|(_, o)| owned.iter().any(|rs| uid(rs) == o))
        })
        .collect();
    let updated = mine.iter().filter(|p| p["metadata"]["labels"]["pod-template-hash"] == json!(hash)).count();
    let ready_count = mine.iter().filter(|p| ready(p)).count();
    let available = ready_count >= replicas as usize;
    let status = json!({
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": mine.len(), "updatedReplicas": updated, "readyReplicas": ready_count,
        "availableReplicas": ready_count, "unavailableReplicas": (replicas as usize).saturating_sub(ready_count),
        "conditions": [{"type": "Available", "status": if available { "True" } else { "False" },
            "reason": if available { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
            "message": if available { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." }}]
    });
    let mut status = status;
    if status["readyReplicas"] == 0 {
        if let Some(map) = status.as_object_mut() {
            map.remove("readyReplicas");
            map.remove("availableReplicas");
        }
    }
    if deployment["status"] != status {
        let _ = store.update(DEPLOYMENTS, ns, name, |d| {
            d["status"] = status;
            Ok(())
        });
    }
}

fn replica_set_step(store: &Store, rs: &Value, pods: &[Value]) {
    let ns = meta_str(rs, "namespace");
    let want = rs["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    let mine: Vec<&Value> = pods
        .iter()
        .filter(|p| {
            meta_str(p, "namespace") == ns
                && p["metadata"]["deletionTimestamp"].is_null()
                && controller_of(p).is_some_and(|(_, o)| o == uid(rs))
        })
        .collect();
    for _ in mine.len()..want {
        let template = &rs["spec"]["template"];
        let mut pod = json!({
            "metadata": {"generateName": format!("{}-", meta_str(rs, "name")), "labels": template["metadata"]["labels"],
                "ownerReferences": [owner(rs)]},
            "spec": template["spec"]
        });
        if let Some(annotations) = template["metadata"]["annotations"].as_object() {
            pod["metadata"]["annotations"] = json!(annotations);
        }
        match crate::api::prepare(PODS, &mut pod) {
            Ok(()) => {
                if let Err(e) = store.create(PODS, ns, pod) {
                    tracing::warn!("replicaset {}: creating a pod: {}", meta_str(rs, "name"), e.message);
                }
            }
            Err(e) => tracing::warn!("replicaset {}: invalid pod template: {}", meta_str(rs, "name"), e.message),
        }
    }
    for extra in mine.iter().skip(want) {
        delete_pod(store, extra);
    }
    let ready_count = mine.iter().filter(|p| ready(p)).count();
    let status = json!({"replicas": mine.len(), "readyReplicas": ready_count, "availableReplicas": ready_count,
        "fullyLabeledReplicas": mine.len(), "observedGeneration": 1});
    if rs["status"] != status {
        let _ = store.update(REPLICASETS, ns, meta_str(rs, "name"), |r| {
            r["status"] = status;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_gets_a_replica_set_and_pods_and_deleting_it_collects_them() {
        let store = Store::new(1000);
        store.create(crate::resources::NAMESPACES, "", json!({"metadata": {"name": "ci"}})).unwrap();
        let mut d = json!({"metadata": {"name": "runner"}, "spec": {"selector": {"matchLabels": {"app": "r"}},
            "template": {"metadata": {"labels": {"app": "r"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}});
        prepare_deployment(&mut d).unwrap();
        store.create(DEPLOYMENTS, "ci", d).unwrap();
        reconcile(&store);
        reconcile(&store);
        let (sets, _) = store.list(REPLICASETS, Some("ci"));
        assert_eq!(sets.len(), 1);
        let hash = sets[0]["metadata"]["labels"]["pod-template-hash"].as_str().unwrap().to_string();
        assert_eq!(sets[0]["metadata"]["name"], format!("runner-{hash}"));
        assert_eq!(sets[0]["metadata"]["ownerReferences"][0]["kind"], "Deployment");
        let (pods, _) = store.list(PODS, Some("ci"));
        assert_eq!(pods.len(), 1);
        assert!(pods[0]["metadata"]["name"].as_str().unwrap().starts_with(&format!("runner-{hash}-")));
        assert_eq!(pods[0]["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert_eq!(pods[0]["metadata"]["labels"]["pod-template-hash"], hash.as_str());
        store.delete(DEPLOYMENTS, "ci", "runner");
        reconcile(&store);
        assert!(store.list(REPLICASETS, Some("ci")).0.is_empty());
        let (pods, _) = store.list(PODS, Some("ci"));
        assert!(pods[0]["metadata"]["deletionTimestamp"].is_string(), "the orphaned pod is being deleted");
    }

    #[test]
    fn a_selector_must_match_the_template() {
        let mut d = json!({"metadata": {"name": "x"}, "spec": {"selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "b"}}, "spec": {}}}});
        assert_eq!(prepare_deployment(&mut d).unwrap_err().code, 422);
    }
}
