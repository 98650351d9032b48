//! The parts of the Auto Scaling and EC2 XML answers the plugin reads, and how their states
//! map to fleeting's.
//!
//! Owns: parsing and state mapping. Must not touch: requests.

use roxmltree::{Document, Node};
use runway_sdk::fleeting::InstanceState;

/// One Auto Scaling group.
#[derive(Debug, Clone)]
pub struct Group {
    pub max_size: u32,
    pub desired: u32,
    pub instances: Vec<AsgInstance>,
}

/// An instance as the group lists it.
#[derive(Debug, Clone)]
pub struct AsgInstance {
    pub id: String,
    /// `Pending`, `InService`, `Terminating:Wait`, ...
    pub lifecycle: String,
}

/// An instance as EC2 describes it.
#[derive(Debug, Clone)]
pub struct Ec2Instance {
    pub id: String,
    /// `pending`, `running`, `shutting-down`, `terminated`, `stopping`, `stopped`.
    pub state: String,
    pub private_ip: Option<String>,
    pub public_ip: Option<String>,
    /// `spot` or `scheduled`; absent for on-demand.
    pub lifecycle: Option<String>,
}

/// One scaling activity.
#[derive(Debug, Clone)]
pub struct Activity {
    pub status: String,
    pub message: String,
    pub start: Option<u64>,
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children().find(|n| n.is_element() && n.tag_name().name() == name)
}

fn text(node: Node<'_, '_>, name: &str) -> Option<String> {
    child(node, name).and_then(|n| n.text()).map(|t| t.trim().to_string())
}

fn members<'a, 'i>(node: Node<'a, 'i>, name: &'a str) -> impl Iterator<Item = Node<'a, 'i>> + 'a {
    node.children().filter(move |n| n.is_element() && n.tag_name().name() == name)
}

fn parse(body: &str) -> Result<Document<'_>, String> {
    Document::parse(body).map_err(|e| format!("answer is not XML: {e}"))
}

/// The group `name` from a DescribeAutoScalingGroups answer (`None` when it is not there).
pub fn parse_group(body: &str, name: &str) -> Result<Option<Group>, String> {
    let doc = parse(body)?;
    let Some(groups) = doc.descendants().find(|n| n.tag_name().name() == "AutoScalingGroups") else {
        return Err("no AutoScalingGroups in the answer".into());
    };
    let Some(member) = members(groups, "member").find(|m| text(*m, "AutoScalingGroupName").as_deref() == Some(name))
    else {
        return Ok(None);
    };
    let number = |key: &str| -> Result<u32, String> {
        text(member, key).and_then(|v| v.parse().ok()).ok_or_else(|| format!("group {name} has no {key}"))
    };
    let instances = child(member, "Instances")
        .map(|list| {
            members(list, "member")
                .filter_map(|m| Some(AsgInstance { id: text(m, "InstanceId")?, lifecycle: text(m, "LifecycleState")? }))
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(Group { max_size: number("MaxSize")?, desired: number("DesiredCapacity")?, instances }))
}

/// Every instance of a DescribeInstances answer.
pub fn parse_instances(body: &str) -> Result<Vec<Ec2Instance>, String> {
    let doc = parse(body)?;
    let mut out = Vec::new();
    for set in doc.descendants().filter(|n| n.tag_name().name() == "instancesSet") {
        for item in members(set, "item") {
            let Some(id) = text(item, "instanceId") else { continue };
            let state = child(item, "instanceState").and_then(|s| text(s, "name")).unwrap_or_default();
            out.push(Ec2Instance {
                id,
                state,
                private_ip: text(item, "privateIpAddress").filter(|a| !a.is_empty()),
                public_ip: text(item, "ipAddress").filter(|a| !a.is_empty()),
                lifecycle: text(item, "instanceLifecycle"),
            });
        }
    }
    Ok(out)
}

/// The activities of a DescribeScalingActivities answer, newest first.
pub fn parse_activities(body: &str) -> Result<Vec<Activity>, String> {
    let doc = parse(body)?;
    let Some(list) = doc.descendants().find(|n| n.tag_name().name() == "Activities") else {
        return Ok(Vec::new());
    };
    Ok(members(list, "member")
        .map(|m| Activity {
            status: text(m, "StatusCode").unwrap_or_default(),
            message: text(m, "StatusMessage").or_else(|| text(m, "Description")).unwrap_or_default(),
            start: text(m, "StartTime").and_then(|t| cloud_common::parse_rfc3339(&t)),
        })
        .collect())
}

/// Does a failed activity's message say the cloud had no capacity (or the account no quota)?
pub fn is_capacity_failure(message: &str) -> bool {
    const MARKERS: [&str; 7] = [
        "InsufficientInstanceCapacity",
        "Insufficient capacity",
        "InsufficientCapacity",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "SpotMaxPriceTooLow",
    ];
    MARKERS.iter().any(|m| message.contains(m))
}

/// Fleeting's state of an instance from its Auto Scaling lifecycle state and, when known,
/// its EC2 state; `None` for instances that are not the group's to serve (warm pool).
pub fn fleeting_state(lifecycle: &str, ec2: Option<&str>) -> Option<InstanceState> {
    match ec2 {
        Some("terminated") => return Some(InstanceState::Deleted),
        Some("shutting-down" | "stopping" | "stopped") => return Some(InstanceState::Deleting),
        _ => {}
    }
    if lifecycle.starts_with("Warmed") {
        return None;
    }
    Some(match lifecycle {
        "InService" if ec2 == Some("pending") => InstanceState::Creating,
        "InService" => InstanceState::Running,
        "Terminated" | "Detached" => InstanceState::Deleted,
        l if l.starts_with("Pending") => InstanceState::Creating,
        // Terminating*, Detaching, Standby and its transitions, Quarantined: leaving service.
        _ => InstanceState::Deleting,
    })
}
