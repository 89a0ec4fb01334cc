//! datafusion-distributed: the crate installed on a coordinating session and on workers.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, exec_err};
use datafusion::config::ConfigOptions;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, replace_children_if_necessary,
};
use datafusion_distributed::{
    BroadcastExec, DesiredTaskCountEvent, DesiredTaskCountEventResponse, DistributedExt,
    DistributedGetterExt, NetworkBoundaryExt, RouteTasksEvent, RouteTasksEventResponse,
    WorkerQueryContext,
};

use super::codec::SetsCodec;
use crate::config::SetsConfig;
use crate::join::route::PrefixRouteExec;
use crate::join::{JoinDistribution, SimilarityJoinExec};
use crate::search::shard_queries::TopkQueriesShardsExec;
use crate::search::shards::TopkShardsExec;

/// Installs datafusion-sets into a session that plans for datafusion-distributed.
pub trait SetsDistributedExt {
    /// [`crate::SessionStateBuilderExt::with_sets`], plus what a distributed query needs:
    /// the codec of the crate's nodes ([`SetsCodec`]), the `sets.*` options sent with every
    /// task, the planner hint that keeps a similarity join of one shared build in a stage of
    /// one task (its build reads the whole input), and the rule that broadcasts what every
    /// task of a spread join reads whole (the token counts of a prefix-partitioned join, the
    /// small side of a broadcast one), and the routing that sends the tasks ranking a
    /// sharded index to the same workers at every query ([`shard_affinity_routing`]). Call
    /// it on the coordinating session, with the distributed planner and worker resolver;
    /// workers build theirs with [`sets_worker_session`].
    fn with_sets_distributed(self) -> Self;
}

impl SetsDistributedExt for SessionStateBuilder {
    fn with_sets_distributed(self) -> Self {
        let (builder, session) = crate::session::install(self);
        builder
            .with_distributed_user_codec(SetsCodec::new(session))
            .with_distributed_option_extension(SetsConfig::default())
            .with_distributed_desired_task_count_handler(whole_input_operators)
            .with_distributed_route_tasks_handler(shard_affinity_routing)
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

/// The index table a stage ranks shard by shard: the `index` of its `TopkBm25ShardsExec` or
/// `TopkBm25QueriesShardsExec` (not looking into the stages below it).
fn ranked_index(plan: &Arc<dyn ExecutionPlan>) -> Option<String> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let Some(exec) = node.downcast_ref::<TopkShardsExec>() {
            found = Some(exec.index.clone());
        } else if let Some(exec) = node.downcast_ref::<TopkQueriesShardsExec>() {
            found = Some(exec.index.clone());
        } else if node.as_network_boundary().is_some() {
            return Ok(TreeNodeRecursion::Jump);
        }
        Ok(match found {
            Some(_) => TreeNodeRecursion::Stop,
            None => TreeNodeRecursion::Continue,
        })
    });
    found
}

