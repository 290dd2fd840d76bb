//! ExporterSets and VirtualTargetClasses as the admin API shows them.

use jumpstarter_proto::admin_v1::{
    Condition as PbCondition, ExporterSet as PbExporterSet, ScalingDecision,
    VirtualTargetClass as PbClass,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use crate::objects::{
    selector::LabelSelector,
    timestamp_to_proto,
    virtualtarget::{BindingMode, ExporterSet, ReclaimPolicy, RecycleStrategy, VirtualTargetClass},
};
use crate::pools::decisions::Decision;
use crate::service::admin_checks::created;

/// The object as upstream's JSON (empty if it does not serialize, which our types always do).
fn object_json<T: serde::Serialize>(o: &T) -> String {
    serde_json::to_string(o).unwrap_or_default()
}

fn condition(c: &metav1::Condition) -> PbCondition {
    PbCondition {
        r#type: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
        last_transition_time: Some(timestamp_to_proto(c.last_transition_time.0)),
    }
}

/// One decision of the pool engine as the admin API shows it.
pub fn decision_to_admin(d: &Decision) -> ScalingDecision {
    ScalingDecision {
        time: Some(timestamp_to_proto(d.time)),
        action: d.action.as_str().to_string(),
        replica: d.replica.clone().unwrap_or_default(),
        reason: d.reason.clone(),
    }
}

/// An ExporterSet as the admin API shows it, with `decisions` (oldest first).
pub fn exporter_set_to_admin(s: &ExporterSet, decisions: &[Decision]) -> PbExporterSet {
    let status = s.status.clone().unwrap_or_default();
    PbExporterSet {
        namespace: s.metadata.namespace.clone().unwrap_or_default(),
        name: s.metadata.name.clone().unwrap_or_default(),
        virtual_target_class_name: s.spec.virtual_target_class_name.clone(),
        min_replicas: s.spec.min(),
        // 0 keeps its meaning on the wire: no upper bound.
        max_replicas: s.spec.max_replicas.unwrap_or(4),
        min_available_replicas: s.spec.min_available(),
        scale_down_cooldown: s
            .spec
            .scale_down_cooldown
            .clone()
            .unwrap_or_else(|| "5m".into()),
        recycle_strategy: match s.spec.recycle() {
            RecycleStrategy::ExitAndReplace => "ExitAndReplace",
            RecycleStrategy::InPlaceReuse => "InPlaceReuse",
        }
        .into(),
        // Stored sets were validated on the way in; an unreadable selector shows empty.
        selector: LabelSelector::from_k8s(&s.spec.selector)
            .map(|sel| sel.to_selector_string())
            .unwrap_or_default(),
        replicas: status.replicas,
        ready_replicas: status.ready_replicas,
        available_replicas: status.available_replicas,
        unavailable_replicas: status.unavailable_replicas,
        leased_replicas: status.leased_replicas,
        conditions: status.conditions.iter().map(condition).collect(),
        decisions: decisions.iter().map(decision_to_admin).collect(),
        created: created(&s.metadata),
        object_json: object_json(s),
    }
}

/// A VirtualTargetClass as the admin API shows it.
pub fn class_to_admin(c: &VirtualTargetClass) -> PbClass {
    PbClass {
        namespace: c.metadata.namespace.clone().unwrap_or_default(),
        name: c.metadata.name.clone().unwrap_or_default(),
        provisioner: c.spec.provisioner.clone(),
        binding_mode: match c.spec.binding_mode.unwrap_or_default() {
            BindingMode::Immediate => "Immediate",
            BindingMode::WaitForFirstConsumer => "WaitForFirstConsumer",
        }
        .into(),
        reclaim_policy: match c.spec.reclaim_policy.unwrap_or_default() {
            ReclaimPolicy::Delete => "Delete",
            ReclaimPolicy::Retain => "Retain",
        }
        .into(),
        created: created(&c.metadata),
        object_json: object_json(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::virtualtarget::{
        ExporterSetSpec, ExporterSetStatus, VirtualTargetClassSpec,
    };
    use crate::pools::decisions::Action;

    #[test]
    fn sets_show_defaults_counts_conditions_and_decisions() {
        let mut s = ExporterSet::new(
            "pool",
            ExporterSetSpec {
                virtual_target_class_name: "local".into(),
                selector: metav1::LabelSelector {
                    match_labels: Some([("pool".to_string(), "mock".to_string())].into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        s.metadata.namespace = Some("default".into());
        s.status = Some(ExporterSetStatus {
            replicas: 2,
            ready_replicas: 2,
            available_replicas: 1,
            leased_replicas: 1,
            conditions: vec![metav1::Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "PoolReady".into(),
                message: "1 available".into(),
                last_transition_time: metav1::Time(jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let d = Decision {
            time: jiff::Timestamp::UNIX_EPOCH,
            action: Action::ScaleUp,
            replica: Some("pool-abc".into()),
            reason: "1 lease waiting".into(),
        };
        let pb = exporter_set_to_admin(&s, &[d]);
        assert_eq!((pb.min_replicas, pb.max_replicas), (0, 4));
        assert_eq!(pb.scale_down_cooldown, "5m");
        assert_eq!(pb.recycle_strategy, "ExitAndReplace");
        assert_eq!(pb.selector, "pool=mock");
        assert_eq!(
            (pb.replicas, pb.available_replicas, pb.leased_replicas),
            (2, 1, 1)
        );
        assert_eq!(pb.conditions[0].reason, "PoolReady");
        assert_eq!(pb.decisions[0].action, "ScaleUp");
        assert_eq!(pb.decisions[0].replica, "pool-abc");
        let back: ExporterSet = serde_json::from_str(&pb.object_json).unwrap();
        assert_eq!(back, s);

        let c = VirtualTargetClass::new(
            "local",
            VirtualTargetClassSpec {
                provisioner: "local".into(),
                ..Default::default()
            },
        );
        let pb = class_to_admin(&c);
        assert_eq!(
            (pb.binding_mode.as_str(), pb.reclaim_policy.as_str()),
            ("Immediate", "Delete")
        );
    }
}
