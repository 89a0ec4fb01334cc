//! datafusion-distributed: the crate installed on a coordinating session and on workers.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, replace_children_if_necessary,
};
use datafusion_distributed::{
    BroadcastExec, DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt,
    WorkerQueryContext,
};

use super::codec::SetsCodec;
use crate::config::SetsConfig;
use crate::join::route::PrefixRouteExec;
use crate::join::{JoinDistribution, SimilarityJoinExec};
use crate::search::shard_queries::TopkQueriesShardsExec;

/// Installs datafusion-sets into a session that plans for datafusion-distributed.
pub trait SetsDistributedExt {
    /// [`crate::SessionStateBuilderExt::with_sets`], plus what a distributed query needs:
    /// the codec of the crate's nodes ([`SetsCodec`]), the `sets.*` options sent with every
    /// task, the planner hint that keeps a similarity join of one shared build in a stage of
    /// one task (its build reads the whole input), and the rule that broadcasts what every
    /// task of a spread join reads whole (the token counts of a prefix-partitioned join, the
    /// small side of a broadcast one). Call it on the coordinating session, with the
    /// distributed planner and worker resolver; workers build theirs with
    /// [`sets_worker_session`].
    fn with_sets_distributed(self) -> Self;
}

impl SetsDistributedExt for SessionStateBuilder {
    fn with_sets_distributed(self) -> Self {
        let (builder, session) = crate::session::install(self);
        builder
            .with_distributed_user_codec(SetsCodec::new(session))
            .with_distributed_option_extension(SetsConfig::default())
            .with_distributed_desired_task_count_handler(whole_input_operators)
            .with_physical_optimizer_rule(Arc::new(BroadcastWholeInputs))
    }
}

/// A worker's session for one query: `ctx.builder` with datafusion-sets installed, the
/// crate's codec, and the `sets.*` options the coordinating session sent. Pass it to
/// `Worker::from_session_builder`; a worker that needs more (its own tables, functions)
/// calls it from its own builder function.
pub async fn sets_worker_session(ctx: WorkerQueryContext) -> Result<SessionState> {
    let (builder, session) = crate::session::install(ctx.builder);
    Ok(builder
        .with_distributed_user_codec(SetsCodec::new(session))
        .with_distributed_option_extension_from_headers::<SetsConfig>(&ctx.headers)?
        .build())
}

/// The planner hint for the crate's nodes: a similarity join of one shared build runs in a
/// stage of one task (each task's copy builds from every row it reads).
fn whole_input_operators(
    ev: DesiredTaskCountEvent<'_>,
) -> Option<Result<DesiredTaskCountEventResponse>> {
    ev.plan
        .downcast_ref::<SimilarityJoinExec>()
        .filter(|j| j.distribution() == JoinDistribution::Single)
        .map(|_| Ok(DesiredTaskCountEventResponse::maximum(1)))
}

/// Puts a `BroadcastExec` under each input that every task of a spread operator reads whole:
/// the token counts of a `PrefixRouteExec`, the left input of a broadcast or replicated
/// similarity join, the distinct queries of a `TopkBm25QueriesShardsExec`.
/// datafusion-distributed then sends that input to every task of the stage (a
/// `NetworkBroadcastExec`); without it, a coalesced input would hold the stage to one task.
#[derive(Debug)]
struct BroadcastWholeInputs;

/// `child` (read whole by its parent) under a `BroadcastExec` and a coalesce.
fn broadcast_child(child: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    let input = match child.downcast_ref::<CoalescePartitionsExec>() {
        Some(c) if c.input().is::<BroadcastExec>() => return None,
        Some(c) => Arc::clone(c.input()),
        None if child.output_partitioning().partition_count() == 1 => Arc::clone(child),
        None => return None,
    };
    let broadcast: Arc<dyn ExecutionPlan> = Arc::new(BroadcastExec::new(input, 1));
    Some(Arc::new(CoalescePartitionsExec::new(broadcast)))
}

impl PhysicalOptimizerRule for BroadcastWholeInputs {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let whole = if node.is::<PrefixRouteExec>() || node.is::<TopkQueriesShardsExec>() {
                1
            } else if node.downcast_ref::<SimilarityJoinExec>().is_some_and(|j| {
                matches!(
                    j.distribution(),
                    JoinDistribution::Broadcast | JoinDistribution::Replicated
                )
            }) {
                0
            } else {
                return Ok(Transformed::no(node));
            };
            let mut children: Vec<_> = node.children().into_iter().cloned().collect();
            match broadcast_child(&children[whole]) {
                Some(child) => {
                    children[whole] = child;
                    Ok(Transformed::yes(replace_children_if_necessary(
                        node, children,
                    )?))
                }
                None => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "sets_broadcast_whole_inputs"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