/// The routing of a stage that ranks a sharded index: task `i` goes to worker `(o + i) mod
/// W` of the workers' URLs in sorted order, `o` an FNV-1a hash of the index table's name.
/// A task of a given index reads the same file groups at every query (the scan's cut is
/// deterministic), so it lands where its shards were loaded by the query before and finds
/// them kept ([`crate::search`]'s loaded partitions); each worker holds only its own tasks'
/// shards. datafusion-distributed's default routing starts at a random worker per query,
/// so every worker came to load every shard. Other stages keep the default routing.
fn shard_affinity_routing(ev: RouteTasksEvent<'_>) -> Option<Result<RouteTasksEventResponse>> {
    let index = ranked_index(ev.plan)?;
    let urls = ev
        .task_ctx
        .session_config()
        .get_distributed_worker_resolver()
        .and_then(|resolver| resolver.get_urls());
    let mut urls = match urls {
        Ok(urls) => urls,
        Err(e) => return Some(Err(e)),
    };
    urls.sort();
    urls.dedup();
    if urls.is_empty() {
        return Some(exec_err!(
            "topk_bm25: no worker to rank the shards of index '{index}' on"
        ));
    }
    let hash = index.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    // The remainder is below the worker count, a `usize`.
    let offset = (hash % urls.len() as u64) as usize;
    let routed: Vec<_> = (0..ev.task_count)
        .map(|i| urls[(offset + i) % urls.len()].clone())
        .collect();
    log::debug!(
        "datafusion-sets: the {} tasks ranking the shards of '{index}' routed to {}",
        routed.len(),
        routed
            .iter()
            .map(|u| u.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Some(Ok(RouteTasksEventResponse::new(routed)))
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::ExecutionPlan;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion_distributed::{DistributedExt, RouteTasksEvent, WorkerResolver};

    use super::shard_affinity_routing;
    use crate::search::shards::TopkShardsExec;
    use crate::search::topk::Mode;

    /// Workers at these ports, listed in this order.
    struct Ports(Vec<u16>);

    impl WorkerResolver for Ports {
        fn get_urls(&self) -> datafusion::common::Result<Vec<url::Url>> {
            Ok(self
                .0
                .iter()
                .map(|p| url::Url::parse(&format!("http://10.0.0.{p}:50051")).unwrap())
                .collect())
        }
    }

    /// The workers `shard_affinity_routing` gives `tasks` tasks of `plan` (their last
    /// octet), `None` where it leaves the stage to the default routing.
    fn routed(ports: &[u16], plan: &Arc<dyn ExecutionPlan>, tasks: usize) -> Option<Vec<u16>> {
        let state = SessionStateBuilder::new()
            .with_distributed_worker_resolver(Ports(ports.to_vec()))
            .build();
        let ev = RouteTasksEvent {
            task_ctx: state.task_ctx(),
            plan,
            task_count: tasks,
        };
        let urls = shard_affinity_routing(ev)?.unwrap().urls;
        assert_eq!(urls.len(), tasks);
        Some(
            urls.iter()
                .map(|u| {
                    let host = u.host_str().unwrap();
                    host.rsplit('.').next().unwrap().parse().unwrap()
                })
                .collect(),
        )
    }

    fn ranking(index: &str) -> Arc<dyn ExecutionPlan> {
        let scan = Arc::new(EmptyExec::new(Arc::new(Schema::new(vec![
            Field::new("term", DataType::Utf8, false),
            Field::new("shard", DataType::UInt32, false),
        ]))));
        let shards =
            TopkShardsExec::try_new(scan, index.into(), "white house".into(), 10, Mode::Or)
                .unwrap();
        Arc::new(CoalescePartitionsExec::new(Arc::new(shards)))
    }

    /// A stage ranking a sharded index goes to the same workers at every query, whatever
    /// order the resolver lists them in, task `i` and `i + W` on one worker, every worker
    /// used; other stages are left to the default routing.
    #[test]
    fn shard_stages_keep_their_workers() {
        let plan = ranking("idx_sh");
        let once = routed(&[1, 2, 3], &plan, 6).unwrap();
        assert_eq!(routed(&[1, 2, 3], &plan, 6), Some(once.clone()));
        assert_eq!(routed(&[3, 1, 2], &plan, 6), Some(once.clone()));
        assert_eq!(routed(&[2, 3, 1, 3], &plan, 6), Some(once.clone()));
        assert_eq!(&once[..3], &once[3..]);
        let mut used = once[..3].to_vec();
        used.sort();
        assert_eq!(used, vec![1, 2, 3]);
        // Consecutive tasks on consecutive workers, from an offset of the index's name.
        for i in 1..6 {
            assert_eq!(once[i], once[i - 1] % 3 + 1, "{once:?}");
        }
        let offsets: std::collections::HashSet<u16> = (0..12)
            .map(|n| routed(&[1, 2, 3], &ranking(&format!("idx_{n}")), 1).unwrap()[0])
            .collect();
        assert!(offsets.len() > 1, "every index starts on one worker");
        // One worker, one task.
        assert_eq!(routed(&[7], &plan, 3), Some(vec![7, 7, 7]));
        // No resolver's workers: an error, not a panic.
        let state = SessionStateBuilder::new()
            .with_distributed_worker_resolver(Ports(vec![]))
            .build();
        let ev = RouteTasksEvent {
            task_ctx: state.task_ctx(),
            plan: &plan,
            task_count: 2,
        };
        let Some(Err(err)) = shard_affinity_routing(ev) else {
            panic!("routed with no workers");
        };
        let err = err.to_string();
        assert!(
            err.contains("no worker to rank the shards of index 'idx_sh'"),
            "{err}"
        );
        // A stage without a shard ranking.
        let other: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(Schema::empty())));
        assert_eq!(routed(&[1, 2, 3], &other, 3), None);
    }
}
